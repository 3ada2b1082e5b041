"""The decode reservation's lifecycle is an Enum moved by one checked transition
function (decode_worker/reservations.py `advance`), like the directory's."""

from __future__ import annotations

import pytest

from decode_worker.reservations import Reservation, ResState, advance

R, C, P, F, A = ResState.RESERVED, ResState.RECEIVING, ResState.PUBLISHED, ResState.FINISHED, ResState.ABORTED


def _res() -> Reservation:
    return Reservation("r/1", "r", "t", 1, seq=None, num_layers=2, first_block=0, last_block=2, expected={},
                       deadline_s=30.0)


@pytest.mark.parametrize("path", [[C, P, F], [C, P, A], [C, A], [P, F], [A]])
def test_legal_lifecycles(path):
    res = _res()
    for state in path:
        advance(res, state)
    assert res.state is path[-1]


@pytest.mark.parametrize("path", [[F], [C, F], [C, C], [A, C], [A, A], [C, P, F, A], [C, P, C], [C, P, P]])
def test_illegal_moves_raise_and_change_nothing(path):
    res = _res()
    for state in path[:-1]:
        advance(res, state)
    before = res.state
    with pytest.raises(RuntimeError, match="is not a legal move"):
        advance(res, path[-1])
    assert res.state is before
