"""Hand-off event record: JSON lines appended to a file (PD_EVENT_LOG), for tests and drills.

Each line is {"event": name, "t": time.monotonic(), ...fields}; CLOCK_MONOTONIC is
one clock for every process on a host, so a test can order the events of a
prefill and a decode worker. Empty path: records nothing (the default).
"""

from __future__ import annotations

import asyncio
import json
import time


class EventLog:
    """Append-only JSON-lines record of hand-off events (tests assert their order).

    Times are time.monotonic() (CLOCK_MONOTONIC: comparable across processes on one host).
    """

    def __init__(self, path: str, worker: str = ""):
        self.path = path
        self.worker = worker
        """Written into every record (one file may collect every worker's events)."""
        self._f = open(path, "a", buffering=1) if path else None

    def __call__(self, event: str, **fields) -> None:
        if self._f is not None:
            self._f.write(json.dumps(dict(event=event, t=time.monotonic(), worker=self.worker,
                                          **fields)) + "\n")


PLAN_OPTIONS = ("one_by_one", "token_late")
"""What a fault test may ask of a prefill's hand-off plan, by naming it in the request id
(`FaultPause.asks`): a whole transfer's chunks one message each, so that a pause at
"chunk" falls between two (`one_by_one`); no token COMMIT from token 0's callback, so
that a pause at "sampled" or "computed" holds the token's COMMIT back (`token_late`)."""

PAUSE_STEPS = ("reserved", "computed", "sampled", "chunk", "commit", "published")
"""Hand-off steps a fault test can stop a request at (`FaultPause`): decode reserved its
blocks (the Reserve call has not returned); prefill computed (nothing sent); prefill
sampled token 0 (streamed: its COMMIT may have gone ahead, the token's not yet);
prefill between two chunks (mid-transfer); decode received the commit (not validated);
decode published (token 0 not yet streamed)."""


class FaultPause:
    """Fault injection for tests and drills: a request whose id names a step as
    `@<step>` waits `seconds` at that step (0: off, the default), so that a test can
    kill, stop, cancel or time out exactly there."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def wants(self, step: str, request_id: str) -> bool:
        """Does `request_id` pause at `step`? (A pause never changes what the hand-off
        does: prefill_worker/handoff.py HandOffPlan.)"""
        return self.seconds > 0 and f"@{step}" in request_id

    def asks(self, option: str, request_id: str) -> bool:
        """Does `request_id` ask its hand-off's plan for `option` (PLAN_OPTIONS)? Only with
        fault injection on, as for a pause."""
        assert option in PLAN_OPTIONS, option
        return self.seconds > 0 and f"@{option}" in request_id

    async def __call__(self, step: str, request_id: str) -> None:
        if self.wants(step, request_id):
            await asyncio.sleep(self.seconds)
