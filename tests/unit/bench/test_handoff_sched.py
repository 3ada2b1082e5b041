"""bench/_handoff_sched.py: perf's scheduler trace read into runs, and each segment of a
request's path charged with the CPU that ran in it (by process, loop apart from other
threads) and the waits for a CPU in it, split by whether one was free."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench._handoff_sched import LOOP, THREADS, Run, Timeline, parse_timehist, path_cpu, segment_cpu
from bench._handoff_sched import rows as sched_rows

MS = 1_000_000

TIMEHIST = """\
           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   72880.884198 [0000]  <idle>                              0.000      0.000      0.161
   72880.887215 [0000]  python[29433]                       0.000      0.032      3.016
   72880.901605 [0001]  python[29664/29433]                 3.361      0.020     11.029
   72880.901700 [0001]  kworker/1:1H-kb[46]                 1.417      0.029      0.051
   72880.901800 [0001]  Web Content[777/700]                0.000      0.000      0.010
   72880.901900 [0001]  perf[30265]                                                      awakened: migration/0[18]
"""


def test_timehist_lines_become_runs_that_end_when_the_thread_left_its_cpu():
    runs = parse_timehist(TIMEHIST.splitlines())
    assert [(r.cpu, r.pid, r.tid) for r in runs] == [(0, 29433, 29433), (1, 29433, 29664), (1, 46, 46), (1, 700, 777)]
    main = runs[0]
    assert main.end_ns == 72880_887215_000 and main.end_ns - main.start_ns == 3_016_000 and main.delay_ns == 32_000
    assert runs[1].start_ns == 72880_901605_000 - 11_029_000


def run(start_ms, end_ms, pid, tid=None, cpu=0, delay_ms=0.0):
    return Run(int(start_ms * MS), int(end_ms * MS), cpu, pid, pid if tid is None else tid, int(delay_ms * MS))


def test_a_segment_gets_the_overlap_of_each_run_by_process_loop_and_threads():
    tl = Timeline([run(0, 4, 10), run(2, 3, 10, tid=11, cpu=1), run(5, 9, 20, cpu=1), run(1, 2, 99, cpu=1)], cores=2)
    seg = segment_cpu(tl, 1 * MS, 6 * MS, {10: "router", 20: "decode"})
    assert seg.cpu == {f"router/{LOOP}": 3 * MS, f"router/{THREADS}": 1 * MS, f"decode/{LOOP}": 1 * MS,
                       "other": 1 * MS}


def test_a_wait_counts_as_contention_only_while_every_cpu_is_busy():
    # CPU 0 busy 0-10 ms; CPU 1 busy 0-4 ms and idle after; the decode waited 2 ms before
    # it ran at 5 (3-5: 1 ms with both busy, 1 ms with CPU 1 free), the router 1 ms at 1.
    tl = Timeline([run(0, 10, 99), run(0, 4, 98, cpu=1), run(5, 6, 20, cpu=1, delay_ms=2.0),
                   run(2, 3, 10, cpu=1, delay_ms=1.0)], cores=2)
    assert tl.while_free(3 * MS, 5 * MS) == 1 * MS
    seg = segment_cpu(tl, 0, 20 * MS, {10: "router", 20: "decode"})
    assert (seg.waited_core_free, seg.waited_cores_busy) == (1 * MS, 2 * MS)
    assert segment_cpu(tl, int(4.5 * MS), 20 * MS, {20: "decode"}).waited_core_free == int(0.5 * MS)


def span(service, name, start_ms, end_ms, events=()):
    return SimpleNamespace(service=f"pdserve-{service}", name=name, start_ns=int(start_ms * MS),
                           end_ns=int(end_ms * MS), events=[{"name": n, "t_ns": int(t * MS)} for n, t in events])


def colocated(at_ms):
    return SimpleNamespace(spans=[
        span("router", "/pd.v1.Router/Generate", at_ms, at_ms + 10, []),
        span("router", "router.request", at_ms, at_ms + 10, [("first_token", at_ms + 8)]),
        span("decode", "/pd.v1.Decode/Generate", at_ms + 2, at_ms + 9),
    ])


def test_each_trace_is_cut_at_its_steps_on_the_trace_clock_and_averaged():
    offset = 1_000 * MS  # the spans' clock runs 1 s ahead of the scheduler's
    tl = Timeline([run(0, 2, 10), run(2, 8, 20, tid=21, cpu=1), run(100, 102, 10), run(102, 108, 20, tid=21)],
                  cores=2)
    rows = path_cpu(tl, [colocated(1_000), colocated(1_100), SimpleNamespace(spans=[])], "colocated", offset,
                    {10: "router", 20: "decode"})
    first, second = rows
    assert first["segment"] == "request -> decode's Generate began" and first["traces"] == 2
    assert first["cpu_ms"] == {"router": {LOOP: 2.0}} and first["wall_median_ms"] == 2.0
    assert first["idle_cpu_ms"] == pytest.approx(2.0)
    assert second["cpu_ms"] == {"decode": {THREADS: 6.0}} and second["cluster_cpu_ms"] == 6.0
    assert second["idle_cpu_ms"] == pytest.approx(6.0)


def _segment(name, wall, cpu, free, busy, idle, traces=2):
    return {"segment": name, "wall_median_ms": wall, "cpu_ms": {}, "cluster_cpu_ms": cpu, "waited_core_free_ms": free,
            "waited_cores_busy_ms": busy, "idle_cpu_ms": idle, "traces": traces}


def test_the_rows_sum_each_path_and_the_extra_row_is_the_difference():
    rows = {"colocated": [_segment("a", 2.0, 3.0, 0.5, 0.5, 1.0), _segment("b", 5.0, 7.0, 1.0, 1.0, 3.0)],
            "disaggregated": [_segment("a", 4.0, 6.0, 1.0, 2.0, 2.0), _segment("c", 10.0, 20.0, 3.0, 8.0, 0.0, 1)]}
    out = sched_rows(rows, "", 9.0, 20, 5.0)
    whole = [r for r in out if r.get("segment", "").startswith("request -> token 0")]
    assert [(r["mode"], r["wall_median_ms"], r["cluster_cpu_ms"], r["traces"]) for r in whole] == [
        ("colocated", 7.0, 10.0, 2), ("disaggregated", 14.0, 26.0, 1)]
    extra = out[-1]
    assert extra["metric"] == "path_cpu_extra" and extra["overhead_ms"] == 9.0 and extra["target_ms"] == 5.0
    assert (extra["wall_median_ms"], extra["cluster_cpu_ms"], extra["waited_cores_busy_ms"], extra["idle_cpu_ms"]) == \
        (7.0, 16.0, 8.5, -2.0)


def test_without_rows_one_row_says_why():
    assert sched_rows({}, "perf is not installed", 9.0, 20, 5.0) == [
        {"metric": "path_cpu", "measured": False, "why": "perf is not installed"}]


def test_the_waits_with_a_cpu_free_are_also_told_by_process():
    # CPU 0 busy 0-10 ms (the prefill's loop); CPU 1 idle from 4; the decode's loop waited
    # 3-5 (1 ms of it with CPU 1 free), the router's engine thread 6-7 with CPU 1 free.
    tl = Timeline([run(0, 10, 30), run(0, 4, 98, cpu=1), run(5, 6, 20, delay_ms=2.0),
                   run(7, 8, 10, tid=11, cpu=1, delay_ms=1.0)], cores=2)
    seg = segment_cpu(tl, 0, 20 * MS, {10: "router", 20: "decode", 30: "prefill"})
    assert seg.waited_free_by == {f"decode/{LOOP}": 1 * MS, f"router/{THREADS}": 1 * MS}
    assert seg.waited_busy_by == {f"decode/{LOOP}": 1 * MS}
    assert seg.waited_core_free == 2 * MS and seg.waited_cores_busy == 1 * MS
