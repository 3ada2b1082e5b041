"""The policy (autoscaler/policy.py) driven decision by decision with a clock of our own:
up after up_stable_s of agreeing targets, down only after down_stable_s (a target the
other way restarts the wait), the cool-down after any change, max_step, the bounds, and a
reason on every decision."""

from __future__ import annotations

from autoscaler.config import AutoscalerSettings
from autoscaler.policy import Policy, Rules, Sizes, Target

BOUNDS = {"prefill": (1, 6), "decode": (1, 8), "mixed": (0, 0)}


def policy(**kw) -> Policy:
    rules = dict(up_stable_s=30, down_stable_s=300, cooldown_s=60, max_step=1, bounds=BOUNDS) | kw
    return Policy(Rules(**rules))


def target(prefill: int, decode: int, mixed: int = 0) -> Target:
    return Target(prefill, decode, mixed, f"planner says prefill {prefill}, decode {decode}")


def test_up_after_up_stable_s_of_agreeing_targets_then_one_step():
    p, now = policy(), Sizes(1, 3)
    first = p.decide(0, now, target(1, 5))
    assert first.action == "hold" and "decode wants 5 (now 3), up after 30 s stable (0 s so far)" in first.reason
    assert p.decide(20, now, target(1, 4)).action == "hold"
    up = p.decide(30, now, target(1, 6))
    assert up.action == "scale" and up.changed == ("decode",)
    assert up.new == Sizes(1, 4)  # max_step 1 of the lowest target of the streak (4)
    assert up.reason.startswith("decode 3 -> 4: up after 30 s stable (wanted 4); planner: planner says")


def test_down_waits_down_stable_s_and_a_target_the_other_way_restarts_the_wait():
    p, now = policy(), Sizes(2, 4)
    assert p.decide(0, now, target(2, 2)).action == "hold"
    assert p.decide(200, now, target(2, 5)).action == "hold"  # up: the down streak ends
    assert p.decide(210, now, target(2, 2)).action == "hold"  # a new down streak from 210
    held = p.decide(500, now, target(2, 3))
    assert held.action == "hold" and "down after 300 s stable (290 s so far)" in held.reason
    down = p.decide(510, now, target(2, 2))
    assert down.new == Sizes(2, 3)  # the highest target of the streak (3), one step
    assert down.reason.startswith("decode 4 -> 3: down after 300 s stable (wanted 3)")


def test_no_change_during_the_cool_down_and_streaks_count_on():
    p = policy(up_stable_s=0, cooldown_s=60)
    assert p.decide(0, Sizes(1, 1), target(3, 1)).new == Sizes(2, 1)
    cool = p.decide(10, Sizes(2, 1), target(3, 3))
    assert cool.action == "hold" and cool.reason.startswith("hold: cool-down 50 s left")
    after = p.decide(60, Sizes(2, 1), target(3, 3))
    assert after.new == Sizes(3, 2) and after.changed == ("prefill", "decode")


def test_max_step_bounds_each_pool_per_decision():
    p = policy(up_stable_s=0, cooldown_s=0, max_step=2)
    assert p.decide(0, Sizes(1, 1), target(1, 8)).new == Sizes(1, 3)
    assert p.decide(1, Sizes(1, 3), target(1, 8)).new == Sizes(1, 5)


def test_bounds_win_over_the_planner_and_bring_a_pool_back_into_range():
    p = policy(up_stable_s=0, down_stable_s=0, cooldown_s=0)
    d = p.decide(0, Sizes(1, 8), target(9, 20, mixed=3))
    assert d.target == Sizes(6, 8, 0) and d.new == Sizes(2, 8, 0)
    assert p.decide(1, Sizes(1, 1), target(0, 0)).action == "hold"  # at the minimums already
    assert "at target (prefill 1, decode 1, mixed 0)" in p.decide(2, Sizes(1, 1), target(0, 0)).reason
    assert p.decide(3, Sizes(7, 1), target(1, 1)).new == Sizes(6, 1)  # above max: down


def test_no_target_holds_with_why_and_breaks_the_streak():
    p = policy()
    p.decide(0, Sizes(1, 1), target(1, 2))
    none = p.decide(20, Sizes(1, 1), None, "no observed load: router down")
    assert none.action == "hold" and none.reason == "hold: no target: no observed load: router down"
    assert none.to_dict()["target"] is None
    assert p.decide(30, Sizes(1, 1), target(1, 2)).action == "hold"  # the streak restarted at 30
    assert p.decide(60, Sizes(1, 1), target(1, 2)).action == "scale"


def test_rules_from_settings_and_a_decision_as_json():
    s = AutoscalerSettings.from_env({"PD_AUTOSCALER_UP_STABLE_S": "5", "PD_AUTOSCALER_MAX_DECODE": "9",
                                     "PD_AUTOSCALER_MAX_STEP": "3"})
    rules = Rules.of(s)
    assert (rules.up_stable_s, rules.max_step, rules.bounds["decode"]) == (5, 3, (1, 9))
    d = Policy(rules).decide(7.5, Sizes(1, 1), target(1, 2))
    assert d.to_dict() == {"at_s": 7.5, "action": "hold", "current": {"prefill": 1, "decode": 1, "mixed": 0},
                           "new": {"prefill": 1, "decode": 1, "mixed": 0},
                           "target": {"prefill": 1, "decode": 2, "mixed": 0}, "reason": d.reason}
