"""Prefill worker logic (no gRPC).

One request:
  0. Granted   — destination, chunk plan and capability, checked. The router may
                 send the job before its grant (it asks the decode worker for blocks
                 meanwhile): a transfer too small to stream takes its grant after the
                 compute, one that may stream before (its chunks leave per layer)
  1. Queued    — prompt validated, blocks allocated (prefix reuse: compute set only); a full
                 pool queues the job until prefills in flight free theirs (room.py)
  2. Computing — chunked prefill on the engine loop; samples token 0 (to the router at once)
  3. Sending   — transfer-set chunks pushed to the destination's reserved blocks.
                 The capability is presented (AUTH) once granted.
                 Streaming (transfers of at least stream_min_bytes): BEGIN
                 (TRANSFERRING) before compute, each chunk leaves as soon as prefill
                 wrote its layer (streaming.py), and once the last one left (most
                 often before the compute ends) the COMMIT goes ahead of the first
                 token (TOKEN_FOLLOWS: the destination validates and publishes while
                 the compute ends; the COMMIT after it brings the token alone);
                 otherwise after the whole prefill, the COMMIT in the last message
  4. Committed — manifest (chunks, checksums, digest, first token) handed over,
                 the source's declaration sealed in it (services/security/seal.py:
                 no declaring BEGIN); the destination's Publish relays the seal,
                 the directory opens it and publishes, or the destination refuses
Blocks are freed in every case (full prompt blocks stay as prefix cache). Any
failure once granted aborts the transfer at the destination and the transaction
(before, neither was reached: the router's teardown aborts its record).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from pdserve_client.spans import TRANSFER_COMMIT
from services.common.tasks import TaskSet
from services.directory.chunk_plan import Layout
from services.directory.wire import evidence_of
from services.engine import InvalidRequest, SamplingParams, Sequence
from services.engine.digest import LayerDigest
from services.telemetry import tracing
from services.telemetry.catalog import WorkerMetrics
from services.transfer import TOKEN_FOLLOWS, Chunk, ChunkKey, KVSender, TransferCommit, TransferKey, Verdict
from services.transfer.chunks import chunk_bytes, chunk_views, describe_chunk
from services.worker.capabilities import SourceGate
from services.worker.config import PrefillWorkerConfig
from services.worker.directory_ops import TxnOps
from services.worker.events import EventLog, FaultPause
from services.worker.loop import AsyncSink, EngineLoop, Job, TokenOut

from .commit import TokenCommit, present, settle
from .room import PoolQueue
from .streaming import ProducerGate, stream_chunks
from .tasks import PrefillOutcome, Target, Task, TaskState, advance, end, send_plan, whole_keys
from .tracing import PrefillTrace

log = logging.getLogger(__name__)


class TransferRefused(RuntimeError):
    """The destination or the directory refused the transfer (reason in the message)."""


class PrefillWorker:
    """Runs prefills and pushes their K/V."""

    def __init__(self, cfg: PrefillWorkerConfig, loop: EngineLoop, sender: KVSender, txn: TxnOps,
                 gate: SourceGate | None = None, metrics: WorkerMetrics | None = None):
        self.cfg, self.metrics = cfg, metrics or WorkerMetrics()
        """Where completed hand-offs are counted (pd_kv_transfer_bytes_total, exposed time)."""
        self.gate = gate
        """Checks the router's transfer capability before any K/V is read (None: security off)."""
        self.loop, self.engine, self.sender, self.txn = loop, loop.engine, sender, txn
        self.tasks: dict[str, Task] = {}
        """Prefills in flight, until their blocks are freed (after the reply)."""
        self._releasing = TaskSet(lambda e: log.error("freeing a prefill's blocks failed: %r", e))
        self.events = EventLog(cfg.event_log, cfg.worker_id)
        self.pause = FaultPause(cfg.fault_pause_s)
        self.room = PoolQueue(on_wait=self.metrics.prefill_pool_waits.inc)  # jobs waiting for blocks

    async def prefill(self, *, request_id: str, tenant: str, generation: int, transfer_id: str,
                      prompt: list[int], sampling: SamplingParams, abi_digest: str,
                      first_token_pos: int = 0, dest: str = "", chunks: list[Layout] = (),
                      manifest=None, capability: bytes = b"", target: Awaitable[Target] | None = None,
                      on_first_token: Callable[[int], None] | None = None) -> PrefillOutcome:
        """Compute, send and commit one transfer; raises on any failure (after cleanup).
        ``chunks`` is the manifest's expected list: exactly what is sent. With a gate, the
        capability must grant exactly this transfer (CapabilityDenied before anything is read).
        ``target``: the destination, the grant's, comes later (instead of these arguments);
        one too small to stream computes meanwhile. Nothing is read or sent before it.
        ``on_first_token(token)``: token 0, on the loop as soon as it is sampled (to the router)."""
        if abi_digest:
            self.engine.abi.check_compatible(abi_digest)
        if target is None:
            target = asyncio.get_running_loop().create_future()
            target.set_result(Target(dest, first_token_pos, list(chunks), manifest, capability))
        if transfer_id in self.tasks:
            raise InvalidRequest(f"transfer {transfer_id} is already in progress")
        task = self.tasks[transfer_id] = Task(request_id, generation,
                                              runner=asyncio.current_task())
        ttl = asyncio.get_running_loop().call_later(self.cfg.prefill_ttl_s, self._expire, task)
        try:
            out = await self._compute_and_send(task, tenant, transfer_id, prompt, sampling, target, on_first_token)
            self.metrics.sent(out.sent_bytes, out.transfer_ms / 1000)
            return out
        except BaseException as e:
            end(task, TaskState.FAILED)
            if task.dest is not None:  # the hand-off began: undo it at both ends
                reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                await self.sender.abort(task.dest, transfer_id, reason)
                await self.txn.abort(request_id, transfer_id, generation, f"prefill: {reason}")
            raise
        finally:
            ttl.cancel()
            # Off the reply's way: the engine thread frees the blocks (~1 ms), then the task leaves the table.
            self._releasing.spawn(self._release(task, transfer_id))

    async def _release(self, task: Task, transfer_id: str) -> None:
        try:
            if task.seq is not None:
                seq = task.seq
                await self.loop.call(lambda e: e.free(seq))
        finally:
            self.room.freed()
            if self.tasks.get(transfer_id) is task:
                del self.tasks[transfer_id]
            windows = getattr(self.sender, "credit_windows", dict)()
            self.events("credits", request=task.request_id, transfer=transfer_id,
                        in_flight=sum(w.in_flight for w in windows.values()))

    async def _granted(self, task: Task, transfer_id: str, prompt_len: int,
                       target: Awaitable[Target]) -> list[ChunkKey]:
        """The target checked (plan, capability): the plan; `task.dest`, `task.auth` (leaving)."""
        t = await target
        plan = send_plan(self.engine, t.first_token_pos, prompt_len, t.chunks)
        credential = None
        if self.gate is not None and plan:  # no chunk: no byte is read or sent
            credential = self.gate.check(t.capability, t.manifest, plan, sum(n for *_, n in t.chunks))
        self._check(task)
        task.dest, task.key = t.dest, TransferKey.of(transfer_id, t.key)
        keys = whole_keys(self.engine, plan, self.cfg, self.pause.wants("chunk", task.request_id))
        # out while this computes (checked meanwhile); nothing of the transfer leaves before it
        task.auth = asyncio.ensure_future(present(self.sender, t.dest, transfer_id, credential, t.key, keys))
        return plan

    async def _compute_and_send(self, task: Task, *args) -> PrefillOutcome:
        try:
            return await self._hand_off(task, *args)
        finally:
            await settle(task.granting)  # before the presentation it may have started
            await settle(task.auth)

    async def _hand_off(self, task: Task, tenant: str, transfer_id: str, prompt: list[int],
                        sampling: SamplingParams, target: Awaitable[Target],
                        on_first_token: Callable[[int], None] | None) -> PrefillOutcome:
        t0 = time.perf_counter()
        e, bs = self.engine, self.engine.block_size
        layers = e.model_cfg.num_hidden_layers
        # Granted later, a transfer that cannot stream (the whole prompt is below the
        # streaming size) computes meanwhile; one that may stream needs its plan to start.
        whole = -(-len(prompt) // bs) * layers * e.cache.block_bytes_per_layer
        granted_later = not (isinstance(target, asyncio.Future) and target.done()) \
            and not (self.cfg.stream_layers and whole >= self.cfg.stream_min_bytes)
        plan: list[ChunkKey] = []
        if granted_later:  # checked as soon as it lands, its capability presented while this computes
            task.granting = asyncio.ensure_future(self._granted(task, transfer_id, len(prompt), target))
        else:
            plan = await self._granted(task, transfer_id, len(prompt), target)
        task.seq = seq = await self.room.allocate(
            lambda: self.loop.add_request(transfer_id, prompt, 1, sampling, tenant), len(prompt))
        self._check(task)
        advance(task, TaskState.COMPUTING)
        reused = seq.num_cached_tokens
        nbytes = sum(chunk_bytes(e, k) for k in plan)
        stream = not granted_later and self.cfg.stream_layers and nbytes >= self.cfg.stream_min_bytes
        rid = task.request_id
        kv = LayerDigest(e, seq)  # streamed: each layer hashed once final, while later ones compute

        def written(layer: int, end: int) -> None:
            self.events("layer_written", request=rid, layer=layer, token_end=end)
            if end >= len(prompt):
                kv.final(layer)
        gate = ProducerGate(layers, reused, len(prompt), asyncio.get_running_loop(), written)
        early = TokenCommit(stream and not any(self.pause.wants(step, rid) for step in ("sampled", "computed")),
                            lambda: task.state is TaskState.COMPUTING
                            and ((auth := task.auth) is None
                                 or (auth.done() and not auth.cancelled() and auth.exception() is None)))
        sink = AsyncSink(asyncio.get_running_loop(), on_first=early.on_first if on_first_token is None else
                         lambda token: (early.on_first(token), on_first_token(token)))  # the COMMIT posts first
        chunks: list[Chunk] = []
        order = {key: i for i, key in enumerate(plan)}
        trace = PrefillTrace()

        async def send_all(described: Iterable[Chunk], last: bool = False, keys: list | tuple = ()) -> None:
            """Out in one call (small chunks may share a message); lazy: each hashed as the last moves.
            `last`: the COMMIT follows at once (the last message may carry it); `keys`: send_many's."""
            if chunks:
                await self.pause("chunk", rid)
            if task.auth is not None:
                await task.auth
            t_ns, sent = time.time_ns(), []

            def items():
                for c in described:
                    self.events("chunk_sent", request=rid, layer=c.key.layer, block_start=c.key.block_start,
                                block_count=c.key.block_count, needs_token=min(
                                    (c.key.block_start + c.key.block_count) * bs, len(prompt)))
                    sent.append(c)
                    yield c, chunk_views(e, seq, c.key)
            await self.sender.send_many(task.dest, transfer_id, items(), hold_last=last, keys=keys)
            for c in sent:
                trace.sent(c.key.layer, c.num_bytes, t_ns)
                chunks.append(c)

        async def send(key: ChunkKey) -> None:
            await send_all([describe_chunk(e, seq, key, task.key)])

        ahead = False  # streamed: committed ahead of the first token (the COMMIT then brings only it)
        if stream:  # the transaction must be TRANSFERRING before the first chunk leaves
            await self._begin(task, transfer_id)
        digested: list[str] = []

        def done(s: Sequence, error: BaseException | None) -> None:
            """Engine thread, the job just ended: not streamed, the digest is taken here,
            before the first token's wake-up, instead of one more hop to this thread after it."""
            if error is None and not stream:
                try:
                    digested.append(kv.hexdigest())
                except Exception as exc:  # noqa: BLE001 - the prefill fails with it
                    error = exc
            sink.on_done(s, error)
        job = Job(seq, sink.on_token, done, prefill_only=True, on_layer=gate.on_layer if stream else None)
        self.loop.submit_prefill(job)
        streamer = asyncio.ensure_future(stream_chunks(
            gate, plan, bs, send, lambda: self._check(task))) if stream else None
        computed = asyncio.Event()
        declared = asyncio.ensure_future(self._declare(task, transfer_id, streamer, kv, chunks, order, task.dest,
                                                       computed, early)) if stream else None
        try:
            try:
                first_token, t_first = await self._computed(sink, gate)
                await self.pause("sampled", rid)  # (a test's long compute tail: the COMMIT goes ahead)
                computed.set()
                t_computed = time.perf_counter()
                self.events("computed", request=rid)
                await self.pause("computed", rid)
                self._check(task)
                if granted_later:  # the compute is done: the grant's check (most often done already)
                    plan = await task.granting
                    t_computed = time.perf_counter()
                if streamer is None:
                    # No Begin: the declaration travels sealed in the COMMIT, and the
                    # destination's Publish declares, validates and publishes in one step.
                    kv_digest = digested[0]
                    described = (describe_chunk(e, seq, key, task.key) for key in plan)  # hashed just before it leaves
                    # Chunks one at a time only where a test pauses between two.
                    one_by_one = self.pause.wants("chunk", rid)
                    keys = () if one_by_one else [(key, chunk_bytes(e, key)) for key in plan]  # announced
                    for part in ([c] for c in described) if one_by_one else [described]:
                        self._check(task)
                        await send_all(part, last=not one_by_one, keys=keys)
                else:  # declared (and committed ahead) once every chunk left, most often while computing
                    kv_digest, ahead = await declared
                self.events("digest", request=rid)
            finally:
                await settle(streamer)
                await settle(declared)
            self._check(task)
            if task.auth is not None:
                await task.auth
            advance(task, TaskState.COMMITTING)
            self.events("commit", request=rid, chunks=len(chunks))
            if early.sent is not None:  # the token's COMMIT left from token 0's callback (TokenCommit)
                verdict = await early.sent
                tracing.past_span(TRANSFER_COMMIT, early.sent_ns, time.time_ns())
            else:
                with tracing.span_in(TRANSFER_COMMIT):  # its context travels in the commit
                    verdict = await self._commit(task, transfer_id, task.dest, () if ahead else chunks, kv_digest,
                                                 first_token, sealed=not ahead)
        finally:  # the past spans (queue, compute, send), off the token's way: built before its
            # COMMIT, they held it ~1 ms at 2,048 tokens (in a failure too, for its trace)
            await settle(early.sent)
            trace.ended(job)
        if not verdict.published:
            raise TransferRefused(f"destination refused the transfer: {verdict.reason}")
        advance(task, TaskState.PUBLISHED)
        t_end = time.perf_counter()
        self.events("verdict", request=rid, published=True, streamed=stream)
        # compute: the job's own chunks; queue: the rest of the wait for its first token
        # (prompts ahead of it, decode steps between its chunks on a mixed worker).
        compute_ms = job.compute_s * 1000
        return PrefillOutcome(
            transfer_id, len(prompt) - reused, reused, first_token, kv_digest,
            sum(c.num_bytes for c in chunks), len(chunks), max(0.0, (t_first - t0) * 1000 - compute_ms),
            compute_ms, (t_end - t_computed) * 1000, (t_end - t0) * 1000)

    async def _computed(self, sink: AsyncSink, gate: ProducerGate) -> tuple[int, float]:
        """Wait for the prefill's first token; (token, when). A failure also stops the gate."""
        first = None
        t_first = 0.0
        while True:
            item = await sink.queue.get()
            if isinstance(item, TokenOut):
                first, t_first = item.token_id, time.perf_counter()
            elif item.error is not None:
                gate.fail(item.error)
                raise item.error
            else:
                return first, t_first

    async def _declare(self, task: Task, transfer_id: str, streamer: asyncio.Future, kv: LayerDigest,
                       chunks: list[Chunk], order: dict[ChunkKey, int], dest: str,
                       computed: asyncio.Event, early: TokenCommit) -> tuple[str, bool]:
        """Streamed: as soon as every chunk left, and if the compute still runs, the COMMIT
        (the declaration sealed in it) goes ahead of the first token
        (TOKEN_FOLLOWS): the destination validates and publishes meanwhile, and only the
        token is left for after the compute. Every layer is final by then and already hashed
        (LayerDigest), while the compute goes on (the last layer's MLP, the norm, the head:
        ~70 ms of a 2,048-token prompt on `small`). Returns (digest, committed ahead)."""
        await streamer
        if kv.hashed == self.engine.model_cfg.num_hidden_layers:  # all hashed: only the finish
            kv_digest = kv.hexdigest()
        else:  # a layer not final yet (the plan did not reach the prompt's end): after the compute
            kv_digest = await self.loop.call(lambda en: kv.hexdigest())
        chunks.sort(key=lambda c: order[c.key])  # manifest order: what the seal and the destination list
        if computed.is_set():  # the token is there already: one COMMIT with everything
            return kv_digest, False
        self.events("commit_ahead", request=task.request_id, chunks=len(chunks))
        with tracing.span_in(TRANSFER_COMMIT):
            verdict = await self._commit(task, transfer_id, dest, chunks, kv_digest, TOKEN_FOLLOWS, sealed=True)
        if not verdict.published:
            raise TransferRefused(f"destination refused the transfer: {verdict.reason}")
        token_commit = self._manifest(task, transfer_id, (), kv_digest, TOKEN_FOLLOWS)  # made now, not on its way
        early.arm(lambda token: self._early(task, dest, token_commit, token))
        return kv_digest, True

    def _early(self, task: Task, dest: str, commit: TransferCommit, token: int) -> Awaitable[Verdict]:
        """The token's COMMIT, posted now where the backend can (TokenCommit)."""
        self.events("token_commit", request=task.request_id, early=True)
        commit = dataclasses.replace(commit, first_token=token, source_epoch=self.txn.epoch_fn())
        posted = self.sender.commit_now(dest, commit)
        return posted if posted is not None else self.sender.commit(dest, commit)

    def _manifest(self, task: Task, transfer_id: str, chunks: list[Chunk] | tuple, kv_digest: str,
                  first_token: int, sealed: bool = False) -> TransferCommit:
        """The COMMIT; `sealed`: it declares `chunks` (manifest order) and the digest, under
        this worker's seal (not in the token-only COMMIT of a transfer committed ahead)."""
        seal = self.txn.seal(transfer_id, task.generation, evidence_of(kv_digest, chunks)) if sealed else b""
        return TransferCommit(transfer_id, task.request_id, task.generation, self.engine.abi.digest, tuple(chunks),
                              kv_digest, first_token, self.txn.worker_id, self.txn.epoch_fn(),
                              tuple(tracing.inject().items()), seal)

    async def _commit(self, task: Task, transfer_id: str, dest: str, chunks: list[Chunk] | tuple, kv_digest: str,
                      first_token: int, sealed: bool = False) -> Verdict:
        """COMMIT `chunks` (none: the token's COMMIT of a transfer committed ahead of it)."""
        return await self.sender.commit(dest, self._manifest(task, transfer_id, chunks, kv_digest, first_token,
                                                             sealed))

    async def _begin(self, task: Task, transfer_id: str) -> None:
        """Directory Begin: open a streamed transfer (TRANSFERRING before its first chunk)."""
        r = await self.txn.begin(task.request_id, transfer_id, task.generation)
        if not r.ok:
            raise TransferRefused(f"directory refused BEGIN: {r.outcome.name}, state "
                                  f"{r.state.name if r.state else 'none'}")

    def _expire(self, task: Task) -> None:
        """The prefill TTL passed: cancel it wherever it waits (its finally frees the blocks)."""
        log.warning("prefill %s@%d still running after %.0f s: cancelled", task.request_id,
                    task.generation, self.cfg.prefill_ttl_s)
        self._cancel(task, f"prefill TTL of {self.cfg.prefill_ttl_s:g} s expired")

    def _cancel(self, task: Task, why: str | None = None) -> None:
        """Stop `task` wherever it waits (room in the pool, a credit, READY, the verdict)."""
        end(task, TaskState.CANCELLED)
        if task.seq is not None:
            self.loop.cancel(task.seq)
        if task.runner is not None and task.runner is not asyncio.current_task():
            task.runner.cancel(why)

    def held_blocks(self) -> int:
        """Blocks held by prefills in flight (computing, sending or awaiting the verdict)."""
        return len({b for t in list(self.tasks.values()) if t.seq is not None for b in t.seq.block_table})

    def _check(self, task: Task) -> None:
        if task.state is TaskState.CANCELLED:
            raise asyncio.CancelledError("cancelled by caller")

    async def cancel(self, request_id: str, generation: int = 0) -> bool:
        """Cancel every prefill of request_id (at one generation, or all when 0)."""
        found = False
        for task in list(self.tasks.values()):
            if task.request_id == request_id and generation in (0, task.generation):
                found = True
                self._cancel(task)
        return found
