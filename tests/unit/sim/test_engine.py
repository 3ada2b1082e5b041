"""The simulated engine loop (sim/engine.py) against a plain step-by-step reference of the
same loop: the closed form of decode-only stretches, their cuts when a sequence joins, and
chunked prefill interleaved with the decode batch."""

from __future__ import annotations

import heapq
import math

import pytest

from runtime.directory.records import WorkerRole
from sim.engine import Seq, Worker
from tests.unit.sim.conftest import make_profile


class Driver:
    """Runs one Worker's events and timed submissions in time order."""

    def __init__(self, role: WorkerRole, **kw):
        self.profile = make_profile(**kw)
        self.heap: list = []
        self.n = 0
        self.token0: dict[int, float] = {}
        self.done: dict[int, Seq] = {}
        self.w = Worker("w", role, self.profile.engine, self._sched, self._t0, self._done, lambda w: None)

    def _sched(self, w, t):
        self.n += 1
        heapq.heappush(self.heap, (t, self.n, "worker", w.version))

    def _t0(self, w, seq, t):
        self.token0[seq.index] = t

    def _done(self, w, seq):
        self.done[seq.index] = seq

    def at(self, t: float, what: str, seq: Seq) -> None:
        self.n += 1
        heapq.heappush(self.heap, (t, self.n, what, seq))

    def run(self) -> None:
        while self.heap:
            t, _, what, x = heapq.heappop(self.heap)
            if what == "worker":
                if x == self.w.version:
                    self.w.on_event(t)
            elif what == "join":
                x.generated = 1
                self.w.reserve(x, -(-(x.prompt + x.output) // 16))
                self.w.join(x, t)
            else:
                self.w.reserve(x, -(-(x.prompt + x.output) // 16))
                self.w.submit(x, t)


def reference_decode(joins: list[tuple[float, int, int, int]], base=10.0, per_seq=0.2, per_ctx=0.001,
                     max_batch=64) -> dict[int, float]:
    """Step by step: (time, index, prompt, output) joins, admitted at the next step boundary;
    returns each sequence's last token time."""
    joins = sorted(joins)
    t, batch, last = 0.0, [], {}
    while batch or joins:
        if not batch:
            t = max(t, joins[0][0])
        while joins and joins[0][0] <= t:
            _, i, p, o = joins.pop(0)
            batch.append([i, p + 1, o - 1])  # token 0 came with the hand-off
        b = len(batch)
        t += math.ceil(b / max_batch) * base + per_seq * b + per_ctx * sum(s[1] for s in batch)
        for s in list(batch):
            s[1] += 1
            s[2] -= 1
            if s[2] == 0:
                last[s[0]] = t
                batch.remove(s)
    return last


@pytest.mark.parametrize("max_batch", [64, 3])
def test_decode_closed_form_matches_steps(max_batch):
    joins = [(0.0, 0, 100, 40), (0.0, 1, 300, 7), (5.0, 2, 50, 25), (123.4, 3, 2000, 60), (124.0, 4, 10, 2),
             (400.0, 5, 500, 30), (2000.0, 6, 64, 5)]
    d = Driver(WorkerRole.DECODE, max_batch=max_batch)
    for t, i, p, o in joins:
        d.at(t, "join", Seq(i, p, o))
    d.run()
    want = reference_decode(joins, max_batch=max_batch)
    assert set(d.done) == set(want)
    for i, t in want.items():
        assert d.done[i].last_ms == pytest.approx(t, rel=1e-9), i
        assert d.done[i].generated == joins[i][3]
    assert d.w.free_blocks == d.w.engine.total_blocks and not d.w.batch and d.w.context == 0


def test_chunked_prefill_interleaves_with_the_batch():
    # A decoding stream, then a 1,200-token prompt in chunks of 512: each iteration is one
    # chunk plus one decode step; the prompt's token 0 comes after its last chunk.
    d = Driver(WorkerRole.MIXED, chunk=512)
    d.at(0.0, "join", Seq(0, 100, 50))
    d.at(0.0, "submit", Seq(1, 1200, 3))
    d.run()
    step = lambda b, ctx: 10.0 + 0.2 * b + 0.001 * ctx  # noqa: E731
    t = 0.0
    for k, chunk in enumerate((512, 512, 176)):
        t += 2.0 + 0.05 * chunk
        if k == 2:
            assert d.token0[1] == pytest.approx(t)
            t += step(2, 101 + k + 1201)  # the prompt's sequence joins its last chunk's step
        else:
            t += step(1, 101 + k)
    assert d.done[1].first_decode_ms == pytest.approx(t)
    assert d.done[1].generated == 3
    assert d.w.free_blocks == d.w.engine.total_blocks


def test_prefill_worker_waits_for_its_pool():
    # Two prompts of 40 blocks on a 64-block prefill worker: the second starts only when the
    # first's blocks are given back (after its K/V left).
    d = Driver(WorkerRole.PREFILL, total_blocks=64)
    a, b = Seq(0, 640, 1, prefill_only=True), Seq(1, 640, 1, prefill_only=True)
    d.w.submit(a, 0.0)
    d.w.submit(b, 0.0)
    d.run()
    assert 0 in d.token0 and 1 not in d.token0
    assert d.w.free_blocks == 24
    d.w.release(a, 500.0)
    d.run()
    assert d.token0[1] == pytest.approx(500.0 + 2.0 + 0.05 * 512 + 2.0 + 0.05 * 128)


def test_prefix_cache_reuses_a_groups_blocks():
    d = Driver(WorkerRole.MIXED)
    first = Seq(0, 1000, 2, prefix_group=7, prefix_blocks=40)
    d.at(0.0, "submit", first)
    d.run()
    second = Seq(1, 1000, 2, prefix_group=7, prefix_blocks=40)
    d.at(1000.0, "submit", second)
    d.run()
    assert first.reused == 0 and second.reused == 640
    assert second.compute_ms == pytest.approx(2.0 + 0.05 * 360)


def test_recent_busy_share_rises_while_computing_and_decays_after():
    """Worker.recent_busy: exponentially weighted over BUSY_WINDOW_MS; one window of
    continuous work from idle gives 1 - 1/e, and a window of rest after it divides that by e."""
    from sim.engine import BUSY_WINDOW_MS

    d = Driver(WorkerRole.MIXED, chunk=512)
    assert d.w.recent_busy(0.0) == 0.0
    d.at(0.0, "join", Seq(0, 100, 10_000))  # decodes far beyond the window
    d.heap.sort()
    t, _, what, x = heapq.heappop(d.heap)
    d.w.reserve(x, 400)
    x.generated = 1
    d.w.join(x, t)
    assert d.w.recent_busy(BUSY_WINDOW_MS) == pytest.approx(1 - math.exp(-1), rel=1e-6)
    assert d.w.recent_busy(10 * BUSY_WINDOW_MS) == pytest.approx(1.0, abs=1e-4)

    idle = Driver(WorkerRole.MIXED)
    idle.at(0.0, "join", Seq(0, 100, 2))
    idle.run()
    end = idle.done[0].last_ms
    after = idle.w.recent_busy(end)
    assert 0 < after < 1
    assert idle.w.recent_busy(end + BUSY_WINDOW_MS) == pytest.approx(after / math.e, rel=1e-6)
