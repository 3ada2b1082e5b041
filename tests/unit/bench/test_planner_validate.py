"""bench/_sim_validate.py's judgement of one rate: attainment against the two real runs'
mean (or their spread), medians against the pooled runs (or their own difference)."""

from __future__ import annotations

import _sim_validate as v

from sim.metrics import RequestResult, RunResult


def seen(ttft: float, tpot: float) -> v.Seen:
    return v.Seen(ttft, tpot, "colocated", True)


def sim_of(pairs) -> RunResult:
    reqs = tuple(RequestResult(i, 0.0, 10, 5, "colocated", t, p, 0.0, t, p, "", "w", "") for i, (t, p) in
                 enumerate(pairs))
    return RunResult(reqs, 50.0, 2.0, 1.0, 2, {"colocated": len(reqs)}, {"decode": 0.5}, 0.1, 100.0)


SLO = (50.0, 2.0)


def test_a_simulation_that_matches_passes_every_check():
    real = [seen(10.0 + i, 1.0) for i in range(20)]
    row = v.compare(real, real, sim_of([(s.ttft_ms * 1.05, 1.1) for s in real]), SLO)
    assert row["checks"] == {"attainment": True, "attainment_in_noise": True, "ttft": True, "ttft_in_noise": True,
                             "tpot": True, "tpot_in_noise": True}
    assert row["ttft"]["sim_vs_real"]["median_abs_rel"] == 0.05


def test_misses_are_judged_against_the_runs_spread():
    real = [seen(10.0, 1.0)] * 10 + [seen(90.0, 1.0)] * 10       # half miss TTFT
    again = [seen(10.0, 1.0)] * 16 + [seen(90.0, 1.0)] * 4       # 80% meet: the runs disagree by 30 points
    sim = sim_of([(10.0, 1.0)] * 18 + [(90.0, 1.0)] * 2)         # 90%: 25 points off their mean
    c = v.compare(real, again, sim, SLO)["checks"]
    assert not c["attainment"] and not c["attainment_in_noise"]  # above both runs + 5 points
    sim = sim_of([(10.0, 1.0)] * 16 + [(90.0, 1.0)] * 4)         # 80%: inside the spread
    c = v.compare(real, again, sim, SLO)["checks"]
    assert not c["attainment"] and c["attainment_in_noise"]
    c = v.compare(real, again, sim_of([(10.0, 3.0)] * 20), SLO)["checks"]
    assert not c["tpot"] and not c["tpot_in_noise"]              # 3x the TPOT of both runs
