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
import math
import time
from collections.abc import Callable

from runtime.directory.records import WorkerRecord


@dataclasses.dataclass(slots=True)
class _Stream:
    worker_id: str
    epoch: int
    start_s: float
    """Predicted start (clock seconds); read only while the stream is planned."""
    started: bool = False


class StreamBook:
    """Planned and started streams of this router, by worker."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._streams: dict[int, _Stream] = {}
        self._next = 0

    def book(self, worker: WorkerRecord, predicted_ttft_ms: float) -> int:
        """A stream planned on `worker`, expected to start `predicted_ttft_ms` from now;
        returns the handle for `started` and `drop`."""
        self._next += 1
        wait = predicted_ttft_ms / 1000.0 if math.isfinite(predicted_ttft_ms) and predicted_ttft_ms > 0 else 0.0
        self._streams[self._next] = _Stream(worker.worker_id, worker.epoch, self._clock() + wait)
        return self._next

    def started(self, handle: int | None) -> None:
        """The stream's first token arrived (idempotent; unknown handles are ignored)."""
        s = self._streams.get(handle) if handle is not None else None
        if s is not None:
            s.started = True

    def drop(self, handle: int | None) -> None:
        """The stream ended, or its attempt failed (idempotent)."""
        if handle is not None:
            self._streams.pop(handle, None)

    def at(self, epochs: dict[str, int] | None = None) -> dict[str, tuple[int, int, float]]:
        """Worker id -> (started, planned, ms until the earliest planned start), for the
        workers with any stream booked (at their current epoch, when `epochs` is given)."""
        if not self._streams:
            return {}
        now = self._clock()
        out: dict[str, tuple[int, int, float]] = {}
        for s in self._streams.values():
            if epochs is not None and epochs.get(s.worker_id) != s.epoch:
                continue
            started, planned, nxt = out.get(s.worker_id, (0, 0, math.inf))
            if s.started:
                out[s.worker_id] = (started + 1, planned, nxt)
            else:
                out[s.worker_id] = (started, planned + 1, min(nxt, max(0.0, (s.start_s - now) * 1000.0)))
        return out

    def __len__(self) -> int:
        return len(self._streams)
