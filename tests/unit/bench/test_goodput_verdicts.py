"""bench/goodput.py's figures and target verdicts (bench/_goodput_report.py): a
target is met only when the sweeps' bounds decide it."""

from __future__ import annotations

import pytest
from _goodput_report import at_least, goodput
from _goodput_run import PointResult


def point(rate: float, joint: float) -> PointResult:
    return PointResult(rate_rps=rate, n=12, ttft_attainment=joint, tpot_attainment=joint, joint_attainment=joint,
                       p50_ttft_ms=0.0, p90_ttft_ms=0.0, p50_tpot_ms=0.0, p90_tpot_ms=0.0, errors=0)


def sweep(*points: tuple[float, float]):
    return goodput([point(r, j) for r, j in points], 0.9)


def test_goodput_figures_and_their_bounds():
    bracketed = sweep((1.0, 1.0), (2.0, 0.5))
    assert bracketed.method == "interpolated"
    assert bracketed.goodput_rps == pytest.approx(1.0 + (1.0 - 0.9) / (1.0 - 0.5))  # 1.2
    assert bracketed.upper_rps == bracketed.goodput_rps
    unbounded = sweep((1.0, 1.0), (2.0, 0.95))
    assert (unbounded.method, unbounded.goodput_rps, unbounded.upper_rps) == ("highest_tested_lower_bound", 2.0,
                                                                               float("inf"))
    none = sweep((0.4, 0.5), (0.2, 0.8))
    assert (none.method, none.goodput_rps, none.upper_rps) == ("none_passed", 0.0, 0.2)


def test_a_target_is_met_only_when_the_bounds_decide_it():
    auto = sweep((2.5, 0.95), (3.6, 0.7))  # 2.5 + 0.05 / 0.25 * 1.1 = 2.72
    assert at_least(auto, sweep((1.2, 1.0), (2.6, 0.5)), 0.95)[0] is True
    assert at_least(auto, sweep((2.9, 1.0), (3.5, 0.5)), 0.95)[0] is False  # 2.72 < 0.95 x 3.02
    met, why = at_least(auto, sweep((1.2, 1.0), (2.5, 0.95)), 0.95)  # the other never failed: >= 2.5, no more known
    assert met is None and "undecided" in why
    # every rate of the other failed: it is below its lowest tested rate
    assert at_least(sweep((0.3, 0.92), (0.35, 0.8)), sweep((0.17, 0.6), (0.087, 0.8)), 1.5)[0] is True
    assert at_least(sweep((0.08, 0.92), (0.35, 0.8)), sweep((0.17, 0.6), (0.087, 0.8)), 1.5)[0] is None  # 0.125
    assert at_least(sweep((0.17, 0.8)), sweep((0.17, 0.6)), 1.5) == (False, "no rate passed")
    # a lower bound on the x side is enough when it already reaches k x the other's most
    assert at_least(sweep((3.0, 1.0)), sweep((1.0, 1.0), (2.0, 0.5)), 0.95)[0] is True
