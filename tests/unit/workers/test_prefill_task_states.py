"""A prefill's lifecycle is an Enum moved by one checked transition function
(prefill_worker/tasks.py `advance`): QUEUED -> COMPUTING -> COMMITTING -> PUBLISHED,
CANCELLED or FAILED from any step before the end, nothing after one."""

from __future__ import annotations

import pytest

from prefill_worker.tasks import Task, TaskState, advance, end

Q, C, M, P, X, F = (TaskState.QUEUED, TaskState.COMPUTING, TaskState.COMMITTING, TaskState.PUBLISHED,
                    TaskState.CANCELLED, TaskState.FAILED)


@pytest.mark.parametrize("path", [[C, M, P], [X], [C, X], [C, M, X], [F], [C, F], [C, M, F]])
def test_legal_lifecycles(path):
    task = Task("r", 1)
    for state in path:
        advance(task, state)
    assert task.state is path[-1]


@pytest.mark.parametrize("path", [[M], [P], [C, P], [C, C], [C, M, P, X], [X, C], [F, X], [C, M, P, F]])
def test_illegal_moves_raise_and_change_nothing(path):
    task = Task("r", 1)
    for state in path[:-1]:
        advance(task, state)
    before = task.state
    with pytest.raises(RuntimeError, match="is not a legal move"):
        advance(task, path[-1])
    assert task.state is before


def test_ending_a_task_that_already_ended_changes_nothing():
    task = Task("r", 1)
    advance(task, C)
    end(task, X)
    assert task.state is X
    end(task, F)  # a failure racing the cancel: the first end stands
    assert task.state is X
    done = Task("r", 2)
    for state in (C, M, P):
        advance(done, state)
    end(done, X)  # a cancel racing publication
    assert done.state is P
