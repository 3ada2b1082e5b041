"""Background tasks that nothing awaits as they run: held by strong reference until done.

The event loop keeps only a weak reference to a task, so a task made and forgotten may be
collected before it finishes. `TaskSet.spawn` keeps it until it is done; the owner's stop
waits for the set (`wait`) or cancels what is left (`cancel`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any


class TaskSet:
    """The owner's background tasks, each held until it is done."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
