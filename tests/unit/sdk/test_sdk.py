"""Client SDK against an in-process fake Router+Admin on a real loopback gRPC server
(tests/support/sdk.py, fixtures in conftest.py): the sync client and the stream folding.

Assertions are on what the SDK computes (client-side TTFT/TPOT, error mapping,
request encoding, cancel on close), not on values echoed from the script.
"""

from __future__ import annotations

import uuid

import grpc
import pytest

from pdserve_client import Client, PdError
from pdserve_client.rpc.pd.v1 import admin_pb2, common_pb2, manifest_pb2, router_pb2
from pdserve_client.stream import StreamTally
from tests.support.sdk import Abort, Forever, complete, error, paced_script, started, token
from tooling.cluster.ports import free_port

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


def test_result_says_why_earlier_attempts_failed(fake, client):
    why = "attempt 1 (disaggregated p0 -> d0): prefill: UNAVAILABLE: p0 crashed"
    fake.script = [started(route=router_pb2.ROUTE_COLOCATED, generation=2), token(0, 5),
                   complete(1, route=router_pb2.ROUTE_COLOCATED, attempts=2, failed_attempts=why)]
    result = client.generate_full(prompt_ids=[1, 2], max_tokens=1)
    assert (result.route, result.attempts, result.failed_attempts) == ("colocated", 2, why)


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
    assert plain.prompt_text == "text" and plain.tenant == "" and plain.mode == router_pb2.MODE_UNSPECIFIED
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
    (common_pb2.ERROR_CODE_TRANSFER_FAILED, "TRANSFER_FAILED", "ABORTED", True),
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
    assert (prefill.role, prefill.epoch, prefill.pending_prefill_tokens, prefill.total_blocks) == \
        ("prefill", 3, 512, 64)
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
