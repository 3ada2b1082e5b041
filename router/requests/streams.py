"""This router's own decode streams per worker: planned (not started yet) and started.

A heartbeat shows a stream once it decodes; the load overlay (router/requests/placement.py)
shows a dispatch only until the next heartbeat. Neither tells *when* a planned
stream will start, and that is what decides whether a prefill on its worker
stalls it: a prefill that ends before the stream's first token holds back
nothing. So the router books every request it plans from plan time to the end
of its first attempt, with the earliest start its plan allows (the orchestrator
passes the predicted TTFT less the queue ahead of the prefill); the first token
marks it started.

`at()` gives, per worker, (streams started, streams planned and not started, ms
until the earliest planned start; 0 when overdue), which CostModel.costs folds
into the worker's cost row (`WorkerCosts.live`, `planned`, `next_start_ms`) for
the interference rules (router/pricing/interference.py).

A stream overdue (its predicted start passed, no token yet) is taken to start
now: any prefill beside it holds it back. Entries are owned by the request's
run (router/requests/orchestrator.py): booked at plan time, dropped when attempt 1 fails
or the request ends, so none outlives its request.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable

from runtime.directory.records import WorkerRecord


@dataclasses.dataclass(slots=True)
class _Stream:
    key: tuple[str, int]
    """(worker id, epoch) it was booked at."""
    start_s: float
    """Predicted start (clock seconds); read only while the stream is planned."""
    started: bool = False


@dataclasses.dataclass(slots=True)
class _Tally:
    """One worker epoch's streams: counts, and a heap of (predicted start, handle) holding
    every planned one (and, until they reach its top, entries of streams since started
    or dropped: removed lazily)."""

    started: int = 0
    planned: int = 0
    starts: list[tuple[float, int]] = dataclasses.field(default_factory=list)


class StreamBook:
    """Planned and started streams of this router, by worker. `at` costs one step per
    worker with streams, not per stream: a router at 1,000 requests a second holds
    thousands of streams and calls it on every decision."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._streams: dict[int, _Stream] = {}
        self._tallies: dict[tuple[str, int], _Tally] = {}
        self._next = 0

    def book(self, worker: WorkerRecord, predicted_ttft_ms: float) -> int:
        """A stream planned on `worker`, expected to start `predicted_ttft_ms` from now;
        returns the handle for `started` and `drop`."""
        self._next += 1
        wait = predicted_ttft_ms / 1000.0 if math.isfinite(predicted_ttft_ms) and predicted_ttft_ms > 0 else 0.0
        s = _Stream((worker.worker_id, worker.epoch), self._clock() + wait)
        self._streams[self._next] = s
        t = self._tallies.get(s.key)
        if t is None:
            t = self._tallies[s.key] = _Tally()
        t.planned += 1
        heapq.heappush(t.starts, (s.start_s, self._next))
        return self._next

    def started(self, handle: int | None) -> None:
        """The stream's first token arrived (idempotent; unknown handles are ignored)."""
        s = self._streams.get(handle) if handle is not None else None
        if s is not None and not s.started:
            s.started = True
            t = self._tallies[s.key]
            t.planned -= 1
            t.started += 1

    def drop(self, handle: int | None) -> None:
        """The stream ended, or its attempt failed (idempotent)."""
        s = self._streams.pop(handle, None) if handle is not None else None
        if s is None:
            return
        t = self._tallies[s.key]
        if s.started:
            t.started -= 1
        else:
            t.planned -= 1
        if not (t.started or t.planned):
            del self._tallies[s.key]

    def at(self, epochs: dict[str, int] | None = None) -> dict[str, tuple[int, int, float]]:
        """Worker id -> (started, planned, ms until the earliest planned start), for the
        workers with any stream booked (at their current epoch, when `epochs` is given)."""
        if not self._tallies:
            return {}
        now = self._clock()
        out: dict[str, tuple[int, int, float]] = {}
        for (worker_id, epoch), t in self._tallies.items():
            if epochs is not None and epochs.get(worker_id) != epoch:
                continue
            nxt = max(0.0, (self._earliest(t) - now) * 1000.0) if t.planned else math.inf
            if worker_id in out:  # another epoch's (no `epochs` given)
                started, planned, other = out[worker_id]
                out[worker_id] = (started + t.started, planned + t.planned, min(nxt, other))
            else:
                out[worker_id] = (t.started, t.planned, nxt)
        return out

    def _earliest(self, t: _Tally) -> float:
        """The earliest predicted start of `t`'s planned streams (it has one), dropping the
        heap's stale entries on the way; the heap is rebuilt when stale ones dominate it."""
        heap = t.starts
        while True:
            start_s, handle = heap[0]
            s = self._streams.get(handle)
            if s is not None and not s.started:
                break
            heapq.heappop(heap)
        if len(heap) > 4 * t.planned + 64:
            t.starts = [(s.start_s, h) for h, s in ((e[1], self._streams.get(e[1])) for e in heap)
                        if s is not None and not s.started]
            heapq.heapify(t.starts)
        return start_s

    def __len__(self) -> int:
        return len(self._streams)
