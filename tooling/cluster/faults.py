"""Fault injection on a running local cluster, for the fault suite and bench/faults.py.

A case stops one request at one step of the hand-off and does something to it
there: SIGKILL a process (prefill, decode, directory, Redis or the router),
SIGSTOP a worker (hung: it is continued after the request ended), cancel the
request, or let its deadline pass. Workers started with
PD_FAULT_PAUSE_S > 0 wait that long at a step a request's id names as
`@<step>` (runtime/worker/events.FaultPause), and append their hand-off events
to PD_EVENT_LOG, which is how a case knows the request reached the step and
which worker holds it. After the case the victim is restarted and the cluster
must come back clean: no held block on any worker, no open transaction, no
transaction of the request left PUBLISHED.

The steps, and which await of the hand-off each one stops in:

    reserved   router awaits Decode.Reserve (D holds the blocks; no transaction yet)
    computed   router awaits Prefill (transaction RESERVED; nothing sent)
    chunk      router awaits Prefill (TRANSFERRING; some chunks visible at D)
    commit     router awaits Prefill; P awaits D's verdict (D has the commit)
    published  router awaits token 0 (PUBLISHED at D; nothing streamed yet)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import threading
import time
from pathlib import Path

from pdserve_client import PdError
from runtime.directory.client import DirectoryClient
from runtime.directory.states import TxnState
from tooling.cluster.launcher import LocalCluster

STEPS = ("reserved", "computed", "chunk", "commit", "published")
PLAN_ASKS = {"chunk": "@one_by_one", "computed": "@token_late"}
"""Plan options a step's case names beside it (runtime/worker/events.py PLAN_OPTIONS): a
pause between two chunks needs them sent one by one; a pause after the compute holds a
streamed transfer's token COMMIT back only when it does not leave from token 0's callback."""
STEP_EVENT = {"reserved": "reserved", "computed": "computed", "chunk": "chunk_visible",
              "commit": "commit_received", "published": "published"}
"""The event a worker logs when the request reaches the step (and pauses right after)."""
PREFILL_EVENTS = ("computed", "chunk_sent", "commit", "verdict")
DECODE_EVENTS = ("reserved", "chunk_visible", "commit_received", "published")
VICTIMS = ("prefill", "decode", "directory", "redis", "router")
ACTIONS = ("kill", "stop", "cancel", "deadline")


def kill_cases() -> list[tuple[str, str]]:
    """(victim, step) for every process at every step where it takes part: the prefill
    worker is not engaged before `computed`."""
    return [(v, s) for v in VICTIMS for s in STEPS if not (v == "prefill" and s == "reserved")]


@dataclasses.dataclass
class CaseResult:
    """What one fault did to its request and to the cluster."""

    action: str
    victim: str
    step: str
    request_id: str
    outcome: str = ""
    """"ok", "failed: <code>", "cancelled" (completed early by a cancel once output had
    begun), or "hung" (no answer within the case's patience)."""
    tokens_match: bool | None = None
    """Tokens equal to the fault-free run's, or its first ones when cancelled (None when the
    request failed)."""
    attempts: int = 0
    held_blocks: int = 0
    """Blocks still held on the workers once the cluster settled (leaked)."""
    open_txns: int = 0
    unreleased: int = 0
    """Transactions of the request left PUBLISHED after it ended."""
    reached: bool = True
    """The request reached the step (False: the fault landed elsewhere)."""
    detail: str = ""
    """The request's error message, when it failed."""
    settle_s: float = 0.0

    @property
    def stale_publications(self) -> int:
        """Output from K/V that was not the request's own complete one (tokens differ
        from the fault-free run), or a publication nobody released."""
        return int(self.tokens_match is False) + self.unreleased

    def clean(self) -> bool:
        """Nothing held, nothing open, nothing unreleased."""
        return not (self.held_blocks or self.open_txns or self.unreleased)


class EventFile:
    """The workers' shared hand-off event log (JSON lines)."""

    def __init__(self, path: Path):
        self.path = path

    def of(self, request_id: str, event: str = "") -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if e.get("request") == request_id and (not event or e["event"] == event):
                out.append(e)
        return out

    def wait(self, request_id: str, event: str, timeout_s: float, while_=lambda: True) -> dict | None:
        """The request's first `event`; None after `timeout_s`, or once `while_()` is
        false (the request ended) and the event is still not there."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            going = while_()
            if found := self.of(request_id, event):
                return found[0]
            if not going:
                return None
            time.sleep(0.01)
        return None

    def worker_of(self, request_id: str, events: tuple[str, ...]) -> str:
        """The worker that logged one of `events` for the request first."""
        for e in self.of(request_id):
            if e["event"] in events and e.get("worker"):
                return e["worker"]
        return ""


def _directory(cluster: LocalCluster, fn):
    async def go():
        async with DirectoryClient(cluster.directory_address, 3.0, cluster.identity("operator")) as d:
            return await fn(d)
    return asyncio.run(go())


def leaks(cluster: LocalCluster, request_id: str = "") -> tuple[int, int, int]:
    """(blocks held on live workers, open transactions, transactions of `request_id`
    still PUBLISHED). Raises if the directory cannot answer."""
    async def read(d):
        snap, open_txns = await d.snapshot(), await d.list_open()
        unreleased = 0
        if request_id:
            for g in range(1, 12):
                rec = await d.lookup(request_id, f"{request_id}/{g}")
                unreleased += rec is not None and rec.state == TxnState.PUBLISHED
        return snap, open_txns, unreleased
    snap, open_txns, unreleased = _directory(cluster, read)
    held = sum(w.load.total_blocks - w.load.free_blocks for w in snap.workers if w.load.total_blocks)
    return held, len(open_txns), unreleased


def settle(cluster: LocalCluster, request_id: str = "", timeout_s: float = 30.0) -> tuple[tuple[int, int, int], float]:
    """Wait until the cluster is clean (or timeout); (last leak figures, seconds waited).
    Every worker of the spec must be registered again (a restarted one re-registers)."""
    t0 = time.monotonic()
    expected = {n for n in cluster.procs if n.startswith(("prefill-", "decode-", "mixed-"))}
    figures = (-1, -1, -1)
    while time.monotonic() - t0 < timeout_s:
        try:
            figures = leaks(cluster, request_id)
            registered = _directory(cluster, lambda d: d.snapshot())
        except Exception:  # noqa: BLE001 - directory or Redis still coming back
            time.sleep(0.2)
            continue
        if figures == (0, 0, 0) and expected <= {w.worker_id for w in registered.workers}:
            return figures, time.monotonic() - t0
        time.sleep(0.2)
    return figures, time.monotonic() - t0


class FaultRunner:
    """Runs fault cases one after another on one cluster (started with
    PD_FAULT_PAUSE_S and PD_EVENT_LOG set, see `fault_env`)."""

    def __init__(self, cluster: LocalCluster, events: Path, prompt: list[int], max_tokens: int,
                 pause_s: float, patience_s: float = 60.0):
        self.cluster = cluster
        self.events = EventFile(events)
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.pause_s = pause_s
        self.patience_s = patience_s
        self._n = 0
        with cluster.client() as c:
            self.reference = c.generate_full(prompt_ids=prompt, max_tokens=max_tokens, mode="colocated",
                                             ignore_eos=True).token_ids

    def run(self, action: str, victim: str, step: str, mode: str = "disaggregated") -> CaseResult:
        """One case: the request stopped at `step`, then `action` (kill `victim`, cancel,
        or a deadline that passes during the pause; "none": a plain request, the
        baseline); restart; settle."""
        self._n += 1
        asks = PLAN_ASKS.get(step, "")  # what the step's pause needs of the hand-off's plan
        rid = f"{action}-{victim}@{step}{asks}-{self._n}" if action != "none" else f"baseline-{self._n}"
        res = CaseResult(action, victim, step, rid)
        # A deadline passes during the pause whenever the request reaches the step before
        # it: 0.9 of the pause leaves the most room for a loaded machine's way there.
        deadline_s = self.pause_s * 0.9 if action == "deadline" else self.patience_s
        box: dict = {}

        def request():
            try:
                with self.cluster.client(timeout_s=self.patience_s) as c:
                    box["result"] = c.generate_full(
                        prompt_ids=self.prompt, max_tokens=self.max_tokens, mode=mode, ignore_eos=True,
                        request_id=rid, deadline_s=deadline_s)
            except PdError as exc:
                box["error"] = exc
            except Exception as exc:  # noqa: BLE001 - e.g. the router's connection dropped
                box["error"] = exc

        thread = threading.Thread(target=request, daemon=True)
        thread.start()
        t0 = time.monotonic()
        hit = self.events.wait(rid, STEP_EVENT[step], 20.0, thread.is_alive) if action != "none" else None
        res.reached = hit is not None or action == "none"
        waited_s = time.monotonic() - t0
        target = None
        if hit is not None and action in ("kill", "stop"):
            target = self._victim(victim, rid)
            if target:
                self.cluster.signal(target, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        elif hit is not None and action == "cancel":
            with self.cluster.client() as c:
                c.cancel(rid, reason="fault suite")
        thread.join(self.patience_s + 10)
        self._outcome(res, box, hung=thread.is_alive())
        if not res.reached:  # what the request did get to, for whoever reads the failure
            res.detail += f" (not at {step} after {waited_s:.2f} s; its events: " + ", ".join(
                f"{e['event']}@{e.get('worker', '')}" for e in self.events.of(rid)) + ")"
        if target and action == "kill":
            self.cluster.restart(target)
        elif target:  # stopped (hung): it comes back, finds its lease lost, registers again
            self.cluster.signal(target, signal.SIGCONT)
        (res.held_blocks, res.open_txns, res.unreleased), res.settle_s = settle(self.cluster, rid)
        until_disaggregated(self.cluster, self.prompt[:8], timeout_s=15.0)
        return res

    def _outcome(self, res: CaseResult, box: dict, hung: bool) -> None:
        """`res`'s outcome from what its request's thread left in `box` (`hung`: it never ended)."""
        if hung:
            res.outcome = "hung"
        elif "result" in box:
            r = box["result"]
            res.attempts = r.attempts
            if r.finish_reason == "cancelled":  # after output began: the tokens so far, then the end
                res.outcome = "cancelled"
                res.tokens_match = list(r.token_ids) == list(self.reference)[:len(r.token_ids)]
            else:
                res.outcome = "ok"
                res.tokens_match = list(r.token_ids) == list(self.reference)
        else:
            err = box.get("error")
            res.outcome = f"failed: {getattr(err, 'code', type(err).__name__)}"
            res.detail = str(getattr(err, "message", err))

    def _victim(self, victim: str, rid: str) -> str:
        if victim == "prefill":
            return self.events.worker_of(rid, PREFILL_EVENTS)
        if victim == "decode":
            return self.events.worker_of(rid, DECODE_EVENTS)
        return victim  # directory, redis, router: one process each


def until_disaggregated(cluster: LocalCluster, prompt: list[int], timeout_s: float = 30.0) -> bool:
    """Probe until a request is served disaggregated again (after a directory or Redis
    outage the router serves colocated until it sees a decode-capable worker)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with cluster.client(timeout_s=10) as c:
                if c.generate_full(prompt_ids=prompt, max_tokens=1, mode="disaggregated").route == "disaggregated":
                    return True
        except Exception:  # noqa: BLE001 - still coming back
            pass
        time.sleep(0.2)
    return False


def fences(cluster: LocalCluster) -> tuple[dict[str, int], int]:
    """(every registered worker's epoch, the route epoch): fences that must never move
    backwards, whatever happens to Redis."""
    async def read(d):
        snap = await d.snapshot()
        return {w.worker_id: w.epoch for w in snap.workers}, await d.get_route_epoch()
    return _directory(cluster, read)


def advance_route_epoch(cluster: LocalCluster) -> int:
    """Advance the route epoch once (as a rollback would); the new epoch."""
    async def advance(d):
        return (await d.advance_route_epoch(reason="fault suite")).route_epoch
    return _directory(cluster, advance)


def fault_env(events: Path, pause_s: float) -> dict[str, str]:
    """Worker environment for fault cases: the pause knob, the event log, short TTLs
    so that whatever a dead caller left behind is reclaimed within a case."""
    return {"PD_FAULT_PAUSE_S": str(pause_s), "PD_EVENT_LOG": str(events),
            "PD_RESERVATION_TTL_S": "8", "PD_PREFILL_TTL_S": "20", "PD_TXN_TTL_S": "10",
            "PD_PROFILE_CALIBRATE": "0"}
