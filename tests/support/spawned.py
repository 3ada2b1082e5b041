"""Worker processes for the tests, on the plumbing bench/transfer.py uses too
(bench/_spawned.py: `Spawned`, its command protocol, RemoteError, TimeoutError).

`spawned` starts the processes a test or a module needs and, when it is done with
them, closes every one and checks each exited 0: a worker that crashed, or hung
on its way out, fails the test that owned it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from bench._spawned import RemoteError, Spawned

__all__ = ["RemoteError", "Spawned", "spawned"]


@contextlib.contextmanager
def spawned(*workers: tuple[str, str], **options) -> Iterator[list[Spawned]]:
    """One `Spawned(name, target, **options)` per (name, target), closed at the end."""
    started: list[Spawned] = []
    try:
        for name, target in workers:
            started.append(Spawned(name, target, **options))
        yield started
    finally:
        codes = {w.name: w.close() for w in started}
    assert all(code == 0 for code in codes.values()), f"a worker exited badly: {codes}"
