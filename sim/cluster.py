"""A discrete-event simulation of one pdserve cluster serving one workload.

    clients   replay the workload open loop (sim/workload.py)
    router    the live router's Planner (sim/router.py): plan or reject at arrival; a
              request whose blocks fit on no decode-capable worker waits in one FIFO
              (router/requests/queueing.py) until a release makes room; dispatch takes the
              planned route when its decode worker still has room, else places one
    workers   engine loops (sim/engine.py): chunked prefill, continuous batching, the
              K/V pool, prefix reuse, colocated interference
    host      optionally, the cores every process shares (sim/profile.py HostProfile): steps
            and the fixed costs' hops stretch while the demand exceeds them
  hand-off  P's token 0 goes to the client; the K/V moves in the exposed transfer time
              of the profile's transport (layer streaming overlaps it with the prefill),
              then Reserve/COMMIT/validate/publish (Overheads.handoff_ms) before D admits
              it at its next iteration; P frees its blocks when the K/V has left

Per request it records TTFT, TPOT, route, admission wait and the router's predictions;
per run, attainment of each target and of both, and each pool's utilisation
(sim/metrics.py). Times are ms from the workload's start.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import time

from router.pricing.shapes import Outcome
from router.requests.placement import blocks_needed
from router.requests.planner import Plan
from router.types import Completed, FinishReason, PrefillDone, Route, Slo
from runtime.directory.records import WorkerRole
from sim.engine import Seq, SharedHost, Worker
from sim.metrics import RequestResult, RunResult
from sim.profile import SimProfile
from sim.router import SimRouter, prompt_ids, router_config
from sim.workload import Workload

MODES = ("colocated", "disaggregated", "auto")

MAX_QUEUE_SHARE = 0.75
"""The busy share past which a split route's control plane stops waiting longer behind a
worker's loop (`Simulation._queued`: at most 4x). A thread waiting for the GIL gets it at the
latest after the interpreter's switch interval, so the wait is bounded where a queue's is
not; in the validation runs the first token gap grew at most 2.8x over its isolated value,
while 1 / (1 - u) with u near 0.9 made it 10x."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterSpec:
    """How many workers of each role (a worker spans `profile.gpus` GPUs)."""

    prefill: int = 0
    decode: int = 0
    mixed: int = 0

    def __post_init__(self) -> None:
        if min(self.prefill, self.decode, self.mixed) < 0:
            raise ValueError(f"worker counts must be >= 0: {self}")
        if self.decode + self.mixed < 1:
            raise ValueError(f"a cluster needs a decode-capable worker (decode or mixed): {self}")

    @property
    def workers(self) -> int:
        return self.prefill + self.decode + self.mixed

    def gpus(self, profile: SimProfile) -> int:
        return self.workers * profile.gpus

    def label(self) -> str:
        parts = [f"{n}{k}" for n, k in ((self.prefill, "P"), (self.decode, "D"), (self.mixed, "M")) if n]
        return "+".join(parts)


@dataclasses.dataclass(slots=True, eq=False)
class _Flight:
    """One request on its way through the simulated cluster."""

    index: int
    arrival_ms: float
    prompt: tuple[int, ...]
    need: int
    plan: Plan | None = None
    booking: int | None = None
    route: Route = Route.COLOCATED
    p: Worker | None = None
    d: Worker | None = None
    seq_p: Seq | None = None
    seq_d: Seq | None = None
    dispatch_ms: float = math.nan
    token0_ms: float = math.nan
    """The client's token 0."""
    decode_start_ms: float = math.nan
    transfer_ms: float = 0.0
    nbytes: int = 0


ARRIVE, WORKER, PUBLISHED, SENT = 0, 1, 2, 3


class Simulation:
    """One cluster, one router mode, one pair of targets; `run` replays a workload."""

    def __init__(self, spec: ClusterSpec, profile: SimProfile, mode: str = "auto", slo_ttft_ms: float = 0.0,
                 slo_tpot_ms: float = 0.0, **router_overrides):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "disaggregated" and not (spec.prefill + spec.mixed and spec.decode + spec.mixed):
            raise ValueError(f"disaggregated mode needs a prefill-capable and a decode-capable worker: {spec}")
        self.spec, self.profile, self.mode = spec, profile, mode
        self.slo = Slo(slo_ttft_ms, slo_tpot_ms)
        self.now = 0.0
        self._heap: list = []
        self._n = 0
        self.router = SimRouter(router_config(profile, mode, **router_overrides), profile, lambda: self.now / 1000.0)
        h = profile.host
        self.host = None if h is None else SharedHost(h.cores, h.token_cpu_ms, h.request_cpu_ms, h.split_cpu_ms,
                                                      self._busy)
        self.workers = self._make_workers()
        self._by_id = {w.worker_id: w for w in self.workers}
        self._queue: list[_Flight] = []
        self._queue_head = 0
        self._kick = False
        self._flights: dict[int, _Flight] = {}
        self.results: list[RequestResult | None] = []
        self._workload: Workload | None = None

    def _make_workers(self) -> list[Worker]:
        out = []
        for role, n in ((WorkerRole.PREFILL, self.spec.prefill), (WorkerRole.DECODE, self.spec.decode),
                        (WorkerRole.MIXED, self.spec.mixed)):
            for i in range(n):
                out.append(Worker(f"{role.value}-{i}", role, self.profile.engine, self._schedule_worker,
                                  self._token0, self._done, self._freed, self.host))
                out[-1].admit_ms = self.profile.overheads.admit_ms
        return out

    def _busy(self) -> int:
        return sum(1 for w in self.workers if w.seg is not None)

    def _relayed(self, t: float) -> float:
        """When a token a worker emits at `t` reaches the client (Overheads.colocated_ms: the
        worker's and the router's hops, stretched by the shared host)."""
        return t + self.profile.overheads.colocated_ms * self._cpu_wait(t)

    def _cpu_wait(self, t: float) -> float:
        """How much the shared host stretches a fixed cost (its hops run on the same cores as
        the workers); 1 when the workers own their hosts."""
        return self.host.factor(t, extra=0.0) if self.host is not None else 1.0

    # ---- the event loop ---------------------------------------------------------------
    def _push(self, t: float, kind: int, obj, version: int = 0) -> None:
        self._n += 1
        heapq.heappush(self._heap, (t, self._n, kind, obj, version))

    def _schedule_worker(self, w: Worker, t: float) -> None:
        self._push(t, WORKER, w, w.version)

    def run(self, workload: Workload) -> RunResult:
        """Replay `workload` to the last completion."""
        t0 = time.process_time()
        self._workload = workload
        self.results = [None] * len(workload)
        for i, r in enumerate(workload.requests):
            self._push(r.arrival_s * 1000.0, ARRIVE, i)
        heap = self._heap
        while heap:
            t, _, kind, obj, version = heapq.heappop(heap)
            self.now = t
            if kind == WORKER:
                if version == obj.version:
                    obj.on_event(t)
            elif kind == ARRIVE:
                self._arrive(obj)
            elif kind == SENT:
                self._sent(obj)
            else:
                self._published(obj)
            if self._kick:
                self._pump()
        self._unserved_left()
        return self._result(workload, time.process_time() - t0)

    def _result(self, workload: Workload, cpu_s: float) -> RunResult:
        reqs = tuple(self.results)
        routes = dict(collections.Counter(r.route for r in reqs))
        span = max(self.now, 1e-9)
        busy: dict[str, list[float]] = {}
        for w in self.workers:
            busy.setdefault(w.role.value, []).append(w.busy_ms / span)
        return RunResult(reqs, self.slo.ttft_ms, self.slo.tpot_ms, workload.rate_rps, self.spec.gpus(self.profile),
                         routes, {k: sum(v) / len(v) for k, v in busy.items()}, cpu_s,
                         self.router.decision_us / max(1, len(reqs)), span,
                         {k: len(v) for k, v in busy.items()})

    # ---- the router's side -------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        r = self._workload.requests[i]
        if self.host is not None:
            self.host.request(self.now)
        f = _Flight(i, self.now, prompt_ids(i, r), blocks_needed(r.prompt_tokens, r.output_tokens,
                                                                  self.profile.engine.block_size))
        cluster = self.router.snapshot(self.workers, self.now)
        if not self.router.can_ever_serve(cluster, r):
            self._end(f, "unserved")
            return
        t0 = time.perf_counter()
        f.plan = self.router.plan(i, r, f.prompt, self.slo, cluster)
        self.router.decision_us += (time.perf_counter() - t0) * 1e6
        if f.plan.outcome is Outcome.REJECT:
            self._end(f, "rejected")
            return
        f.booking = self.router.inflight.book(f.plan)
        self._flights[i] = f
        if self._queue_head < len(self._queue) or not self._dispatch(f):
            self._queue.append(f)

    def _room(self, need: int) -> bool:
        return any(w.can_decode and w.free_blocks >= need for w in self.workers)

    def _dispatch(self, f: _Flight) -> bool:
        """Start `f`'s attempt now, on its plan's route or one placed now; False: no room yet."""
        if not self._room(f.need):
            return False
        plan, r = f.plan, self._workload.requests[f.index]
        d = self._by_id[plan.decode.worker_id] if plan.decode is not None else None
        p = self._by_id[plan.prefill.worker_id] if plan.prefill is not None else None
        route = plan.route
        if d is None or d.free_blocks < f.need or (route is Route.DISAGGREGATED and p is None):
            cluster = self.router.snapshot(self.workers, self.now)
            split = plan.route is Route.DISAGGREGATED and any(w.can_prefill for w in self.workers)
            c = self.router.place(r, f.prompt, self.slo, cluster, split) or \
                (self.router.place(r, f.prompt, self.slo, cluster, False) if split else None)
            if c is None or self._by_id[c.decode.worker_id].free_blocks < f.need:
                return False
            route, d = c.route, self._by_id[c.decode.worker_id]
            p = self._by_id[c.prefill.worker_id] if c.prefill is not None else None
        self._start(f, r, route, p, d)
        return True

    def _start(self, f: _Flight, r, route: Route, p: Worker | None, d: Worker) -> None:
        f.route, f.p, f.d, f.dispatch_ms = route, p, d, self.now
        e = self.profile.engine
        pfx = {"prefix_group": r.prefix_group,
               "prefix_blocks": r.prefix_tokens // e.block_size if r.prefix_group >= 0 else 0}
        f.seq_d = Seq(f.index, r.prompt_tokens, r.output_tokens, **pfx)
        d.reserve(f.seq_d, f.need)
        if route is Route.COLOCATED:
            d.submit(f.seq_d, self.now)
            return
        if self.host is not None:
            self.host.request(self.now, self.host.split_cpu_ms)
        f.seq_p = Seq(f.index, r.prompt_tokens, r.output_tokens, prefill_only=True, **pfx)
        p.submit(f.seq_p, self.now)

    def _pump(self) -> None:
        """Room was released: dispatch waiting requests in order while they fit."""
        self._kick = False
        q = self._queue
        while self._queue_head < len(q) and self._dispatch(q[self._queue_head]):
            q[self._queue_head] = None
            self._queue_head += 1
        if self._queue_head > 1024 and self._queue_head * 2 > len(q):
            del q[:self._queue_head]
            self._queue_head = 0

    # ---- the workers' side ---------------------------------------------------------------
    def _freed(self, w: Worker) -> None:
        if w.can_decode:
            self._kick = True

    def _token0(self, w: Worker, seq: Seq, t: float) -> None:
        f = self._flights[seq.index]
        o = self.profile.overheads
        self.router.inflight.started(f.booking)
        if not seq.prefill_only:
            f.token0_ms = self._relayed(t)
            return
        f.token0_ms = t + self._queued(o.split_ms * self._cpu_wait(t), w, t)
        e, d = self.profile.engine, f.d
        hit_blocks = d.prefix_hit(f.seq_d) // e.block_size
        moved = -(-seq.prompt // e.block_size) - hit_blocks
        f.nbytes = moved * e.cost.kv_bytes_per_block
        f.transfer_ms = self.profile.transfer.exposed_ms(f.nbytes, seq.compute_ms, e.layers)
        self._push(t + f.transfer_ms, SENT, f)

    def _sent(self, f: _Flight) -> None:
        """The K/V left P: P's blocks go back; the hand-off's control plane runs."""
        seq = f.seq_p
        f.p.release(seq, self.now)
        self.router.prefill_done(f.plan, f.p.worker_id, f.d.worker_id, PrefillDone(
            computed_tokens=seq.prompt - seq.reused, reused_tokens=seq.reused, compute_ms=seq.compute_ms,
            transfer_ms=f.transfer_ms, sent_bytes=f.nbytes))
        if seq.output <= 1:  # nothing to decode: the reservation goes back
            f.d.release(f.seq_d, self.now)
            self._finish(f, f.seq_p)
            return
        self._push(self.now + self._handoff_ms(f), PUBLISHED, f)

    def _handoff_ms(self, f: _Flight) -> float:
        """The hand-off's control plane (Overheads.handoff_ms). On a shared host its steps at
        D (the COMMIT, the checks, the publication, the import command) queue behind D's
        engine loop for the GIL and the cores (`_queued`: bench/results/planner.md, the real
        first token gap grew so with the decode loop's busy share)."""
        return self._queued(self.profile.overheads.handoff_ms * self._cpu_wait(self.now), f.d, self.now)

    def _queued(self, ms: float, w: Worker, t: float) -> float:
        """`ms` of a split route's control plane at worker `w` (P's token 0 and its sends; D's
        hand-off), queued behind `w`'s engine loop on a shared host: / (1 - its recent busy share)."""
        if self.host is None:
            return ms
        return ms / (1.0 - min(MAX_QUEUE_SHARE, w.recent_busy(t)))

    def _published(self, f: _Flight) -> None:
        seq = f.seq_d
        seq.generated = 1
        seq.computed = seq.prompt
        f.decode_start_ms = self._relayed(self.now)
        f.d.join(seq, self.now)

    def _done(self, w: Worker, seq: Seq) -> None:
        self._finish(self._flights[seq.index], seq)

    def _finish(self, f: _Flight, seq: Seq) -> None:
        r = self._workload.requests[f.index]
        n = seq.generated
        last = self._relayed(seq.last_ms) if n > 1 else f.token0_ms
        ttft = f.token0_ms - f.arrival_ms
        tpot = (last - f.token0_ms) / (n - 1) if n > 1 else 0.0
        split = f.route is Route.DISAGGREGATED
        dttft = f.decode_start_ms - f.arrival_ms if split and n > 1 else None
        dtpot = (last - f.decode_start_ms) / (n - 1) if dttft is not None else None
        self.router.completed(f.index, f.plan, f.p.worker_id if split else None, f.d.worker_id,
                              Completed(FinishReason.LENGTH, ttft, tpot, n, f.route, 1, decode_ttft_ms=dttft,
                                        decode_tpot_ms=dtpot))
        self.router.inflight.drop(f.booking)
        del self._flights[f.index]
        first = self._relayed(seq.first_decode_ms) - f.token0_ms if n > 1 else math.nan
        self._end(f, f.route.name.lower(), ttft, tpot, first)
        assert r.output_tokens == n, f"request {f.index} generated {n} of {r.output_tokens} tokens"

    def _end(self, f: _Flight, route: str, ttft: float = math.nan, tpot: float = math.nan,
             first_gap: float = math.nan) -> None:
        r = self._workload.requests[f.index]
        c = f.plan.predicted if f.plan is not None else None
        self.results[f.index] = RequestResult(
            f.index, f.arrival_ms, r.prompt_tokens, r.output_tokens, route, ttft, tpot,
            (f.dispatch_ms - f.arrival_ms) if not math.isnan(f.dispatch_ms) else math.nan,
            c.ttft_ms if c else math.nan, c.tpot_ms if c else math.nan,
            f.p.worker_id if f.p is not None and route == "disaggregated" else "",
            f.d.worker_id if f.d is not None else "", r.kind, first_gap)

    def _unserved_left(self) -> None:
        """Requests still waiting when nothing else can happen (their blocks never fit)."""
        for f in self._queue[self._queue_head:]:
            if f is not None:
                self.router.inflight.drop(f.booking)
                self._end(f, "unserved")
        for f in list(self._flights.values()):
            if self.results[f.index] is None:
                self._end(f, "unserved")
