"""One simulated worker, run as the engine loop runs (runtime/worker/loop.py):

    each iteration: the commands queued (a hand-off's sequence joins the decode batch),
    one prefill chunk of the oldest prompt (chunked prefill), one decode step over the
    batch (continuous batching; a batch past max_decode_batch is rotated through)

A prompt's last chunk samples its token 0 and, on a worker that decodes, the sequence
joins the decode step of that same iteration. Step times come from the worker's
EngineProfile (its CostProfile), so the simulator prices compute exactly as the router
believes it costs; the residual between the two is what validation measures.

Speed: while the worker only decodes, nothing changes between two events but the
context, which grows by one token per sequence per round, so k rounds cost

    T(k) = k * (A + f * C0) + f * b * k (k - 1) / 2,   A = R * base + per_seq * b, R = ceil(b / M)

(b sequences, context C0, f ms per context token, M the batch limit): a decode-only
stretch is one event, ended by its first finishing sequence or cut at the round
boundary after something arrives (`interrupt`). Iterations with a prefill chunk are one
event each.

Blocks: a decode-capable worker's sequences hold the blocks the router reserved for them
(prompt + output, taken at dispatch); a prefill worker takes a prompt's blocks when its
first chunk starts (it waits when its pool is full) and gives them back when the K/V has
left. A finished prompt leaves its shared prefix cached (LRU, counted as free).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable

from runtime.directory.records import WorkerRole
from sim.profile import EngineProfile


@dataclasses.dataclass(slots=True, eq=False)
class Seq:
    """One request's sequence at one worker."""

    index: int
    """The request's index in the run."""
    prompt: int
    output: int
    """Tokens to generate, token 0 included."""
    blocks: int = 0
    """Blocks it holds here (reserved at dispatch, or taken by a prefill worker's first chunk)."""
    prefill_only: bool = False
    reused: int = 0
    """Prompt tokens found in this worker's prefix cache."""
    computed: int = 0
    """Prompt tokens whose K/V exists here (reused ones included)."""
    generated: int = 0
    compute_ms: float = 0.0
    """Time in its own prefill chunks."""
    token0_ms: float = math.nan
    first_decode_ms: float = math.nan
    """When this worker's first decode step gave it a token (a hand-off's first at D)."""
    last_ms: float = math.nan
    prefix_group: int = -1
    prefix_blocks: int = 0

    @property
    def context(self) -> int:
        return self.prompt + self.generated


ITER, DECODE, ADMIT = 1, 2, 3

BUSY_WINDOW_MS = 200.0
"""The window of a worker's recent busy share (`Worker.recent_busy`)."""


@dataclasses.dataclass(slots=True)
class Segment:
    """What the worker is running: one iteration, or `rounds` decode-only rounds."""

    kind: int
    start_ms: float
    end_ms: float
    rounds: int = 0
    chunk: int = 0
    """ITER: prompt tokens of the chunk (0: none)."""
    chunk_ms: float = 0.0
    step_ms: float = 0.0
    a_ms: float = 0.0
    """DECODE: the per-round cost without its context term (A)."""
    c0: int = 0
    scale: float = 1.0
    """How much the shared host stretches this segment (1: the worker owns its core)."""


class Worker:
    """A simulated engine loop. The cluster (sim/cluster.py) calls `submit`, `join` and
    `on_event`; the worker calls back `token0(worker, seq, t)`, `done(worker, seq)` and
    `freed(worker)`, and asks `schedule(worker, t)` for its next event."""

    def __init__(self, worker_id: str, role: WorkerRole, engine: EngineProfile,
                 schedule: Callable[[Worker, float], None], token0: Callable[[Worker, Seq, float], None],
                 done: Callable[[Worker, Seq], None], freed: Callable[[Worker], None],
                 host: SharedHost | None = None):
        self.worker_id, self.role, self.engine = worker_id, role, engine
        self.can_prefill, self.can_decode = role is not WorkerRole.DECODE, role is not WorkerRole.PREFILL
        self._schedule, self._token0, self._done, self._freed = schedule, token0, done, freed
        self.host = host
        self.admit_ms = 0.0
        """Loop time per hand-off admitted (Overheads.admit_ms; the cluster sets it)."""
        self.prefill_q: collections.deque[Seq] = collections.deque()
        self.batch: list[Seq] = []
        self.joining: list[Seq] = []
        self.free_blocks = engine.total_blocks
        self.context = 0
        """Context tokens of the decode batch (as of the segment's start)."""
        self.seg: Segment | None = None
        self.version = 0
        """Bumped whenever the scheduled event changes (older heap entries are stale)."""
        self.cached: collections.OrderedDict[int, int] = collections.OrderedDict()
        """Prefix group -> leading blocks cached here (LRU)."""
        self.busy_ms = 0.0
        """Time spent computing (for utilisation)."""
        self._recent = 0.0
        """Busy share over the last BUSY_WINDOW_MS (exponentially weighted), as of `_recent_t`."""
        self._recent_t = 0.0
        self.pending_tokens = 0
        """Prompt tokens queued or in prefill, not yet computed."""

    def recent_busy(self, now: float) -> float:
        """The share of the last ~BUSY_WINDOW_MS this worker's loop spent computing
        (exponentially weighted; the segment running now counted up to `now`)."""
        s = self.seg
        if s is None or now <= s.start_ms:
            return self._recent_at(now)
        return self._busy_since(s.start_ms, now)

    def _recent_at(self, t: float) -> float:
        return self._recent * math.exp(-max(0.0, t - self._recent_t) / BUSY_WINDOW_MS)

    def _busy_since(self, start: float, now: float) -> float:
        """The recent busy share at `now` after computing without a pause since `start`."""
        decay = math.exp(-(now - start) / BUSY_WINDOW_MS)
        return self._recent_at(start) * decay + 1.0 - decay

    # ---- what the cluster does ----------------------------------------------------
    def reserve(self, seq: Seq, blocks: int) -> None:
        """Take `blocks` for `seq`, which the router dispatched here (the cluster checked room)."""
        assert blocks <= self.free_blocks, f"{self.worker_id}: reserve {blocks} > free {self.free_blocks}"
        self.free_blocks -= blocks
        seq.blocks = blocks

    def submit(self, seq: Seq, now: float) -> None:
        """A prompt to prefill (its blocks already reserved here unless `prefill_only`)."""
        seq.reused = self.prefix_hit(seq)
        seq.computed = seq.reused
        self.pending_tokens += seq.prompt - seq.computed
        self.prefill_q.append(seq)
        self._wake(now)

    def join(self, seq: Seq, now: float) -> None:
        """A hand-off published: the sequence decodes from the next iteration on."""
        self.joining.append(seq)
        self._wake(now)

    def prefix_hit(self, seq: Seq) -> int:
        """Prompt tokens of `seq` this worker has cached (whole blocks, never the last token)."""
        if seq.prefix_group < 0:
            return 0
        blocks = self.cached.get(seq.prefix_group, 0)
        if blocks:
            self.cached.move_to_end(seq.prefix_group)
        usable = (seq.prompt - 1) // self.engine.block_size
        return min(blocks, seq.prefix_blocks, usable) * self.engine.block_size

    def release(self, seq: Seq, now: float) -> None:
        """Give back `seq`'s blocks (its prefix stays cached)."""
        self.free_blocks += seq.blocks
        seq.blocks = 0
        if seq.prefix_group >= 0 and seq.prefix_blocks:
            self.cached[seq.prefix_group] = max(self.cached.get(seq.prefix_group, 0), seq.prefix_blocks)
            self.cached.move_to_end(seq.prefix_group)
            while sum(self.cached.values()) > max(0, self.free_blocks):
                self.cached.popitem(last=False)
        self._freed(self)
        if self.seg is None and self.prefill_q:  # a prefill waiting for the pool
            self._start(now)

    # ---- state as a heartbeat would report it -------------------------------------------
    def load_at(self, now: float) -> tuple[int, int, int]:
        """(pending prefill tokens, decode batch, context tokens) at `now`."""
        s = self.seg
        ctx = self.context
        if s is not None and s.kind == DECODE and s.rounds:
            ctx += len(self.batch) * self._rounds_done(s, now)
        return self.pending_tokens, len(self.batch), ctx

    def cached_blocks(self) -> int:
        if not self.cached:
            return 0
        return min(sum(self.cached.values()), max(0, self.free_blocks))

    # ---- the loop ------------------------------------------------------------------------
    def _wake(self, now: float) -> None:
        s = self.seg
        if s is None or now <= s.start_ms:  # nothing ran yet: plan the iteration again with it
            self.seg = None
            self._start(now)
        elif s.kind == DECODE:
            self._cut(s, now)

    def _start(self, now: float) -> None:
        if self.joining:
            for q in self.joining:
                self.batch.append(q)
                self.context += q.context
            k = len(self.joining)
            self.joining.clear()
            if self.admit_ms > 0:  # the imports run first: the batch waits for them
                scale = self.host.factor(now) if self.host is not None else 1.0
                self._set(Segment(ADMIT, now, now + self.admit_ms * k * scale, scale=scale))
                return
        head = self.prefill_q[0] if self.prefill_q else None
        if head is not None and head.blocks == 0 and head.prefill_only:
            need = -(-head.prompt // self.engine.block_size)
            if need > self.free_blocks:
                head = None  # the pool is full: wait for a release (`freed` wakes us)
            else:
                head.blocks = need
                self.free_blocks -= need
        if head is not None:
            self._iterate(head, now)
        elif self.batch:
            self._decode(now)
        else:
            self.seg = None

    def _iterate(self, head: Seq, now: float) -> None:
        e = self.engine
        chunk = min(e.max_prefill_tokens, head.prompt - head.computed)
        chunk_ms = e.prefill_ms(chunk, head.computed)
        last = head.computed + chunk >= head.prompt
        b = len(self.batch) + (1 if last and self.can_decode and not head.prefill_only and head.output > 1 else 0)
        ctx = self.context + (head.prompt + 1 if b > len(self.batch) else 0)
        step_ms = self._step_ms(b, ctx) if b else 0.0
        k = self.host.factor(now) if self.host is not None else 1.0
        chunk_ms, step_ms = chunk_ms * k, step_ms * k
        self._set(Segment(ITER, now, now + chunk_ms + step_ms, chunk=chunk, chunk_ms=chunk_ms, step_ms=step_ms,
                          scale=k))

    def _decode(self, now: float) -> None:
        b = len(self.batch)
        rounds = min(q.output - q.generated for q in self.batch)
        a = self._round_fixed_ms(b)
        s = Segment(DECODE, now, 0.0, rounds=rounds, a_ms=a, c0=self.context,
                    scale=self.host.factor(now) if self.host is not None else 1.0)
        s.end_ms = now + self._rounds_ms(s, rounds)
        self._set(s)

    def _set(self, s: Segment) -> None:
        self.seg = s
        self.version += 1
        self._schedule(self, s.end_ms)

    def _cut(self, s: Segment, now: float) -> None:
        """Something arrived during a decode-only stretch: end it at the next round boundary."""
        k = self._rounds_done(s, now) + 1
        if k < s.rounds:
            s.rounds = k
            s.end_ms = s.start_ms + self._rounds_ms(s, k)
            self.version += 1
            self._schedule(self, s.end_ms)

    def on_event(self, now: float) -> None:
        """The scheduled segment ended at `now`."""
        s = self.seg
        assert s is not None and abs(s.end_ms - now) < 1e-6, "a stale event reached the worker"
        self.busy_ms += s.end_ms - s.start_ms
        self._recent, self._recent_t = self._busy_since(s.start_ms, now), now
        if s.kind == ITER:
            self._end_iteration(s)
        elif s.kind == DECODE:
            self._end_rounds(s)
        self.seg = None
        self._start(now)

    def _end_iteration(self, s: Segment) -> None:
        head = self.prefill_q[0]
        head.computed += s.chunk
        head.compute_ms += s.chunk_ms
        self.pending_tokens -= s.chunk
        t_chunk = s.start_ms + s.chunk_ms
        if head.computed >= head.prompt:
            self.prefill_q.popleft()
            head.generated = 1
            head.token0_ms = head.last_ms = t_chunk
            if self.host is not None:
                self.host.tokens(t_chunk, 1)
            if self.can_decode and not head.prefill_only and head.output > 1:
                self.batch.append(head)
                self.context += head.context
            self._token0(self, head, t_chunk)
            if not head.prefill_only and head.output <= 1:
                self._finish(head, t_chunk)
        if s.step_ms:
            self._step_all(1, s.end_ms)

    def _end_rounds(self, s: Segment) -> None:
        self._step_all(s.rounds, s.end_ms)

    def _step_all(self, rounds: int, t: float) -> None:
        """Every sequence of the batch gained `rounds` tokens, the last at `t`."""
        b = len(self.batch)
        if self.host is not None:
            self.host.tokens(t, b * rounds)
        self.context += b * rounds
        done = []
        for q in self.batch:
            if q.generated == 1 and math.isnan(q.first_decode_ms):
                q.first_decode_ms = t if rounds == 1 else self._first_round_end(t)
            q.generated += rounds
            q.last_ms = t
            if q.generated >= q.output:
                done.append(q)
        for q in done:
            self.batch.remove(q)
            self.context -= q.context
            self._finish(q, t)

    def _first_round_end(self, t: float) -> float:
        s = self.seg
        return s.start_ms + self._rounds_ms(s, 1) if s is not None and s.kind == DECODE else t

    def _finish(self, q: Seq, t: float) -> None:
        self.release(q, t)
        self._done(self, q)

    # ---- costs -------------------------------------------------------------------------
    def _step_ms(self, b: int, ctx: int) -> float:
        return self._round_fixed_ms(b) + self.engine.cost.decode_ms_per_context_token * ctx

    def _round_fixed_ms(self, b: int) -> float:
        c = self.engine.cost
        rounds = -(-b // self.engine.max_decode_batch)
        return rounds * c.decode_base_ms + c.decode_ms_per_seq * b

    def _rounds_ms(self, s: Segment, k: int) -> float:
        """T(k): k decode-only rounds from the segment's start."""
        f, b = self.engine.cost.decode_ms_per_context_token, len(self.batch)
        return (k * (s.a_ms + f * s.c0) + f * b * k * (k - 1) / 2) * s.scale

    def _rounds_done(self, s: Segment, now: float) -> int:
        """Rounds of `s` complete by `now` (at most s.rounds)."""
        dt = (now - s.start_ms) / s.scale
        if dt <= 0:
            return 0
        f, b = self.engine.cost.decode_ms_per_context_token, len(self.batch)
        lin = s.a_ms + f * s.c0 - f * b / 2
        quad = f * b / 2
        if quad > 0:
            k = int((-lin + math.sqrt(lin * lin + 4 * quad * dt)) / (2 * quad))
        else:
            k = int(dt / lin) if lin > 0 else s.rounds
        k = max(0, min(k, s.rounds))
        while k > 0 and self._rounds_ms(s, k) / s.scale > dt + 1e-9:
            k -= 1
        while k < s.rounds and self._rounds_ms(s, k + 1) / s.scale <= dt + 1e-9:
            k += 1
        return k


class SharedHost:
    """The cores a cluster's processes share (sim/profile.py HostProfile): the demand now is
    the workers computing (one core each) plus the serving path's CPU at the recent token
    and request rates (exponentially decayed over `window_ms`); a step that starts while the
    demand exceeds the cores is stretched by demand / cores."""

    def __init__(self, cores: float, token_cpu_ms: float, request_cpu_ms: float, split_cpu_ms: float,
                 busy: Callable[[], int], window_ms: float = 100.0):
        self.cores, self.token_cpu_ms, self.request_cpu_ms = cores, token_cpu_ms, request_cpu_ms
        self.split_cpu_ms = split_cpu_ms
        self._busy = busy
        self._tau = window_ms
        self._cpu = 0.0
        """Serving-path CPU ms per ms of late (decayed)."""
        self._t = 0.0

    def _decay(self, now: float) -> None:
        if now > self._t:
            self._cpu *= math.exp(-(now - self._t) / self._tau)
            self._t = now

    def tokens(self, now: float, n: int) -> None:
        self._decay(now)
        self._cpu += n * self.token_cpu_ms / self._tau

    def request(self, now: float, cpu_ms: float | None = None) -> None:
        """A request's CPU (default: `request_cpu_ms`) spent around `now`."""
        self._decay(now)
        self._cpu += (self.request_cpu_ms if cpu_ms is None else cpu_ms) / self._tau

    def factor(self, now: float, extra: float = 1.0) -> float:
        """demand / cores (at least 1); `extra`: cores the asker adds (a worker about to
        compute: 1; a hop: 0)."""
        self._decay(now)
        return max(1.0, (self._busy() + extra + self._cpu) / self.cores)
