"""The rollback over the in-process fake cluster (tests/support/orchestrator.py): the
steps run in order (runtime/release/machine.py, ROLLBACK_ORDER) and are recorded; a failure at any step leaves a
record that the next run — another router, once the runner's lease lapsed — resumes
from that step, keeping what ended; the completion gate refuses what does not hold."""

from __future__ import annotations

import asyncio

import pytest

from router.release import controller as release_controller
from router.release import rollback as steps
from router.release.controller import ReleaseConflict, ReleaseController
from router.release.probes import RollbackBlocked
from router.requests.orchestrator import Orchestrator
from runtime.release.machine import ROLLBACK_ORDER, Release, RollbackStep
from tests.support.orchestrator import assert_no_leaks, config, run, two_by_two

FAST = {"rollback_lease_s": 0.05, "rollback_drain_timeout_s": 0.3, "rollback_reclaim_timeout_s": 0.3}


def controller(fake, router_id: str = "router-a", **kw) -> ReleaseController:
    orch = Orchestrator(fake, fake, config(**{**FAST, **kw}))
    return ReleaseController(orch, router_id, orch.config, "tok")


def test_the_steps_run_in_order_each_recorded_and_new_requests_go_colocated():
    fake = two_by_two()

    async def go():
        ctl = controller(fake)
        created = await ctl.refresh()
        record = await ctl.rollback("drill", "operator")
        return created, record, ctl

    created, record, ctl = run(go())
    assert (created.state, created.version, created.manifest.tokenizer_identity) == (Release.ACTIVE, 1, "tok")
    rb = record.rollback
    assert record.state is Release.ROLLED_BACK and rb.complete and rb.from_state is Release.ACTIVE
    assert [s.step for s in rb.steps] == list(ROLLBACK_ORDER)
    assert all(s.ended_ms >= s.started_ms > 0 for s in rb.steps)
    assert rb.retired_epoch == 7 and fake.cluster.route_epoch == 8  # the fake's epoch, advanced once
    assert rb.step(RollbackStep.ROLLBACK_COMPLETE).counts["publications_under_retired_epoch"] == 0
    writes = [c for c in fake.calls if c[0] == "write_release"]
    assert writes[:2] == [("write_release", "ACTIVE", 1), ("write_release", "ROLLED_BACK", 2)]  # STOP: one write
    assert ctl.orch.default_mode == "colocated" and ctl.orch.view.colocated_only
    assert any(c[0] == "generate" for c in fake.calls)  # the colocated probe was served end to end
    assert_no_leaks(ctl.orch, fake)


@pytest.mark.parametrize("failing", ROLLBACK_ORDER[1:], ids=lambda s: s.name)
def test_a_failure_at_any_step_is_resumed_from_that_step_by_another_router(failing, monkeypatch):
    fake = two_by_two()
    real = steps.STEPS[failing]

    async def fails_once(ctl):
        monkeypatch.setitem(steps.STEPS, failing, real)
        raise RollbackBlocked(f"injected at {failing.name}")

    monkeypatch.setitem(steps.STEPS, failing, fails_once)
    # The lease is judged on the routers' wall clock; this one jumps past it when the test
    # says so, not when a loaded machine happens to take 50 ms between two calls.
    skipped_ms = [0]
    wall_ms = release_controller.now_ms
    monkeypatch.setattr(release_controller, "now_ms", lambda: wall_ms() + skipped_ms[0])
    lease = {"rollback_lease_s": 30.0}

    async def go():
        first = controller(fake, "router-a", **lease)
        await first.refresh()
        with pytest.raises(RollbackBlocked, match="injected"):
            await first.rollback("drill", "operator")
        stopped = first.record
        second = controller(fake, "router-b", **lease)
        await second.refresh()  # follows the record: stops routes at once, leaves the run to router-a
        assert second.orch.view.colocated_only and second.runner is None
        skipped_ms[0] += 31_000  # router-a's lease lapses
        await second.refresh()
        await second.runner
        return stopped, second.record

    stopped, done = run(go())
    rb = stopped.rollback
    assert stopped.state is Release.ROLLED_BACK and rb.next_step() is failing
    assert "blocked: injected" in rb.step(failing).detail and not rb.step(failing).ended
    ended_before = [s for s in rb.steps if s.ended]
    assert [s.step for s in ended_before] == list(ROLLBACK_ORDER[:ROLLBACK_ORDER.index(failing)])
    assert done.rollback.complete and done.rollback.owner == "router-b"
    assert list(done.rollback.steps[:len(ended_before)]) == ended_before  # kept, not run again
    assert [s.step for s in done.rollback.steps] == list(ROLLBACK_ORDER)


def test_a_live_runner_keeps_its_rollback():
    fake = two_by_two()

    async def go():
        first = controller(fake, "router-a", rollback_lease_s=30.0, rollback_step_pause_s=0.2)
        await first.refresh()
        await first.rollback("drill", "operator", wait=False)
        second = controller(fake, "router-b")
        await second.refresh()
        with pytest.raises(ReleaseConflict, match="router-a runs this rollback"):
            await second.rollback("again", "operator")
        first.runner.cancel()

    run(go())


def test_blocks_that_stay_reserved_block_the_rollback_at_reclaim():
    fake = two_by_two()
    fake.reserved_blocks["d1"] = 3

    async def go():
        ctl = controller(fake)
        await ctl.refresh()
        with pytest.raises(RollbackBlocked, match="3 blocks of unpublished transfers are still reserved"):
            await ctl.rollback("drill", "operator")
        return ctl.record

    record = run(go())
    assert record.rollback.next_step() is RollbackStep.RECLAIM_UNPUBLISHED and not record.rollback.complete


def test_a_publication_under_the_retired_epoch_fails_the_completion_gate(monkeypatch):
    fake = two_by_two()
    real = steps.STEPS[RollbackStep.RECLAIM_UNPUBLISHED]

    async def late_publication(ctl):
        fake.publications_by_epoch[ctl.record.rollback.retired_epoch] = 1
        return await real(ctl)

    monkeypatch.setitem(steps.STEPS, RollbackStep.RECLAIM_UNPUBLISHED, late_publication)

    async def go():
        ctl = controller(fake)
        await ctl.refresh()
        with pytest.raises(RollbackBlocked, match="1 transfers published under route epoch 7 after it was retired"):
            await ctl.rollback("drill", "operator")
        return ctl.record

    assert not run(go()).rollback.complete


def test_a_stop_that_cannot_be_written_leaves_the_release_as_it_was():
    fake = two_by_two()

    async def go():
        ctl = controller(fake)
        await ctl.refresh()
        fake.directory_down = True
        with pytest.raises(Exception, match="directory unreachable"):
            await ctl.rollback("drill", "operator")
        fake.directory_down = False
        return ctl

    ctl = run(go())
    assert fake.release.state is Release.ACTIVE and fake.release.rollback is None
    assert not ctl.orch.view.routes_stopped  # this router resumed disaggregated routes too


def test_a_worker_that_never_reports_its_connector_off_blocks_the_rollback():
    fake = two_by_two()
    fake.deaf.add("p1")

    async def go():
        ctl = controller(fake, rollback_connector_timeout_s=0.3)
        await ctl.refresh()
        with pytest.raises(RollbackBlocked, match="p1 still report their connector on"):
            await ctl.rollback("drill", "operator")
        return ctl.record

    assert run(go()).rollback.next_step() is RollbackStep.DISABLE_CONNECTOR


def test_a_read_in_flight_while_the_router_writes_does_not_put_the_older_version_back():
    fake = two_by_two()

    async def go():
        ctl = controller(fake)
        await ctl.refresh()  # version 1 created
        real_get, gate = fake.get_release, asyncio.Event()

        async def slow_get(timeout_s):  # the read leaves now, its answer comes after the write
            answer = await real_get(timeout_s)
            await gate.wait()
            return answer

        fake.get_release = slow_get
        reading = asyncio.ensure_future(ctl.refresh(force=True))
        await asyncio.sleep(0.01)
        writing = asyncio.ensure_future(ctl.write(ctl.record.next_version()))
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(reading, writing)
        fake.get_release = real_get
        return ctl.record.version, fake.release.version

    assert run(go()) == (2, 2)
