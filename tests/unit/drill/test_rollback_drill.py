"""The rollback drill against the in-memory fake (no processes): a healthy cluster passes
every check, and each thing that can go wrong fails its check, with the figure."""

from __future__ import annotations

import json

import pytest

from pdserve_ops.drill.checks import EXPECTED_STEPS
from pdserve_ops.drill.cluster import DrillError
from pdserve_ops.drill.fake import FakeCluster, FakeKnobs
from pdserve_ops.drill.report import render
from pdserve_ops.drill.run import DrillOptions, rollback_drill

QUICK = DrillOptions(rate_rps=200, duration_s=0.4, trigger_after_s=0.1, max_tokens=6, min_disaggregated=3,
                     settle_s=0, step_dwell_s=0)
CHECKS = ["requests_failed", "disaggregated_before_rollback", "tokens_equal_colocated",
          "publications_under_old_epoch", "reserved_blocks_after", "open_transactions_after",
          "rollback_complete", "decode_replaced"]


def drill(**knobs):
    cluster = FakeCluster(FakeKnobs(**knobs))
    return cluster, rollback_drill(cluster, QUICK)


def failing(report) -> dict:
    return {c.name: c for c in report.checks if not c.passed}


def test_a_healthy_cluster_passes_every_check():
    cluster, r = drill()
    assert [c.name for c in r.checks] == CHECKS
    assert r.passed, render(r)
    assert r.sent >= 20 and r.succeeded == r.sent and r.failed == 0 and r.compared == r.sent
    assert r.disaggregated_before >= 3 and r.routes["disaggregated"] >= 3 and r.routes["colocated"] >= 1
    assert [s.step for s in r.steps] == list(EXPECTED_STEPS) and all(s.ended_unix_ms for s in r.steps)
    assert (r.release_before, r.release_after, r.publications_under_old_epoch) == ("active", "rolled_back", 0)
    assert (r.reserved_blocks_after, r.open_transactions_after) == (0, 0)
    assert [(p.worker_id, p.epoch_before, p.epoch_after) for p in r.decode.replacements] == \
        [("decode-0", 1, 2), ("decode-1", 1, 2)]
    assert [v.mode for v in cluster.recorded] == ["rolled_back"]
    doc = json.loads(json.dumps(r.to_dict()))
    assert doc["passed"] is True and doc["options"]["rate_rps"] == 200
    text = render(r)
    assert text.startswith("drill rollback on fake: PASS")
    assert all(f"PASS  {name}" in text for name in CHECKS)
    assert "  ROLLBACK_COMPLETE" in text and "publications_under_retired_epoch=0" in text


def test_a_failed_request_fails_the_drill_with_its_error():
    _, r = drill(fail_after_rollback=2)
    assert list(failing(r)) == ["requests_failed"]
    assert (r.failed, failing(r)["requests_failed"].value) == (2, 2)
    assert len(r.errors) == 2 and all("UNAVAILABLE: fake: request drill-" in e for e in r.errors)


def test_tokens_unequal_to_colocated_fail_the_drill():
    _, r = drill(mismatched_requests=2)
    assert list(failing(r)) == ["tokens_equal_colocated"]
    assert r.mismatch_count == 2 and all("(disaggregated on prefill-0->decode-" in m for m in r.mismatches)
    assert all("first differs at token 5" in m for m in r.mismatches)


def test_a_missing_publication_count_is_not_measured_and_fails():
    _, r = drill(publications_under_retired_epoch=None)
    (check,) = failing(r).values()
    assert (check.name, check.value, r.publications_under_old_epoch) == ("publications_under_old_epoch", None, None)
    assert "NOT MEASURED" in check.detail and "publications_under_retired_epoch" in check.detail
    (line,) = [line for line in render(r).splitlines() if "publications_under_old_epoch" in line]
    assert line.split()[:3] == ["FAIL", "publications_under_old_epoch", "NOT"] and "NOT MEASURED:" in line
    assert r.to_dict()["publications_under_old_epoch"] is None


def test_publications_under_the_old_epoch_fail_the_drill():
    _, r = drill(publications_under_retired_epoch=3)
    assert list(failing(r)) == ["publications_under_old_epoch"] and r.publications_under_old_epoch == 3


@pytest.mark.parametrize("knob, name", [("reserved_blocks_after", "reserved_blocks_after"),
                                        ("open_transactions_after", "open_transactions_after")])
def test_leftovers_fail_the_drill(knob, name):
    _, r = drill(**{knob: 4})
    assert list(failing(r)) == [name] and failing(r)[name].value == 4


def test_a_rollback_stopped_at_a_step_fails_the_drill_with_the_steps_it_ran():
    _, r = drill(rollback_blocked_at="RECLAIM_UNPUBLISHED")
    check = failing(r)["rollback_complete"]
    assert "the rollback stopped: FAILED_PRECONDITION" in check.detail and "not complete" in check.detail
    assert [s.step for s in r.steps] == list(EXPECTED_STEPS[:7]) and r.steps[-1].ended_unix_ms == 0
    assert "publications_under_old_epoch" in failing(r)  # ROLLBACK_COMPLETE never ran: nothing counted


def test_a_decode_roll_back_that_fails_fails_the_drill():
    _, r = drill(decode_error="decode-1 not registered with a new lease within 5 s")
    check = failing(r)["decode_replaced"]
    assert list(failing(r)) == ["decode_replaced"]
    assert "decode-1 not registered" in check.detail and "not replaced: decode-0, decode-1" in check.detail


def test_without_disaggregated_traffic_the_drill_says_it_proves_nothing():
    r = rollback_drill(FakeCluster(mode="pinned"), QUICK)
    check = failing(r)["disaggregated_before_rollback"]
    assert check.value == 0 and "proves nothing" in check.detail
    assert r.release_before == "pinned"


def test_a_release_rolled_back_already_is_refused():
    cluster = FakeCluster()
    rollback_drill(cluster, QUICK)
    with pytest.raises(DrillError, match="ROLLED_BACK already"):
        rollback_drill(cluster, QUICK)


@pytest.mark.parametrize("kw, message", [({"rate_rps": 0}, "rate_rps must be > 0"),
                                         ({"trigger_after_s": 30, "duration_s": 10}, "must not exceed duration_s"),
                                         ({"canary_fraction": 2.0}, "canary_fraction must be in"),
                                         ({"concurrency": 0}, "concurrency must be > 0")])
def test_bad_options_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        DrillOptions(**kw)
