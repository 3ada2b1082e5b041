"""pd.v1 <-> SDK values: request encoding, response decoding, error mapping.

The only SDK module that knows protobuf field names; both clients (one source,
`_async/client.py`) share it, so they encode and decode identically.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence

import grpc

from pdserve_client import contract
from pdserve_client.options import UINT32_MAX, GenerateOptions
from pdserve_client.rpc.pd.v1 import admin_pb2, common_pb2, manifest_pb2, router_pb2
from pdserve_client.types import (
    ClusterStatus,
    InvalidArgumentError,
    ModeChange,
    PdError,
    TokenLogprobs,
    TransactionInfo,
    WorkerStatus,
)

# Channel options shared by both clients.
MAX_MESSAGE_BYTES = contract.MAX_MESSAGE_BYTES
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A restarted router is reached again within a second (gRPC's default reconnect
    # backoff grows to two minutes, failing every call meanwhile).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # gRPC core reads this as the least time a connection attempt (its TLS handshake)
    # is given, not as a floor on the backoff: 200 ms cut handshakes to a busy router.
    ("grpc.min_reconnect_backoff_ms", 5_000),
]

MODES = {name: router_pb2.Mode.Value(f"MODE_{name.upper()}") for name in contract.MODES}
RELEASE_MODES = {name: admin_pb2.ReleaseMode.Value(f"RELEASE_MODE_{name.upper()}")
                 for name in contract.RELEASE_MODES}
TXN_STATES = {
    name.removeprefix("TXN_STATE_").lower(): number
    for name, number in manifest_pb2.TxnState.items() if number != 0
}

_GRPC_EQUIVALENT = contract.ERROR_CODE_STATUS
_RETRYABLE_GRPC = contract.RETRYABLE_STATUSES


def enum_name(enum, number: int, prefix: str) -> str:
    """'ROUTE_COLOCATED' -> 'colocated'; unknown numbers keep their value visible."""
    try:
        return enum.Name(number).removeprefix(prefix).lower()
    except ValueError:
        return f"unknown({number})"


def role_name(role: int) -> str:
    """WorkerRole -> 'prefill' | 'decode' | 'mixed' (both phases; WORKER_ROLE_BOTH on the wire)."""
    name = enum_name(common_pb2.WorkerRole, role, "WORKER_ROLE_")
    return "mixed" if name == "both" else name


def route_name(route: int) -> str:
    """Route enum -> 'disaggregated' | 'colocated' ('unspecified' if unset)."""
    return enum_name(router_pb2.Route, route, "ROUTE_")


def finish_reason_name(reason: int) -> str:
    """FinishReason enum -> 'stop' | 'length' | 'cancelled'."""
    return enum_name(common_pb2.FinishReason, reason, "FINISH_REASON_")


def new_request_id() -> str:
    """A fresh client-side request id (uuid4, hex)."""
    return uuid.uuid4().hex


def _bad(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message)


def _token_ids(ids: Iterable[int], name: str) -> list[int]:
    """Reject ids the uint32 wire field cannot carry (protobuf would raise a bare ValueError)."""
    ids = list(ids)
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= UINT32_MAX), None)
    if bad is not None:
        raise _bad(f"{name} must be integers in [0, {UINT32_MAX}], got {bad!r}")
    return ids


def build_generate_request(
    prompt: str | None, prompt_ids: Sequence[int] | None, options: GenerateOptions,
) -> router_pb2.GenerateRequest:
    """Encode one Generate call: exactly one of `prompt` (text) or `prompt_ids`, and its options.

    `options` was validated when it was built; the prompt is checked here only for
    what the wire cannot carry (its emptiness, and ids past the vocabulary, are the
    router's to refuse, with its own message). Raises InvalidArgumentError.
    """
    if (prompt is None) == (prompt_ids is None):
        raise _bad("give exactly one of prompt (text) or prompt_ids (token ids)")
    o = options
    request = router_pb2.GenerateRequest(
        request_id=o.request_id or new_request_id(),
        tenant=o.tenant,
        max_tokens=o.max_tokens,
        mode=encode_mode(o.mode),
        sampling=common_pb2.SamplingParams(
            temperature=float(o.temperature), top_k=o.top_k, top_p=float(o.top_p),
            stop_token_ids=o.stop_token_ids, ignore_eos=o.ignore_eos, first_step=o.first_step,
            logprobs=o.logprobs,
        ),
        slo=common_pb2.Slo(ttft_ms=float(o.slo_ttft_ms or 0.0), tpot_ms=float(o.slo_tpot_ms or 0.0)),
        priority=o.priority,
    )
    if o.seed is not None:
        request.sampling.seed = o.seed  # an explicit 0 is a seed, not "unset"
    if prompt is not None:
        request.prompt_text = prompt
    else:
        request.prompt_token_ids.ids.extend(_token_ids(prompt_ids, "prompt_ids"))
    if o.deadline_s is not None:
        # Round up so a sub-millisecond deadline never turns into 0 ("no deadline").
        request.deadline_ms = math.ceil(o.deadline_s * 1000)
    return request


def encode_mode(mode: str | None) -> int:
    """'colocated' etc. (or None for the router default) -> Mode."""
    if mode is None:
        return router_pb2.MODE_UNSPECIFIED
    try:
        return MODES[mode.lower()]
    except KeyError:
        raise _bad(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}") from None


def encode_release_mode(mode: str) -> int:
    """'pinned' | 'shadow' | 'canary' | 'active' | 'rolled_back' -> ReleaseMode."""
    try:
        return RELEASE_MODES[mode.lower().replace("-", "_")]
    except KeyError:
        raise _bad(f"unknown release mode {mode!r}; expected one of {', '.join(RELEASE_MODES)}") from None


def encode_txn_states(states: Iterable[str]) -> list[int]:
    """['aborted', ...] -> [TxnState, ...]."""
    out = []
    for state in states:
        try:
            out.append(TXN_STATES[state.lower()])
        except KeyError:
            raise _bad(f"unknown transaction state {state!r}; expected one of {', '.join(TXN_STATES)}") from None
    return out


def error_from_event(error: common_pb2.Error) -> PdError:
    """A stream `error` event -> PdError; ERROR_CODE_UNSPECIFIED reads as INTERNAL (common.proto)."""
    code = enum_name(common_pb2.ErrorCode, error.code, "ERROR_CODE_").upper()
    if code == "UNSPECIFIED":
        code = "INTERNAL"
    return PdError(code, error.message, retryable=error.retryable, grpc_code=_GRPC_EQUIVALENT.get(code, code))


def error_from_rpc(error: grpc.RpcError) -> PdError:
    """A failed gRPC call (sync or aio) -> PdError with the status name and the server's details."""
    status = error.code() if callable(getattr(error, "code", None)) else None
    code = status.name if isinstance(status, grpc.StatusCode) else "UNKNOWN"
    details = error.details() if callable(getattr(error, "details", None)) else None
    return PdError(code, details if details is not None else str(error), retryable=code in _RETRYABLE_GRPC)


def status_from_proto(response: admin_pb2.StatusResponse) -> ClusterStatus:
    """Admin.Status answer -> ClusterStatus."""
    workers = [
        WorkerStatus(
            worker_id=w.worker_id,
            role=role_name(w.role),
            address=w.grpc_address,
            epoch=w.epoch,
            free_blocks=w.load.free_blocks,
            reserved_blocks=w.load.reserved_blocks,
            # A worker that has not reported load yet still declared its capacity.
            total_blocks=w.load.total_blocks or w.capacity.total_blocks,
            pending_prefill_tokens=w.load.pending_prefill_tokens,
            active_decode_batch=w.load.active_decode_batch,
            lease_expires_unix_ms=w.lease_expires_unix_ms,
            colocated_only_reason=w.colocated_only_reason,
            active_blocks=w.load.active_blocks,
            cached_blocks=w.load.cached_blocks,
            capacity=_fields(w.capacity),
            profile=_fields(w.profile) if w.HasField("profile") and w.profile.source else {},
        )
        for w in response.workers
    ]
    return ClusterStatus(
        workers=workers,
        free_blocks=response.free_blocks,
        reserved_blocks=response.reserved_blocks,
        total_blocks=response.total_blocks,
        open_transactions=response.open_transactions,
        mode=enum_name(admin_pb2.ReleaseMode, response.mode, "RELEASE_MODE_"),
        canary_fraction=response.canary_fraction,
        route_epoch=response.route_epoch,
    )


def _fields(msg) -> dict:
    """A flat proto message's fields by name, defaults included."""
    return {f.name: getattr(msg, f.name) for f in msg.DESCRIPTOR.fields}


def logprobs_from_proto(pb: common_pb2.TokenLogprobs) -> TokenLogprobs:
    """pd.v1.TokenLogprobs -> TokenLogprobs (top: its two lists paired)."""
    return TokenLogprobs(pb.logprob, tuple(zip(pb.top_token_ids, pb.top_logprobs)))


def transaction_from_proto(t: manifest_pb2.Transaction) -> TransactionInfo:
    """Transaction record -> TransactionInfo (manifest omitted)."""
    return TransactionInfo(
        request_id=t.request_id, transfer_id=t.transfer_id, tenant=t.tenant,
        generation=t.generation, attempt=t.attempt,
        state=enum_name(manifest_pb2.TxnState, t.state, "TXN_STATE_"),
        source_worker_id=t.source_worker_id, source_epoch=t.source_epoch,
        destination_worker_id=t.destination_worker_id, destination_epoch=t.destination_epoch,
        reservation_id=t.reservation_id, chunks_expected=t.chunks_expected, kv_digest=t.kv_digest,
        abort_reason=t.abort_reason, created_unix_ms=t.created_unix_ms, updated_unix_ms=t.updated_unix_ms,
    )


def mode_change_from_proto(response: admin_pb2.SetModeResponse) -> ModeChange:
    """Admin.SetMode answer -> ModeChange."""
    return ModeChange(
        previous_mode=enum_name(admin_pb2.ReleaseMode, response.previous_mode, "RELEASE_MODE_"),
        mode=enum_name(admin_pb2.ReleaseMode, response.mode, "RELEASE_MODE_"),
        route_epoch=response.route_epoch,
        steps=list(response.steps),
    )


def trace_metadata() -> tuple[tuple[str, str], ...] | None:
    """W3C trace headers of the caller's current span, when the caller uses OpenTelemetry
    (its API is importable and a span is current): the request's trace at the router then
    joins the caller's. None otherwise (the SDK itself does not depend on OpenTelemetry)."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items()) or None
