"""The hand-off's data-plane spans (prefill_worker/tracing.py, decode_worker/tracing.py):
one span per side, one event per layer, however many chunks each layer took, so a
trace grows with the model's depth and not with the prompt's length; and one
transfer.receive per reservation, whether it failed before its commit, after it, or not
at all."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from decode_worker.tracing import ReservationTrace
from pdserve_client import spans as S
from prefill_worker.tracing import PrefillTrace
from runtime.telemetry import tracing


@pytest.fixture
def spans():
    memory = InMemorySpanExporter()
    provider = tracing.configure("unit", "u", environ={}, exporter=memory)

    def finished():
        assert provider.force_flush(5000)
        return memory.get_finished_spans()
    yield finished
    tracing.shutdown()


def _events(span, name: str) -> list[dict]:
    return [dict(e.attributes) for e in span.events if e.name == name]


def test_the_send_span_has_one_event_per_layer_in_the_order_the_layers_left(spans):
    trace = PrefillTrace()
    # Layer 1 finishes before layer 0's second chunk; 80 layers of 3 chunks each in all.
    trace.sent(0, 100, 1_000)
    trace.sent(1, 200, 1_000)
    trace.sent(0, 50, 2_000)
    for layer in range(2, 80):
        for _ in range(3):
            trace.sent(layer, 10, 3_000)
    trace.sent(1, 7, 4_000)
    trace.sent(1, 8, 4_000)
    trace.transferred()
    (send,) = spans()
    assert send.name == S.TRANSFER_SEND and send.start_time == 1_000 and send.end_time >= send.start_time
    assert dict(send.attributes) == {S.LAYERS: 80, S.CHUNKS: 2 + 3 + 78 * 3, S.BYTES: 150 + 215 + 78 * 30}
    sent = _events(send, S.EVENT_LAYER_SENT)
    assert len(sent) == len(send.events) == 80 and send.dropped_events == 0
    assert sent[0] == {S.LAYER: 0, S.CHUNKS: 2, S.BYTES: 150}
    assert sent[-1] == {S.LAYER: 1, S.CHUNKS: 3, S.BYTES: 215}  # its last chunk left last
    times = [e.timestamp for e in send.events]
    assert times == sorted(times)


def test_nothing_sent_no_send_span_and_nothing_recorded_while_tracing_is_off(spans):
    PrefillTrace().transferred()
    assert spans() == ()
    tracing.shutdown()
    off = PrefillTrace()
    off.sent(0, 10, 1)
    assert not off.on and not off.layers


def test_the_prefill_builds_its_spans_after_the_reply_in_one_loop_turn(spans):
    job = SimpleNamespace(submitted_ns=10, chunks_ns=[(20, 30), (30, 40)])  # what the spans read of a Job

    async def go():
        trace = PrefillTrace()
        trace.sent(3, 64, 45)
        trace.ended(job)
        assert spans() == ()  # not yet: call_soon
        await asyncio.sleep(0)
    asyncio.run(go())
    assert sorted(s.name for s in spans()) == sorted(
        [S.PREFILL_QUEUE, S.PREFILL_COMPUTE, S.PREFILL_COMPUTE, S.TRANSFER_SEND])


def test_the_receive_span_has_one_event_per_layer_and_the_denials(spans):
    trace = ReservationTrace(0)
    for layer in (0, 1, 0, 2, 1):
        trace.chunk_visible(layer, 16)
    trace.denied("nonce")
    trace.chunk_visible(2, 16)
    trace.committed(())
    trace.flush()
    trace.ended()
    (receive,) = spans()
    assert receive.name == S.TRANSFER_RECEIVE
    visible = _events(receive, S.EVENT_LAYER_VISIBLE)
    assert sorted((e[S.LAYER], e[S.CHUNKS], e[S.BYTES]) for e in visible) == [(0, 2, 32), (1, 2, 32), (2, 2, 32)]
    assert [e.name for e in receive.events][-2:] == [S.EVENT_CAPABILITY_DENIED, S.EVENT_LAYER_VISIBLE]
    times = [e.timestamp for e in receive.events]
    assert times == sorted(times)


@pytest.mark.parametrize("when", ["before the commit", "after the commit", "after admission"])
def test_one_receive_span_per_reservation_whenever_it_failed(spans, when):
    trace = ReservationTrace(0)
    trace.chunk_visible(0, 8)
    if when != "before the commit":
        trace.committed(())
    if when == "after admission":
        trace.admitted_ns = trace.ready_ns
    trace.ended("ConnectionError: peer lost")
    got = spans()
    (receive,) = [s for s in got if s.name == S.TRANSFER_RECEIVE]
    assert len(_events(receive, S.EVENT_LAYER_VISIBLE)) == 1
    failed = receive if when != "after admission" else next(s for s in got if s.name == S.DECODE_GENERATE)
    assert not failed.status.is_ok and failed.status.description == "ConnectionError: peer lost"
    assert len(got) == (2 if when == "after admission" else 1)
