"""Where a pdserve-ucx hand-off's time goes: stamps from both peers on one clock.

bench/transfer.py (`--timeline-transfers`) switches `Stamps` on in its sender and
receiver processes (bench/_transfer_peers.py), runs a few more pdserve-ucx hand-offs
of the smallest size, and reports one row per step: when it started (µs after the
sender's `send_many` began: CLOCK_MONOTONIC is one clock for every process of a
host), how long it took, and how much of that the thread spent on a CPU. A post
whose wall time is well over its CPU time lost its CPU to the peer it woke.

The steps are backend methods and the UCX runtime's calls, wrapped while the stamps
are on and restored after (the timed rounds of part 1 run unwrapped). Each wrapper
costs ~1-2 µs, so the figures run a little long; compare steps, not totals with
part 1's. Not a product module: it reaches into private methods by name, and
fails loudly when one is renamed.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import statistics
import time
from collections import Counter, defaultdict

from _spawned import Spawned

STEPS = (  # (module, owner or "", attribute, label): S = sender side, R = receiver side
    ("_transfer_peers", "", "chunk_checksum", "S.checksum"),
    ("runtime.transfer.ucx.sender", "UcxSender", "send_many", "S.send_many"),
    ("runtime.transfer.ucx.sender", "UcxSender", "commit", "S.commit"),
    ("runtime.transfer.ucx.sender", "UcxSender", "_post", "S.post_message"),
    ("runtime.transfer.ucx.sender", "", "pack", "S.pack"),
    ("runtime.transfer.ucx.sender", "UcxSender", "_on_reply", "S.on_reply"),
    ("runtime.transfer.ucx.receiver", "UcxReceiver", "_on_message", "R.on_message"),
    ("runtime.transfer.ucx.receiver", "UcxReceiver", "_on_chunk", "R.on_chunk"),
    ("runtime.transfer.ucx.receiver", "UcxReceiver", "_land", "R.land"),
    ("runtime.transfer.ucx.receiver", "", "scatter", "R.scatter"),
    ("runtime.transfer.ucx.receiver", "", "chunk_checksum", "R.checksum"),
    ("runtime.transfer.ucx.receiver", "UcxReceiver", "_decide", "R.decide"),
    ("runtime.transfer.ucx.runtime", "UcxRuntime", "progress", "progress"),
    ("runtime.transfer.ucx.runtime", "UcxRuntime", "post_send", "post_send"),
    ("runtime.transfer.ucx.runtime", "UcxRuntime", "post_recv", "post_recv"),
)
TIMELINE_IDS = 1_000_000
"""The timeline's transfers are numbered from here (the timed rounds' from 0)."""
SUMMED = ("S.checksum", "R.checksum")
"""Steps called once per chunk: reported as one row per transfer (their count and total)."""


class Stamps:
    """Wraps STEPS in this process while on; `take` returns (label, start ns, end ns, cpu ns)."""

    def __init__(self):
        self.records: list[tuple[str, int, int, int]] = []
        self._saved: list[tuple[object, str, object]] = []

    def on(self) -> None:
        if self._saved:
            return
        for module, owner, attr, label in STEPS:
            target = importlib.import_module(module)
            if owner:
                target = getattr(target, owner)
            original = getattr(target, attr)  # AttributeError: a step was renamed; update STEPS
            self._saved.append((target, attr, original))
            setattr(target, attr, self._wrap(original, label))

    def off(self) -> None:
        for target, attr, original in reversed(self._saved):
            setattr(target, attr, original)
        self._saved.clear()
        self.records.clear()

    def take(self) -> list[tuple[str, int, int, int]]:
        out, self.records = self.records, []
        return out

    def _wrap(self, f, label: str):
        if inspect.iscoroutinefunction(f):
            @functools.wraps(f)
            async def stamped(*args, **kwargs):  # (CPU of an awaited step counts other tasks' too)
                t0, c0 = time.monotonic_ns(), time.thread_time_ns()
                try:
                    return await f(*args, **kwargs)
                finally:
                    self.records.append((label, t0, time.monotonic_ns(), time.thread_time_ns() - c0))
            return stamped

        @functools.wraps(f)
        def stamped(*args, **kwargs):
            t0, c0 = time.monotonic_ns(), time.thread_time_ns()
            try:
                return f(*args, **kwargs)
            finally:
                self.records.append((label, t0, time.monotonic_ns(), time.thread_time_ns() - c0))
        return stamped


def timeline_rows(transfers: list[tuple[list, list]]) -> list[dict]:
    """Rows from each transfer's (sender stamps, receiver stamps): one per step occurrence
    seen in at least half of the transfers (start, wall and CPU, medians, µs after the
    sender's send_many began), one per SUMMED step, then a summary."""
    per: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    summed: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    lost: list[float] = []
    for sender, receiver in transfers:
        starts = [t0 for label, t0, _, _ in sender if label == "S.send_many"]
        if not starts:
            continue
        zero, seen, lost_here = min(starts), Counter(), 0.0
        for who, stamps in (("S", sender), ("R", receiver)):
            sums: dict[str, list[float]] = defaultdict(list)
            for label, t0, t1, cpu in sorted(stamps, key=lambda s: s[1]):
                if label in SUMMED:
                    sums[label].append((t1 - t0) / 1e3)
                    continue
                seen[(who, label)] += 1
                step = f"{label}#{seen[(who, label)]}"
                per[(who, step)].append(((t0 - zero) / 1e3, (t1 - t0) / 1e3, cpu / 1e3))
                if label == "post_send":
                    lost_here += max(0.0, (t1 - t0 - cpu) / 1e3)
            for label, walls in sums.items():
                summed[(who, label)].append((len(walls), sum(walls)))
        lost.append(lost_here)
    n = len(lost)
    rows = []
    for (who, step), v in per.items():
        if len(v) * 2 < n:
            continue
        rows.append(dict(bench="transfer", metric="timeline", who=who, step=step, n=len(v),
                         start_us=round(statistics.median(s for s, _, _ in v)),
                         wall_us=round(statistics.median(w for _, w, _ in v)),
                         cpu_us=round(statistics.median(c for _, _, c in v))))
    rows.sort(key=lambda r: r["start_us"])
    for (who, label), v in summed.items():
        rows.append(dict(bench="transfer", metric="timeline", who=who, step=f"{label} (all)", n=len(v),
                         calls=round(statistics.median(c for c, _ in v)),
                         wall_us=round(statistics.median(w for _, w in v))))
    if n:
        rows.append(dict(bench="transfer", metric="timeline_summary", transfers=n,
                         posts_off_cpu_us=round(statistics.median(lost)),
                         note="posts_off_cpu_us: per transfer, the time posts spent off their CPU "
                              "(wall - CPU): the woken peer ran in their place"))
    return rows


def run_timeline(r: Spawned, s: Spawned, one, transfers: int, size_mib: int) -> list[dict]:
    """`transfers` more pdserve-ucx hand-offs (`one`) with `Stamps` on in both peers, after one
    that warms the wrappers: `timeline_rows` of them, each tagged with `size_mib`."""
    for p in (r, s):
        p.call("timeline", action="on")
    got = []
    try:
        for i in range(transfers + 1):
            one(TIMELINE_IDS + i)
            pair = s.call("timeline", action="take"), r.call("timeline", action="take")
            if i:
                got.append(pair)
    finally:
        for p in (r, s):
            p.call("timeline", action="off")
    return [dict(row, size_mib=size_mib) for row in timeline_rows(got)]
