"""What the release says about itself (docs/design.md, The release): where the live
cluster drifted from the frozen manifest, the state and the command in every refusal,
what `pdserve up` prints, and `pdctl release promote` with no state named."""

from __future__ import annotations

import dataclasses
import io

import pytest

from pdserve_client.release import ReleaseChange, ReleaseView, RollbackStepView, RollbackView, standing, stopped_routes
from pdserve_ops import cli
from router.release.controller import GatesFailed, moves
from router.release.gates import Check
from router.release.manifest import drift
from runtime.release.machine import ROLLBACK_ORDER, Release, RollbackStep
from runtime.release.record import DeploymentManifest, ReleaseRecord, Rollback, StepRecord

TINY = DeploymentManifest(model="tiny", model_identity=("a" * 64,), tokenizer_identity="none",
                          cache_abi_digests=("c" * 64,), transports=("ucx",), roles=("decode=1", "prefill=1"),
                          route_epoch=7, allowed_modes=("colocated",), fallback_mode="colocated")


def test_drift_names_each_identity_frozen_then_live_and_nothing_else():
    live = dataclasses.replace(TINY, model="/ckpt", model_identity=("b" * 64,), cache_abi_digests=("d" * 64,),
                               roles=("decode=2", "prefill=1"), route_epoch=9)
    assert drift(TINY, live) == ["model tiny -> /ckpt", f"model_identity {'a' * 12} -> {'b' * 12}",
                                 f"cache_abi_digests {'c' * 12} -> {'d' * 12}"]
    # Scaling and a rollback's new epoch are the same deployment.
    assert drift(TINY, dataclasses.replace(TINY, roles=("decode=3",), route_epoch=10)) == []


@pytest.mark.parametrize(("state", "says"), [
    (Release.PINNED, "the release is PINNED: `pdctl release promote --reason R` moves it to SHADOW or "
                     "`pdctl release rollback --reason R` rolls it back"),
    (Release.ACTIVE, "the release is ACTIVE: `pdctl release rollback --reason R` rolls it back"),
    (Release.ROLLED_BACK, "the release is ROLLED_BACK: `pdctl release promote --reason R` moves it to PINNED"),
], ids=lambda v: v.name if isinstance(v, Release) else "")
def test_a_refusal_names_the_state_and_the_command_that_moves_it(state, says):
    done = Rollback(Release.ACTIVE, 1, "r", "op", tuple(StepRecord(s, 1, 2) for s in ROLLBACK_ORDER))
    assert moves(ReleaseRecord(state, 3, TINY, rollback=done)) == says


def test_an_unfinished_rollback_is_resumed_not_promoted():
    open_rb = Rollback(Release.ACTIVE, 1, "r", "op", (StepRecord(RollbackStep.STOP_NEW_ROUTES, 1, 2),))
    assert "its rollback unfinished: `pdctl release rollback --reason R` resumes it" in moves(
        ReleaseRecord(Release.ROLLED_BACK, 3, TINY, rollback=open_rb))


def test_failed_gates_say_the_release_stays_where_it_was():
    message = str(GatesFailed(Release.CANARY, Release.ACTIVE, [Check("canary_samples", False, "3 of 20")]))
    assert message.startswith("promotion to ACTIVE refused (the release stays CANARY; ")
    assert message.endswith("1 of 1 gates failed: canary_samples FAILED: 3 of 20")


def view(mode: str, **kw) -> ReleaseView:
    history = ({"from_mode": "active", "to_mode": mode, "at_unix_ms": 1_700_000_000_000, "by": "operator",
                "reason": "drill", "gates": ""},)
    return ReleaseView(mode, 2, {"digest": "f" * 64, "model": "tiny"}, history=history, **kw)


def test_up_says_nothing_of_an_active_release_under_its_own_manifest():
    assert standing(view("active")) == ""


def test_up_says_a_rolled_back_release_what_it_serves_and_what_moves_it():
    done = RollbackView("active", 1, "drill", "operator",
                        (RollbackStepView("ROLLBACK_COMPLETE", 1, 2, {}, ""),), 1, "router", 2)
    said = standing(view("rolled_back", rollback=done, routes_stopped=True))
    assert said.startswith("release ROLLED_BACK since 2023-11-14 22:13:20.000Z (operator: drill): every request "
                           "runs colocated")
    assert "`pdctl release promote --reason R` moves it to PINNED, then one state at a time on to ACTIVE" in said
    assert "rollback --reason R" not in said  # there is nothing to roll back


def test_up_says_a_manifest_frozen_for_another_deployment_even_when_active():
    said = standing(view("active", manifest_drift="model tiny -> /ckpt"))
    assert said.startswith("release manifest ffffffffffffffff is NOT the live cluster's: model tiny -> /ckpt; ")
    assert "`pdctl release rollback --reason R`, then `pdctl release promote --reason R` to PINNED" in said


def test_a_colocated_answer_to_a_disaggregated_request_names_the_release_only_when_it_is_why():
    assert stopped_routes(view("active")) == ""
    said = stopped_routes(view("rolled_back", routes_stopped=True))
    assert said.startswith("the release is ROLLED_BACK, which stops disaggregated routes until it is promoted")


class Promotes:
    """The one Client call `pdctl release promote` makes, answered as the router would."""

    def __init__(self):
        self.asked = []

    def promote(self, target, canary_fraction=0.0, reason=""):
        self.asked.append((target, reason))
        return ReleaseChange("rolled_back", ReleaseView("pinned", 4))


def test_release_promote_with_no_state_named_asks_for_the_next():
    args = cli.build_parser().parse_args(["release", "promote", "--reason", "x"])
    client, out = Promotes(), io.StringIO()
    assert args.run(client, args, out) == 0
    assert client.asked == [("", "x")]  # "" on the wire: the router's next state
    assert out.getvalue().startswith("release: ROLLED_BACK -> PINNED (version 4)")


def test_release_promote_with_a_state_named_asks_for_it():
    args = cli.build_parser().parse_args(["release", "promote", "shadow", "--reason", "x"])
    assert args.target == "shadow"
