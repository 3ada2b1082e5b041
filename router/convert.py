"""pd.v1 messages (and the directory client's records) <-> router domain values.
Protobuf only; no gRPC here."""

from __future__ import annotations

from typing import Any

from pdserve_client import contract
from pdserve_client.rpc.pd.v1 import common_pb2, decode_pb2, manifest_pb2, prefill_pb2, router_pb2
from router.types import (
    Completed,
    Event,
    FinishReason,
    GenerateParams,
    Mode,
    PrefillCall,
    PrefillDone,
    Reservation,
    ReserveCall,
    Route,
    RouterError,
    Sampling,
    Slo,
    Started,
    StatusCode,
    StreamCall,
    StreamComplete,
    StreamItem,
    StreamToken,
    TokenLogprobs,
    TokenOut,
    WorkerCallError,
)
from runtime.directory.wire import STATE_TO_PB as STORE_STATE_TO_PB

ERROR_CODE_STATUS: dict[int, StatusCode] = {
    common_pb2.ErrorCode.Value(f"ERROR_CODE_{name}"): StatusCode[status]
    for name, status in contract.ERROR_CODE_STATUS.items()}
"""pd.v1.ErrorCode -> status, as pdserve_client/contract.py maps them."""

_FINISH_FROM_PB = {common_pb2.FINISH_REASON_STOP: FinishReason.STOP,
                   common_pb2.FINISH_REASON_LENGTH: FinishReason.LENGTH,
                   common_pb2.FINISH_REASON_CANCELLED: FinishReason.CANCELLED}
_FINISH_TO_PB = {v: k for k, v in _FINISH_FROM_PB.items()}
_ROUTE_TO_PB = {Route.DISAGGREGATED: router_pb2.ROUTE_DISAGGREGATED, Route.COLOCATED: router_pb2.ROUTE_COLOCATED}


def txn_record_to_pb(r: Any) -> manifest_pb2.Transaction:
    """The directory client's TxnRecord -> pd.v1.Transaction (for Admin.ListTransactions)."""
    return manifest_pb2.Transaction(
        request_id=r.request_id, transfer_id=r.transfer_id, tenant=r.tenant, generation=r.generation,
        attempt=r.attempt, state=STORE_STATE_TO_PB[r.state], source_worker_id=r.source.worker_id,
        source_epoch=r.source.epoch, destination_worker_id=r.dest.worker_id, destination_epoch=r.dest.epoch,
        reservation_id=r.reservation_id, chunks_expected=r.chunks_expected, kv_digest=r.kv_digest,
        abort_reason=r.abort_reason, created_unix_ms=r.created_unix_ms, updated_unix_ms=r.updated_unix_ms,
        manifest=r.manifest)


def sampling_from_pb(pb: common_pb2.SamplingParams) -> Sampling:
    """SamplingParams -> Sampling (seed and logprobs None when unset)."""
    return Sampling(pb.temperature, pb.top_k, pb.top_p, pb.seed if pb.HasField("seed") else None,
                    tuple(pb.stop_token_ids), pb.ignore_eos, pb.first_step,
                    pb.logprobs if pb.HasField("logprobs") else None)


def sampling_to_pb(s: Sampling) -> common_pb2.SamplingParams:
    """Sampling -> SamplingParams (seed and logprobs left unset when None)."""
    return common_pb2.SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed,
                                     stop_token_ids=list(s.stop_token_ids), ignore_eos=s.ignore_eos,
                                     first_step=s.first_step, logprobs=s.logprobs)


def logprobs_from_pb(pb: common_pb2.TokenLogprobs) -> TokenLogprobs:
    """pd.v1.TokenLogprobs -> TokenLogprobs; WorkerCallError (INTERNAL) when its two lists
    differ in length (a worker's bug, not a value to guess from)."""
    if len(pb.top_token_ids) != len(pb.top_logprobs):
        raise WorkerCallError(StatusCode.INTERNAL, f"TokenLogprobs lists {len(pb.top_token_ids)} top ids and "
                                                   f"{len(pb.top_logprobs)} top logprobs")
    return TokenLogprobs(pb.logprob, tuple(zip(pb.top_token_ids, pb.top_logprobs)))


def logprobs_to_pb(lp: TokenLogprobs | None) -> common_pb2.TokenLogprobs | None:
    """TokenLogprobs -> pd.v1.TokenLogprobs (None stays None: the field unset)."""
    if lp is None:
        return None
    return common_pb2.TokenLogprobs(logprob=lp.logprob, top_token_ids=[i for i, _ in lp.top],
                                    top_logprobs=[v for _, v in lp.top])


def reserve_call_to_pb(c: ReserveCall) -> decode_pb2.DecodeReserveRequest:
    """ReserveCall -> DecodeReserveRequest."""
    return decode_pb2.DecodeReserveRequest(
        request_id=c.request_id, tenant=c.tenant, generation=c.generation, prompt_token_ids=list(c.prompt_token_ids),
        max_tokens=c.max_tokens, sampling=sampling_to_pb(c.sampling), cache_abi_digest=c.cache_abi_digest,
        transfer_key=c.transfer_key)


def reservation_from_pb(resp: decode_pb2.DecodeReserveResponse) -> Reservation:
    """DecodeReserveResponse -> Reservation; raises WorkerCallError for its error result."""
    if resp.WhichOneof("result") != "reservation":
        err = resp.error
        raise WorkerCallError(ERROR_CODE_STATUS.get(err.code, StatusCode.INTERNAL),
                              err.message or "Decode.Reserve returned neither a reservation nor an error")
    r = resp.reservation
    return Reservation(r.reservation_id, tuple(r.block_ids), r.data_plane_address, r.destination_worker_id,
                       r.destination_epoch, r.visible_prefix_blocks, r.ttl_ms, tuple(r.expected_chunks))


def prefill_call_to_pb(c: PrefillCall) -> prefill_pb2.PrefillRequest:
    """PrefillCall -> PrefillRequest."""
    return prefill_pb2.PrefillRequest(manifest=c.manifest, prompt_token_ids=list(c.prompt_token_ids),
                                      destination_data_plane_address=c.destination_data_plane_address,
                                      sampling=sampling_to_pb(c.sampling), capability=c.capability,
                                      transfer_key=c.transfer_key)


def prefill_done_from_pb(r: prefill_pb2.PrefillResult) -> PrefillDone:
    """PrefillResult -> PrefillDone."""
    return PrefillDone(r.transfer_id, r.first_token_id, r.computed_tokens, r.reused_tokens, r.kv_digest,
                       r.timings.compute_ms, r.timings.transfer_ms, r.sent_bytes)


def stream_call_to_pb(c: StreamCall) -> decode_pb2.DecodeStreamRequest:
    """StreamCall -> DecodeStreamRequest."""
    return decode_pb2.DecodeStreamRequest(request_id=c.request_id, generation=c.generation, transfer_id=c.transfer_id,
                                          max_tokens=c.max_tokens, sampling=sampling_to_pb(c.sampling),
                                          capability=c.capability)


def generate_call_to_pb(c: StreamCall) -> decode_pb2.DecodeGenerateRequest:
    """StreamCall -> DecodeGenerateRequest."""
    return decode_pb2.DecodeGenerateRequest(
        request_id=c.request_id, tenant=c.tenant, generation=c.generation,
        prompt_token_ids=list(c.prompt_token_ids), max_tokens=c.max_tokens, sampling=sampling_to_pb(c.sampling))


def token_event_from_pb(ev: decode_pb2.TokenEvent) -> StreamItem:
    """TokenEvent -> StreamToken | StreamComplete; raises WorkerCallError for an error event."""
    kind = ev.WhichOneof("event")
    if kind == "token":
        t = ev.token
        return StreamToken(t.token_id, t.index, t.kv_digest, t.source_seal, tuple(t.chunks),
                           logprobs_from_pb(t.logprobs) if t.HasField("logprobs") else None)
    if kind == "complete":
        return StreamComplete(_FINISH_FROM_PB.get(ev.complete.finish_reason, FinishReason.STOP),
                              ev.complete.num_tokens, ev.complete.kv_digest)
    if kind == "error":
        raise WorkerCallError(ERROR_CODE_STATUS.get(ev.error.code, StatusCode.INTERNAL), ev.error.message)
    raise WorkerCallError(StatusCode.INTERNAL, "TokenEvent without an event")


def generate_params_from_pb(req: router_pb2.GenerateRequest) -> GenerateParams:
    """GenerateRequest -> GenerateParams; RouterError (INVALID_ARGUMENT) for a mode value
    this router does not know (a newer client's), rather than serving it as another mode."""
    which = req.WhichOneof("prompt")
    try:
        mode = Mode(req.mode)
    except ValueError:
        known = ", ".join(f"{m.value} ({m.name})" for m in Mode)
        raise RouterError(StatusCode.INVALID_ARGUMENT, f"mode {req.mode} is not a known pd.v1.Mode: {known}") from None
    return GenerateParams(
        request_id=req.request_id, tenant=req.tenant,
        prompt_token_ids=tuple(req.prompt_token_ids.ids) if which == "prompt_token_ids" else None,
        prompt_text=req.prompt_text if which == "prompt_text" else None,
        max_tokens=req.max_tokens, sampling=sampling_from_pb(req.sampling), mode=mode, deadline_ms=req.deadline_ms,
        slo=Slo(req.slo.ttft_ms, req.slo.tpot_ms), priority=req.priority)


def event_to_pb(request_id: str, ev: Event) -> router_pb2.GenerateEvent:
    """Started | TokenOut | Completed -> GenerateEvent."""
    E = router_pb2.GenerateEvent
    if isinstance(ev, Started):
        return E(request_id=request_id, started=E.Started(
            route=_ROUTE_TO_PB[ev.route], prefill_worker_id=ev.prefill_worker_id,
            decode_worker_id=ev.decode_worker_id, generation=ev.generation, route_epoch=ev.route_epoch))
    if isinstance(ev, TokenOut):
        return E(request_id=request_id, token=E.Token(token_id=ev.token_id, text=ev.text, index=ev.index,
                                                      time_since_start_ms=ev.time_since_start_ms,
                                                      logprobs=logprobs_to_pb(ev.logprobs)))
    assert isinstance(ev, Completed)
    return E(request_id=request_id, complete=E.Complete(
        finish_reason=_FINISH_TO_PB[ev.finish_reason], ttft_ms=ev.ttft_ms, tpot_ms=ev.tpot_ms,
        num_tokens=ev.num_tokens, route=_ROUTE_TO_PB[ev.route], attempts=ev.attempts,
        prefill_kv_digest=ev.prefill_kv_digest, decode_kv_digest=ev.decode_kv_digest,
        failed_attempts=ev.failed_attempts, text_tail=ev.text_tail))
