"""The router attempt's lifecycle is an Enum with one checked transition function:
stages move only forward along the two routes, and what teardown must undo (D's
state, P's prefill) is read from the stage, not from flags set beside it."""

from __future__ import annotations

import pytest

from router.requests.attempt import Attempt, Stage, advance
from router.types import Route
from runtime.directory.records import WorkerRole
from tests.support.orchestrator import worker

SPLIT = [Stage.DECODE_RESERVE, Stage.DIRECTORY_RESERVE, Stage.PREFILL, Stage.DECODE]


def _split() -> Attempt:
    return Attempt(1, Route.DISAGGREGATED, decode=worker("d0", WorkerRole.DECODE),
                   prefill=worker("p0", WorkerRole.PREFILL))


def test_a_split_attempt_walks_its_stages_in_order_and_engages_as_it_goes():
    att = _split()
    assert not att.decode_engaged and not att.prefill_engaged
    seen = []
    for stage in SPLIT:
        advance(att, stage)
        seen.append((stage, att.decode_engaged, att.prefill_engaged))
    assert seen == [(Stage.DECODE_RESERVE, True, False), (Stage.DIRECTORY_RESERVE, True, False),
                    (Stage.PREFILL, True, True), (Stage.DECODE, True, True)]


def test_a_colocated_attempt_has_one_stage_and_never_engages_a_prefill():
    att = Attempt(1, Route.COLOCATED, decode=worker("d0", WorkerRole.DECODE))
    advance(att, Stage.COLOCATED)
    assert att.decode_engaged and not att.prefill_engaged


@pytest.mark.parametrize("path", [
    [Stage.PREFILL],                                          # skips both reserves
    [Stage.DECODE_RESERVE, Stage.PREFILL],                    # skips the directory
    [Stage.DECODE_RESERVE, Stage.DIRECTORY_RESERVE, Stage.DECODE_RESERVE],  # backwards
    [Stage.COLOCATED, Stage.DECODE],                          # colocated has no hand-off
    [Stage.DECODE_RESERVE, Stage.COLOCATED],                  # switches route mid-way
])
def test_illegal_moves_are_refused_naming_the_attempt_and_both_stages(path):
    att = _split()
    with pytest.raises(RuntimeError, match="is not a legal move") as err:
        for stage in path:
            advance(att, stage)
    assert "attempt 1 (disaggregated p0 -> d0)" in str(err.value)
    assert att.stage is not path[-1] or path[-1] is Stage.DECODE_RESERVE
