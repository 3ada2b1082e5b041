# Generated from pdserve_client/_async/client.py by client/gen_sync.py (unasync); do not edit.
"""Client of the router's Router and Admin services, and its token stream.

Both clients come from this text: `_async/client.py` is the source (the asyncio
client) and client/gen_sync.py derives `_sync/client.py` (the blocking client)
from it with unasync, so the two cannot drift apart. What differs beyond a
rename lives in `_shims.py` of each. The text is written to read right in both:
docstrings name no flavour, and every `async`/`await` is one the blocking
client simply drops. Public names: `pdserve_client.aio` and `pdserve_client.client`.

Every failure is a `PdError`. Leaving a token stream early (break, `close()`,
the `with` block ending, garbage collection) cancels the gRPC call, which the
router sees as a cancelled request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import grpc

from pdserve_client import tls, wire
from pdserve_client._sync import _shims
from pdserve_client.address import resolve_router_address
from pdserve_client.blocks import BlocksView, blocks_from_proto
from pdserve_client.options import GenerateOptions, resolve_options
from pdserve_client.release import RELEASE_TIMEOUT_S, ReleaseChange, ReleaseView
from pdserve_client.release import change_from_proto as release_change
from pdserve_client.release import status_from_proto as release_status
from pdserve_client.rpc.pd.v1 import admin_pb2, common_pb2
from pdserve_client.stream import StreamTally
from pdserve_client.tls import TlsFiles
from pdserve_client.types import (
    ClusterStatus,
    GenerationResult,
    ModeChange,
    PdError,
    RouteInfo,
    TokenEvent,
    TransactionInfo,
)


class TokenStream(_shims.StreamClosing):
    """An open Generate call: iterate it for TokenEvents; `result` is set once it completes.

    Iteration raises PdError on a stream `error` event or a gRPC failure.
    """

    def __init__(self, call: _shims.GenerateCall, tally: StreamTally, client: Client):
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
                event = _shims.next_event(self._call)
            except grpc.RpcError as e:
                self._closed = True
                self._tally.fail(wire.error_from_rpc(e))  # raises
            if event is None:
                self._tally.end_of_stream()
                break
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
    """Client of the router's Router and Admin services.

    `timeout_s` bounds every unary call (Cancel, Status, ...). Generate has no
    gRPC timeout unless a deadline is given, because a long generation is not a
    hung one.
    """

    def __init__(self, router_address: str | None = None, timeout_s: float = 30.0, *,
                 tls_files: TlsFiles | None = None, identity: str = "client"):
        """tls_files: the certificate to present (default: $PD_TLS_*, else the local
        cluster's `.pdserve/tls/<identity>.crt`; none with $PD_INSECURE=1), see tls.py."""
        self.address = resolve_router_address(router_address)
        self.timeout_s = timeout_s
        self._channel = _shims.RouterChannel(self.address, tls.resolve(tls_files, identity))

    def generate(
        self, prompt: str | None = None, *, prompt_ids: Sequence[int] | None = None,
        options: GenerateOptions | None = None, **keywords: Any,
    ) -> TokenStream:
        """Start a generation; the returned stream yields TokenEvents as they arrive.

        Give exactly one of `prompt` (text) or `prompt_ids`, and the options as
        `options=GenerateOptions(...)`, as its fields by keyword
        (`max_tokens=8, seed=3`), or both (keywords override). Client-side times
        are measured from this call. Bad options raise InvalidArgumentError here,
        before anything is sent.
        """
        t0_s = time.perf_counter()
        options = resolve_options(options, keywords)
        request = wire.build_generate_request(prompt, prompt_ids, options)
        router, _ = self._channel.stubs()
        call = router.Generate(request, timeout=options.grpc_timeout_s, metadata=wire.trace_metadata())
        return TokenStream(call, StreamTally(request.request_id, t0_s), self)

    def generate_full(self, prompt: str | None = None, **kwargs: Any) -> GenerationResult:
        """Run a generation to the end (same arguments as `generate`) and return its result."""
        with self.generate(prompt, **kwargs) as stream:
            return stream.collect()

    complete = generate_full

    def cancel(self, request_id: str, reason: str = "client cancel") -> bool:
        """Cancel a running request; True if the router knew it, False if it did not
        (unknown, or already ended: a cancel racing the end is not an error). Idempotent."""
        router, _ = self._channel.stubs()
        request = common_pb2.CancelRequest(request_id=request_id, reason=reason)
        try:
            response = self._unary(router.Cancel, request)
        except PdError as e:
            if e.code == "NOT_FOUND":
                return False
            raise
        return response.found

    def status(self) -> ClusterStatus:
        """Cluster status from Admin.Status."""
        _, admin = self._channel.stubs()
        return wire.status_from_proto(self._unary(admin.Status, admin_pb2.StatusRequest()))

    def transactions(self, states: Sequence[str] = (), tenant: str = "", limit: int = 0) -> list[TransactionInfo]:
        """Transfer transactions, most recently updated first; `states` like ['aborted']."""
        _, admin = self._channel.stubs()
        request = admin_pb2.ListTransactionsRequest(states=wire.encode_txn_states(states), tenant=tenant, limit=limit)
        response = self._unary(admin.ListTransactions, request)
        return [wire.transaction_from_proto(t) for t in response.transactions]

    def blocks(self, request_id: str = "", worker_id: str = "", orphans_only: bool = False) -> BlocksView:
        """Who holds which blocks on every worker, orphans flagged (Admin.Blocks; operators
        only); `request_id`/`worker_id` narrow it, `orphans_only` lists only orphans."""
        _, admin = self._channel.stubs()
        request = admin_pb2.BlocksRequest(request_id=request_id, worker_id=worker_id, orphans_only=orphans_only)
        return blocks_from_proto(self._unary(admin.Blocks, request))

    def set_mode(self, mode: str, canary_fraction: float = 0.0, reason: str = "") -> ModeChange:
        """Change the release mode ('pinned', 'shadow', 'canary', 'active', 'rolled_back')."""
        _, admin = self._channel.stubs()
        request = admin_pb2.SetModeRequest(mode=wire.encode_release_mode(mode),
                                           canary_fraction=canary_fraction, reason=reason)
        return wire.mode_change_from_proto(self._unary(admin.SetMode, request))

    def release(self) -> ReleaseView:
        """The release record (state, manifest, history, rollback steps), Admin.ReleaseStatus."""
        _, admin = self._channel.stubs()
        return release_status(self._unary(admin.ReleaseStatus, admin_pb2.ReleaseStatusRequest()))

    def promote(self, target: str = "", canary_fraction: float = 0.0, reason: str = "",
            timeout_s: float = RELEASE_TIMEOUT_S) -> ReleaseChange:
        """Promote the release one state (or to `target`) through its gates (operators only);
        a failed gate raises FAILED_PRECONDITION naming it. The gates run requests: the
        call may take seconds (`timeout_s`)."""
        _, admin = self._channel.stubs()
        request = admin_pb2.PromoteRequest(target=wire.encode_release_mode(target) if target else 0,
                                           canary_fraction=canary_fraction, reason=reason)
        return release_change(self._unary(admin.Promote, request, timeout_s))

    def rollback(
            self, reason: str = "", wait: bool = True, timeout_s: float = RELEASE_TIMEOUT_S) -> ReleaseChange:
        """Roll the release back in order, or resume an unfinished rollback (operators only);
        with `wait`, returns once it completed (a drain can take `timeout_s`)."""
        _, admin = self._channel.stubs()
        request = admin_pb2.RollbackRequest(reason=reason, wait=wait)
        return release_change(self._unary(admin.Rollback, request, timeout_s))

    def _unary(self, method, request, timeout_s: float | None = None):
        try:
            return method(request, timeout=max(self.timeout_s, timeout_s or 0.0))
        except grpc.RpcError as e:
            raise wire.error_from_rpc(e) from e

    def close(self) -> None:
        """Close the channel; open streams are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
