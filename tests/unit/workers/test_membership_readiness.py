"""Readiness of a worker follows its lease (runtime/worker/membership.py): NOT_SERVING
until registered, while the directory is unreachable at start, after a lease loss
until re-registered, and after a whole lease without a renewal; `leave` deregisters.
Driven over a scripted directory client and a manual clock (no processes)."""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.directory.client import Lease, Registration
from runtime.directory.records import DirectoryUnavailable, LoadReport, WorkerCapacity, WorkerInfo, WorkerRole
from runtime.worker import membership as membership_mod
from runtime.worker.membership import Membership

CAP = WorkerCapacity(total_blocks=8, max_decode_batch=2, max_prefill_tokens=64, block_size=16,
                     vocab_size=512, max_model_len=256)


class ScriptedDirectory:
    """A DirectoryClient whose answers the test sets: `up` (False: every call is
    DirectoryUnavailable) and `lease_ok` (False: the next heartbeat finds the lease lost)."""

    def __init__(self):
        self.up = True
        self.lease_ok = True
        self.epoch = 0
        self.registered: set[str] = set()
        self.calls: list[str] = []
        self.beats: list[float] = []  # when each heartbeat came (time.monotonic)

    def _check(self, what: str) -> None:
        self.calls.append(what)
        if not self.up:
            raise DirectoryUnavailable(f"{what}: directory down")

    async def register_worker(self, info: WorkerInfo) -> Registration:
        self._check("register")
        self.epoch += 1
        self.lease_ok = True
        self.registered.add(info.worker_id)
        return Registration(self.epoch, 300, 0)

    async def heartbeat(self, worker_id: str, epoch: int, load: LoadReport | None = None) -> Lease:
        self._check("heartbeat")
        self.beats.append(time.monotonic())
        ok = self.lease_ok and epoch == self.epoch
        return Lease(ok, 300 if ok else 0, 0)

    async def deregister_worker(self, worker_id: str, epoch: int, timeout_s: float | None = None) -> bool:
        self._check("deregister")
        live = worker_id in self.registered and epoch == self.epoch and self.lease_ok
        self.registered.discard(worker_id)
        return live


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def member(directory: ScriptedDirectory, clock: Clock, states: list[bool], lost: list[int]) -> Membership:
    async def on_ready(ready: bool) -> None:
        states.append(ready)

    async def on_lost() -> None:
        lost.append(directory.epoch)

    info = WorkerInfo("decode-0", WorkerRole.DECODE, "127.0.0.1:1", "tcp://127.0.0.1:2", "abi", CAP)
    return Membership(directory, info, LoadReport, on_lease_lost=on_lost, on_ready=on_ready, clock=clock)


async def until(done, timeout_s: float = 3.0) -> None:
    """Poll `done()` until it holds (a busy host may delay the task that makes it so)."""
    async def wait():
        while not done():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), timeout_s)


async def settle(m: Membership, states: list[bool], want: bool, timeout_s: float = 3.0) -> None:
    """Wait until the last readiness reported is `want`."""
    await until(lambda: states and states[-1] is want, timeout_s)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(membership_mod, "REGISTER_BACKOFF_MAX_S", 0.05)


def test_not_ready_while_the_directory_is_unreachable_at_start_then_ready():
    async def main():
        d, clock, states, lost = ScriptedDirectory(), Clock(), [], []
        d.up = False
        m = member(d, clock, states, lost)
        starting = asyncio.create_task(m.start())
        await asyncio.sleep(0.5)  # far more attempts than the old limit would matter for: still trying
        assert not starting.done() and states == [] and m.epoch == 0
        assert d.calls.count("register") >= 3
        d.up = True
        await asyncio.wait_for(starting, 3.0)
        assert states == [True] and m.epoch == 1
        assert await m.leave() and d.registered == set()
    asyncio.run(main())


def test_a_lost_lease_is_not_ready_until_registered_again():
    async def main():
        d, clock, states, lost = ScriptedDirectory(), Clock(), [], []
        m = member(d, clock, states, lost)
        await m.start()
        assert states == [True]
        seen: list[bool] = []

        async def on_ready(ready: bool) -> None:
            seen.append(ready)
            if seen == [False]:
                d.up = False  # re-registration fails for a while
                asyncio.get_running_loop().call_later(0.3, setattr, d, "up", True)
        m.on_ready = on_ready
        d.lease_ok = False
        await settle(m, seen, True)
        assert seen[0] is False and set(lost) == {1}  # lost: not ready, unpublished state dropped
        assert m.epoch == 2 and seen[-1] is True  # re-registered: ready again
        assert await m.leave()
    asyncio.run(main())


def test_no_renewal_for_a_whole_lease_is_not_ready_and_the_next_one_is():
    async def main():
        d, clock, states, lost = ScriptedDirectory(), Clock(), [], []
        m = member(d, clock, states, lost)
        await m.start()
        d.up = False
        await asyncio.sleep(0.25)  # heartbeats fail, but the lease may still stand
        assert states == [True]
        clock.now += m.lease_ttl_s + 0.01  # a whole lease since the last renewal
        await settle(m, states, False)
        d.up = True  # the directory answers: the lease was still there (lease_ok)
        await settle(m, states, True)
        assert lost == [] and m.epoch == 1
        assert await m.leave()
    asyncio.run(main())


def test_leave_deregisters_and_a_lease_lost_while_leaving_is_not_registered_again():
    async def main():
        d, clock, states, lost = ScriptedDirectory(), Clock(), [], []
        m = member(d, clock, states, lost)
        await m.start()
        m.leaving = True  # draining
        d.lease_ok = False
        await settle(m, states, False)
        await asyncio.sleep(0.3)
        assert d.calls.count("register") == 1 and lost and states[-1] is False
        assert not await m.leave()  # the lease was gone already
        d.up = False
        m2 = member(d, clock, [], [])
        d.up = True
        await m2.start()
        d.up = False
        assert not await m2.leave()  # directory away: best effort, the lease expires by itself
    asyncio.run(main())


def test_a_heartbeat_leaves_early_once_the_load_moved_and_not_before():
    """With a 30 s lease (a heartbeat every 10 s), a load that moved by an eighth of the
    capacity is reported within a check interval; a smaller move, or none, waits."""
    class Directory(ScriptedDirectory):
        async def register_worker(self, info):
            await super().register_worker(info)
            return Registration(self.epoch, 30_000, 0)

        async def heartbeat(self, worker_id, epoch, load=None):
            self.loads.append(load)
            return await super().heartbeat(worker_id, epoch, load)

    async def main():
        d = Directory()
        d.loads = []
        load = [LoadReport(free_blocks=8, total_blocks=8)]
        info = WorkerInfo("decode-0", WorkerRole.DECODE, "127.0.0.1:1", "tcp://127.0.0.1:2", "abi",
                          WorkerCapacity(total_blocks=8, max_decode_batch=16, max_prefill_tokens=64))
        m = Membership(d, info, lambda: load[0], clock=Clock(), report_change=0.125, min_report_interval_s=0.02)
        await m.start()
        await m.heartbeat_now()  # the report moves are measured against
        assert len(d.loads) == 1
        await asyncio.sleep(0.1)
        assert len(d.loads) == 1  # nothing moved: the lease third (10 s) is far away
        load[0] = LoadReport(free_blocks=8, total_blocks=8, active_decode_batch=1, pending_prefill_tokens=7)
        await asyncio.sleep(0.1)
        assert len(d.loads) == 1  # 1 of 16 sequences, 7 of 64 tokens: under an eighth
        load[0] = LoadReport(free_blocks=7, total_blocks=8)  # one block of 8 taken
        await until(lambda: len(d.loads) == 2)  # within a few check intervals (a busy host may stall it)
        assert d.loads[-1].free_blocks == 7
        load[0] = LoadReport(free_blocks=7, total_blocks=8, connector_disabled=1)
        await until(lambda: len(d.loads) == 3)
        assert d.loads[-1].connector_disabled == 1
        await asyncio.sleep(0.1)
        assert len(d.loads) == 3  # reported: quiet again
        await m.stop()
    asyncio.run(main())


def test_without_a_report_share_heartbeats_keep_to_the_lease_third():
    async def main():
        d = ScriptedDirectory()  # a 0.3 s lease: a heartbeat every 0.1 s
        load = [LoadReport(free_blocks=8, total_blocks=8)]
        info = WorkerInfo("decode-0", WorkerRole.DECODE, "127.0.0.1:1", "tcp://127.0.0.1:2", "abi", CAP)
        m = Membership(d, info, lambda: load[0], clock=Clock(), report_change=0.0)
        await m.start()
        started = time.monotonic()
        load[0] = LoadReport(free_blocks=0, total_blocks=8)  # every block taken: no early report
        await until(lambda: d.beats)
        assert d.beats[0] - started >= 0.09, "a heartbeat left before its lease third"
        await m.stop()
    asyncio.run(main())
