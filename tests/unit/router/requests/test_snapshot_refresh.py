"""The router's snapshot off the request's path (router/requests/cluster_view.py): past
its max age but within STALE_FACTOR times it, a request is served the cached snapshot at
once while one fetch runs in the background; older than that, or asked with an explicit
max age (release controller, admin), the caller waits for the fetch."""

from __future__ import annotations

import asyncio
import dataclasses

from router.requests.cluster_view import STALE_FACTOR, ClusterView
from tests.support.orchestrator import config, two_by_two


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class SlowDirectory:
    """The fake cluster's snapshots, each held until `release` is set; counted."""

    def __init__(self):
        self.fake, self.calls, self.release = two_by_two(), 0, asyncio.Event()

    async def snapshot(self, timeout_s):
        self.calls += 1
        await self.release.wait()
        return dataclasses.replace(await self.fake.snapshot(timeout_s))  # a new one each time


def test_a_stale_snapshot_is_served_at_once_and_refreshed_in_the_background():
    async def go():
        clock, directory = Clock(), SlowDirectory()
        view = ClusterView(directory, config(snapshot_max_age_ms=100), clock)
        directory.release.set()
        first = await view.get()  # nothing cached: the caller waits
        directory.release.clear()
        clock.t += 0.150  # past the max age, within STALE_FACTOR of it
        served = await asyncio.wait_for(view.get(), 1.0)  # the fetch is held: still answered
        again = await asyncio.wait_for(view.get(), 1.0)
        calls_while_held = directory.calls
        directory.release.set()
        await asyncio.sleep(0.01)  # the background fetch lands
        return first, served, again, calls_while_held, directory.calls, view

    first, served, again, held, calls, view = asyncio.run(go())
    assert served is first and again is first
    assert held == 2 and calls == 2  # one background fetch for both requests
    assert view.latest is not first  # replaced by the fetched one


def test_too_old_or_an_explicit_max_age_waits_for_the_directory():
    async def go():
        clock, directory = Clock(), SlowDirectory()
        view = ClusterView(directory, config(snapshot_max_age_ms=100), clock)
        directory.release.set()
        first = await view.get()
        clock.t += STALE_FACTOR * 0.100 + 0.001  # past the stale window
        late = await view.get()
        clock.t += 0.001
        explicit = await view.get(max_age_s=0.0)  # the release controller's kind of call
        directory.release.clear()
        clock.t += 0.150
        waiting = asyncio.ensure_future(view.get(max_age_s=0.1))
        await asyncio.sleep(0.01)
        blocked = not waiting.done()
        directory.release.set()
        return first, late, explicit, blocked, await waiting, directory.calls

    first, late, explicit, blocked, waited, calls = asyncio.run(go())
    assert late is not first and explicit is not late and waited is not explicit
    assert blocked and calls == 4


def test_a_zero_max_age_always_asks():
    async def go():
        clock, directory = Clock(), SlowDirectory()
        directory.release.set()
        view = ClusterView(directory, config(snapshot_max_age_ms=0), clock)
        got = []
        for _ in range(3):
            got.append(await view.get())
            clock.t += 0.001
        return got, directory.calls

    got, calls = asyncio.run(go())
    assert calls == 3 and len({id(c) for c in got}) == 3
