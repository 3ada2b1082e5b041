"""An in-memory cluster for the drills' unit tests: a fake router answering what the SDK
does (generate_full, status, release, promote, rollback) with plausible values, and knobs
(`FakeKnobs`) that make one thing go wrong, so every check of a drill can be seen to fail.

It follows the real machine where a drill depends on it: requests without a mode run
disaggregated while ACTIVE and colocated once ROLLED_BACK; greedy tokens depend on the
prompt only (a mismatch is a knob); a rollback records the eight steps in order; a
promotion moves one legal step and is refused, naming the failed gates, the way the
router words it; the canary's samples and attainment gates count what was served since
CANARY, with targets (the request's, else the router's), against the router's minimum;
rollback and promote want the operator identity.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from dataclasses import dataclass, field

from pdserve_client.release import Gate, ReleaseChange, ReleaseView, RollbackStepView, RollbackView
from pdserve_client.types import ClusterStatus, GenerationResult, PdError, WorkerStatus
from pdserve_ops.drill.checks import EXPECTED_STEPS, PUBLICATIONS_KEY
from pdserve_ops.drill.cluster import DrillCluster, DrillError, Registered
from pdserve_ops.drill.run import PROMOTION_ORDER

GATES = ("manifest_verified", "colocated_fallback_healthy", "exactness_smoke", "failure_injection_smoke")
"""Gates of a promotion to SHADOW or CANARY (router/release/promotion.py)."""
CANARY_GATES = ("canary_samples", "ttft_attainment", "tpot_attainment", "stale_publications",
                "unauthorized_accepted_transfers", "transfer_failure_rate")
"""What a promotion to ACTIVE adds: the canary's record (router/release/canary.py)."""
TOTAL_BLOCKS = 64


@dataclass
class FakeKnobs:
    """What goes wrong (the defaults: nothing)."""

    fail_requests: int = 0
    """The first n load requests (no mode) fail UNAVAILABLE."""
    fail_after_rollback: int = 0
    """The first n load requests after the rollback started fail UNAVAILABLE."""
    mismatched_requests: int = 0
    """The first n disaggregated answers have their last token changed."""
    publications_under_retired_epoch: int | None = 0
    """What ROLLBACK_COMPLETE counts; None: the router does not record it (not measured)."""
    reserved_blocks_after: int = 0
    """Blocks left reserved once rolled back."""
    open_transactions_after: int = 0
    """Transactions left open once rolled back."""
    rollback_blocked_at: str = ""
    """A step the rollback stops at (FAILED_PRECONDITION), e.g. RECLAIM_UNPUBLISHED."""
    decode_error: str = ""
    """roll_back_decode fails with this (DrillError)."""
    failing_gates: dict[str, str] = field(default_factory=dict)
    """Gate -> the detail it fails with."""


@dataclass
class FakeState:
    """The fake router's state, shared by the clients of one FakeCluster."""

    knobs: FakeKnobs
    mode: str = "active"
    version: int = 1
    route_epoch: int = 7
    canary_fraction: float = 0.0
    workers: dict[str, list] = field(default_factory=dict)
    """worker_id -> [role, epoch]."""
    history: list[dict] = field(default_factory=list)
    rollback: RollbackView | None = None
    load_requests: int = 0
    after_rollback: int = 0
    disaggregated: int = 0
    latency_s: float = 0.002
    canary_min_samples: int = 20
    """The router's PD_CANARY_MIN_SAMPLES."""
    router_slo_ms: tuple[float, float] = (0.0, 0.0)
    """The router's (TTFT, TPOT) targets for a request that names none (0: none)."""
    canary_served: list[tuple[str, bool, bool]] = field(default_factory=list)
    """Since CANARY: (route, had a TTFT target, had a TPOT target) per request served."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def moved(self, to: str, by: str, reason: str) -> None:
        self.history.append({"from_mode": self.mode, "to_mode": to, "at_unix_ms": int(time.time() * 1000),
                             "by": by, "reason": reason, "gates": ""})
        self.mode, self.version = to, self.version + 1
        self.canary_served.clear()

    def served(self, route: str, slo_ttft_ms: float, slo_tpot_ms: float) -> None:
        if self.mode == "canary":
            ttft, tpot = self.router_slo_ms
            self.canary_served.append((route, bool(slo_ttft_ms or ttft), bool(slo_tpot_ms or tpot)))

    def canary_gates(self) -> dict[str, str]:
        """The canary gates that fail on what was served since CANARY, with the router's words."""
        need, failing = self.canary_min_samples, {}
        dis = sum(1 for route, _, _ in self.canary_served if route == "disaggregated")
        if dis < need:
            failing["canary_samples"] = f"{dis} disaggregated requests completed here since CANARY"
        for i, clock in ((1, "TTFT"), (2, "TPOT")):
            judged = [sum(1 for s in self.canary_served if s[0] == route and s[i])
                      for route in ("disaggregated", "colocated")]
            if min(judged) < need:
                failing[f"{clock.lower()}_attainment"] = (
                    f"not measurable: {judged[0]} disaggregated and {judged[1]} colocated requests with a "
                    f"{clock} target (each needs {need})")
        return failing

    def view(self) -> ReleaseView:
        stopped = self.mode in ("rolled_back", "pinned")
        return ReleaseView(self.mode, self.version, {"model": "fake", "digest": "f" * 64}, self.canary_fraction,
                           tuple(self.history), self.rollback,
                           router_mode="colocated" if stopped else "disaggregated",
                           routes_stopped=self.mode == "rolled_back", router_id="fake-router",
                           route_epoch=self.route_epoch, canary_min_samples=self.canary_min_samples,
                           canary_slo_ttft_ms=self.router_slo_ms[0], canary_slo_tpot_ms=self.router_slo_ms[1])


def tokens(prompt: list[int], n: int) -> list[int]:
    """The fake model's greedy answer: a function of the prompt only."""
    rng = random.Random(zlib.crc32(bytes(str(prompt), "ascii")))
    return [rng.randrange(3, 500) for _ in range(n)]


class FakeClient:
    """What a drill calls on `Client`, answered from a FakeState."""

    def __init__(self, state: FakeState, identity: str):
        self._s, self.identity = state, identity

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to close."""

    def generate_full(self, prompt: str | None = None, *, prompt_ids: list[int], max_tokens: int,
                      ignore_eos: bool = False, mode: str | None = None, request_id: str | None = None,
                      slo_ttft_ms: float = 0.0, slo_tpot_ms: float = 0.0, **_) -> GenerationResult:
        """Greedy tokens of `prompt_ids`, routed the way the release says."""
        s, k = self._s, self._s.knobs
        time.sleep(s.latency_s)
        with s.lock:
            if mode is None:
                s.load_requests += 1
                if s.mode == "rolled_back":
                    s.after_rollback += 1
                if s.load_requests <= k.fail_requests or 0 < s.after_rollback <= k.fail_after_rollback:
                    raise PdError("UNAVAILABLE", f"fake: request {request_id} failed", retryable=True)
            disaggregated = (mode == "disaggregated" or mode is None and (
                s.mode == "active" or s.mode == "canary" and s.load_requests % 4 == 0)) and s.mode != "rolled_back"
            out = tokens(prompt_ids, max_tokens)
            if disaggregated:
                s.disaggregated += 1
                if s.disaggregated <= k.mismatched_requests:
                    out[-1] += 1
            if mode is None:
                s.served("disaggregated" if disaggregated else "colocated", slo_ttft_ms, slo_tpot_ms)
            decode = sorted(w for w, (role, _) in s.workers.items() if role == "decode")
            worker = decode[s.load_requests % len(decode)] if decode else "decode-0"
        return GenerationResult(request_id or "fake", out, "", "length", 1.0, 1.0,
                                "disaggregated" if disaggregated else "colocated", 1,
                                "prefill-0" if disaggregated else "", worker, 1.0, 1.0, 2.0,
                                route_epoch=s.route_epoch)

    def status(self) -> ClusterStatus:
        """Workers, blocks and transactions; the knobs' leftovers once rolled back."""
        s = self._s
        with s.lock:
            left = s.mode == "rolled_back"
            reserved = s.knobs.reserved_blocks_after if left else 0
            workers = [WorkerStatus(w, role, f"127.0.0.1:{5000 + i}", epoch, TOTAL_BLOCKS, 0, TOTAL_BLOCKS, 0, 0,
                                    int(time.time() * 1000) + 3000)
                       for i, (w, (role, epoch)) in enumerate(sorted(s.workers.items()))]
            decode = sum(1 for w in workers if w.role == "decode")
            return ClusterStatus(workers, decode * TOTAL_BLOCKS - reserved, reserved, decode * TOTAL_BLOCKS,
                                 s.knobs.open_transactions_after if left else 0, s.mode, s.canary_fraction,
                                 s.route_epoch)

    def release(self) -> ReleaseView:
        """The release record."""
        with self._s.lock:
            return self._s.view()

    def _operator(self, what: str) -> None:
        if self.identity != "operator":
            raise PdError("PERMISSION_DENIED", f"{what} is for operators; {self.identity} asked")

    def rollback(self, reason: str = "", wait: bool = True, timeout_s: float = 0.0) -> ReleaseChange:
        """Run the eight steps at once (or up to the knob's blocked one)."""
        self._operator("Rollback")
        s = self._s
        with s.lock:
            if s.mode == "rolled_back" and s.rollback is not None and s.rollback.complete:
                return ReleaseChange("rolled_back", s.view())
            previous, start_ms = s.mode, int(time.time() * 1000)
            steps, retired = [], s.route_epoch
            s.route_epoch += 1
            for i, step in enumerate(EXPECTED_STEPS):
                blocked = step == s.knobs.rollback_blocked_at
                counts = {"retired_epoch": retired, "route_epoch": s.route_epoch} \
                    if step == "ADVANCE_ROUTE_EPOCH" else {}
                if step == "ROLLBACK_COMPLETE" and s.knobs.publications_under_retired_epoch is not None:
                    counts[PUBLICATIONS_KEY] = s.knobs.publications_under_retired_epoch
                steps.append(RollbackStepView(step, start_ms + i, 0 if blocked else start_ms + i + 1, counts,
                                              "blocked: fake" if blocked else ""))
                if blocked:
                    break
            s.moved("rolled_back", self.identity, reason)
            s.rollback = RollbackView(previous, start_ms, reason, self.identity, tuple(steps), retired,
                                      "fake-router", start_ms + 5000)
            if s.knobs.rollback_blocked_at:
                raise PdError("FAILED_PRECONDITION", f"rollback stopped at {s.knobs.rollback_blocked_at}: fake")
            return ReleaseChange(previous, s.view())

    def promote(self, target: str = "", canary_fraction: float = 0.0, reason: str = "",
                timeout_s: float = 0.0) -> ReleaseChange:
        """One legal step through the gates (the knob's failing ones fail)."""
        self._operator("Promote")
        s = self._s
        with s.lock:
            complete = s.rollback is not None and s.rollback.complete
            legal = {"rolled_back": "pinned" if complete else ""}
            legal.update(zip(PROMOTION_ORDER, PROMOTION_ORDER[1:]))
            target = target or legal.get(s.mode, "")
            if not target or legal.get(s.mode) != target:
                raise PdError("FAILED_PRECONDITION", f"illegal release transition {s.mode.upper()} -> "
                                                     f"{(target or 'none').upper()}")
            names = () if target == "pinned" else GATES + (CANARY_GATES if target == "active" else ())
            failing = {**(s.canary_gates() if target == "active" else {}), **s.knobs.failing_gates}
            gates = tuple(Gate(n, n not in failing, 0.0, 0.0, failing.get(n, "fake: ok")) for n in names)
            failed = [g for g in gates if not g.passed]
            if failed:
                lines = "; ".join(f"{g.name} FAILED: {g.detail}" for g in failed)
                raise PdError("FAILED_PRECONDITION", f"promotion to {target.upper()} refused: {len(failed)} of "
                                                     f"{len(gates)} gates failed: {lines}")
            previous = s.mode
            s.moved(target, self.identity, reason)
            s.canary_fraction = canary_fraction if target == "canary" else s.canary_fraction
            return ReleaseChange(previous, s.view(), gates)


class FakeCluster(DrillCluster):
    """A DrillCluster in memory: `knobs` say what goes wrong; `recorded` holds what
    record_release was given."""

    name = "fake"

    def __init__(self, knobs: FakeKnobs | None = None, decode: int = 2, prefill: int = 1, mode: str = "active",
                 canary_min_samples: int = 20, router_slo_ms: tuple[float, float] = (0.0, 0.0)):
        """`canary_min_samples` and `router_slo_ms`: the router's canary minimum and targets."""
        workers = {f"prefill-{i}": ["prefill", 1] for i in range(prefill)}
        workers.update({f"decode-{i}": ["decode", 1] for i in range(decode)})
        self.state = FakeState(knobs or FakeKnobs(), mode=mode, workers=workers,
                               canary_min_samples=canary_min_samples, router_slo_ms=router_slo_ms)
        self.recorded: list[ReleaseView] = []

    def client(self, identity: str = "client", timeout_s: float = 60.0) -> FakeClient:
        """A FakeClient presenting `identity`."""
        return FakeClient(self.state, identity)

    def record_release(self, view: ReleaseView) -> None:
        """Keep it in `recorded`."""
        self.recorded.append(view)

    def roll_back_decode(self, timeout_s: float) -> list[Registered]:
        """Each decode worker registers again at the next epoch, one at a time."""
        if self.state.knobs.decode_error:
            raise DrillError(self.state.knobs.decode_error)
        before = {w.worker_id: w.epoch for w in self.registered()}
        out = []
        for w in sorted(w for w, (role, _) in self.state.workers.items() if role == "decode"):
            with self.state.lock:
                self.state.workers[w][1] += 1
            out += self.wait_registered(before, [w], timeout_s)
        return out
