"""asyncio pdserve client: the same calls as `client.Client`, awaited.

    async with AsyncClient("127.0.0.1:50080") as client:
        async for token in client.generate(prompt="Hello", max_tokens=16):
            print(token.text, end="", flush=True)
        result = await client.generate_full(prompt_ids=[1, 2, 3], max_tokens=8)

The channel is created on first use, inside the running event loop. Leaving
a stream early (break, `aclose()`, `async with` ending, garbage collection)
cancels the gRPC call, which the router sees as a cancelled request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
import grpc.aio

from pdserve_client import wire
from pdserve_client.address import resolve_router_address
from pdserve_client.client import generate_timeout_s
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


class AsyncTokenStream:
    """An open Generate call: `async for` it for TokenEvents; `result` is set once it completes."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, tally: StreamTally, client: AsyncClient):
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

    def __aiter__(self) -> AsyncTokenStream:
        return self

    async def __anext__(self) -> TokenEvent:
        while not self._tally.finished and not self._closed:
            try:
                event = await self._call.read()
            except grpc.RpcError as e:
                self._closed = True
                self._tally.fail(wire.error_from_rpc(e))
            if event is grpc.aio.EOF:
                self._tally.end_of_stream()
                break
            try:
                token = self._tally.feed(event, time.perf_counter())
            except PdError:
                self.close()
                raise
            if token is not None:
                return token
        raise StopAsyncIteration

    async def collect(self) -> GenerationResult:
        """Read the rest of the stream and return the result."""
        async for _ in self:
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

    async def aclose(self) -> None:
        """Async spelling of `close` (matches async generators)."""
        self.close()

    async def cancel(self, reason: str = "client cancel") -> bool:
        """Cancel the request through Router.Cancel (recording `reason`), then close the stream."""
        try:
            return await self._client.cancel(self.request_id, reason=reason)
        finally:
            self.close()

    async def __aenter__(self) -> AsyncTokenStream:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_call", None) is not None:
            self.close()


class AsyncClient:
    """asyncio client of the router's Router and Admin services; see `client.Client`."""

    def __init__(self, router_address: str | None = None, timeout_s: float = 30.0):
        self.address = resolve_router_address(router_address)
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None

    def _stubs(self) -> tuple[router_pb2_grpc.RouterStub, admin_pb2_grpc.AdminStub]:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=wire.CHANNEL_OPTIONS)
            self._router = router_pb2_grpc.RouterStub(self._channel)
            self._admin = admin_pb2_grpc.AdminStub(self._channel)
        return self._router, self._admin

    def generate(
        self, prompt: str | None = None, *, prompt_ids: Sequence[int] | None = None, max_tokens: int,
        temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
        stop_token_ids: Sequence[int] = (), ignore_eos: bool = False, mode: str | None = None,
        tenant: str = "default", slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
        request_id: str | None = None, deadline_s: float | None = None,
    ) -> AsyncTokenStream:
        """Start a generation (call inside the event loop); `async for` the returned stream.

        Arguments as in `Client.generate`.
        """
        t0_s = time.perf_counter()
        request = wire.build_generate_request(
            prompt=prompt, prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos,
            mode=mode, tenant=tenant, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
            request_id=request_id, deadline_s=deadline_s,
        )
        router, _ = self._stubs()
        call = router.Generate(request, timeout=generate_timeout_s(deadline_s))
        return AsyncTokenStream(call, StreamTally(request.request_id, t0_s), self)

    async def generate_full(self, prompt: str | None = None, **kwargs) -> GenerationResult:
        """Run a generation to the end (same arguments as `generate`) and return its result."""
        async with self.generate(prompt, **kwargs) as stream:
            return await stream.collect()

    complete = generate_full

    async def cancel(self, request_id: str, reason: str = "client cancel") -> bool:
        """Cancel a running request; True if the router knew it, False if it did not
        (unknown, or already ended). Idempotent."""
        router, _ = self._stubs()
        request = common_pb2.CancelRequest(request_id=request_id, reason=reason)
        try:
            return (await self._unary(router.Cancel, request)).found
        except PdError as e:
            if e.code == "NOT_FOUND":
                return False
            raise

    async def status(self) -> ClusterStatus:
        """Cluster status from Admin.Status."""
        _, admin = self._stubs()
        return wire.status_from_proto(await self._unary(admin.Status, admin_pb2.StatusRequest()))

    async def transactions(self, states: Sequence[str] = (), tenant: str = "", limit: int = 0) -> list[TransactionInfo]:
        """Transfer transactions, most recently updated first; `states` like ['aborted']."""
        _, admin = self._stubs()
        request = admin_pb2.ListTransactionsRequest(states=wire.encode_txn_states(states), tenant=tenant, limit=limit)
        response = await self._unary(admin.ListTransactions, request)
        return [wire.transaction_from_proto(t) for t in response.transactions]

    async def set_mode(self, mode: str, canary_fraction: float = 0.0, reason: str = "") -> ModeChange:
        """Change the release mode ('pinned', 'shadow', 'canary', 'active', 'rolled_back')."""
        _, admin = self._stubs()
        request = admin_pb2.SetModeRequest(mode=wire.encode_release_mode(mode),
                                           canary_fraction=canary_fraction, reason=reason)
        return wire.mode_change_from_proto(await self._unary(admin.SetMode, request))

    async def _unary(self, method, request):
        try:
            return await method(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise wire.error_from_rpc(e) from e

    async def close(self) -> None:
        """Close the channel; open streams are cancelled."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
