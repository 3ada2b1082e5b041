"""Background tasks that nothing awaits as they run: held by strong reference until done.

The event loop keeps only a weak reference to a task, so a task made and forgotten may be
collected before it finishes. `TaskSet.spawn` keeps it until it is done; the owner's stop
waits for the set (`wait`), cancels what is left (`cancel`), or gives it a grace period
and then cancels (`settle`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any


class TaskSet:
    """The owner's background tasks, each held until it is done."""

    def __init__(self, on_error: Callable[[BaseException], None] | None = None) -> None:
        """on_error(exc): called with the error of each task that fails (not cancelled),
        which is then retrieved; without it a task's error is left to its awaiter."""
        self._tasks: set[asyncio.Task] = set()
        self._on_error = on_error

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if self._on_error is not None and not task.cancelled() and task.exception() is not None:
            self._on_error(task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task]:
        return iter(list(self._tasks))

    async def wait(self) -> None:
        """Until every task, including those spawned meanwhile, is done (errors are theirs)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every task left and wait until each has ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def settle(self, grace_s: float, also: Iterable[asyncio.Task] = ()) -> None:
        """Wait up to `grace_s` for every task (and the owner's other tasks in `also`) to
        end by itself, then cancel the late ones; returns once each has ended."""
        tasks = [*self._tasks, *also]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
