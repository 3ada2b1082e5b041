"""The simulated router: the live router's Planner (router/requests/planner.py) over
snapshots the simulator builds, called as the orchestrator calls it
(router/requests/orchestrator.py, router/requests/retries.py):

    arrival      Planner.plan(mode)  -> reject (auto mode, before any work), or a Plan;
                 InFlight.book(plan)   the planned stream, for the interference rules
    dispatch     the plan's route when its decode worker has room now, else
                 Planner.place within the plan's route kind (a retry's placement)
    token 0      the booking marked started
    prefill done Planner.prefill_done (compute and exposed transfer correct the costs)
    completion   Planner.completed (TPOT, TTFT residuals and the prefix index learn)

What differs from the live router, on purpose: the snapshot is each worker's state at
the decision (a heartbeat with no lag), so the load overlay that covers a heartbeat's
lag is not used; the prompt's token ids are made up (a shared prefix's are the same for
every request of its group, the rest unique), so the prefix index sees what a real
one would.
"""

from __future__ import annotations

import dataclasses

from router.config import RouterConfig
from router.pricing.candidate import Candidate
from router.requests.inflight import InFlight
from router.requests.placement import Demand, LoadOverlay, rejects
from router.requests.planner import Plan, Planner
from router.types import Completed, PrefillDone, Slo
from runtime.directory.records import ClusterSnapshot, LoadReport, WorkerCapacity, WorkerRecord
from sim.engine import Worker
from sim.profile import SimProfile
from sim.workload import Request

TENANT = "sim"

UNIQUE_BASE = 1 << 20
"""Made-up token ids of a request's own tokens start here (a prefix group's are below)."""


def router_config(profile: SimProfile, mode: str, **overrides) -> RouterConfig:
    """The router's settings for a simulated cluster: its defaults, the transfer and fixed
    costs priced as the profile says (a deployed router learns them online), `overrides`."""
    o = profile.overheads
    base = {"default_mode": mode, "transfer_latency_ms": profile.transfer.latency_ms,
            "transfer_mb_per_s": profile.transfer.gb_per_s * 1000.0,
            "colocated_overhead_ms": o.colocated_ms, "disaggregated_overhead_ms": o.split_ms,
            "handoff_overhead_ms": o.handoff_ms}
    return RouterConfig(**{**base, **overrides})


def prompt_ids(index: int, r: Request) -> tuple[int, ...]:
    """Token ids standing for request `index`'s prompt: its prefix group's shared ones, then its own."""
    shared = ()
    if r.prefix_group >= 0 and r.prefix_tokens:
        start = r.prefix_group * 65536
        shared = tuple(range(start, start + r.prefix_tokens))
    own = r.prompt_tokens - len(shared)
    start = UNIQUE_BASE + index * 65536
    return shared + tuple(range(start, start + own))


class SimRouter:
    """One router over the simulated workers."""

    def __init__(self, config: RouterConfig, profile: SimProfile, clock_s):
        self.config = config
        self.planner = Planner(config, clock_s)
        self.inflight = InFlight(LoadOverlay(clock=clock_s), self.planner.streams, config)
        e = profile.engine
        self._capacity = WorkerCapacity(e.total_blocks, e.max_decode_batch, e.max_prefill_tokens, e.block_size, 0,
                                        e.max_model_len)
        self._profile = e.cost if e.cost.source else dataclasses.replace(e.cost, source="calibrated")
        self._records: dict[str, WorkerRecord] = {}
        self._keys: dict[str, tuple[int, ...]] = {}
        self.decision_us = 0.0

    def record(self, w: Worker, now_ms: float) -> WorkerRecord:
        """`w` as a snapshot shows it at `now_ms` (the same record object while its load is
        unchanged: the router's cost model keeps a row per record, as it does between two
        heartbeats)."""
        pending, batch, ctx = w.load_at(now_ms)
        free = max(0, w.free_blocks)
        key = (pending, batch, ctx, free, w.cached_blocks())
        last = self._records.get(w.worker_id)
        if last is not None and self._keys.get(w.worker_id) == key:
            return last
        load = LoadReport(pending, batch, free, 0, w.engine.total_blocks, ctx,
                          max(0, w.engine.total_blocks - free), key[4])
        rec = WorkerRecord(w.worker_id, w.role, "sim", "", "sim", self._capacity, load, profile=self._profile)
        self._records[w.worker_id] = rec
        self._keys[w.worker_id] = key
        return rec

    def snapshot(self, workers: list[Worker], now_ms: float) -> ClusterSnapshot:
        return ClusterSnapshot(tuple(self.record(w, now_ms) for w in workers), now_ms=int(now_ms))

    def latest(self, worker_id: str) -> WorkerRecord:
        return self._records[worker_id]

    def plan(self, index: int, r: Request, prompt: tuple[int, ...], slo: Slo, cluster: ClusterSnapshot) -> Plan:
        """The first attempt's plan under the router's mode (may be a REJECT)."""
        return self.planner.plan(f"r{index}", TENANT, prompt, r.output_tokens, self.config.default_mode, slo, cluster)

    def place(self, r: Request, prompt: tuple[int, ...], slo: Slo, cluster: ClusterSnapshot,
              split: bool) -> Candidate | None:
        """A route placed now, within one route kind (a plan whose decode worker has no room)."""
        return self.planner.place(TENANT, prompt, r.output_tokens, slo, cluster, None, split, {})

    @staticmethod
    def can_ever_serve(cluster: ClusterSnapshot, r: Request) -> bool:
        """Some decode-capable worker could take `r` with its whole pool free."""
        d = Demand(r.prompt_tokens, r.output_tokens)
        return any(w.can_decode and rejects(w, d) is None for w in cluster.workers)

    def prefill_done(self, plan: Plan, p: str, d: str, done: PrefillDone) -> None:
        """What Prefill.Prefill returned for a split route (its timings correct the costs)."""
        self.planner.prefill_done(plan, self.latest(p), self.latest(d), done)

    def completed(self, index: int, plan: Plan, p: str | None, d: str, done: Completed) -> None:
        """The request's Complete event (TPOT, TTFT and the prefix index learn from it)."""
        self.planner.completed(f"r{index}", plan, done, self.latest(p) if p else None, self.latest(d))
