"""The router's own stream book (router/requests/streams.py) and the timing-aware
interference it enables (router/pricing/interference.py), on hand-computed cases.

Round numbers as in tests/support/pricing.py: prefill 1 ms per token, decode
steps of 10 ms per sequence, split overhead 5 ms, colocated overhead 1 ms.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from router.pricing.cost_model import CostModel
from router.pricing.decision import decide
from router.pricing.interference import colocated_disturb_ms, split_disturb_ms, stalled_streams
from router.pricing.reference import reference_decide
from router.pricing.shapes import Outcome, RequestShape
from router.requests.orchestrator import Orchestrator
from router.requests.streams import StreamBook
from router.types import Started, TokenOut
from runtime.directory.records import WorkerRole
from tests.support.orchestrator import assert_no_leaks, config, run, two_by_two
from tests.support.orchestrator import params as gen_params
from tests.support.pricing import BS, CFG, params, worker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_book_reports_planned_and_started_streams_per_worker():
    clock = Clock()
    book = StreamBook(clock)
    d, e = worker("d", WorkerRole.DECODE), worker("e", WorkerRole.DECODE)
    assert book.at() == {}
    a = book.book(d, 1500.0)
    b = book.book(d, 400.0)
    c = book.book(e, math.nan)  # no usable prediction: due now
    assert book.at() == {"d": (0, 2, pytest.approx(400.0)), "e": (0, 1, 0.0)}
    clock.now += 0.3
    assert book.at()["d"] == (0, 2, pytest.approx(100.0))
    clock.now += 0.5  # b is overdue: taken to start now
    assert book.at()["d"] == (0, 2, 0.0)
    book.started(b)
    book.started(b)  # idempotent
    assert book.at()["d"] == (1, 1, pytest.approx(700.0))
    assert book.at({"d": d.epoch, "e": e.epoch + 1}) == {"d": (1, 1, pytest.approx(700.0))}  # e re-registered
    for h in (a, b, c, c, None):
        book.drop(h)
    assert len(book) == 0 and book.at() == {}



def test_the_book_agrees_with_a_recount_of_its_streams_through_many_bookings():
    """`at` keeps per-worker tallies and a lazily cleaned heap of starts; a recount of
    every live stream (what `at` once did) must give the same answer after any sequence
    of bookings, starts, drops, re-registrations and clock moves."""
    rng = random.Random(7)
    clock = Clock()
    book = StreamBook(clock)
    workers = [worker(f"w{i}", WorkerRole.DECODE) for i in range(4)]
    live: dict[int, list] = {}  # handle -> [worker id, epoch, start_s, started]
    for step in range(3000):
        op = rng.random()
        if op < 0.4:
            w = rng.choice(workers)
            ttft = rng.choice([math.nan, 0.0, rng.uniform(0, 2000)])
            h = book.book(w, ttft)
            wait = ttft / 1000 if math.isfinite(ttft) and ttft > 0 else 0.0
            live[h] = [w.worker_id, w.epoch, clock.now + wait, False]
        elif op < 0.6 and live:
            h = rng.choice(list(live))
            book.started(h)
            live[h][3] = True
        elif op < 0.85 and live:
            h = rng.choice(list(live))
            book.drop(h)
            del live[h]
        elif op < 0.9:
            i = rng.randrange(len(workers))  # the worker re-registers: its old streams no longer count
            workers[i] = dataclasses.replace(workers[i], epoch=workers[i].epoch + 1)
        else:
            clock.now += rng.uniform(0, 0.5)
        epochs = {w.worker_id: w.epoch for w in workers} if step % 2 else None
        want: dict[str, tuple[int, int, float]] = {}
        for wid, epoch, start_s, started in live.values():
            if epochs is not None and epochs.get(wid) != epoch:
                continue
            s, p, n = want.get(wid, (0, 0, math.inf))
            want[wid] = (s + 1, p, n) if started else (s, p + 1, min(n, max(0.0, (start_s - clock.now) * 1000)))
        got = book.at(epochs)
        assert got.keys() == want.keys()
        for wid, (s, p, n) in want.items():
            assert got[wid][:2] == (s, p) and got[wid][2] == pytest.approx(n)
    assert len(book) == len(live)

def burst_rows(model: CostModel, first_start_ms: float):
    """Two idle mixed workers just after the router planned a 1000-token prompt r1
    split w0 -> w1: r1 queues on w0 (1000 ms), its stream is planned on w1 (blocks and
    a sequence in the overlay, not in a heartbeat yet) to start `first_start_ms` from now."""
    w0, w1 = worker("w0", WorkerRole.MIXED), worker("w1", WorkerRole.MIXED)
    return [model.costs(w0, extra_tokens=1000, streams=(0, 0, math.inf)),
            model.costs(w1, extra_blocks=66, extra_seqs=1, streams=(0, 1, first_start_ms))]


def test_prefill_that_ends_before_a_planned_stream_starts_stalls_nobody():
    model = CostModel(CFG)
    _, w1 = burst_rows(model, 1011.0)
    # r2 (1000 tokens) colocated on w1: 4 chunks of 256 with a 10 ms step (batch 1,
    # the planned stream) between them: it ends at 1040 ms, 29 ms after r1 starts.
    assert w1.live == 0 and w1.planned == 1 and w1.batch == 1
    assert colocated_disturb_ms(w1, 1000.0, 41, 1040.0) == pytest.approx(10 + 29 / 20)
    assert stalled_streams(w1, 1040.0) == 1
    assert colocated_disturb_ms(w1, 1000.0, 41, 1011.0) == 0.0 and stalled_streams(w1, 1011.0) == 0
    # Had r1 been due at 100 ms, 940 ms of the prefill would run beside it: 10 + 47 > 55.
    assert colocated_disturb_ms(w1, 1000.0, 41, 1040.0) < 55 < colocated_disturb_ms(
        burst_rows(model, 100.0)[1], 1000.0, 41, 1040.0)
    # The same on a split route whose P is w1 (r2 decoding on w0).
    assert split_disturb_ms(w1, 1000.0, 41, 1040.0) == pytest.approx(10 + 29 / 20)
    assert split_disturb_ms(w1, 1000.0, 41, 1000.0) == 0.0
    # Without the book the planned stream counts as live: the whole prefill stalls it.
    plain = model.costs(worker("w1", WorkerRole.MIXED), extra_blocks=66, extra_seqs=1)
    assert plain.live == 1 and colocated_disturb_ms(plain, 1000.0, 41, 1040.0) == pytest.approx(10 + 50)


def test_burst_second_prompt_prefills_beside_the_first_instead_of_queueing_behind_it():
    # r2, 1000 tokens, 41 out, targets 5000 / 55 ms. Split w0 -> w1 queues it behind
    # r1 on w0: TTFT 1000 + 1000 + ... > 2000 ms. Colocated on w1 ends at 1040 ms, 29 ms
    # into r1's stream (stall 1.45 ms per token: calm), TTFT 1041 ms; TPOT: w1's step
    # with 2 streams (20 ms) + the 29 ms that overlap r1's stream over 40 gaps.
    model = CostModel(CFG)
    req = RequestShape(prompt_tokens=1000, max_tokens=41, block_size=BS, slo_ttft_ms=5000, slo_tpot_ms=55)
    for fn in (decide, reference_decide):
        dec = fn(model, burst_rows(model, 1011.0), req, params())
        assert dec.outcome is Outcome.COLOCATED and dec.chosen.decode.worker_id == "w1", dec.reason
        assert dec.chosen.ttft_ms == pytest.approx(1041.0) and dec.chosen.tpot_ms == pytest.approx(20 + 29 / 40)
    # r1 due at 100 ms: colocating r2 on w1 would stall r1's stream (10 + 47 > 55), so
    # it queues behind r1 on the calm w0 and decodes on w1.
    for fn in (decide, reference_decide):
        dec = fn(model, burst_rows(model, 100.0), req, params())
        assert dec.outcome is Outcome.DISAGGREGATED, dec.reason
        assert (dec.chosen.prefill.worker_id, dec.chosen.decode.worker_id) == ("w0", "w1")
        assert dec.chosen.ttft_ms > 2000


@pytest.mark.parametrize("windows", [False, True])
def test_orchestrator_books_the_planned_stream_until_the_request_ends(windows):
    fake = two_by_two()
    fake.hang.add(("decode_stream", "d1"))
    seen = {}

    async def go():
        orch = Orchestrator(fake, fake, config(stream_start_windows=windows), clock=lambda: 100.0)  # time stands
        gen = orch.generate(gen_params())
        assert isinstance(await gen.__anext__(), Started)
        seen["planned"] = orch.planner.streams.at()
        await gen.aclose()
        await orch.drain()
        seen["after"] = len(orch.planner.streams)
        # A request that streams: started at its decode's first token (not at the prefill's
        # token 0, which comes before any decode step), dropped at the end.
        fake.hang.clear()
        gen = orch.generate(gen_params(request_id="s"))
        async for ev in gen:
            if isinstance(ev, TokenOut) and not ev.decoding:
                seen["prefill token"] = orch.planner.streams.at()
            if isinstance(ev, TokenOut) and ev.decoding:
                seen["streaming"] = orch.planner.streams.at()
                break
        await gen.aclose()
        await orch.drain()
        return orch

    fake2 = fake
    orch = run(go())
    (d, (started, planned, start_ms)), = seen["planned"].items()
    assert (d, started, planned) == ("d1", 0, 1)
    # Without windows the stream counts as starting now; with them, at 0.75 (the
    # default stream_start_share) of its plan's predicted TTFT less the queue ahead
    # of its prefill (the fake's queues are empty).
    rec = orch.planner.log.get("r")
    assert rec.predicted_ttft_ms > 5
    assert start_ms == (pytest.approx(0.75 * rec.predicted_ttft_ms) if windows else 0.0)
    assert seen["after"] == 0
    assert [v[:2] for v in seen["prefill token"].values()] == [(0, 1)]
    assert list(seen["streaming"].values()) == [(1, 0, math.inf)]
    assert_no_leaks(orch, fake2)


def test_table_key_counts_only_the_overlap_with_a_planned_stream():
    # top_k 1 colocated: the cheap key alone picks the worker that gets priced. wa has a
    # stream planned at 900 ms: its 1000-token prefill (4 chunks, a 10 ms step between
    # them) ends at 1040, 140 ms into it. Key: TTFT 1041 / 5000 + (step of 2 = 20
    # + 140 / 40 gaps) / 55 = 0.635. wb is idle with 500 ms queued: 1501 / 5000
    # + (10 + 500 / 40) / 55 = 0.709. Counting wa's whole prefill (20 + 1000 / 40 = 45 ms)
    # would make it 1.026 and pick wb.
    model = CostModel(CFG)
    wa = model.costs(worker("wa", WorkerRole.DECODE), extra_blocks=66, extra_seqs=1, streams=(0, 1, 900.0))
    wb = model.costs(worker("wb", WorkerRole.DECODE, pending=500))
    req = RequestShape(prompt_tokens=1000, max_tokens=41, block_size=BS, slo_ttft_ms=5000, slo_tpot_ms=55)
    for fn in (decide, reference_decide):
        dec = fn(model, [wa, wb], req, params(top_k=1), split=False)
        assert dec.best_colocated.decode.worker_id == "wa"
        assert dec.best_colocated.tpot_ms == pytest.approx(20 + 140 / 40)


def test_start_windows_are_configured_from_the_environment_and_checked():
    from router.config import RouterConfig
    cfg = RouterConfig.from_env({"PD_ROUTER_STREAM_START_WINDOWS": "1", "PD_ROUTER_STREAM_START_SHARE": "0.5"})
    assert (cfg.stream_start_windows, cfg.stream_start_share) == (True, 0.5)
    assert (RouterConfig().stream_start_windows, RouterConfig().stream_start_share) == (False, 0.75)
    with pytest.raises(ValueError, match=r"stream_start_share=1.5 \(PD_ROUTER_STREAM_START_SHARE\): .* or equal to 1"):
        RouterConfig(stream_start_share=1.5)
