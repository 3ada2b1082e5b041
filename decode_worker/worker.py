"""Decode worker logic (no gRPC): reserve, receive, validate, publish, decode, release.

Lifecycle of a disaggregated request here, as numbered queues:
  1. Reserved   — blocks for prompt + max_tokens allocated; receiver expects chunks
  2. Receiving  — chunks land in the reserved (unpublished) blocks
  3. Published  — commit validated, directory CAS applied; admitted to the batch
                  (admission.py) — a commit sent ahead of its first token (layer
                  streaming) waits for the token's COMMIT, published, not admitted
  4. Decoding   — tokens streamed; at the end blocks freed, transaction released
Every failure before admission goes through `abort_unpublished` (idempotent): stop the
receiver, free the blocks, abort the transaction (release it, if it was published
ahead of a token that did not come), wake the waiting stream.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator

from pdserve_client.spans import DECODE_VALIDATE
from runtime.common.tasks import TaskSet
from runtime.directory.records import TransferRef
from runtime.engine import InvalidRequest, SamplingParams, Sequence
from runtime.security.capability import CapabilityDenied
from runtime.telemetry import tracing
from runtime.telemetry.catalog import WorkerMetrics
from runtime.transfer import (
    ChunkArrived,
    ChunkKey,
    Expectation,
    Failed,
    KVReceiver,
    TransferCommit,
    Verdict,
    token_follows,
)
from runtime.transfer.base import MissingTransferKey
from runtime.transfer.chunks import chunk_bytes, chunk_views, plan_chunks
from runtime.worker.capabilities import DestinationGate, FromRouter
from runtime.worker.config import DecodeWorkerConfig
from runtime.worker.directory_ops import TxnOps
from runtime.worker.events import EventLog, FaultPause
from runtime.worker.loop import AsyncSink, EngineLoop, Job, SeqDone, TokenOut

from . import publication
from .admission import Admission
from .reservations import Reservation, ResState, advance, validate_commit
from .tracing import ReservationTrace

log = logging.getLogger(__name__)

INLINE_DIGEST_BYTES = 256 * 1024
"""Up to this much received K/V, its digest is taken on the event loop when the engine is
idle (`EngineLoop.call(inline=True)`: ~tens of µs of hashing against a loop -> engine ->
loop round trip of thread hand-offs on the hand-off's critical path); more, on the engine
thread, so that a long prompt's hashing never stalls the loop."""


class DecodeWorker:
    """Reservations and streams of one decode worker."""

    def __init__(self, cfg: DecodeWorkerConfig, loop: EngineLoop, receiver: KVReceiver, txn: TxnOps,
                 gate: DestinationGate | None = None, metrics: WorkerMetrics | None = None):
        self.cfg = cfg
        self.metrics = metrics or WorkerMetrics()
        """Where accepted hand-offs are counted (pd_kv_transfer_bytes_total)."""
        self.gate = gate
        """Checks each sender's transfer capability before any chunk lands (None: security off)."""
        self.loop = loop
        self.engine = loop.engine
        self.receiver = receiver
        self.txn = txn
        self.reservations: dict[str, Reservation] = {}
        self.unread: dict[str, Reservation] = {}
        """Finished before any DecodeStream attached (max_tokens 1 finishes at publication):
        kept with their queued tokens until a stream reads them or the reservation TTL."""
        self.colocated: dict[str, Sequence] = {}
        self.ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.events = EventLog(cfg.event_log, cfg.worker_id)
        self.pause = FaultPause(cfg.fault_pause_s)
        self._releases = TaskSet(on_error=lambda e: log.warning("a release or abort of a reservation failed: %r", e))
        self.admission = Admission(loop, cfg.reservation_ttl_s, self._timers, self._finished)

    # ---- 1. reserve -----------------------------------------------------
    async def reserve(self, request_id: str, tenant: str, generation: int, prompt: list[int],
                      max_tokens: int, sampling: SamplingParams, abi_digest: str, key: bytes = b"") -> Reservation:
        """Allocate blocks for a transfer and start expecting its chunks, keyed by `key` (the
        router's transfer secret: runtime/transfer/keys.py)."""
        t0_ns = time.time_ns()
        if abi_digest:
            self.engine.abi.check_compatible(abi_digest)
        self._check_limits(max_tokens)
        transfer_id = TransferRef(request_id, generation).transfer_id
        if transfer_id in self.reservations:
            return self.reservations[transfer_id]  # retried call: same reservation
        if not key and self.receiver.key_required(self.gate is not None):
            raise MissingTransferKey(f"transfer {transfer_id}: no transfer_key (the router mints one per attempt;"
                                     " over this data plane nothing else binds a message to its sender)")
        for old in [r for r in self.reservations.values()
                    if r.request_id == request_id and r.generation < generation]:
            await self.abort_unpublished(old, f"superseded by generation {generation}")
        seq = await self.loop.add_request(transfer_id, prompt, max_tokens, sampling, tenant, receive=True)
        bs, layers = self.engine.block_size, self.engine.num_layers
        first, last = seq.num_cached_tokens // bs, -(-len(prompt) // bs)
        plan = plan_chunks(layers, first, last, self._chunk_blocks())
        res = Reservation(transfer_id, request_id, tenant, generation, seq, layers, first, last,
                          {key: chunk_bytes(self.engine, key) for key in plan},
                          time.monotonic() + self.cfg.reservation_ttl_s, trace=ReservationTrace(t0_ns))
        self.reservations[transfer_id] = res
        self.receiver.expect(Expectation(
            transfer_id, resolve=lambda k: self._resolve(res, k),
            on_event=lambda ev: self._on_event(res, ev), on_commit=lambda c: self._on_commit(res, c),
            authorize=None if self.gate is None else lambda cred, peer: self._authorize(res, cred, peer), key=key))
        self._timers[transfer_id] = asyncio.get_running_loop().call_later(
            self.cfg.reservation_ttl_s, self._expire, res)
        self.events("reserved", request=request_id, generation=generation, blocks=len(seq.block_table))
        try:
            await self.pause("reserved", request_id)
        except asyncio.CancelledError:  # the caller never learns of this reservation: give it back
            await asyncio.shield(self.abort_unpublished(res, "Reserve call cancelled"))
            raise
        return res

    def _chunk_blocks(self) -> int:
        """Blocks per chunk: one prefill chunk's worth (the source's layers open that
        many blocks at a time; engines that pair share the chunk size), capped."""
        per_prefill_chunk = max(1, self.engine.chunk_tokens // self.engine.block_size)
        return max(1, min(self.cfg.max_chunk_blocks, per_prefill_chunk))

    def _check_limits(self, max_tokens: int) -> None:
        if max_tokens > self.cfg.max_tokens_limit:
            raise InvalidRequest(f"max_tokens {max_tokens} exceeds the limit "
                                 f"{self.cfg.max_tokens_limit}")

    def _expire(self, res: Reservation) -> None:
        asyncio.ensure_future(self.abort_unpublished(res, "reservation TTL expired before publish"))

    def check_ahead(self, res: Reservation, capability: bytes) -> None:
        """The router's copy of the attempt's capability (DecodeStream): check it and consume
        its nonce now, before the sender's AUTH comes (unless that already began)."""
        if self.gate is None or not capability or res.ahead is not None or res.auth_started \
                or res.state > ResState.RECEIVING:
            return
        res.ahead = self.gate.ahead(capability, tenant=res.tenant, transfer_id=res.transfer_id,
                                    generation=res.generation, regions=res.regions, num_bytes=res.expected_bytes)

    # ---- 2. receive -----------------------------------------------------
    async def _authorize(self, res: Reservation, credential: dict, peer: str | None) -> None:
        """The sender's capability must grant exactly this reservation's transfer set
        (raises CapabilityDenied: the receiver refuses that sender; the reservation waits
        for the one holding the capability, until its TTL)."""
        if res.state > ResState.RECEIVING:
            raise RuntimeError(f"reservation {res.transfer_id} is {res.state.name}")
        res.auth_started = True
        try:
            with tracing.attached(res.trace.context):  # its nonce check is the request's call, in its trace
                res.grant = await self.gate.check(
                    credential, peer, tenant=res.tenant, transfer_id=res.transfer_id, generation=res.generation,
                    regions=res.regions, num_bytes=res.expected_bytes, router=FromRouter(res.ahead, res.stream_came))
        except CapabilityDenied as e:
            self.events("capability_denied", request=res.request_id, reason=e.reason.value)
            res.trace.denied(e.reason.value)
            log.warning("%s: %s", res.transfer_id, e)
            raise
        self.events("authorized", request=res.request_id)

    def _resolve(self, res: Reservation, key: ChunkKey) -> list[memoryview]:
        if res.state > ResState.RECEIVING:
            raise KeyError(f"reservation {res.transfer_id} is {res.state.name}")
        res.admit_chunk_key(key)
        if res.state is ResState.RESERVED:
            advance(res, ResState.RECEIVING)
        return chunk_views(self.engine, res.seq, key)

    def _on_event(self, res: Reservation, event) -> None:
        if isinstance(event, ChunkArrived):
            res.received[event.key] = event
            res.trace.chunk_visible(event.key.layer, event.num_bytes)
            self.events("chunk_visible", request=res.request_id, layer=event.key.layer,
                        block_start=event.key.block_start, block_count=event.key.block_count)
        elif isinstance(event, Failed):
            asyncio.ensure_future(self.abort_unpublished(res, event.reason))

    # ---- 3. validate and publish ------------------------------------------
    async def _on_commit(self, res: Reservation, commit: TransferCommit) -> Verdict:
        if res.awaiting_token:
            return await self._on_token(res, commit)
        self.events("commit_received", request=res.request_id)
        res.trace.committed(commit.trace)
        await self.pause("commit", res.request_id)
        ahead = token_follows(commit)
        received = sum(a.num_bytes for a in res.received.values())  # every chunk is in: the commit came
        with tracing.span_in(DECODE_VALIDATE, res.trace.context) as span:
            reason = validate_commit(res, commit, self.engine.abi.digest)
            local = ""
            if not reason:
                local = await self.loop.call(lambda e: e.kv_digest(res.seq), inline=received <= INLINE_DIGEST_BYTES)
                self.events("digest_computed", request=res.request_id)
            if not reason and not ahead:
                reason = self._token_error(commit.first_token)
            if not reason and res.state == ResState.ABORTED:  # cancelled, TTL or sender abort meanwhile
                reason = f"aborted while validating: {res.abort_reason}"
            reason = tracing.failed(span, reason)
        if not reason:
            reason = await self._recorded(res)
        if not reason:
            reason = await publication.publish(self.txn, res, local, commit.kv_digest, commit.seal)
            if not reason and res.state == ResState.ABORTED:
                # Aborted (blocks freed) while the directory published: give the publication back.
                self._release_later(res)
                reason = f"aborted while publishing: {res.abort_reason}"
        if reason:
            await self.abort_unpublished(res, reason)
            return Verdict(False, reason)
        self._cancel_timer(res.transfer_id)
        res.kv_digest = local
        advance(res, ResState.PUBLISHED)
        self.metrics.received(received)
        self.events("published", request=res.request_id, chunks=len(res.received), token_follows=ahead)
        await self.pause("published", res.request_id)
        if ahead:  # the prefill still computes its first token: the blocks wait for it, within the TTL
            res.awaiting_token = True
            self._timers[res.transfer_id] = asyncio.get_running_loop().call_later(
                self.cfg.reservation_ttl_s, lambda: asyncio.ensure_future(self.abort_unpublished(
                    res, "no first token within the reservation TTL after publication")))
            return Verdict(True)
        await self.admission.start(res, commit.first_token)  # the VERDICT once token 0 has left
        return Verdict(True)

    def _token_error(self, token: int) -> str:
        return "" if 0 <= token < self.engine.vocab_size else f"first token {token} outside the vocabulary"

    async def _on_token(self, res: Reservation, commit: TransferCommit) -> Verdict:
        """The token's COMMIT of a transfer published ahead of it: admit, or give it all back."""
        self.events("token_received", request=res.request_id)
        reason = self._token_error(commit.first_token)
        if commit.chunks or (commit.request_id, commit.generation, commit.kv_digest) != \
                (res.request_id, res.generation, res.kv_digest):
            reason = "not this transfer's token COMMIT (it lists chunks, or names another request or K/V digest)"
        if reason:
            await self.abort_unpublished(res, reason)
            return Verdict(False, reason)
        self._cancel_timer(res.transfer_id)
        res.awaiting_token = False
        await self.admission.start(res, commit.first_token)
        return Verdict(True)

    @staticmethod
    async def _recorded(res: Reservation) -> str:
        """"" once the router's DecodeStream came (it leaves after the directory recorded the
        transaction: one-way, no Publish of a transaction not recorded yet); else why not:
        aborted meanwhile, or the reservation's TTL. Most often it came before the chunks."""
        if not res.stream_came.is_set():
            waits = {asyncio.ensure_future(res.stream_came.wait()), asyncio.ensure_future(res.published.wait())}
            try:
                await asyncio.wait(waits, timeout=max(0.0, res.deadline_s - time.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        if res.state == ResState.ABORTED:
            return f"aborted while waiting for its stream: {res.abort_reason}"
        if not res.stream_came.is_set():
            return ("no DecodeStream within the reservation TTL (the router sends it once the directory "
                    "recorded the transaction)")
        return ""

    # ---- 4. decode stream -------------------------------------------------
    def find(self, transfer_id: str) -> Reservation | None:
        """The live reservation of transfer_id, or its finished one no stream has read yet."""
        return self.reservations.get(transfer_id) or self.unread.get(transfer_id)

    async def stream(self, transfer_id: str) -> AsyncIterator[TokenOut | SeqDone]:
        """Wait for publication, then yield TokenOut ... SeqDone (runtime/worker/loop.py).
        A sequence that finished before this call (max_tokens 1) streams what it queued."""
        res = self.reservations.get(transfer_id)
        if res is None and (res := self.unread.pop(transfer_id, None)) is not None:
            self._cancel_timer(transfer_id)
        if res is None:
            raise KeyError(self.ended.get(transfer_id, f"no reservation {transfer_id}"))
        res.streamed = True
        res.stream_came.set()
        if res.state == ResState.PUBLISHED and not res.awaiting_token:
            self._cancel_timer(transfer_id)  # claimed: the unclaimed-publication timer stops
        timeout = max(0.0, res.deadline_s - time.monotonic())
        try:
            async with asyncio.timeout(timeout):  # not wait_for: it can swallow the caller's cancel
                await res.published.wait()
        except TimeoutError:
            await self.abort_unpublished(res, "not published before the reservation TTL")
        except asyncio.CancelledError:  # the stream's caller left: unclaimed again (TTL applies)
            res.streamed = False
            raise
        if res.state == ResState.ABORTED:
            raise RuntimeError(f"transfer {transfer_id} aborted: {res.abort_reason}")
        async for item in self._drain(res.sink, res.seq, res):
            yield item
            res.token_0_out.set()  # resumed: gRPC took the item (token 0 the first time)

    async def _drain(self, sink: AsyncSink, seq: Sequence,
                     res: Reservation | None = None) -> AsyncIterator[TokenOut | SeqDone]:
        done = False
        try:
            while not done:
                item = await sink.queue.get()
                done = isinstance(item, SeqDone)
                yield item
        finally:
            if not done:  # consumer went away: stop decoding this sequence
                if res is not None:
                    res.cancelled = True  # token 0 streams before the import: `_admit` may be to come
                self.loop.cancel(seq)

    def _finished(self, res: Reservation, error: BaseException | None) -> None:
        res.trace.ended("" if error is None else repr(error))
        advance(res, ResState.FINISHED if error is None else ResState.ABORTED)
        self._forget(res, "finished" if error is None else f"ended: {error!r}")
        if not res.streamed:  # the DecodeStream call is still on its way: keep the tokens
            self.unread[res.transfer_id] = res
            self._timers[res.transfer_id] = asyncio.get_running_loop().call_later(
                self.cfg.reservation_ttl_s, self.unread.pop, res.transfer_id, None)
        self._release_later(res)

    def _release_later(self, res: Reservation) -> None:
        """PUBLISHED -> RELEASED in the directory, retried while it is away."""
        self._releases.spawn(publication.release(self.txn, res))

    # ---- colocated ----------------------------------------------------------
    async def generate(self, request_id: str, tenant: str, generation: int, prompt: list[int],
                       max_tokens: int, sampling: SamplingParams) -> AsyncIterator[TokenOut | SeqDone]:
        """Chunked prefill + decode here; yields like `stream`."""
        self._check_limits(max_tokens)
        key = TransferRef(request_id, generation).transfer_id
        seq = await self.loop.add_request(key, prompt, max_tokens, sampling, tenant)
        sink = AsyncSink(asyncio.get_running_loop())
        self.colocated[key] = seq
        self.loop.submit_prefill(Job(seq, sink.on_token, sink.on_done))
        try:
            async for item in self._drain(sink, seq):
                yield item
        finally:
            self.colocated.pop(key, None)

    # ---- cancel / abort -------------------------------------------------------
    async def cancel(self, request_id: str, generation: int = 0, reason: str = "cancelled",
                     discard_kv: bool = False) -> bool:
        """Stop every piece of state of request_id (at one generation, or all when 0);
        `discard_kv`: its published prompt blocks also leave the prefix cache."""
        found = False
        if discard_kv:
            await self.admission.discard(request_id, generation, reason)
        for res in list(self.reservations.values()):
            if res.request_id == request_id and generation in (0, res.generation):
                found = True
                if res.state == ResState.PUBLISHED and not res.awaiting_token:
                    res.cancelled = True  # not admitted yet: `_admit` stops it
                    self.loop.cancel(res.seq)
                else:
                    await self.abort_unpublished(res, reason)
        for key, seq in list(self.colocated.items()):
            ref = TransferRef.parse(key)
            if ref.request_id == request_id and generation in (0, ref.generation):
                found = True
                self.loop.cancel(seq)
        return found

    async def abort_unpublished(self, res: Reservation, reason: str) -> None:
        """Idempotent: fence the receiver, free the blocks, abort the transaction (published
        ahead of a first token that did not come: release the publication instead). Once
        begun it runs to its end even if its caller is cancelled (a cancel RPC's handler
        goes with its call while the fence waits out a posted receive)."""
        published = res.awaiting_token
        if res.state >= ResState.PUBLISHED and not published:
            return
        res.awaiting_token = False
        advance(res, ResState.ABORTED)
        res.abort_reason = reason
        res.trace.ended(reason)
        log.info("abort %s: %s", res.transfer_id, reason)
        self.events("aborted", request=res.request_id, generation=res.generation, reason=reason)
        self.receiver.forget(res.transfer_id)
        await asyncio.shield(self._releases.spawn(self._aborted(res, reason, published)))

    async def _aborted(self, res: Reservation, reason: str, published: bool) -> None:
        await self.receiver.fence(res.transfer_id)
        await self.loop.call(lambda e: e.free(res.seq))
        self._forget(res, f"aborted: {reason}")
        res.published.set()
        if published:
            self._release_later(res)
        else:
            await self.txn.abort(res.request_id, res.transfer_id, res.generation, reason)

    async def abort_all_unpublished(self, reason: str) -> None:
        """Lease lost or shutting down: every unpublished reservation goes."""
        for res in list(self.reservations.values()):
            await self.abort_unpublished(res, reason)

    def _cancel_timer(self, transfer_id: str) -> None:
        timer = self._timers.pop(transfer_id, None)
        if timer is not None:
            timer.cancel()

    def _forget(self, res: Reservation, note: str) -> None:
        self._cancel_timer(res.transfer_id)
        self.reservations.pop(res.transfer_id, None)
        self.ended[res.transfer_id] = f"{res.transfer_id} {note}"
        while len(self.ended) > 1024:
            self.ended.popitem(last=False)

    # ---- load ------------------------------------------------------------------
    def reserved_blocks(self) -> int:
        """Blocks held by unpublished reservations."""
        return sum(len(r.seq.block_table) for r in list(self.reservations.values())
                   if r.state < ResState.PUBLISHED)

