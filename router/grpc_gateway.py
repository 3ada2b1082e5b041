"""The gateways over pd.v1 gRPC: one channel per worker address, one to the directory.

Every gRPC failure becomes `WorkerCallError` with the same status name; an
in-band pd.v1.Error (a Reserve error result, a TokenEvent error) becomes one
too. Leaving a stream (consumer cancelled, generator closed) cancels the call.

The directory is reached through the shared `runtime.directory.client.DirectoryClient`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from pdserve_client.rpc.pd.v1 import (
    blocks_pb2,
    blocks_pb2_grpc,
    common_pb2,
    decode_pb2_grpc,
    manifest_pb2,
    prefill_pb2_grpc,
)
from router import convert
from router.gateway import DirectoryGateway, WorkerGateway
from router.types import (
    PrefillCall,
    PrefillDone,
    Reservation,
    ReserveCall,
    StatusCode,
    StreamCall,
    StreamComplete,
    StreamItem,
    TokenLogprobs,
    TxnAnswer,
    WorkerCallError,
)
from runtime.common.grpc_server import MAX_MESSAGE_BYTES, RECONNECT_OPTIONS
from runtime.directory.client import DirectoryClient, ReleaseWrite, RouteEpoch
from runtime.directory.records import ClusterSnapshot, DirectoryUnavailable, WorkerRecord
from runtime.directory.states import Outcome
from runtime.release.record import ReleaseRecord
from runtime.security.tls import Security

log = logging.getLogger(__name__)

KEEPALIVE_S, PING_TIMEOUT_S = 1.0, 2.0
"""After how long without a byte from a worker the router pings its connection (a call
open), and how long it waits for the answer before it closes it: a frozen worker's calls
fail ~3 s after it froze (runtime/common/grpc_server.py `PING_OPTIONS` lets workers take
the pings). gRPC's own threads answer them: a worker whose Python is busy, even holding
the GIL for seconds, is not taken for frozen (tests/integration/test_keepalive.py)."""
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A worker that stops answering (frozen, its host gone) is noticed by its calls' own
    # connection: the call fails UNAVAILABLE ("ping timeout") and the request moves on,
    # well before the worker's lease lapses in the directory (10 s).
    ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.keepalive_timeout_ms", int(PING_TIMEOUT_S * 1000)),
    ("grpc.http2.ping_timeout_ms", int(PING_TIMEOUT_S * 1000)),  # what gRPC core reads now (default 1 min)
    ("grpc.http2.max_pings_without_data", 0),  # a server stream's client sends no data: keep pinging
    *RECONNECT_OPTIONS,
    # gRPC shares subchannels between channels to one target by default: a new
    # incarnation's channel would inherit the dead one's subchannel, still in reconnect
    # backoff, and fail its first calls at once ("connection refused"). Its own pool.
    ("grpc.use_local_subchannel_pool", 1),
]

RETIRE_AFTER_S = 600.0
"""A worker incarnation's channel is closed this long after a newer one appeared at its
address (its last streams have ended by then: the default deadline is 120 s)."""


def grpc_code(code: StatusCode) -> grpc.StatusCode:
    """The grpc.StatusCode of the same name (for servicers aborting with a RouterError)."""
    return grpc.StatusCode[code.name]


def call_error(exc: grpc.aio.AioRpcError, what: str) -> WorkerCallError:
    """An RPC failure as WorkerCallError carrying the peer's message as it is
    (the router returns INVALID_ARGUMENT messages verbatim); `what` names the
    call when the peer gave no message."""
    code = StatusCode.__members__.get(exc.code().name, StatusCode.UNKNOWN)
    return WorkerCallError(code, exc.details() or f"{what} failed with {exc.code().name}")


class _Channels:
    """Lazily opened channels, one per worker incarnation (address, epoch) and service
    (a mixed worker answers pd.v1.Decode and pd.v1.Prefill; each channel checks that the
    server's certificate names the service it calls).

    A worker restarted at the same address registers a new epoch and gets a fresh
    channel: the old one may sit in reconnect backoff after the crash and would fail
    calls to the new process at once. The old channel is not closed at once (the same
    process re-registering after a lease blip still streams on it); it is closed
    `RETIRE_AFTER_S` later."""

    def __init__(self, security: Security) -> None:
        self._security = security
        self._channels: dict[tuple[str, str], tuple[int, grpc.aio.Channel]] = {}
        self._retired: set[grpc.aio.Channel] = set()

    def get(self, address: str, service: str, epoch: int = 0) -> grpc.aio.Channel:
        entry = self._channels.get((address, service))
        if entry is not None and entry[0] >= epoch:
            return entry[1]  # this incarnation's, or a call for an older one: whoever is there now
        if entry is not None:
            self._retire(entry[1])
        ch = self._security.aio_channel(address, service, options=CHANNEL_OPTIONS)
        self._channels[(address, service)] = (epoch, ch)
        return ch

    def _retire(self, ch: grpc.aio.Channel) -> None:
        self._retired.add(ch)
        loop = asyncio.get_running_loop()
        loop.call_later(RETIRE_AFTER_S, lambda: self._retired.discard(ch) is None and
                        loop.create_task(ch.close()))

    async def close(self) -> None:
        channels = [ch for _, ch in self._channels.values()] + list(self._retired)
        self._channels, self._retired = {}, set()
        for ch in channels:
            await ch.close()


class GrpcWorkerGateway(WorkerGateway):
    """WorkerGateway over pd.v1.Decode and pd.v1.Prefill."""

    def __init__(self, security: Security) -> None:
        self._channels = _Channels(security)

    def _decode(self, w: WorkerRecord) -> decode_pb2_grpc.DecodeStub:
        return decode_pb2_grpc.DecodeStub(self._channels.get(w.grpc_address, "decode", w.epoch))

    def _prefill(self, w: WorkerRecord) -> prefill_pb2_grpc.PrefillStub:
        return prefill_pb2_grpc.PrefillStub(self._channels.get(w.grpc_address, "prefill", w.epoch))

    async def reserve(self, worker: WorkerRecord, call: ReserveCall, timeout_s: float) -> Reservation:
        try:
            resp = await self._decode(worker).Reserve(convert.reserve_call_to_pb(call), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc, f"Decode.Reserve on {worker.worker_id}") from None
        return convert.reservation_from_pb(resp)

    async def prefill(self, worker: WorkerRecord, call: PrefillCall, timeout_s: float,
                      grant: Awaitable[PrefillCall] | None = None,
                      on_first_token: Callable[[int, TokenLogprobs | None], None] | None = None,
                      job_sent: asyncio.Future | None = None) -> PrefillDone:
        rpc = self._prefill(worker).Prefill(timeout=timeout_s)
        # The job, then the grant, written beside the reading: the prefill's token 0 is read as
        # soon as it comes, the grant's way (the decode's Reserve) written or not.
        writer = asyncio.ensure_future(_send_job(rpc, call, grant, job_sent))
        try:
            async for event in rpc:
                if event.HasField("result"):
                    return convert.prefill_done_from_pb(event.result)
                if on_first_token is not None and event.HasField("first_token"):
                    first = event.first_token
                    on_first_token(first.token_id,
                                   convert.logprobs_from_pb(first.logprobs) if first.HasField("logprobs") else None)
        except grpc.aio.AioRpcError as exc:
            if writer.done() and not writer.cancelled() and writer.exception() is not None:
                raise writer.exception() from None  # the grant failed: the call was cancelled for it
            raise call_error(exc, f"Prefill.Prefill on {worker.worker_id}") from None
        finally:
            rpc.cancel()  # no-op once the call finished; a grant that never came ends it
            writer.cancel()
            writer.add_done_callback(lambda t: t.cancelled() or t.exception())  # (retrieved: raised above)
            if job_sent is not None and not job_sent.done():
                job_sent.set_result(None)
        raise WorkerCallError(StatusCode.INTERNAL, f"Prefill.Prefill on {worker.worker_id} ended without a result")

    async def _stream(self, call: Any, what: str) -> AsyncIterator[StreamItem]:
        try:
            async for ev in call:
                item = convert.token_event_from_pb(ev)
                yield item
                if isinstance(item, StreamComplete):
                    return  # nothing may follow a complete event
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc, what) from None
        finally:
            call.cancel()  # no-op once the call finished

    def decode_stream(self, worker: WorkerRecord, call: StreamCall,
                      timeout_s: float | None) -> AsyncIterator[StreamItem]:
        rpc = self._decode(worker).DecodeStream(convert.stream_call_to_pb(call), timeout=timeout_s)
        return self._stream(rpc, f"Decode.DecodeStream on {worker.worker_id}")

    def generate(self, worker: WorkerRecord, call: StreamCall, timeout_s: float | None) -> AsyncIterator[StreamItem]:
        rpc = self._decode(worker).Generate(convert.generate_call_to_pb(call), timeout=timeout_s)
        return self._stream(rpc, f"Decode.Generate on {worker.worker_id}")

    async def cancel_decode(self, worker: WorkerRecord, request_id: str, generation: int, reason: str,
                            timeout_s: float, discard_kv: bool = False) -> bool:
        req = common_pb2.CancelRequest(request_id=request_id, generation=generation, reason=reason,
                                       discard_kv=discard_kv)
        try:
            return (await self._decode(worker).Cancel(req, timeout=timeout_s)).found
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc, f"Decode.Cancel on {worker.worker_id}") from None

    async def cancel_prefill(self, worker: WorkerRecord, request_id: str, generation: int, reason: str,
                             timeout_s: float) -> bool:
        req = common_pb2.CancelRequest(request_id=request_id, generation=generation, reason=reason)
        try:
            return (await self._prefill(worker).Cancel(req, timeout=timeout_s)).found
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc, f"Prefill.Cancel on {worker.worker_id}") from None

    async def blocks(self, worker: WorkerRecord, request_id: str, timeout_s: float) -> Any:
        # Every node serves WorkerAdmin next to its phases: reach it as one of them.
        ch = self._channels.get(worker.grpc_address, "decode" if worker.can_decode else "prefill", worker.epoch)
        try:
            return await blocks_pb2_grpc.WorkerAdminStub(ch).Blocks(
                blocks_pb2.WorkerBlocksRequest(request_id=request_id), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc, f"WorkerAdmin.Blocks on {worker.worker_id}") from None

    async def close(self) -> None:
        await self._channels.close()


class GrpcDirectoryGateway(DirectoryGateway):
    """DirectoryGateway over the shared `runtime.directory.client.DirectoryClient`.

    `caller_id` is the worker_id the router states in transitions it makes (the
    directory fences only a transaction's own ends by epoch, not the router).
    """

    def __init__(self, address: str, security: Security, caller_id: str = "router", timeout_s: float = 5.0):
        self._client = DirectoryClient(address, timeout_s=timeout_s, security=security)
        self._caller_id = caller_id

    async def _call(self, what: str, coro: Any, timeout_s: float) -> Any:
        try:
            async with asyncio.timeout(timeout_s):  # the request's deadline may be shorter
                return await coro
        except TimeoutError:
            raise WorkerCallError(StatusCode.DEADLINE_EXCEEDED, f"{what}: no answer within {timeout_s:g} s") from None
        except DirectoryUnavailable as exc:
            raise WorkerCallError(StatusCode.UNAVAILABLE, str(exc)) from None
        except ValueError as exc:
            raise WorkerCallError(StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except grpc.aio.AioRpcError as exc:
            raise call_error(exc, what) from None

    async def snapshot(self, timeout_s: float) -> ClusterSnapshot:
        return await self._call("Directory.ClusterSnapshot", self._client.snapshot(), timeout_s)

    async def reserve_txn(self, manifest: manifest_pb2.HandoffManifest, timeout_s: float) -> TxnAnswer:
        reply = await self._call("Directory.Reserve", self._client.reserve(manifest), timeout_s)
        return TxnAnswer(reply.outcome, reply.current_generation)

    async def abort_txn(self, request_id: str, transfer_id: str, generation: int, reason: str,
                        timeout_s: float) -> Outcome:
        reply = await self._call("Directory.Abort", self._client.abort(
            request_id, transfer_id, generation, self._caller_id, 0, reason=reason), timeout_s)
        return reply.outcome

    async def list_open_transactions(self, timeout_s: float) -> Sequence[Any]:
        records = await self._call("Directory.ListOpenTransactions", self._client.list_open(), timeout_s)
        return [convert.txn_record_to_pb(r) for r in records]

    async def get_release(self, timeout_s: float) -> ReleaseRecord | None:
        return await self._call("Directory.GetRelease", self._client.get_release(), timeout_s)

    async def write_release(self, expected_version: int, record: ReleaseRecord, timeout_s: float) -> ReleaseWrite:
        return await self._call("Directory.WriteRelease", self._client.write_release(expected_version, record),
                                timeout_s)

    async def advance_route_epoch(self, expected: int, reason: str, timeout_s: float) -> RouteEpoch:
        return await self._call("Directory.AdvanceRouteEpoch", self._client.advance_route_epoch(expected, reason),
                                timeout_s)

    async def publications(self, route_epoch: int, timeout_s: float) -> int:
        return await self._call("Directory.GetRouteEpoch", self._client.publications(route_epoch), timeout_s)

    async def close(self) -> None:
        await self._client.close()


async def _send_job(rpc, call: PrefillCall, grant: Awaitable[PrefillCall] | None,
                    job_sent: asyncio.Future | None) -> None:
    """A Prefill call's requests: the job (`job_sent` then set), then the grant once it is there."""
    try:
        await rpc.write(convert.prefill_call_to_pb(call))  # (after the call's headers went)
        if job_sent is not None and not job_sent.done():
            job_sent.set_result(None)
        if grant is not None:
            # shielded: the caller's future, set later, is not this task's to cancel
            await rpc.write(convert.prefill_call_to_pb(await asyncio.shield(grant)))
        await rpc.done_writing()
    except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
        pass  # the call ended (the prefill refused the job, or failed): the reader has its status
    except Exception:
        rpc.cancel()  # the grant failed: nothing more will come; the reader raises this
        raise
