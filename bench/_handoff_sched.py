"""Whose CPU a request's path spends, segment by segment, for bench/handoff.py's
`path_cpu` row: the kernel's scheduler trace (`perf sched record`, every CPU, on
CLOCK_MONOTONIC) over traced requests, each request's window cut at its traced steps.

For every segment of a request (between two consecutive steps, e.g. "Publish left ->
published"), every thread's running time inside it is summed by process: the cluster's
processes by name (their event loop's thread apart from their other threads: the engine,
the store pool, the span exporter, gRPC's own), everything else as "other". With it, the
time the cluster's threads spent runnable but waiting for a core (the scheduler's delay
from wake-up or preemption to running) and the cores' idle time in the segment. It says,
for each step of the path, whether the time is work (and whose), waiting for a core, or
neither (idle cores: waiting on something else, e.g. the GIL held by a thread that is not
running). The spans are on the wall clock (time_ns), the trace on the monotonic one; the
offset between them is taken once, in this process, while the trace runs.
"""

from __future__ import annotations

import bisect
import re
import shutil
import signal
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from bench._handoff_traces import AFTER_COMPUTE, edge

START = ("request", ("router", "/pd.v1.Router/Generate", "start"))
STEPS = {
    "disaggregated": (START, ("compute began", ("prefill", "prefill.compute", "start")), *AFTER_COMPUTE),
    "colocated": (START, ("decode's Generate began", ("decode", "/pd.v1.Decode/Generate", "start")),
                  AFTER_COMPUTE[-1]),
}
"""Each mode's traced steps, in path order (bench/_handoff_traces.py reads each step)."""
LOOP = "loop"
"""A process's main thread: its event loop (gRPC's handlers, pdserve's coroutines)."""
THREADS = "threads"
"""A process's other threads: the engine, the directory's store pool, the span exporter,
gRPC's event engine."""
RECORD_START_S = 10.0
"""How long perf may take to start writing its trace."""

_LINE = re.compile(r"^\s*(\d+\.\d+)\s+\[(\d+)\]\s+(.*?)\[(\d+)(?:/(\d+))?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


class Run(NamedTuple):
    """A thread on a CPU: [start_ns, end_ns), after `delay_ns` runnable without a core."""

    start_ns: int
    end_ns: int
    cpu: int
    pid: int
    tid: int
    delay_ns: int


def unavailable() -> str:
    """'' when perf can record the scheduler's trace here; else why not."""
    perf = shutil.which("perf")
    if perf is None:
        return "perf is not installed (Debian: apt-get install linux-perf)"
    probe = subprocess.run([perf, "sched", "record", "-o", "/dev/null", "--", "true"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode:
        return f"perf sched record failed here: {(probe.stderr or probe.stdout).strip()[-300:]}"
    return ""


class Recording:
    """`perf sched record` over every CPU while the block runs; `runs()` after it."""

    def __init__(self, path: Path):
        self.path, self._proc = path, None

    def __enter__(self) -> Recording:
        self._proc = subprocess.Popen(["perf", "sched", "record", "-k", "CLOCK_MONOTONIC", "-a", "-o",
                                       str(self.path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + RECORD_START_S
        while not (self.path.exists() and self.path.stat().st_size) and time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"perf sched record exited: {self._proc.stderr.read().decode()[-300:]}")
            time.sleep(0.05)
        time.sleep(0.3)  # its per-CPU buffers are set up with the header
        self.offset_ns = time.time_ns() - time.monotonic_ns()
        return self

    def __exit__(self, *exc) -> None:
        self._proc.send_signal(signal.SIGINT)
        self._proc.communicate(timeout=60)

    def runs(self) -> list[Run]:
        out = subprocess.run(["perf", "sched", "timehist", "-i", str(self.path)], capture_output=True, text=True,
                             timeout=300, check=True).stdout
        return parse_timehist(out.splitlines())


def parse_timehist(lines: Iterable[str]) -> list[Run]:
    """`perf sched timehist` lines -> runs: each line is a thread leaving a CPU at `time`
    after `run time` ms on it, which it got `sch delay` ms after it could run (idle and
    header lines are dropped)."""
    runs = []
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        t, cpu, _name, tid, pid, _wait, delay, run = m.groups()
        end = round(float(t) * 1e9)
        runs.append(Run(end - round(float(run) * 1e6), end, int(cpu), int(pid or tid), int(tid),
                        round(float(delay) * 1e6)))
    return runs


def _overlap(a: int, b: int, lo: int, hi: int) -> int:
    return max(0, min(b, hi) - max(a, lo))


class Timeline:
    """Runs by start (for the runs that overlap a window, or wait in it, without a scan),
    and how many CPUs were busy at each instant."""

    def __init__(self, runs: Sequence[Run], cores: int):
        self.runs, self.cores = sorted(runs), cores
        self._starts = [r.start_ns for r in self.runs]
        self._longest = max((r.end_ns - r.start_ns for r in self.runs), default=0)
        self._longest_wait = max((r.delay_ns for r in self.runs), default=0)
        self._at, self._busy, busy = [], [], 0
        for t, step in sorted([(r.start_ns, 1) for r in self.runs] + [(r.end_ns, -1) for r in self.runs]):
            busy += step
            self._at.append(t)
            self._busy.append(busy)

    def around(self, lo: int, hi: int) -> Sequence[Run]:
        """Every run that may be on a CPU, or waiting for one, within [lo, hi)."""
        return self.runs[bisect.bisect_left(self._starts, lo - self._longest):
                         bisect.bisect_left(self._starts, hi + self._longest_wait)]

    def while_free(self, lo: int, hi: int) -> int:
        """ns of [lo, hi) during which at least one CPU ran nothing."""
        i = bisect.bisect_right(self._at, lo) - 1
        busy = self._busy[i] if i >= 0 else 0
        free, t = 0, lo
        for at, now_busy in zip(self._at[i + 1:], self._busy[i + 1:]):
            if at >= hi:
                break
            if busy < self.cores:
                free += at - t
            t, busy = at, now_busy
        return free + (hi - t if busy < self.cores else 0)


class Segment(NamedTuple):
    """One window of one request: CPU ns by "process/loop" or "process/threads" ("other"
    for any process not named), and the ns the named processes' threads spent runnable
    without a CPU, by the same keys, split by whether some CPU ran nothing meanwhile (a
    wake-up's latency, or a thread queued behind the one that woke it) or every CPU was
    busy (contention)."""

    cpu: dict[str, int]
    waited_free_by: dict[str, int]
    waited_busy_by: dict[str, int]

    @property
    def waited_core_free(self) -> int:
        return sum(self.waited_free_by.values())

    @property
    def waited_cores_busy(self) -> int:
        return sum(self.waited_busy_by.values())


def segment_cpu(timeline: Timeline, lo: int, hi: int, names: Mapping[int, str]) -> Segment:
    """What ran, and who waited for a CPU, in [lo, hi) (`names`: pid -> process)."""
    cpu: dict[str, int] = defaultdict(int)
    free_by: dict[str, int] = defaultdict(int)
    busy_by: dict[str, int] = defaultdict(int)
    for r in timeline.around(lo, hi):
        name = names.get(r.pid)
        who = "other" if name is None else f"{name}/{LOOP if r.tid == r.pid else THREADS}"
        if ns := _overlap(r.start_ns, r.end_ns, lo, hi):
            cpu[who] += ns
        a, b = max(lo, r.start_ns - r.delay_ns), min(hi, r.start_ns)
        if name is not None and b > a:
            f = timeline.while_free(a, b)
            if f:
                free_by[who] += f
            if b - a - f:
                busy_by[who] += b - a - f
    return Segment(dict(cpu), dict(free_by), dict(busy_by))


def path_cpu(timeline: Timeline, traces, mode: str, offset_ns: int, names: Mapping[int, str]) -> list[dict]:
    """Per segment of `mode`'s path (STEPS), over the traces holding every step: the median
    wall time; the mean CPU ms by process (its loop and its other threads) and of the
    cluster's processes together; the mean ms their threads waited for a CPU, with one
    free and with every one busy; and the mean ms the CPUs ran nothing."""
    steps = STEPS[mode]
    acc: dict[str, dict] = {}
    for trace in traces:
        edges = [edge(trace, *where) for _, where in steps]
        if None in edges:
            continue
        edges = [e - offset_ns for e in edges]
        for (a, _), (b, _), lo, hi in zip(steps, steps[1:], edges, edges[1:]):
            seg = segment_cpu(timeline, lo, hi, names)
            into = acc.setdefault(f"{a} -> {b}", {"wall": [], "cpu": defaultdict(int), "free": 0, "busy": 0,
                                                  "idle": 0})
            into["wall"].append(max(0, hi - lo))
            for k, ns in seg.cpu.items():
                into["cpu"][k] += ns
            into["free"] += seg.waited_core_free
            into["busy"] += seg.waited_cores_busy
            into["idle"] += max(0, timeline.cores * (hi - lo) - sum(seg.cpu.values()))
    rows = []
    for name, seg in acc.items():
        n = len(seg["wall"])

        def ms(ns: float) -> float:
            return round(ns / n / 1e6, 2)
        by_process: dict[str, dict[str, float]] = defaultdict(dict)
        for k, ns in sorted(seg["cpu"].items()):
            proc, _, part = k.partition("/")
            by_process[proc][part or "all"] = ms(ns)
        rows.append({"segment": name, "wall_median_ms": round(statistics.median(seg["wall"]) / 1e6, 2),
                     "cpu_ms": dict(by_process),
                     "cluster_cpu_ms": ms(sum(ns for k, ns in seg["cpu"].items() if k != "other")),
                     "waited_core_free_ms": ms(seg["free"]), "waited_cores_busy_ms": ms(seg["busy"]),
                     "idle_cpu_ms": ms(seg["idle"]), "traces": n})
    return rows


def rows(paths: Mapping[str, list[dict]], why: str, overhead_ms: float, requests: int, target_ms: float) -> list[dict]:
    """bench/handoff.py's `path_cpu` rows from `path_cpu`'s segments by mode: each mode's
    segments, then its whole path (request -> token 0: the segments summed), then
    `path_cpu_extra` (disaggregated minus colocated) when both modes have one; or one row
    saying why there are none."""
    if not paths:
        return [{"metric": "path_cpu", "measured": False, "why": why or "no traced request held every step"}]
    out, whole = [], {}
    keys = ("wall_median_ms", "cluster_cpu_ms", "waited_core_free_ms", "waited_cores_busy_ms", "idle_cpu_ms")
    for mode, segments in paths.items():
        whole[mode] = {k: round(sum(s[k] for s in segments), 2) for k in keys}
        out += [{"metric": "path_cpu", "mode": mode, **seg} for seg in segments]
        out.append({"metric": "path_cpu", "mode": mode,
                    "segment": "request -> token 0 left the router (sum of the segments)", **whole[mode],
                    "traces": min((s["traces"] for s in segments), default=0), "requests": requests})
    if whole.keys() == STEPS.keys():
        dis, col = whole["disaggregated"], whole["colocated"]
        out.append({"metric": "path_cpu_extra", **{k: round(dis[k] - col[k], 2) for k in dis},
                    "overhead_ms": round(overhead_ms, 2), "target_ms": target_ms})
    return out
