"""runtime.common.tasks.TaskSet: a spawned task is held until done, wait covers tasks
spawned while waiting, cancel ends every task left, settle
gives a grace period and then cancels, on_error hears failures."""

from __future__ import annotations

import asyncio
import gc

from runtime.common.tasks import TaskSet


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


def test_settle_lets_tasks_finish_within_the_grace_and_cancels_the_late_ones():
    async def go():
        tasks = TaskSet()
        quick = tasks.spawn(asyncio.sleep(0.01, "quick"))
        slow = tasks.spawn(asyncio.sleep(60))
        other = asyncio.get_running_loop().create_task(asyncio.sleep(60))  # the owner's, not spawned
        t0 = asyncio.get_running_loop().time()
        await tasks.settle(0.2, also=[other])
        waited = asyncio.get_running_loop().time() - t0
        return quick.result(), slow.cancelled(), other.cancelled(), len(tasks), waited

    quick, slow_cancelled, other_cancelled, left, waited = asyncio.run(go())
    assert (quick, slow_cancelled, other_cancelled, left) == ("quick", True, True, 0)
    assert 0.2 <= waited < 30  # the grace, not the slow tasks' minute


def test_on_error_hears_each_failure_and_not_cancellations():
    async def go():
        heard = []
        tasks = TaskSet(on_error=heard.append)

        async def fail():
            raise ValueError("boom")

        tasks.spawn(fail())
        tasks.spawn(asyncio.sleep(60))
        await asyncio.sleep(0.01)
        await tasks.cancel()
        return heard

    heard = asyncio.run(go())
    assert [type(e) for e in heard] == [ValueError] and str(heard[0]) == "boom"
