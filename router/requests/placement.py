"""Where a request runs: pure placement functions over a cluster snapshot.

Disaggregated: prefill worker P = fewest pending prefill tokens; decode worker
D = most free K/V blocks among workers whose cache ABI digest equals P's and
that can hold the request's blocks; P != D. Colocated: the decode-capable
worker with most free blocks.

Heartbeats lag dispatch, so every load figure is the snapshot's plus this
router's own dispatches that the snapshot cannot show yet, less those it shows
that have ended since (`LoadOverlay`).

Ranking, most important first (every key is a tuple; ties end on worker id,
so placement is deterministic):

1. workers to avoid: least total penalty (failures of this request's earlier
   attempts, and workers whose calls recently failed router-wide —
   `FailureMemory`); an avoided worker is still chosen when nothing else can;
2. fits now (free blocks >= blocks needed) before "fits only when emptier" —
   the snapshot lags, so a worker that could ever hold the request is still
   worth a Reserve when nothing fits now; the worker's answer is authoritative;
3. P's pending prefill tokens, ascending;
4. D's free blocks, descending.

A worker that cannot hold the request even empty (capacity.total_blocks), or
whose vocab / context length the request exceeds, is never chosen.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from router.types import free_blocks_after
from runtime.directory.records import ClusterSnapshot, WorkerRecord


@dataclasses.dataclass(frozen=True, slots=True)
class Demand:
    """The shape of one request, as placement sees it."""

    prompt_tokens: int
    max_tokens: int
    max_token_id: int = 0

    def blocks_on(self, worker: WorkerRecord) -> int:
        """K/V blocks the request needs on `worker` (0 if it declares no block size)."""
        return blocks_needed(self.prompt_tokens, self.max_tokens, worker.capacity.block_size)


def blocks_needed(prompt_tokens: int, max_tokens: int, block_size: int) -> int:
    """ceil((prompt + max_tokens - 1) / block_size): the last sampled token needs no K/V."""
    if block_size <= 0:
        return 0
    return math.ceil((prompt_tokens + max_tokens - 1) / block_size)


def rejects(worker: WorkerRecord, demand: Demand) -> str | None:
    """Why `worker` can never serve `demand` (vocab, context, capacity), or None."""
    cap = worker.capacity
    if cap.vocab_size and demand.max_token_id >= cap.vocab_size:
        return f"token id {demand.max_token_id} >= vocab_size {cap.vocab_size}"
    total = demand.prompt_tokens + demand.max_tokens
    if cap.max_model_len and total > cap.max_model_len:
        return f"prompt + max_tokens = {total} > max_model_len {cap.max_model_len}"
    need = demand.blocks_on(worker)
    if worker.can_decode and cap.total_blocks and need > cap.total_blocks:
        return f"needs {need} blocks of {cap.block_size} tokens > total_blocks {cap.total_blocks}"
    return None


@dataclasses.dataclass(slots=True)
class _Dispatch:
    worker_id: str
    epoch: int
    prefill_tokens: int
    blocks: int
    after_fetch: int
    """Id of the last snapshot fetch started before this dispatch (before its end, once ended)."""
    at_s: float
    """When it was dispatched (when it ended, once ended)."""
    planned: bool = False
    """Counted at plan time for a request not dispatched yet (see `add`): it counts until
    its owner removes it or `ttl_s` passes, whatever the reports say."""
    sign: int = 1
    """+1: dispatched, not in the worker's reported load yet; 0: a report shows it, kept for
    its end (or, ended: no report taken during it was seen yet); -1: ended, a report taken
    before its end shows it: given back until a report newer than its end."""
    started_s: float = 0.0
    """When it was dispatched, kept after its end (dated reports are compared with it)."""
    ended: bool = False
    confirmed: bool = True
    """False until the worker said it holds the blocks (`LoadOverlay.confirm`): a report
    taken after the dispatch was sent may still predate its allocation (the call in flight,
    or queued behind the worker's busy loop), so only one taken after the confirmation shows it."""


SHOWN_TTL_S = 3600.0
"""A dispatch a heartbeat showed is kept (counting nothing) for its end at most this long:
a bound for a handle its owner never removes, far past any request's life."""

DATE_SLACK_S = 0.001
"""The store's clock counts whole milliseconds: a report's age read from two of its
readings is off by up to this much either way."""


class LoadOverlay:
    """What this router dispatched that the latest snapshot may not show yet, and what
    it shows that has ended since.

    A dispatch counts until (a) its owner removes it (the attempt ended), (b) a load
    report provably taken after the dispatch (after the worker confirmed it, for one added
    unconfirmed: `confirm`) shows up, (c) the worker re-registered or
    left, or (d) `ttl_s` passed. Double counting in between is conservative: it only
    under-states headroom. After (b) the entry is kept, counting nothing, for its end.

    When did a worker take its report? The directory stamps each one on its own clock,
    and the snapshot says what that clock read (`load_reported_ms`, `now_ms`): the
    report is that much older than the snapshot's read, which happened between this
    router's sending the fetch and its answer, so on this router's clock the report was
    taken within that window less its age. Without the stamps (a directory before them)
    a report is only known to be newer than a dispatch when the worker's lease expiry
    changed between two snapshots whose reads both started after the dispatch.

    A dispatch that ends is given back (counted negative) while the latest report was
    taken during it — it shows the request, not its end — until a report newer than its
    end, (c), or `ttl_s` after the end. Heartbeats are a lease third apart, so without
    that a worker whose last report was taken while it held a request looks loaded for
    up to that long after the request ended: a stream of short requests would each see
    the last one still in its worker's decode batch. A dated report read only after the
    end still counts: the entry waits, counting nothing, for the first report newer than
    its end, and turns negative if one taken during it shows up first. Figures built
    from the overlay are clamped to what a worker can report (free blocks at most its
    total, counts at least 0).
    """

    def __init__(self, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[int, _Dispatch] = {}
        self._next_id = 0
        self._fetches = 0
        self._observed = 0
        self._sent: dict[int, float] = {}  # fetch id -> when it was sent
        self._marks: dict[str, tuple[int, int, int]] = {}  # id -> (epoch, lease expiry, fetch id)
        self._dated: dict[str, tuple[int, float, float]] = {}
        """Worker id -> (epoch, earliest, latest): when its latest report was taken, on this
        router's clock (workers whose reports the directory dates)."""

    def fetch_started(self) -> int:
        """Call before asking the directory for a snapshot; pass the id to `observe`."""
        self._fetches += 1
        self._sent[self._fetches] = self._clock()
        return self._fetches

    def _windows(self, cluster: ClusterSnapshot, sent: float) -> dict[str, tuple[int, float, float]]:
        """When each dated report of `cluster` was taken (see the class)."""
        received = self._clock()
        if not cluster.now_ms:
            return {}
        out = {}
        for w in cluster.workers:
            if w.load_reported_ms:
                age = max(0, cluster.now_ms - w.load_reported_ms) / 1000.0
                out[w.worker_id] = (w.epoch, sent - age - DATE_SLACK_S, received - age + DATE_SLACK_S)
        return out

    def observe(self, cluster: ClusterSnapshot, fetch_id: int) -> None:
        """Retire entries that snapshot `fetch_id` (or its reports) already reflects."""
        sent = self._sent.pop(fetch_id, None)
        for old in [k for k in self._sent if k < fetch_id]:
            del self._sent[old]  # fetches that failed or were overtaken
        if fetch_id <= self._observed:
            return  # an older fetch finished late; the newer one already counted
        self._observed = fetch_id
        self._dated = self._windows(cluster, self._clock() if sent is None else sent)
        live = {w.worker_id: w for w in cluster.workers}
        for key, e in list(self._entries.items()):
            w = live.get(e.worker_id)
            if w is None or w.epoch != e.epoch:
                del self._entries[key]  # that incarnation's state is gone
                continue
            if e.planned or not e.confirmed:
                continue  # not on the worker yet (or not known to be): no report can show it
            dated = self._dated.get(e.worker_id)
            if dated is not None:
                _, lo, hi = dated
                newer = lo > e.at_s  # the report was taken after the dispatch (its end, once ended)
                during = e.ended and lo > e.started_s and hi < e.at_s
            else:
                prev = self._marks.get(e.worker_id)
                newer = prev is not None and prev[1] != w.lease_expiry_ms and e.after_fetch < prev[2]
                during = False
            if not e.ended:
                if newer:
                    e.sign = 0  # a report newer than the dispatch shows it: kept for its end
            elif newer:
                del self._entries[key]  # ... or newer than its end: the report is right again
            elif during:
                e.sign = -1  # taken while it ran, read only after it ended: given back
        self._marks = {w.worker_id: (w.epoch, w.lease_expiry_ms, fetch_id) for w in cluster.workers}
        self._expire()

    def add(self, worker: WorkerRecord, prefill_tokens: int = 0, blocks: int = 0, planned: bool = False,
            confirmed: bool = True) -> int:
        """Count a dispatch against `worker`; returns a handle for `remove`. `planned`:
        a route planned but not dispatched yet (placement counts it, so a burst spreads;
        the admission queue's room check does not, the request may wait instead).
        `confirmed` False: no report shows it before `confirm` (blocks the worker allocates
        when the call reaches it)."""
        self._next_id += 1
        now = self._clock()
        self._entries[self._next_id] = _Dispatch(worker.worker_id, worker.epoch, prefill_tokens, blocks,
                                                 self._fetches, now, planned, started_s=now, confirmed=confirmed)
        return self._next_id

    def confirm(self, handle: int | None) -> None:
        """The worker holds what dispatch `handle` counts (its Reserve answered, its stream
        began): from now, a report taken later shows it (idempotent; None is ignored)."""
        e = self._entries.get(handle) if handle is not None else None
        if e is None or e.confirmed or e.ended:
            return
        e.confirmed, e.after_fetch, e.at_s = True, self._fetches, self._clock()

    def remove(self, handle: int | None) -> None:
        """The dispatch ended: stop counting it, or, when a heartbeat showed it, give it back
        until one shows its end (idempotent; None is ignored)."""
        e = self._entries.get(handle) if handle is not None else None
        if e is None or e.ended:
            return
        dated = self._dated.get(e.worker_id)
        if e.planned or (e.sign > 0 and (dated is None or dated[0] != e.epoch)):
            del self._entries[handle]  # no report showed it, and none read later can say it did
            return
        e.sign = -1 if e.sign == 0 else 0
        e.ended, e.after_fetch, e.at_s = True, self._fetches, self._clock()

    def prefill_tokens(self, worker_id: str) -> int:
        """Prompt tokens dispatched to `worker_id` and not yet visible in its load."""
        self._expire()
        return sum(e.sign * e.prefill_tokens for e in self._entries.values() if e.worker_id == worker_id)

    def blocks(self, worker_id: str, planned: bool = True) -> int:
        """K/V blocks reserved on `worker_id` and not yet visible in its load (with
        `planned` False: dispatched ones only)."""
        self._expire()
        return sum(e.sign * e.blocks for e in self._entries.values()
                   if e.worker_id == worker_id and (planned or not e.planned))

    def totals(self) -> dict[str, tuple[int, int, int]]:
        """Worker id -> (prefill tokens, blocks, sequences holding blocks) not yet
        visible in its load, in one pass."""
        self._expire()
        out: dict[str, tuple[int, int, int]] = {}
        for e in self._entries.values():
            t, b, n = out.get(e.worker_id, (0, 0, 0))
            out[e.worker_id] = (t + e.sign * e.prefill_tokens, b + e.sign * e.blocks, n + e.sign * (e.blocks > 0))
        return out

    def __len__(self) -> int:
        """Holds not removed yet (the given-back ended ones are not holds)."""
        return sum(not e.ended for e in self._entries.values())

    def _expire(self) -> None:
        now = self._clock()
        for key in [k for k, e in self._entries.items()
                    if e.at_s < now - (SHOWN_TTL_S if e.sign == 0 and not e.ended else self._ttl_s)]:
            del self._entries[key]


class FailureMemory:
    """Workers whose own calls failed (unreachable, hung) in the last `cooldown_s`.

    Shared by all requests, so the request after a worker died does not pick it
    again while the directory still lists it (until its lease expires). A
    worker that re-registers (new epoch) starts clean.
    """

    def __init__(self, cooldown_s: float = 3.0, clock: Callable[[], float] = time.monotonic):
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._failed: dict[str, tuple[int, float]] = {}  # id -> (epoch, when)

    def record(self, worker: WorkerRecord) -> None:
        """Remember that a call to `worker` failed now."""
        self._failed[worker.worker_id] = (worker.epoch, self._clock())

    def penalties(self, cluster: ClusterSnapshot, weight: int = 2) -> dict[str, int]:
        """Penalty per recently failed worker of `cluster` (same epoch, within the cooldown)."""
        cutoff = self._clock() - self._cooldown_s
        self._failed = {k: v for k, v in self._failed.items() if v[1] >= cutoff}
        live = {w.worker_id: w.epoch for w in cluster.workers}
        return {k: weight for k, (epoch, _) in self._failed.items() if live.get(k) == epoch}


def free_blocks(worker: WorkerRecord, overlay: LoadOverlay | None = None, planned: bool = True) -> int:
    """Free K/V blocks: the heartbeat's figure (capacity before the first heartbeat)
    minus this router's unreported reservations (`planned`: and plan-time holds), plus
    the reported ones that ended since; may be negative, never above the total."""
    return free_blocks_after(worker, overlay.blocks(worker.worker_id, planned) if overlay is not None else 0)


def pending_prefill_tokens(worker: WorkerRecord, overlay: LoadOverlay | None = None) -> int:
    """Prompt tokens queued at `worker`, including this router's unreported dispatches
    (less the reported ones that ended since; never below 0)."""
    extra = overlay.prefill_tokens(worker.worker_id) if overlay is not None else 0
    return max(0, worker.load.pending_prefill_tokens + extra)


Avoid = Mapping[str, int] | Collection[str]
"""Worker ids to avoid: a penalty per id, or a plain collection (penalty 1 each)."""


def _penalty(avoid: Avoid, worker_id: str) -> int:
    if isinstance(avoid, Mapping):
        return avoid.get(worker_id, 0)
    return int(worker_id in avoid)


def _decode_key(worker: WorkerRecord, demand: Demand, overlay: LoadOverlay | None) -> tuple:
    free = free_blocks(worker, overlay)
    return (free < demand.blocks_on(worker), -free, worker.load.active_decode_batch, worker.worker_id)


def choose_pair(cluster: ClusterSnapshot, demand: Demand, overlay: LoadOverlay | None = None,
                avoid: Avoid = (), tried: Collection[tuple[str, str]] = ()) -> tuple[WorkerRecord, WorkerRecord] | None:
    """Best (prefill, decode) pair for a disaggregated attempt, or None.

    `avoid`: penalties of workers that failed (chosen only when no alternative
    exists); `tried`: (P id, D id) pairs never to choose again.
    """
    prefills = [w for w in cluster.workers if w.can_prefill and rejects(w, demand) is None]
    decodes = [w for w in cluster.workers if w.can_decode and rejects(w, demand) is None]
    best_key, best = None, None
    for p in prefills:
        p_key = (pending_prefill_tokens(p, overlay), p.worker_id)
        for d in decodes:
            if d.worker_id == p.worker_id or d.cache_abi_digest != p.cache_abi_digest:
                continue
            if (p.worker_id, d.worker_id) in tried:
                continue
            d_key = _decode_key(d, demand, overlay)
            key = (_penalty(avoid, p.worker_id) + _penalty(avoid, d.worker_id), d_key[0], p_key, d_key[1:])
            if best_key is None or key < best_key:
                best_key, best = key, (p, d)
    return best


def choose_colocated(cluster: ClusterSnapshot, demand: Demand, overlay: LoadOverlay | None = None,
                     avoid: Avoid = ()) -> WorkerRecord | None:
    """Best decode-capable worker to run the whole request, or None."""
    candidates = [w for w in cluster.workers if w.can_decode and rejects(w, demand) is None]
    if not candidates:
        return None
    return min(candidates, key=lambda w: (_penalty(avoid, w.worker_id), *_decode_key(w, demand, overlay)))


def has_prefill_worker(cluster: ClusterSnapshot) -> bool:
    """True when some worker can run a disaggregated prefill."""
    return any(w.can_prefill for w in cluster.workers)


def capacity_shortfall(workers: Iterable[WorkerRecord], demand: Demand) -> str | None:
    """A message with the numbers if no decode-capable worker could hold the
    request's K/V even when empty; None if one could (or none declares capacity)."""
    sized = [w for w in workers if w.can_decode and w.capacity.total_blocks]
    if not sized or any(demand.blocks_on(w) <= w.capacity.total_blocks for w in sized):
        return None
    best = max(sized, key=lambda w: (w.capacity.total_blocks * max(w.capacity.block_size, 1), w.worker_id))
    need = demand.blocks_on(best)
    return (f"request needs {need} K/V blocks of {best.capacity.block_size} tokens "
            f"(prompt {demand.prompt_tokens} + max_tokens {demand.max_tokens} - 1 = "
            f"{demand.prompt_tokens + demand.max_tokens - 1} tokens), but the largest decode worker "
            f"({best.worker_id}) has only {best.capacity.total_blocks} blocks in total")
