"""The event loop of in-process UCX in a test process.

ucxx binds the futures of this process's UCX runtime (runtime/transfer/ucx/runtime.py)
to the loop that first used it, for the life of the process; test modules that use
UCX in-process (pytest-xdist may put several in one worker) all run it on this one
loop, in a daemon thread.
"""

from __future__ import annotations

import asyncio
import functools
import threading


@functools.cache
def loop() -> asyncio.AbstractEventLoop:
    ucx_loop = asyncio.new_event_loop()
    threading.Thread(target=ucx_loop.run_forever, daemon=True, name="ucx-test-loop").start()
    return ucx_loop


def run(coro, timeout_s: float = 120.0):
    """Run `coro` on the UCX loop and return its result (raises what it raised)."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result(timeout_s)
