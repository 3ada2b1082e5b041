"""One prefill's hand-off, step by step (the steps of prefill_worker/worker.py's docstring).

`HandOffPlan` is decided once, when the grant's plan is known (or known to come later):
granted now or later, streamed or whole, the token's COMMIT ahead or not, chunks in one
announced batch or one by one. `HandOff` then runs it, one method per step of the
protocol: `grant`, `compute`, `send_whole` or `declare` (streamed), `commit`, `verdict`.
Nothing after the plan asks again what kind of hand-off this is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from pdserve_client.spans import TRANSFER_COMMIT
from runtime.directory.wire import evidence_of
from runtime.engine import Engine, SamplingParams, Sequence
from runtime.engine.digest import LayerDigest
from runtime.telemetry import tracing
from runtime.transfer import TOKEN_FOLLOWS, Chunk, ChunkKey, KVSender, TransferCommit, TransferKey, Verdict
from runtime.transfer.chunks import chunk_bytes, chunk_views, describe_chunk
from runtime.worker.capabilities import SourceGate
from runtime.worker.config import PrefillWorkerConfig
from runtime.worker.directory_ops import TxnOps
from runtime.worker.events import EventLog, FaultPause
from runtime.worker.loop import AsyncSink, EngineLoop, Job, TokenOut

from .commit import TokenCommit, present, settle
from .room import PoolQueue
from .streaming import ProducerGate, stream_chunks
from .tasks import PrefillOutcome, Target, Task, TaskState, advance, check_live, send_plan, streams, whole_keys
from .tracing import PrefillTrace


class Worker(Protocol):
    """What a hand-off uses of its prefill worker (prefill_worker/worker.py PrefillWorker)."""

    cfg: PrefillWorkerConfig
    engine: Engine
    loop: EngineLoop
    sender: KVSender
    txn: TxnOps
    gate: SourceGate | None
    room: PoolQueue
    events: EventLog
    pause: FaultPause


class TransferRefused(RuntimeError):
    """The destination or the directory refused the transfer (reason in the message)."""


@dataclasses.dataclass(frozen=True, slots=True)
class HandOffPlan:
    """What kind of hand-off this is, decided once."""

    granted_later: bool
    """The grant comes after the job (the router asked the decode worker for blocks
    meanwhile) and the transfer cannot stream: the prompt computes while the grant is
    checked. Never streamed."""
    stream: bool
    """Chunks leave per layer as the prefill writes it (BEGIN first; the declaration and the
    COMMIT go ahead of the token once every chunk left: `declare`)."""
    token_commit_early: bool
    """Streamed: the token's COMMIT may post from token 0's own callback (TokenCommit;
    a fault test holding it back asks for `token_late`)."""
    one_by_one: bool
    """Whole: each chunk in a message of its own, not one announced batch (a fault test
    stopping between two chunks asks for it: runtime/worker/events.py PLAN_OPTIONS)."""


class HandOff:
    """One prefill: compute, send and commit one transfer (PrefillWorker.prefill runs it)."""

    def __init__(self, worker: Worker, task: Task, tenant: str, transfer_id: str, prompt: list[int],
                 sampling: SamplingParams, target: Awaitable[Target],
                 on_first_token: Callable[[TokenOut], None] | None):
        self.w, self.task, self.tenant, self.transfer_id = worker, task, tenant, transfer_id
        self.prompt, self.sampling, self.target, self.on_first_token = prompt, sampling, target, on_first_token
        self.e = worker.engine
        self.rid = task.request_id
        self.one_by_one = worker.pause.asks("one_by_one", self.rid)
        """A fault test stopping between two chunks asks for them one by one (HandOffPlan)."""
        self.t0 = time.perf_counter()
        self.keys: list[ChunkKey] = []
        """The chunks to send, in manifest order (the grant's plan)."""
        self.chunks: list[Chunk] = []
        """The chunks sent, as described (checksums) when they left."""
        self.trace = PrefillTrace()
        self.plan: HandOffPlan | None = None
        self.seq: Sequence | None = None

    # ---- the plan and the grant -------------------------------------------
    async def grant(self) -> HandOffPlan:
        """Decide the plan: granted now (its check awaited here) or later (checked while this
        computes, `task.granting`)."""
        cfg, e = self.w.cfg, self.e
        whole = -(-len(self.prompt) // e.block_size) * e.num_layers * e.block_bytes_per_layer
        target_now = isinstance(self.target, asyncio.Future) and self.target.done()
        if not target_now and not streams(cfg, whole):  # checked as soon as it lands, presented while this computes
            self.task.granting = asyncio.ensure_future(self._granted())
            self.plan = HandOffPlan(True, False, False, self.one_by_one)
        else:
            self.keys = await self._granted()
            stream = streams(cfg, sum(chunk_bytes(e, k) for k in self.keys))
            early = stream and not self.w.pause.asks("token_late", self.rid)
            self.plan = HandOffPlan(False, stream, early, self.one_by_one)
        self.w.events("plan", request=self.rid, **dataclasses.asdict(self.plan))
        return self.plan

    async def _granted(self) -> list[ChunkKey]:
        """The target checked (plan, capability): the plan; `task.dest`, `task.auth` (leaving)."""
        task, w = self.task, self.w
        t = await self.target
        plan = send_plan(self.e, t.first_token_pos, len(self.prompt), t.chunks)
        credential = None
        if w.gate is not None and plan:  # no chunk: no byte is read or sent
            credential = w.gate.check(t.capability, t.manifest, plan, sum(n for *_, n in t.chunks))
        check_live(task)
        task.dest, task.key = t.dest, TransferKey.of(self.transfer_id, t.key)
        keys = whole_keys(self.e, plan, w.cfg, self.one_by_one)
        # out while this computes (checked meanwhile); nothing of the transfer leaves before it
        task.auth = asyncio.ensure_future(present(w.sender, t.dest, self.transfer_id, credential, t.key, keys))
        return plan

    # ---- compute --------------------------------------------------------------
    async def allocate(self) -> None:
        """Blocks for the prompt (a full pool queues the job: room.py)."""
        w = self.w
        self.task.seq = self.seq = await w.room.allocate(
            lambda: w.loop.add_request(self.transfer_id, self.prompt, 1, self.sampling, self.tenant), len(self.prompt))
        check_live(self.task)
        advance(self.task, TaskState.COMPUTING)

    def arm(self) -> None:
        """The compute's listeners: the layers' digest, the streaming gate, the token's early
        COMMIT and the sink token 0 reaches the router through."""
        task, n = self.task, len(self.prompt)
        self.kv = kv = LayerDigest(self.e, self.seq)  # streamed: each layer hashed once final

        def written(layer: int, end: int) -> None:
            self.w.events("layer_written", request=self.rid, layer=layer, token_end=end)
            if end >= n:
                kv.final(layer)
        self.gate = ProducerGate(self.e.num_layers, self.seq.num_cached_tokens, n,
                                 asyncio.get_running_loop(), written)
        self.early = early = TokenCommit(self.plan.token_commit_early, lambda: task.state is TaskState.COMPUTING and (
            (auth := task.auth) is None or (auth.done() and not auth.cancelled() and auth.exception() is None)))
        first = self.on_first_token
        self.sink = AsyncSink(asyncio.get_running_loop(), on_first=(lambda item: early.on_first(item.token_id))
                              if first is None else  # the COMMIT posts first
                              lambda item: (early.on_first(item.token_id), first(item)))

    def submit(self) -> Job:
        """The prefill to the engine loop; streamed, the chunks follow its layers out and the
        declaration follows the last of them (`self.streamer`, `self.declared`)."""
        stream, self.digested = self.plan.stream, []

        def done(s: Sequence, error: BaseException | None) -> None:
            """Engine thread, the job just ended: not streamed, the digest is taken here,
            before the first token's wake-up, instead of one more hop to this thread after it."""
            if error is None and not stream:
                try:
                    self.digested.append(self.kv.hexdigest())
                except Exception as exc:  # noqa: BLE001 - the prefill fails with it
                    error = exc
            self.sink.on_done(s, error)
        self.job = Job(self.seq, self.sink.on_token, done, prefill_only=True,
                       on_layer=self.gate.on_layer if stream else None)
        self.w.loop.submit_prefill(self.job)
        self.computed_event = asyncio.Event()
        self.streamer = self.declared = None
        if stream:
            self.streamer = asyncio.ensure_future(stream_chunks(
                self.gate, self.keys, self.e.block_size, self._send_one, lambda: check_live(self.task)))
            self.declared = asyncio.ensure_future(self.declare())
        return self.job

    async def compute(self) -> tuple[int, float, float]:
        """Wait for the prefill's first token: (token, when sampled, when the compute was
        over). A failure also stops the gate."""
        first, t_first = None, 0.0
        while True:
            item = await self.sink.queue.get()
            if isinstance(item, TokenOut):
                first, t_first = item.token_id, time.perf_counter()
            elif item.error is not None:
                self.gate.fail(item.error)
                raise item.error
            else:
                break
        await self.w.pause("sampled", self.rid)  # (a test's long compute tail: the COMMIT goes ahead)
        self.computed_event.set()
        t_computed = time.perf_counter()
        self.w.events("computed", request=self.rid)
        await self.w.pause("computed", self.rid)
        check_live(self.task)
        if self.plan.granted_later:  # the compute is done: the grant's check (most often done already)
            self.keys = await self.task.granting
            t_computed = time.perf_counter()
        return first, t_first, t_computed

    # ---- send -------------------------------------------------------------------
    async def _send(self, described: Iterable[Chunk], last: bool = False, keys: list | tuple = ()) -> None:
        """Out in one call (small chunks may share a message); lazy: each hashed as the last moves.
        `last`: the COMMIT follows at once (the last message may carry it); `keys`: send_many's."""
        task, e, bs, n = self.task, self.e, self.e.block_size, len(self.prompt)
        if self.chunks:
            await self.w.pause("chunk", self.rid)
        if task.auth is not None:
            await task.auth
        t_ns, sent = time.time_ns(), []

        def items():
            for c in described:
                self.w.events("chunk_sent", request=self.rid, layer=c.key.layer, block_start=c.key.block_start,
                              block_count=c.key.block_count, needs_token=min(
                                  (c.key.block_start + c.key.block_count) * bs, n))
                sent.append(c)
                yield c, chunk_views(e, self.seq, c.key)
        await self.w.sender.send_many(task.dest, self.transfer_id, items(), hold_last=last, keys=keys)
        for c in sent:
            self.trace.sent(c.key.layer, c.num_bytes, t_ns)
            self.chunks.append(c)

    async def _send_one(self, key: ChunkKey) -> None:
        await self._send([describe_chunk(self.e, self.seq, key, self.task.key)])

    async def send_whole(self) -> str:
        """Not streamed: every chunk once computed, the COMMIT carrying the declaration sealed
        (no Begin: the destination's Publish declares, validates and publishes in one step).
        Returns the K/V digest (taken on the engine thread)."""
        e, seq = self.e, self.seq
        described = (describe_chunk(e, seq, key, self.task.key) for key in self.keys)  # hashed just before it leaves
        one_by_one = self.plan.one_by_one
        keys = () if one_by_one else [(key, chunk_bytes(e, key)) for key in self.keys]  # announced
        for part in ([c] for c in described) if one_by_one else [described]:
            check_live(self.task)
            await self._send(part, last=not one_by_one, keys=keys)
        return self.digested[0]

    async def declare(self) -> tuple[str, bool]:
        """Streamed: as soon as every chunk left, and if the compute still runs, the COMMIT
        (the declaration sealed in it) goes ahead of the first token
        (TOKEN_FOLLOWS): the destination validates and publishes meanwhile, and only the
        token is left for after the compute. Every layer is final by then and already hashed
        (LayerDigest), while the compute goes on (the last layer's MLP, the norm, the head:
        ~70 ms of a 2,048-token prompt on `small`). Returns (digest, committed ahead)."""
        await self.streamer
        kv, order = self.kv, {key: i for i, key in enumerate(self.keys)}
        if kv.hashed == self.e.num_layers:  # all hashed: only the finish
            kv_digest = kv.hexdigest()
        else:  # a layer not final yet (the plan did not reach the prompt's end): after the compute
            kv_digest = await self.w.loop.call(lambda en: kv.hexdigest())
        self.chunks.sort(key=lambda c: order[c.key])  # manifest order: what the seal and the destination list
        if self.computed_event.is_set():  # the token is there already: one COMMIT with everything
            return kv_digest, False
        self.w.events("commit_ahead", request=self.rid, chunks=len(self.chunks))
        with tracing.span_in(TRANSFER_COMMIT):
            verdict = await self._commit(self.chunks, kv_digest, TOKEN_FOLLOWS, sealed=True)
        if not verdict.published:
            raise TransferRefused(f"destination refused the transfer: {verdict.reason}")
        token_commit = self._manifest((), kv_digest, TOKEN_FOLLOWS)  # made now, not on its way
        self.early.arm(lambda token: self._early(token_commit, token))
        return kv_digest, True

    # ---- commit and verdict ------------------------------------------------------
    async def commit(self, first_token: int, kv_digest: str, ahead: bool) -> Verdict:
        """The COMMIT (only the token's when committed `ahead`), or the one token 0's
        callback already posted (TokenCommit); its verdict."""
        task = self.task
        check_live(task)
        if task.auth is not None:
            await task.auth
        advance(task, TaskState.COMMITTING)
        self.w.events("commit", request=self.rid, chunks=len(self.chunks))
        early = self.early
        if early.sent is not None:  # the token's COMMIT left from token 0's callback (TokenCommit)
            verdict = await early.sent
            tracing.past_span(TRANSFER_COMMIT, early.sent_ns, time.time_ns())
            return verdict
        with tracing.span_in(TRANSFER_COMMIT):  # its context travels in the commit
            return await self._commit(() if ahead else self.chunks, kv_digest, first_token, sealed=not ahead)

    def verdict(self, verdict: Verdict, first_token: int, t_first: float, t_computed: float,
                kv_digest: str) -> PrefillOutcome:
        """PUBLISHED (else TransferRefused): the outcome, with the times the router learns from."""
        if not verdict.published:
            raise TransferRefused(f"destination refused the transfer: {verdict.reason}")
        advance(self.task, TaskState.PUBLISHED)
        t_end = time.perf_counter()
        self.w.events("verdict", request=self.rid, published=True, streamed=self.plan.stream)
        # compute: the job's own chunks; queue: the rest of the wait for its first token
        # (prompts ahead of it, decode steps between its chunks on a mixed worker).
        compute_ms, reused = self.job.compute_s * 1000, self.seq.num_cached_tokens
        return PrefillOutcome(
            self.transfer_id, len(self.prompt) - reused, reused, first_token, kv_digest,
            sum(c.num_bytes for c in self.chunks), len(self.chunks), max(0.0, (t_first - self.t0) * 1000 - compute_ms),
            compute_ms, (t_end - t_computed) * 1000, (t_end - self.t0) * 1000)

    def _early(self, commit: TransferCommit, token: int) -> Awaitable[Verdict]:
        """The token's COMMIT, posted now where the backend can (TokenCommit)."""
        self.w.events("token_commit", request=self.rid, early=True)
        commit = dataclasses.replace(commit, first_token=token, source_epoch=self.w.txn.epoch_fn())
        posted = self.w.sender.commit_now(self.task.dest, commit)
        return posted if posted is not None else self.w.sender.commit(self.task.dest, commit)

    def _manifest(self, chunks: list[Chunk] | tuple, kv_digest: str, first_token: int,
                  sealed: bool = False) -> TransferCommit:
        """The COMMIT; `sealed`: it declares `chunks` (manifest order) and the digest, under
        this worker's seal (not in the token-only COMMIT of a transfer committed ahead)."""
        txn, task = self.w.txn, self.task
        seal = txn.seal(self.transfer_id, task.generation, evidence_of(kv_digest, chunks)) if sealed else b""
        return TransferCommit(self.transfer_id, task.request_id, task.generation, self.e.abi.digest, tuple(chunks),
                              kv_digest, first_token, txn.worker_id, txn.epoch_fn(),
                              tuple(tracing.inject().items()), seal)

    async def _commit(self, chunks: list[Chunk] | tuple, kv_digest: str, first_token: int,
                      sealed: bool = False) -> Verdict:
        """COMMIT `chunks` (none: the token's COMMIT of a transfer committed ahead of it)."""
        return await self.w.sender.commit(self.task.dest, self._manifest(chunks, kv_digest, first_token, sealed))

    # ---- the whole --------------------------------------------------------------
    async def run(self) -> PrefillOutcome:
        """Every step in order; raises on any failure (the worker cleans up)."""
        plan = await self.grant()
        await self.allocate()
        self.arm()  # (no Begin: the sealed COMMIT declares, the destination's Publish moves it on)
        job = self.submit()
        try:
            try:
                first_token, t_first, t_computed = await self.compute()
                ahead = False  # streamed: committed ahead of the first token (the COMMIT then brings only it)
                if plan.stream:  # declared (and committed ahead) once every chunk left, most often while computing
                    kv_digest, ahead = await self.declared
                else:
                    kv_digest = await self.send_whole()
                self.w.events("digest", request=self.rid)
            finally:
                await settle(self.streamer)
                await settle(self.declared)
            verdict = await self.commit(first_token, kv_digest, ahead)
        finally:  # the past spans (queue, compute, send), off the token's way: built before its
            # COMMIT, they held it ~1 ms at 2,048 tokens (in a failure too, for its trace)
            await settle(self.early.sent)
            self.trace.ended(job)
        return self.verdict(verdict, first_token, t_first, t_computed, kv_digest)
