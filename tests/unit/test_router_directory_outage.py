"""Colocated serving outlives a directory outage; disaggregated routes resume after it
(router/cluster_view.py; issue 15, item 4)."""

from __future__ import annotations

import asyncio

from orchestrator_support import assert_no_leaks, collect, config, params, run, started, two_by_two
from router.orchestrator import Orchestrator
from router.types import Route, RouterError, StatusCode


def test_colocated_serving_survives_a_directory_outage_and_splits_resume():
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config(directory_retry_ms=200))
        before = await collect(orch, params("before"))
        fake.directory_down = True
        snapshots = fake.snapshots
        during = [await collect(orch, params(f"during-{i}")) for i in range(5)]
        asked_during = fake.snapshots - snapshots
        degraded = orch.view.degraded
        fake.directory_down = False
        await asyncio.sleep(0.25)  # past directory_retry_ms: the next request asks again
        after = await collect(orch, params("after"))
        return orch, before, during, asked_during, degraded, after

    orch, before, during, asked_during, degraded, after = run(go())
    assert before[1] is None and before[0][-1].route is Route.DISAGGREGATED
    for events, error in during:
        assert error is None, error
        # Served colocated at the first attempt: no split was tried against the dead directory.
        assert [s.route for s in started(events)] == [Route.COLOCATED]
        assert events[-1].attempts == 1 and events[-1].failed_attempts == ""
    assert degraded
    assert asked_during == 1, "requests during the outage wait for the retry interval, not a timeout each"
    assert after[1] is None and after[0][-1].route is Route.DISAGGREGATED
    assert not orch.view.degraded
    assert not [c for c in fake.calls if c[0] == "txn_reserve" and "during" in c[1]]
    assert_no_leaks(orch, fake)


def test_no_snapshot_ever_is_unavailable():
    fake = two_by_two()
    fake.directory_down = True

    async def go():
        orch = Orchestrator(fake, fake, config())
        return await collect(orch, params())

    events, error = run(go())
    assert events == [] and isinstance(error, RouterError)
    assert error.code is StatusCode.UNAVAILABLE and "no cluster snapshot was ever fetched" in error.message
