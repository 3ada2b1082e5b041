"""An in-process fake Router+Admin on a real loopback gRPC server for the SDK and pdctl
tests (tests/unit/sdk/test_sdk.py, test_sdk_async_cli.py): scripted streams (events,
sleeps, gRPC aborts, endless token streams), a record of what reached it
(requests, Cancel calls, whether a stream's RPC was cancelled by the client), and
the fixtures `server`, `fake`, `addr`, `client`.
"""

from __future__ import annotations

import threading
import time

import grpc

from pdserve_client.rpc.pd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    blocks_pb2,
    common_pb2,
    manifest_pb2,
    router_pb2,
    router_pb2_grpc,
)

Event = router_pb2.GenerateEvent


# --------------------------------------------------------------------------- script helpers


def started(route=router_pb2.ROUTE_DISAGGREGATED, prefill="prefill-0", decode="decode-0", generation=1):
    return Event(started=Event.Started(route=route, prefill_worker_id=prefill, decode_worker_id=decode,
                                       generation=generation, route_epoch=7))


def token(index, token_id, text="", server_ms=0.0):
    return Event(token=Event.Token(index=index, token_id=token_id, text=text, time_since_start_ms=server_ms))


def complete(n, reason=common_pb2.FINISH_REASON_LENGTH, route=router_pb2.ROUTE_DISAGGREGATED, attempts=1,
             failed_attempts=""):
    # Router-side latencies deliberately far from anything the client can measure.
    return Event(complete=Event.Complete(finish_reason=reason, ttft_ms=1.0, tpot_ms=2.0, num_tokens=n,
                                         route=route, attempts=attempts, failed_attempts=failed_attempts))


def error(code, message, retryable=False):
    return Event(error=common_pb2.Error(code=code, message=message, retryable=retryable))


class Abort:
    """Script step: end the RPC with a gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str):
        self.code, self.details = code, details


class Forever:
    """Script step: stream a token every `interval_s` until the client goes away (or 10 s)."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s


# --------------------------------------------------------------------------- the fake router


class FakeRouter(router_pb2_grpc.RouterServicer, admin_pb2_grpc.AdminServicer):
    """Router + Admin servicer that plays `script` and records what it saw."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.script: list = []
        self.requests: list[router_pb2.GenerateRequest] = []
        self.cancels: list[common_pb2.CancelRequest] = []
        self.list_requests: list[admin_pb2.ListTransactionsRequest] = []
        self.set_mode_requests: list[admin_pb2.SetModeRequest] = []
        self.blocks_requests: list[admin_pb2.BlocksRequest] = []
        self.status_abort: Abort | None = None
        self.stream_cancelled = threading.Event()

    @staticmethod
    def _sleep(context, seconds: float) -> bool:
        """Sleep while the RPC is alive; False once the client cancelled."""
        end = time.perf_counter() + seconds
        while True:
            if not context.is_active():
                return False
            left = end - time.perf_counter()
            if left <= 0:
                return True
            time.sleep(min(left, 0.005))

    def Generate(self, request, context):
        self.requests.append(request)
        cancelled = self.stream_cancelled  # this test's event, even if the handler outlives the test
        try:
            yield from self._play(request, context)
        finally:
            # Ended early by the client: either _play saw it while sleeping, or gRPC
            # abandoned the handler at a `yield` whose send failed.
            if not context.is_active():
                cancelled.set()

    def _play(self, request, context):
        for step in self.script:
            if isinstance(step, float):
                if not self._sleep(context, step):
                    return
            elif isinstance(step, Abort):
                context.abort(step.code, step.details)
            elif isinstance(step, Forever):
                for i in range(int(10 / step.interval_s)):
                    if not self._sleep(context, step.interval_s):
                        return
                    yield Event(request_id=request.request_id, token=Event.Token(index=i, token_id=i))
            else:
                event = Event()
                event.CopyFrom(step)
                event.request_id = request.request_id
                yield event

    def Cancel(self, request, context):
        self.cancels.append(request)
        return common_pb2.CancelResponse(request_id=request.request_id, found=request.request_id == "known")

    def Status(self, request, context):
        if self.status_abort:
            context.abort(self.status_abort.code, self.status_abort.details)
        workers = [
            common_pb2.WorkerInfo(worker_id="prefill-0", role=common_pb2.WORKER_ROLE_PREFILL, epoch=3,
                                  grpc_address="127.0.0.1:7001",
                                  load=common_pb2.LoadReport(pending_prefill_tokens=512, free_blocks=60,
                                                             total_blocks=64, active_blocks=4,
                                                             cached_blocks=10)),
            # No load report yet: total blocks come from the declared capacity.
            common_pb2.WorkerInfo(worker_id="decode-0", role=common_pb2.WORKER_ROLE_DECODE, epoch=1,
                                  grpc_address="127.0.0.1:7002",
                                  capacity=common_pb2.WorkerCapacity(total_blocks=128)),
        ]
        return admin_pb2.StatusResponse(workers=workers, free_blocks=100, reserved_blocks=8, total_blocks=128,
                                        open_transactions=2, mode=admin_pb2.RELEASE_MODE_CANARY,
                                        canary_fraction=0.25, route_epoch=7)

    def ListTransactions(self, request, context):
        self.list_requests.append(request)
        return admin_pb2.ListTransactionsResponse(transactions=[
            manifest_pb2.Transaction(request_id="r1", transfer_id="t1", tenant="a", generation=2, attempt=1,
                                     state=manifest_pb2.TXN_STATE_ABORTED, source_worker_id="prefill-0",
                                     destination_worker_id="decode-0", abort_reason="checksum mismatch"),
        ])

    def SetMode(self, request, context):
        self.set_mode_requests.append(request)
        return admin_pb2.SetModeResponse(previous_mode=admin_pb2.RELEASE_MODE_ACTIVE, mode=request.mode,
                                         route_epoch=8, steps=["STOP_NEW_ROUTES", "ADVANCE_ROUTE_EPOCH"])


    def Blocks(self, request, context):
        self.blocks_requests.append(request)
        leak = blocks_pb2.BlockHolding(
            request_id="gone", tenant="a", transfer_id="gone/2", generation=2,
            state=blocks_pb2.BLOCK_HOLD_STATE_RESERVED, age_s=3.5, num_blocks=5, charged_blocks=5,
            ranges=[blocks_pb2.BlockRange(start=8, count=4), blocks_pb2.BlockRange(start=20, count=1)],
            orphan=True, orphan_reason="request not in flight at the router and no open transaction")
        live = blocks_pb2.BlockHolding(request_id="r1", tenant="a", transfer_id="r1/1", generation=1,
                                       state=blocks_pb2.BLOCK_HOLD_STATE_DECODING, age_s=0.5, num_blocks=3,
                                       charged_blocks=2, ranges=[blocks_pb2.BlockRange(start=1, count=3)])
        d0 = blocks_pb2.WorkerBlocks(worker_id="decode-0", role="decode", epoch=1, total_blocks=64, free_blocks=50,
                                     cached_prefix_blocks=7, reserved_blocks=5, active_blocks=2, orphan_blocks=5,
                                     holdings=[leak] if request.orphans_only else [leak, live])
        p0 = blocks_pb2.WorkerBlocks(worker_id="prefill-0", role="prefill", error="UNAVAILABLE: down")
        return admin_pb2.BlocksResponse(workers=[d0, p0], orphan_holdings=1, in_flight_requests=1)


def paced_script(first_s=0.15, gap_s=0.05):
    return [started(), first_s, token(0, 11, "Hello", 40.0), gap_s, token(1, 12, " world", 41.0), gap_s,
            token(2, 13, "!", 42.0), gap_s, complete(3)]


