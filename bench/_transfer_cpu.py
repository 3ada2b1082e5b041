"""The CPU a transfer costs its two peers (bench/transfer.py part 1): each peer process's
CPU time read around every timed transfer, and pdserve-ucx's time and CPU over the exact
floor's at 1 MiB.

The bench's own work per transfer is in these figures (zeroing and digesting the
receiver's cache, the commands between the processes), alike for every path: compare
paths with them, not with their times.
"""

from __future__ import annotations

import statistics

from _spawned import Spawned

MIB = 1 << 20


def with_cpu(one, r: Spawned, s: Spawned, into: list[tuple[float, float]]):
    """`one` that also appends the transfer's (sender, receiver) CPU seconds to `into`: each
    peer's process CPU around it, so the bench's own work per transfer (zeroing and digesting
    the receiver's cache, the command plumbing) is in it, alike for every path. A warm-up's
    is dropped, like its time."""
    def measured(i: int) -> float:
        s0, r0 = s.call("cpu_ns"), r.call("cpu_ns")
        t = one(i)
        s1, r1 = s.call("cpu_ns"), r.call("cpu_ns")
        if i:
            into.append(((s1 - s0) / 1e9, (r1 - r0) / 1e9))
        return t
    return measured


def cpu_medians(cpu: list[tuple[float, float]]) -> tuple[float, float]:
    """Medians of the sender's and the receiver's CPU seconds per transfer."""
    return statistics.median(c for c, _ in cpu), statistics.median(c for _, c in cpu)


def over_exact_floor(gbps: dict[str, float], cpu: dict[str, tuple[float, float]]) -> dict:
    """pdserve-ucx's time over the exact floor's at 1 MiB, and its CPU over the floor's on each
    side (the bench's own work per transfer cancels out): where they match, the protocol's
    cost is CPU on the way, not waiting."""
    if "pdserve-ucx" not in cpu or "ucxx-python-exact" not in cpu:
        return {}
    (ps, pr), (fs, fr) = cpu["pdserve-ucx"], cpu["ucxx-python-exact"]
    return dict(extra_ms_over_exact_floor=round((MIB / gbps["pdserve-ucx"] - MIB / gbps["ucxx-python-exact"]) / 1e6, 3),
                extra_cpu_ms_over_exact_floor=dict(sender=round((ps - fs) * 1000, 3),
                                                   receiver=round((pr - fr) * 1000, 3)))
