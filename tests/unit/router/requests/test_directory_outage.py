"""Colocated serving outlives a directory outage, and disaggregated routes resume after
it (router/requests/cluster_view.py; docs/design.md, Failures); a hung worker is noticed by
its lease (router/requests/attempts.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from router.requests.orchestrator import Orchestrator
from router.types import Mode, Route, RouterError, StatusCode
from tests.support.orchestrator import assert_no_leaks, collect, config, params, run, started, two_by_two


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


@pytest.mark.parametrize("mode,stalled", [(Mode.COLOCATED, ("generate", "d1")),
                                          (Mode.DISAGGREGATED, ("decode_stream", "d1"))])
def test_a_hung_worker_is_noticed_when_its_lease_expires_not_at_the_token_timeout(mode, stalled):
    """The worker answers nothing (SIGSTOP); the directory expires its lease; the attempt
    fails then and the request completes elsewhere (docs/design.md, Failures)."""
    fake = two_by_two()
    fake.hang.add(stalled)

    async def go():
        orch = Orchestrator(fake, fake, config(liveness_check_s=0.02, first_token_timeout_s=30,
                                                token_timeout_s=30))
        task = asyncio.ensure_future(collect(orch, params(mode=mode)))
        while stalled not in [c[:2] for c in fake.calls]:
            await asyncio.sleep(0.01)
        fake.cluster = dataclasses.replace(  # d1's lease expired: gone from the snapshot
            fake.cluster, workers=tuple(w for w in fake.cluster.workers if w.worker_id != "d1"))
        return orch, *(await asyncio.wait_for(task, 10))

    orch, events, error = run(go())
    assert error is None, error
    assert events[-1].attempts == 2
    assert "d1's lease at epoch 5 expired (gone from the directory): dead or hung" in events[-1].failed_attempts
    assert "d1" not in {s.decode_worker_id for s in started(events)[1:]}


def test_a_directory_back_without_live_workers_keeps_the_last_snapshot():
    """After an outage longer than a lease the directory answers before the workers have
    registered again: requests keep going colocated instead of failing UNAVAILABLE."""
    fake = two_by_two()

    async def go():
        orch = Orchestrator(fake, fake, config(directory_retry_ms=0))
        assert (await collect(orch, params("before")))[1] is None
        fake.directory_down = True
        assert (await collect(orch, params("down")))[1] is None
        workers = fake.cluster
        fake.cluster = dataclasses.replace(workers, workers=())  # every lease lapsed
        fake.directory_down = False
        back = await collect(orch, params("back-but-empty"))
        fake.cluster = workers  # they registered again
        resumed = await collect(orch, params("resumed"))
        return orch, back, resumed

    orch, back, resumed = run(go())
    assert back[1] is None and back[0][-1].route is Route.COLOCATED
    assert resumed[1] is None and resumed[0][-1].route is Route.DISAGGREGATED
    assert not orch.view.degraded
