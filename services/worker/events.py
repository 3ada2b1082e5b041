"""Hand-off event record: JSON lines appended to a file (PD_EVENT_LOG), for tests and drills.

Each line is {"event": name, "t": time.monotonic(), ...fields}; CLOCK_MONOTONIC is
one clock for every process on a host, so a test can order the events of a
prefill and a decode worker. Empty path: records nothing (the default).
"""

from __future__ import annotations

import json
import time


class EventLog:
    """Append-only JSON-lines record of hand-off events (tests assert their order).

    Times are time.monotonic() (CLOCK_MONOTONIC: comparable across processes on one host).
    """

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "a", buffering=1) if path else None

    def __call__(self, event: str, **fields) -> None:
        if self._f is not None:
            self._f.write(json.dumps(dict(event=event, t=time.monotonic(), **fields)) + "\n")
