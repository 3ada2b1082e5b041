"""`pdserve up` saying each process's start as it happens.

A cluster takes tens of seconds to start (six processes, most of each start importing
torch); `ShownCluster` is a LocalCluster that writes one line when a process is
started and one when it answers, so the wait is never silent:

    starting redis
      redis      ready  0.1 s  pid 4242    127.0.0.1:61012        log .pdserve/logs/redis.log
    starting decode-0
    starting prefill-0
      prefill-0  ready  9.8 s  pid 4250    ...

It hooks the two places every start passes through — `start_redis` (Redis answers
PING) and `_wait` (a pdserve service answers its health check, the collector's and
a restart's too) — and changes nothing about how a process starts. Lines go to one
stream under a lock: the workers start in threads of their own.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from .launcher import LocalCluster


def shown_path(path: str | os.PathLike) -> str:
    """`path` relative to the working directory when it lies under it, else absolute."""
    rel = os.path.relpath(path)
    return os.path.abspath(path) if rel.startswith("..") else rel


class ShownCluster(LocalCluster):
    """A LocalCluster that writes each process's start and readiness to `stream`."""

    def __init__(self, spec, stream: TextIO | None = None):
        super().__init__(spec)
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def say(self, line: str) -> None:
        """Write one whole line (threads never interleave within one)."""
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    @contextlib.contextmanager
    def _step(self, name: str) -> Iterator[None]:
        """'starting NAME', then its readiness line once the body returns."""
        self.say(f"starting {name}")
        start_s = time.monotonic()
        yield
        p = self.procs[name]
        self.say(f"  {name:<10} ready {time.monotonic() - start_s:4.1f} s  pid {p.pid:<7} {p.address:<22} "
                 f"log {shown_path(p.log)}")

    # Must match LocalCluster.start_redis and LocalCluster._wait (tooling/cluster/launcher.py).
    def start_redis(self, timeout_s: float = 10.0) -> None:
        """LocalCluster.start_redis, said."""
        with self._step("redis"):
            super().start_redis(timeout_s)

    def _wait(self, name, address, timeout_s, proc) -> None:
        with self._step(name):
            super()._wait(name, address, timeout_s, proc)
