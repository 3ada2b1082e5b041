"""services.common.tasks.TaskSet: a spawned task is held until done, wait covers tasks
spawned while waiting, cancel ends every task left."""

from __future__ import annotations

import asyncio
import gc

from services.common.tasks import TaskSet


def test_a_spawned_task_survives_collection_and_leaves_the_set_when_done():
    async def go():
        tasks, seen = TaskSet(), []

        async def work():
            await asyncio.sleep(0.01)
            seen.append("done")

        tasks.spawn(work())  # no reference kept here
        gc.collect()
        assert len(tasks) == 1
        await tasks.wait()
        return seen, len(tasks)

    assert asyncio.run(go()) == (["done"], 0)


def test_wait_covers_tasks_spawned_while_it_waits_and_errors_stay_theirs():
    async def go():
        tasks, seen = TaskSet(), []

        async def second():
            await asyncio.sleep(0.01)
            seen.append("second")

        async def first():
            await asyncio.sleep(0.01)
            tasks.spawn(second())
            raise RuntimeError("first failed")

        failing = tasks.spawn(first())
        await tasks.wait()
        return seen, failing.exception()

    seen, error = asyncio.run(go())
    assert seen == ["second"] and isinstance(error, RuntimeError)


def test_cancel_ends_every_task_left():
    async def go():
        tasks = TaskSet()
        blocked = [tasks.spawn(asyncio.sleep(60)) for _ in range(3)]
        await asyncio.sleep(0)
        await tasks.cancel()
        return [t.cancelled() for t in blocked], len(tasks)

    assert asyncio.run(go()) == ([True, True, True], 0)
