"""Client SDK and pdctl against an in-process fake Router+Admin on a real loopback gRPC server.

The fake plays scripted streams (events, sleeps, gRPC aborts, endless token
streams) and records what reached it: requests, Cancel calls, and whether a
stream's RPC was cancelled by the client. Assertions are on what the SDK
computes (client-side TTFT/TPOT, error mapping, request encoding, cancel on
close), not on values echoed from the script.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from concurrent import futures

import grpc
import pytest

from services.rpc.pd.v1 import (
    admin_pb2, admin_pb2_grpc, common_pb2, manifest_pb2, router_pb2, router_pb2_grpc,
)
from services.sdk import AsyncClient, Client, PdError, resolve_router_address
from services.sdk.cli import main
from services.sdk.stream import StreamTally

Event = router_pb2.GenerateEvent

# --------------------------------------------------------------------------- script helpers


def started(route=router_pb2.ROUTE_DISAGGREGATED, prefill="prefill-0", decode="decode-0", generation=1):
    return Event(started=Event.Started(route=route, prefill_worker_id=prefill, decode_worker_id=decode,
                                       generation=generation, route_epoch=7))


def token(index, token_id, text="", server_ms=0.0):
    return Event(token=Event.Token(index=index, token_id=token_id, text=text, time_since_start_ms=server_ms))


def complete(n, reason=common_pb2.FINISH_REASON_LENGTH, route=router_pb2.ROUTE_DISAGGREGATED, attempts=1):
    # Router-side latencies deliberately far from anything the client can measure.
    return Event(complete=Event.Complete(finish_reason=reason, ttft_ms=1.0, tpot_ms=2.0, num_tokens=n,
                                         route=route, attempts=attempts))


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
                                                             total_blocks=64)),
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


@pytest.fixture(scope="module")
def server():
    fake = FakeRouter()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    router_pb2_grpc.add_RouterServicer_to_server(fake, srv)
    admin_pb2_grpc.add_AdminServicer_to_server(fake, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield fake, f"127.0.0.1:{port}"
    srv.stop(0)


@pytest.fixture
def fake(server):
    server[0].reset()
    return server[0]


@pytest.fixture
def addr(server):
    return server[1]


@pytest.fixture
def client(addr):
    with Client(addr, timeout_s=5) as c:
        yield c


def paced_script(first_s=0.15, gap_s=0.05):
    return [started(), first_s, token(0, 11, "Hello", 40.0), gap_s, token(1, 12, " world", 41.0), gap_s,
            token(2, 13, "!", 42.0), gap_s, complete(3)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- sync client


def test_stream_yields_tokens_with_client_clock_and_result_math(fake, client):
    fake.script = paced_script()
    stream = client.generate(prompt="hi", max_tokens=3)
    events = list(stream)
    result = stream.result

    assert [(e.index, e.token_id, e.text) for e in events] == [(0, 11, "Hello"), (1, 12, " world"), (2, 13, "!")]
    times = [e.t_ms for e in events]
    assert times == sorted(times) and times[0] >= 150 - 1  # first token waited out the 150 ms pause
    assert all(b - a >= 45 for a, b in zip(times, times[1:]))
    assert result.text == "Hello world!" and result.token_ids == [11, 12, 13]
    assert result.ttft_ms == events[0].t_ms
    assert result.latency_ms >= times[-1] + 45  # the stream ended after the final pause
    assert result.tpot_ms == pytest.approx((result.latency_ms - result.ttft_ms) / 2)
    assert result.token_times_ms == times
    # Client-side and router-side clocks are kept apart.
    assert (result.server_ttft_ms, result.server_tpot_ms) == (1.0, 2.0) and result.ttft_ms > 100
    assert (result.route, result.prefill_worker, result.decode_worker) == ("disaggregated", "prefill-0", "decode-0")
    assert (result.finish_reason, result.attempts, result.generation, result.route_epoch) == ("length", 1, 1, 7)
    # The SDK chose the request id and the router saw the same one.
    assert fake.requests[0].request_id == result.request_id == stream.request_id
    uuid.UUID(result.request_id)


@pytest.mark.parametrize("n", [0, 1])
def test_tpot_is_zero_without_an_inter_token_interval(fake, client, n):
    fake.script = [started(router_pb2.ROUTE_COLOCATED, prefill="")] + [token(i, 5 + i) for i in range(n)] + \
        [0.02, complete(n, reason=common_pb2.FINISH_REASON_STOP, route=router_pb2.ROUTE_COLOCATED)]
    result = client.generate_full(prompt_ids=[1, 2], max_tokens=4)
    assert result.num_tokens == n and result.tpot_ms == 0.0
    assert result.ttft_ms == (result.token_times_ms[0] if n else 0.0)
    assert result.latency_ms >= 20 and (result.route, result.finish_reason) == ("colocated", "stop")


def test_request_encoding(fake, client):
    fake.script = [started(), complete(0)]
    client.complete(prompt_ids=[3, 4, 5], max_tokens=9, temperature=0.7, top_k=40, top_p=0.9, seed=0,
                    stop_token_ids=[2, 13], ignore_eos=True, mode="colocated", tenant="acme",
                    slo_ttft_ms=250, slo_tpot_ms=30, request_id="req-1", deadline_s=1.5)
    client.complete(prompt="text", max_tokens=1)
    full, plain = fake.requests
    assert full.WhichOneof("prompt") == "prompt_token_ids" and list(full.prompt_token_ids.ids) == [3, 4, 5]
    assert (full.request_id, full.tenant, full.max_tokens, full.mode) == ("req-1", "acme", 9, router_pb2.MODE_COLOCATED)
    s = full.sampling
    assert s.HasField("seed") and s.seed == 0  # seed 0 is a seed, not "unset"
    assert (s.top_k, list(s.stop_token_ids), s.ignore_eos) == (40, [2, 13], True)
    assert s.temperature == pytest.approx(0.7) and s.top_p == pytest.approx(0.9)
    assert (full.slo.ttft_ms, full.slo.tpot_ms, full.deadline_ms) == (250, 30, 1500)
    assert plain.prompt_text == "text" and plain.tenant == "default" and plain.mode == router_pb2.MODE_UNSPECIFIED
    assert not plain.sampling.HasField("seed") and plain.deadline_ms == 0 and plain.sampling.top_p == 1.0


@pytest.mark.parametrize("kwargs", [
    dict(prompt="a", prompt_ids=[1]),          # both prompts
    dict(),                                     # no prompt
    dict(prompt="a", mode="sideways"),          # unknown mode
    dict(prompt_ids=[1, -2]),                   # not a uint32
    dict(prompt="a", deadline_s=0),             # deadline that would read as "none"
])
def test_unencodable_arguments_fail_locally(fake, client, kwargs):
    with pytest.raises(PdError) as info:
        client.generate(max_tokens=4, **kwargs)
    assert info.value.code == "INVALID_ARGUMENT"
    assert fake.requests == []


@pytest.mark.parametrize("code,name,grpc_name,retryable", [
    (common_pb2.ERROR_CODE_ADMISSION_REJECTED, "ADMISSION_REJECTED", "RESOURCE_EXHAUSTED", True),
    (common_pb2.ERROR_CODE_INVALID_ARGUMENT, "INVALID_ARGUMENT", "INVALID_ARGUMENT", False),
    (common_pb2.ERROR_CODE_TRANSFER_FAILED, "TRANSFER_FAILED", "UNAVAILABLE", True),
    (common_pb2.ERROR_CODE_UNSPECIFIED, "INTERNAL", "INTERNAL", False),
])
def test_stream_error_event_becomes_pd_error(fake, client, code, name, grpc_name, retryable):
    message = "predicted TTFT 812.5 ms > SLO 250 ms: rejected (p=0.95) — détail"
    fake.script = [started(), token(0, 1, "a"), error(code, message, retryable)]
    stream = client.generate(prompt="x", max_tokens=4)
    with pytest.raises(PdError) as info:
        list(stream)
    e = info.value
    assert (e.code, e.grpc_code, e.message, e.retryable) == (name, grpc_name, message, retryable)
    assert str(e) == f"{name}: {message}"
    assert [t.token_id for t in stream.tokens] == [1] and stream.result is None
    assert list(stream) == []  # the stream stays ended


def test_grpc_status_becomes_pd_error_with_details_intact(fake, client):
    details = "no decode worker has 12 free blocks (tenant=acme)"
    fake.script = [started(), Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, details)]
    with pytest.raises(PdError) as info:
        client.generate_full(prompt="x", max_tokens=4)
    assert (info.value.code, info.value.message, info.value.retryable) == ("RESOURCE_EXHAUSTED", details, True)

    fake.status_abort = Abort(grpc.StatusCode.FAILED_PRECONDITION, "directory unreachable")
    with pytest.raises(PdError) as info:
        client.status()
    assert (info.value.code, info.value.message) == ("FAILED_PRECONDITION", "directory unreachable")


def test_stream_closed_without_complete_is_an_error(fake, client):
    fake.script = [started(), token(0, 1)]
    with pytest.raises(PdError) as info:
        client.generate_full(prompt="x", max_tokens=4)
    assert info.value.code == "INTERNAL" and "without a complete" in info.value.message


def test_unreachable_router_is_unavailable():
    with Client(f"127.0.0.1:{free_port()}", timeout_s=2) as c:
        with pytest.raises(PdError) as info:
            c.status()
        assert info.value.code == "UNAVAILABLE" and info.value.message
        with pytest.raises(PdError) as info:
            c.generate_full(prompt="x", max_tokens=1)
        assert info.value.code == "UNAVAILABLE"


def test_breaking_out_of_the_stream_cancels_the_rpc(fake, client):
    fake.script = [started(), Forever()]
    for event in client.generate(prompt="x", max_tokens=1000):
        assert not fake.stream_cancelled.is_set()
        if event.index == 2:
            break
    assert fake.stream_cancelled.wait(5), "router never saw the cancellation"


@pytest.mark.parametrize("how", ["close", "with"])
def test_closing_the_stream_cancels_the_rpc(fake, client, how):
    fake.script = [started(), Forever()]
    stream = client.generate(prompt="x", max_tokens=1000)
    if how == "close":
        next(stream)
        stream.close()
    else:
        with stream:
            next(stream)
    assert fake.stream_cancelled.wait(5)
    assert list(stream) == []
    with pytest.raises(PdError) as info:
        stream.collect()
    assert info.value.code == "CANCELLED"


def test_cancel_calls_router_cancel(fake, client):
    assert client.cancel("known", reason="user") is True
    assert client.cancel("other") is False
    fake.script = [started(), Forever()]
    stream = client.generate(prompt="x", max_tokens=1000, request_id="req-9")
    next(stream)
    stream.cancel(reason="stop now")
    assert [(c.request_id, c.reason) for c in fake.cancels] == [("known", "user"), ("other", "client cancel"),
                                                                  ("req-9", "stop now")]
    assert fake.stream_cancelled.wait(5)


def test_status_transactions_and_set_mode(fake, client):
    s = client.status()
    assert (s.mode, s.canary_fraction, s.route_epoch, s.open_transactions) == ("canary", 0.25, 7, 2)
    prefill, decode = s.workers
    assert (prefill.role, prefill.epoch, prefill.pending_prefill_tokens, prefill.total_blocks) == ("prefill", 3, 512, 64)
    assert (decode.role, decode.total_blocks, decode.address) == ("decode", 128, "127.0.0.1:7002")

    txns = client.transactions(states=["aborted", "RESERVED"], tenant="a", limit=5)
    assert (txns[0].state, txns[0].abort_reason) == ("aborted", "checksum mismatch")
    req = fake.list_requests[0]
    assert list(req.states) == [manifest_pb2.TXN_STATE_ABORTED, manifest_pb2.TXN_STATE_RESERVED]
    assert (req.tenant, req.limit) == ("a", 5)
    with pytest.raises(PdError):
        client.transactions(states=["limbo"])

    change = client.set_mode("rolled-back", reason="drill")
    assert fake.set_mode_requests[0].mode == admin_pb2.RELEASE_MODE_ROLLED_BACK
    assert (change.previous_mode, change.mode, change.route_epoch) == ("active", "rolled_back", 8)


# --------------------------------------------------------------------------- stream folding, injected clock


def test_tally_math_replays_and_final_route():
    tally = StreamTally("r", t0_s=100.0)
    tally.feed(started(generation=1), 100.001)
    tally.feed(started(router_pb2.ROUTE_COLOCATED, prefill="", decode="decode-1", generation=2), 100.002)
    assert tally.feed(token(0, 7, "a"), 100.010).t_ms == pytest.approx(10.0)
    assert tally.feed(token(0, 7, "a"), 100.011) is None  # replayed position is dropped
    tally.feed(token(1, 8, "b"), 100.030)
    tally.feed(token(2, 9, "c"), 100.050)
    result = tally.feed(complete(3, route=router_pb2.ROUTE_COLOCATED, attempts=2), 100.070) or tally.result
    assert (result.ttft_ms, result.latency_ms) == (pytest.approx(10.0), pytest.approx(70.0))
    assert result.tpot_ms == pytest.approx(30.0)  # (70 - 10) / (3 - 1)
    assert (result.route, result.decode_worker, result.generation, result.attempts) == ("colocated", "decode-1", 2, 2)
    assert result.text == "abc" and tally.finished


# --------------------------------------------------------------------------- async client


def test_async_stream_and_result(fake, addr):
    fake.script = paced_script(first_s=0.1, gap_s=0.03)

    async def run():
        async with AsyncClient(addr, timeout_s=5) as c:
            stream = c.generate(prompt_ids=[1], max_tokens=3, mode="disaggregated")
            events = [e async for e in stream]
            full = await c.generate_full(prompt="again", max_tokens=3)
            return events, stream.result, full

    events, result, full = asyncio.run(run())
    assert [e.token_id for e in events] == [11, 12, 13] and events[0].t_ms >= 100 - 1
    assert result.ttft_ms == events[0].t_ms
    assert result.tpot_ms == pytest.approx((result.latency_ms - result.ttft_ms) / 2) and result.tpot_ms >= 25
    assert full.text == "Hello world!" and full.request_id != result.request_id
    assert fake.requests[0].mode == router_pb2.MODE_DISAGGREGATED


def test_async_errors_keep_code_and_message(fake, addr):
    async def run(script, call):
        fake.script = script
        async with AsyncClient(addr, timeout_s=5) as c:
            with pytest.raises(PdError) as info:
                await call(c)
            return info.value

    e = asyncio.run(run([started(), error(common_pb2.ERROR_CODE_DEADLINE_EXCEEDED, "deadline 50 ms passed")],
                        lambda c: c.generate_full(prompt="x", max_tokens=2)))
    assert (e.code, e.message) == ("DEADLINE_EXCEEDED", "deadline 50 ms passed")
    e = asyncio.run(run([Abort(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0")],
                        lambda c: c.generate_full(prompt="x", max_tokens=2)))
    assert (e.code, e.message) == ("INVALID_ARGUMENT", "max_tokens must be > 0")
    fake.status_abort = Abort(grpc.StatusCode.UNAVAILABLE, "router draining")
    e = asyncio.run(run([], lambda c: c.status()))
    assert (e.code, e.message, e.retryable) == ("UNAVAILABLE", "router draining", True)


@pytest.mark.parametrize("how", ["break", "aclose"])
def test_async_leaving_the_stream_cancels_the_rpc(fake, addr, how):
    fake.script = [started(), Forever()]

    async def run():
        async with AsyncClient(addr, timeout_s=5) as c:
            if how == "break":
                async for event in c.generate(prompt="x", max_tokens=1000):
                    if event.index == 1:
                        break
            else:
                stream = c.generate(prompt="x", max_tokens=1000)
                await stream.__anext__()
                await stream.aclose()
            # Keep the channel open so only the stream's own cancel can end the RPC.
            return await asyncio.to_thread(fake.stream_cancelled.wait, 5)

    assert asyncio.run(run()), "router never saw the cancellation"


def test_async_admin_calls(fake, addr):
    async def run():
        async with AsyncClient(addr) as c:
            return await c.status(), await c.transactions(), await c.cancel("known")

    status, txns, found = asyncio.run(run())
    assert status.mode == "canary" and [w.role for w in status.workers] == ["prefill", "decode"]
    assert txns[0].transfer_id == "t1" and found is True


# --------------------------------------------------------------------------- pdctl


def test_cli_generate_streams_text_and_summary(fake, addr, capsys):
    fake.script = paced_script(first_s=0.02, gap_s=0.01)
    assert main(["--router", addr, "generate", "--prompt", "hi", "--max-tokens", "3", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    text, summary = out.splitlines()
    assert text == "Hello world!"
    request_id = fake.requests[0].request_id
    assert f"request_id={request_id}" in summary and "route=disaggregated" in summary
    assert "ttft_ms=" in summary and "tpot_ms=" in summary and "workers=prefill-0->decode-0" in summary
    assert fake.requests[0].sampling.seed == 4


def test_cli_generate_json(fake, addr, capsys):
    fake.script = paced_script(first_s=0.02, gap_s=0.01)
    argv = ["generate", "--router", addr, "--prompt-ids", "1, 2,3", "--max-tokens", "3", "--mode", "colocated",
            "--temperature", "0.5", "--tenant", "acme", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["token_ids"] == [11, 12, 13] and doc["num_tokens"] == 3 and doc["text"] == "Hello world!"
    assert doc["tpot_ms"] == pytest.approx((doc["latency_ms"] - doc["ttft_ms"]) / 2)
    assert doc["ttft_ms"] >= 20 - 1 and doc["request_id"] == fake.requests[0].request_id
    req = fake.requests[0]
    assert list(req.prompt_token_ids.ids) == [1, 2, 3] and req.mode == router_pb2.MODE_COLOCATED
    assert req.tenant == "acme"


def test_cli_generate_ids_and_textless_output(fake, addr, capsys):
    fake.script = [started(), token(0, 5), token(1, 6), complete(2)]
    assert main(["--router", addr, "generate", "--prompt", "x", "--max-tokens", "2", "--ids"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == ["5", "6"]
    assert main(["--router", addr, "generate", "--prompt", "x", "--max-tokens", "2"]) == 0
    assert "token_ids: 5,6" in capsys.readouterr().out


def test_cli_error_goes_to_stderr_with_code_and_message(fake, addr, capsys):
    fake.script = [started(), token(0, 1, "par"), error(common_pb2.ERROR_CODE_ADMISSION_REJECTED, "TTFT SLO 5 ms unmeetable")]
    assert main(["--router", addr, "generate", "--prompt", "x", "--max-tokens", "4"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "par\n"
    assert "ADMISSION_REJECTED: TTFT SLO 5 ms unmeetable" in captured.err
    assert main(["--router", f"127.0.0.1:{free_port()}", "--timeout", "2", "status"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    [],
    ["generate", "--max-tokens", "3"],
    ["generate", "--prompt", "a", "--prompt-ids", "1", "--max-tokens", "3"],
    ["generate", "--prompt-ids", "1,x", "--max-tokens", "3"],
    ["generate", "--prompt", "a", "--max-tokens", "0"],
    ["generate", "--prompt", "a"],
    ["generate", "--prompt", "a", "--max-tokens", "3", "--mode", "sideways"],
    ["transactions", "--state", "limbo"],
    ["cancel"],
    ["frobnicate"],
])
def test_cli_bad_arguments_exit_2(fake, addr, capsys, argv):
    assert main(["--router", addr] + argv) == 2
    assert capsys.readouterr().err
    assert fake.requests == []


def test_cli_status_transactions_cancel_set_mode(fake, addr, capsys):
    assert main(["--router", addr, "status"]) == 0
    out = capsys.readouterr().out
    assert "mode: canary" in out and "open_transactions: 2" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("prefill-0", "decode-0"))}
    assert rows["prefill-0"][1:8] == ["prefill", "3", "60", "0", "64", "512", "0"]

    assert main(["--router", addr, "status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["open_transactions"] == 2 and [w["worker_id"] for w in doc["workers"]] == ["prefill-0", "decode-0"]

    assert main(["--router", addr, "transactions", "--state", "aborted", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["state"] == "aborted"
    assert list(fake.list_requests[0].states) == [manifest_pb2.TXN_STATE_ABORTED]
    assert main(["--router", addr, "transactions"]) == 0
    assert "checksum mismatch" in capsys.readouterr().out

    assert main(["--router", addr, "cancel", "known", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"request_id": "known", "found": True}
    assert fake.cancels[0].request_id == "known"

    assert main(["--router", addr, "set-mode", "rolled_back", "--reason", "drill"]) == 0
    assert "ADVANCE_ROUTE_EPOCH" in capsys.readouterr().out
    assert fake.set_mode_requests[0].reason == "drill"


def test_router_address_resolution(fake, addr, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PD_ROUTER", raising=False)
    assert resolve_router_address() == "127.0.0.1:50051"
    (tmp_path / ".pdserve").mkdir()
    (tmp_path / ".pdserve" / "router.addr").write_text(addr + "\n")
    assert resolve_router_address() == addr
    assert main(["status", "--json"]) == 0  # found through the launcher's file
    monkeypatch.setenv("PD_ROUTER", "10.0.0.1:1")
    assert resolve_router_address() == "10.0.0.1:1"
    assert resolve_router_address("h:2") == "h:2"
    monkeypatch.setenv("PD_ROUTER", addr)
    (tmp_path / ".pdserve" / "router.addr").write_text("127.0.0.1:1\n")
    assert main(["cancel", "other"]) == 0  # the environment wins over the file
    assert "not found" in capsys.readouterr().out
