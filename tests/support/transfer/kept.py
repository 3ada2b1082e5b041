"""What a harness process still holds of the transfers that ended (R's and S's checks
after every test, tests/support/transfer/fixtures.py)."""

from __future__ import annotations

import asyncio
import gc


async def alive(cls: type) -> int:
    """Objects of `cls` alive once the loop has run a little (a verdict's task, a fence's
    clean-up end a turn or two after the other side heard) and the cycles are collected."""
    await asyncio.sleep(0.05)
    gc.collect()
    return sum(isinstance(o, cls) for o in gc.get_objects())
