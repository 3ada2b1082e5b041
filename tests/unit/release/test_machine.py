"""The release state machine: every legal and illegal transition, and the writes the
directory lets through (runtime/release)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from runtime.release.machine import (
    ROLLBACK_ORDER,
    IllegalTransition,
    Release,
    RollbackStep,
    check_transition,
    next_promotion,
)
from runtime.release.record import DeploymentManifest, ReleaseRecord, Rollback, StepRecord, check_write
from runtime.release.wire import BadRelease, decode, encode, record_from_pb, record_to_pb

P, S, C, A, R = Release.PINNED, Release.SHADOW, Release.CANARY, Release.ACTIVE, Release.ROLLED_BACK
LEGAL = {(P, S), (S, C), (C, A), (P, R), (S, R), (C, R), (A, R)}
"""Every legal move with the rollback incomplete; ROLLED_BACK -> PINNED needs it complete."""

MANIFEST = DeploymentManifest("tiny", ("m1",), "tok1", ("abi1",), ("ucx",), ("decode=1", "prefill=1"), 7,
                              ("colocated", "auto"), "colocated")


@pytest.mark.parametrize("current,target", list(itertools.product(Release, Release)))
def test_every_transition(current, target):
    if (current, target) in LEGAL:
        check_transition(current, target)
    else:
        with pytest.raises(IllegalTransition) as err:
            check_transition(current, target)
        assert current.name in str(err.value) or "already" in str(err.value)
    if (current, target) == (R, P):
        check_transition(R, P, rollback_complete=True)  # legal once the rollback completed


def test_refusals_say_what_is_legal():
    with pytest.raises(IllegalTransition, match=r"legal now: PINNED -> SHADOW"):
        check_transition(P, A)
    with pytest.raises(IllegalTransition, match="resumes"):
        check_transition(R, P)
    with pytest.raises(IllegalTransition, match="back to PINNED"):
        check_transition(R, A, rollback_complete=True)
    assert [next_promotion(s) for s in Release] == [S, C, A, None, None]


def _rolled_back(record: ReleaseRecord, *steps: StepRecord) -> ReleaseRecord:
    rb = Rollback(record.state, 1000, "drill", "operator", steps)
    return record.moved(R, 1000, "operator", "drill", rollback=rb)


def test_the_directory_accepts_only_machine_moves():
    first = ReleaseRecord(A, 1, MANIFEST)
    check_write(None, first)
    with pytest.raises(IllegalTransition, match="version"):
        check_write(first, dataclasses.replace(first, version=3))
    with pytest.raises(IllegalTransition, match="legal now"):
        check_write(first, first.moved(P, 2, "r", "x", manifest=MANIFEST))
    with pytest.raises(IllegalTransition, match="frozen"):
        check_write(first, first.next_version(manifest=dataclasses.replace(MANIFEST, model="other")))
    rolled = _rolled_back(first, StepRecord(RollbackStep.STOP_NEW_ROUTES, 1000, 1001))
    check_write(first, rolled)
    assert rolled.routes_stopped and rolled.rolling_back and rolled.rollback.next_step() is ROLLBACK_ORDER[1]
    with pytest.raises(IllegalTransition, match="needs the rollback completed"):
        check_write(rolled, rolled.moved(P, 2000, "r", "again", manifest=MANIFEST))
    skipped = rolled.next_version(rollback=dataclasses.replace(rolled.rollback, steps=rolled.rollback.steps + (
        StepRecord(RollbackStep.DRAIN_OR_ABORT_TRANSFERS, 1002),)))
    with pytest.raises(IllegalTransition, match="out of order"):
        check_write(rolled, skipped)
    rewritten = rolled.next_version(rollback=dataclasses.replace(rolled.rollback, steps=(
        StepRecord(RollbackStep.STOP_NEW_ROUTES, 1000, 1500),)))
    with pytest.raises(IllegalTransition, match="never rewritten"):
        check_write(rolled, rewritten)
    rb = rolled.rollback
    for step in ROLLBACK_ORDER[1:]:
        rb = rb.with_step(StepRecord(step, 1000 + step, 1001 + step, {"n": int(step)}))
    done = rolled.next_version(rollback=rb)
    check_write(rolled, done)
    assert done.rollback.complete and done.rollback.next_step() is None and done.rollback.duration_ms == 9
    pinned = done.moved(P, 3000, "operator", "fixed", manifest=dataclasses.replace(MANIFEST, route_epoch=9))
    check_write(done, pinned)
    assert not pinned.routes_stopped and [t.to_state for t in pinned.history] == [R, P]


def test_record_round_trips_through_its_proto():
    rec = _rolled_back(ReleaseRecord(C, 4, MANIFEST, 0.25), StepRecord(RollbackStep.STOP_NEW_ROUTES, 5, 6, {"a": 1}))
    assert decode(encode(rec)) == rec
    pb = record_to_pb(rec)
    pb.manifest.model = "tampered"  # the digest no longer matches the fields
    with pytest.raises(BadRelease, match="digest"):
        record_from_pb(pb)
    pb = record_to_pb(rec)
    pb.mode = 9
    with pytest.raises(BadRelease, match="mode: 9"):
        record_from_pb(pb)
    with pytest.raises(BadRelease, match="does not parse"):
        decode(b"\xff\xff")
