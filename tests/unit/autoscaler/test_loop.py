"""The loop (autoscaler/loop.py) over the in-memory scaler: a decision carried out and
published with its reason, the holds when the load or the planner gives nothing, a failed
resize recorded as such; and the planner glue (autoscaler/recommend.py) against stand-ins
of sim.plan and sim.workload with the signatures the planner provides."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from autoscaler.__main__ import rules_for
from autoscaler.config import AutoscalerSettings
from autoscaler.loop import STATUS_FORMAT, Autoscaler
from autoscaler.observe import ObservedLoad, TokenHistogram
from autoscaler.policy import Policy, Rules, Sizes, Target
from autoscaler.recommend import NoTarget, planner_recommend
from autoscaler.scaler import MemoryScaler

EDGES = (128.0, 1024.0, 8192.0, float("inf"))
LOAD = ObservedLoad(12.3, TokenHistogram(EDGES, (0, 90, 10, 0)), TokenHistogram(EDGES, (100, 0, 0, 0)), 60, 738, 2)


class FakeObserver:
    def __init__(self, load=LOAD, error: str = ""):
        self.load, self.error = load, error

    def observe(self) -> ObservedLoad:
        if self.error:
            raise RuntimeError(self.error)
        return self.load


class Clock:
    now = 1_700_000_000.0

    def __call__(self):
        return self.now


def auto(scaler, observer=None, recommend=None, **rules) -> Autoscaler:
    rules = dict(up_stable_s=0, down_stable_s=0, cooldown_s=0) | rules
    return Autoscaler(observer or FakeObserver(), recommend or (lambda load: Target(1, 3, 0, "planner: 3 decode")),
                      Policy(Rules(**rules)), scaler, "local", history=3, clock=Clock())


def test_a_step_resizes_what_the_policy_changed_and_publishes_why():
    s = MemoryScaler(Sizes(1, 1))
    d = auto(s).step()
    assert s.resizes == [("decode", 2)] and d.action == "scale"
    st = s.status
    assert st["format"] == STATUS_FORMAT and st["scaler"] == "local" and st["updated_s"] == Clock.now
    assert st["current"] == {"prefill": 1, "decode": 2, "mixed": 0} and st["target"]["decode"] == 3
    assert st["last"]["reason"] == "decode 1 -> 2: up after 0 s stable (wanted 3); planner: planner: 3 decode"
    assert st["load"]["rate_rps"] == 12.3 and "12.30 rps over 60 s" in st["load"]["summary"]


def test_the_record_keeps_the_newest_decisions_first():
    s = MemoryScaler(Sizes(1, 1))
    a = auto(s)
    for _ in range(5):
        a.step()
    assert [d["new"]["decode"] for d in s.status["decisions"]] == [3, 3, 3]
    assert s.status["decisions"][0]["action"] == "hold" and "at target" in s.status["decisions"][0]["reason"]


def test_no_load_and_no_configuration_are_holds_that_say_so():
    s = MemoryScaler(Sizes(1, 1))
    d = auto(s, FakeObserver(error="no router's /metrics answered: a: refused")).step()
    assert d.reason == "hold: no target: no observed load: no router's /metrics answered: a: refused"
    assert s.status["load"] is None and s.resizes == []

    def nothing_fits(load):
        raise NoTarget("no configuration of at most 8 GPUs meets TTFT 100 ms")
    d = auto(s, recommend=nothing_fits).step()
    assert d.reason == "hold: no target: planner: no configuration of at most 8 GPUs meets TTFT 100 ms"


def test_a_failed_resize_is_recorded_with_why():
    s = MemoryScaler(Sizes(1, 1), pools=("prefill",))
    d = auto(s).step()
    assert d.reason.endswith("; FAILED: no decode pool here") and s.status["last"]["reason"] == d.reason


def test_pools_the_scaler_lacks_are_held_at_zero():
    settings = AutoscalerSettings(max_mixed=3)
    rules = rules_for(settings, MemoryScaler(Sizes(), pools=("prefill", "decode")))
    assert rules.bounds == {"prefill": (1, 4), "decode": (1, 4), "mixed": (0, 0)}
    with pytest.raises(ValueError, match="min_decode=5 is above max_decode=4"):
        AutoscalerSettings(min_decode=5)


@dataclass
class Configuration:
    prefill: int
    decode: int
    mixed: int
    goodput_rps: float
    goodput_per_gpu: float
    why: str


@pytest.fixture
def planner(monkeypatch):
    """sim.plan and sim.workload stand-ins that record what they were given."""
    seen = {}
    plan, workload = types.ModuleType("sim.plan"), types.ModuleType("sim.workload")

    class Workload:
        @classmethod
        def from_lengths(cls, rate_rps, prompt_tokens, output_tokens, seed=0):
            seen["workload"] = (rate_rps, list(prompt_tokens), list(output_tokens), seed)
            return "workload"

    def least_gpus(workload, slo_ttft_ms, slo_tpot_ms, profile, max_gpus, bounds=None):
        seen["least_gpus"] = (workload, slo_ttft_ms, slo_tpot_ms, profile, max_gpus)
        seen["bounds"] = bounds
        return seen.get("answer")

    plan.least_gpus, plan.load_profile, workload.Workload = least_gpus, lambda name: f"profile:{name}", Workload
    monkeypatch.setitem(sys.modules, "sim.plan", plan)
    monkeypatch.setitem(sys.modules, "sim.workload", workload)
    return seen


def test_planner_recommend_asks_least_gpus_for_the_observed_mix(planner):
    settings = AutoscalerSettings(profile="h100", slo_ttft_ms=300, slo_tpot_ms=40, max_gpus=12)
    planner["answer"] = Configuration(2, 5, 0, 14.1, 2.01, "decode-bound")
    t = planner_recommend(LOAD, settings)
    assert (t.prefill, t.decode, t.mixed) == (2, 5, 0)
    assert t.reason.startswith("prefill 2, decode 5, mixed 0 for 12.30 rps over 60 s")
    assert "meets TTFT 300 ms, TPOT 40 ms (goodput 14.10 rps, 2.01 rps/GPU): decode-bound" in t.reason
    rate, prompts, outputs, _ = planner["workload"]
    assert rate == 12.3 and len(prompts) == len(outputs) == 1000
    assert all(128 <= n <= 8192 for n in prompts) and all(1 <= n <= 128 for n in outputs)
    assert planner["least_gpus"] == ("workload", 300, 40, "profile:h100", 12)
    assert planner["bounds"] == {"prefill": (1, 4), "decode": (1, 4), "mixed": (0, 0)}  # the pools the chart has
    planner["answer"] = None
    with pytest.raises(NoTarget, match="no configuration of at most 12 GPUs meets TTFT 300 ms, TPOT 40 ms for 12.30"):
        planner_recommend(LOAD, settings)


def test_no_requests_asks_for_the_minimums(planner):
    idle = ObservedLoad(0.0, TokenHistogram(EDGES, (0, 0, 0, 0)), TokenHistogram(EDGES, (0, 0, 0, 0)), 60, 0, 1)
    t = planner_recommend(idle, AutoscalerSettings(min_decode=2))
    assert (t.prefill, t.decode, t.mixed) == (1, 2, 0) and "no request completed in the last 60 s" in t.reason
    assert "least_gpus" not in planner



def test_the_real_planner_gives_a_target_for_an_observed_load():
    """The glue against sim.plan itself (the signatures above are its)."""
    t = planner_recommend(LOAD, AutoscalerSettings(profile="h100-llama3-8b", slo_ttft_ms=500, slo_tpot_ms=50,
                                                   max_gpus=8))
    assert t.prefill >= 1 and t.decode >= 1 and t.mixed == 0  # the pools the default settings have
    assert "for 12.30 rps over 60 s" in t.reason and "meets TTFT 500 ms, TPOT 50 ms" in t.reason
