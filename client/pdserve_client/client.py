"""Synchronous pdserve client: Generate as an iterator of tokens, Cancel, and Admin calls.

    with Client("127.0.0.1:50080") as client:
        for token in client.generate(prompt="Hello", max_tokens=16):
            print(token.text, end="", flush=True)
        result = client.generate_full(prompt_ids=[1, 2, 3], max_tokens=8)
        print(result.ttft_ms, result.tpot_ms, result.route)

Every failure is a `PdError`. Leaving a token stream early (break, `close()`,
the `with` block ending, or the stream being garbage-collected) cancels the
gRPC call, which the router sees as a cancelled request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc

from pdserve_client import wire
from pdserve_client.address import resolve_router_address
from pdserve_client.rpc.pd.v1 import admin_pb2, admin_pb2_grpc, common_pb2, router_pb2_grpc
from pdserve_client.stream import StreamTally
from pdserve_client.types import (
    ClusterStatus,
    GenerationResult,
    ModeChange,
    PdError,
    RouteInfo,
    TokenEvent,
    TransactionInfo,
)

# Extra gRPC time past the request's own deadline, so the router's DEADLINE_EXCEEDED
# error event (with its message) arrives before the transport deadline fires.
DEADLINE_GRACE_S = 1.0


def generate_timeout_s(deadline_s: float | None) -> float | None:
    """gRPC timeout of a Generate call: none without a request deadline (streams may be long)."""
    return None if deadline_s is None else deadline_s + DEADLINE_GRACE_S


class TokenStream:
    """An open Generate call: iterate it for TokenEvents; `result` is set once it completes.

    Iteration raises PdError on a stream `error` event or a gRPC failure.
    """

    def __init__(self, call, tally: StreamTally, client: Client):
        self._call = call
        self._tally = tally
        self._client = client
        self._closed = False

    @property
    def request_id(self) -> str:
        """Request id (Cancel takes it)."""
        return self._tally.request_id

    @property
    def route(self) -> RouteInfo | None:
        """Latest route the router announced, or None before `started`."""
        return self._tally.route

    @property
    def tokens(self) -> list[TokenEvent]:
        """Tokens received so far."""
        return self._tally.tokens

    @property
    def result(self) -> GenerationResult | None:
        """The finished generation, once the stream completed normally."""
        return self._tally.result

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> TokenEvent:
        while not self._tally.finished and not self._closed:
            try:
                event = next(self._call)
            except StopIteration:
                self._tally.end_of_stream()
                break
            except grpc.RpcError as e:
                self._closed = True
                self._tally.fail(wire.error_from_rpc(e))
            try:
                token = self._tally.feed(event, time.perf_counter())
            except PdError:
                self.close()
                raise
            if token is not None:
                return token
        raise StopIteration

    def collect(self) -> GenerationResult:
        """Read the rest of the stream and return the result."""
        for _ in self:
            pass
        if self._tally.result is None:
            raise PdError("CANCELLED", "stream was closed before it completed")
        return self._tally.result

    def close(self) -> None:
        """Stop reading; cancels the gRPC call if the request is still running. Idempotent."""
        if not self._closed:
            self._closed = True
            if not self._tally.finished:
                self._call.cancel()

    def cancel(self, reason: str = "client cancel") -> bool:
        """Cancel the request through Router.Cancel (recording `reason`), then close the stream."""
        try:
            return self._client.cancel(self.request_id, reason=reason)
        finally:
            self.close()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_call", None) is not None:
            self.close()


class Client:
    """Blocking client of the router's Router and Admin services.

    `timeout_s` bounds every unary call (Cancel, Status, ...). Generate has no
    gRPC timeout unless `deadline_s` is given, because a long generation is
    not a hung one.
    """

    def __init__(self, router_address: str | None = None, timeout_s: float = 30.0):
        self.address = resolve_router_address(router_address)
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(self.address, options=wire.CHANNEL_OPTIONS)
        self._router = router_pb2_grpc.RouterStub(self._channel)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)

    def generate(
        self, prompt: str | None = None, *, prompt_ids: Sequence[int] | None = None, max_tokens: int,
        temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
        stop_token_ids: Sequence[int] = (), ignore_eos: bool = False, mode: str | None = None,
        tenant: str = "default", slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
        request_id: str | None = None, deadline_s: float | None = None,
    ) -> TokenStream:
        """Start a generation; returns a TokenStream that yields TokenEvents as they arrive.

        Give exactly one of `prompt` (text) or `prompt_ids`. `mode` is
        'disaggregated', 'colocated', 'auto', 'shadow', 'canary' or None (router
        default). `request_id` defaults to a fresh uuid. Client-side times are
        measured from this call.
        """
        t0_s = time.perf_counter()
        request = wire.build_generate_request(
            prompt=prompt, prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos,
            mode=mode, tenant=tenant, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
            request_id=request_id, deadline_s=deadline_s,
        )
        call = self._router.Generate(request, timeout=generate_timeout_s(deadline_s))
        return TokenStream(call, StreamTally(request.request_id, t0_s), self)

    def generate_full(self, prompt: str | None = None, **kwargs) -> GenerationResult:
        """Run a generation to the end (same arguments as `generate`) and return its result."""
        with self.generate(prompt, **kwargs) as stream:
            return stream.collect()

    complete = generate_full

    def cancel(self, request_id: str, reason: str = "client cancel") -> bool:
        """Cancel a running request; True if the router knew it, False if it did not
        (unknown, or already ended: a cancel racing the end is not an error). Idempotent."""
        request = common_pb2.CancelRequest(request_id=request_id, reason=reason)
        try:
            return self._unary(self._router.Cancel, request).found
        except PdError as e:
            if e.code == "NOT_FOUND":
                return False
            raise

    def status(self) -> ClusterStatus:
        """Cluster status from Admin.Status."""
        return wire.status_from_proto(self._unary(self._admin.Status, admin_pb2.StatusRequest()))

    def transactions(self, states: Sequence[str] = (), tenant: str = "", limit: int = 0) -> list[TransactionInfo]:
        """Transfer transactions, most recently updated first; `states` like ['aborted']."""
        request = admin_pb2.ListTransactionsRequest(states=wire.encode_txn_states(states), tenant=tenant, limit=limit)
        response = self._unary(self._admin.ListTransactions, request)
        return [wire.transaction_from_proto(t) for t in response.transactions]

    def set_mode(self, mode: str, canary_fraction: float = 0.0, reason: str = "") -> ModeChange:
        """Change the release mode ('pinned', 'shadow', 'canary', 'active', 'rolled_back')."""
        request = admin_pb2.SetModeRequest(mode=wire.encode_release_mode(mode),
                                           canary_fraction=canary_fraction, reason=reason)
        return wire.mode_change_from_proto(self._unary(self._admin.SetMode, request))

    def _unary(self, method, request):
        try:
            return method(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise wire.error_from_rpc(e) from e

    def close(self) -> None:
        """Close the channel; open streams are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
