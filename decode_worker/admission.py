"""From publication to the batch, the end of the decode worker's step 3: import the
published blocks with the first token, stream token 0, join the decode batch (or finish).
And what stays of it: the blocks each hand-off registered in the prefix cache (a discard
unregisters exactly these) and the timer that stops a publication no DecodeStream came for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable

from pdserve_client.spans import DECODE_ADMIT
from runtime.common.tasks import TaskSet
from runtime.directory.records import TransferRef
from runtime.engine import Sequence
from runtime.telemetry import tracing
from runtime.worker.loop import AsyncSink, EngineLoop, Job, TokenOut

from .reservations import Reservation, ResState

log = logging.getLogger(__name__)

IMPORTED_KEPT = 1024
"""Recent hand-offs whose registered blocks a discard can still find."""
TOKEN_0_WAIT_S = 0.005
"""How long the prefill's VERDICT and the import wait for an attached DecodeStream to hand
token 0 to gRPC (a stream the router does not read must not hold them)."""


class StreamSink(AsyncSink):
    """AsyncSink that also runs `on_finished` on the event loop when the sequence ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_finished):
        super().__init__(loop)
        self.on_finished = on_finished

    def on_done(self, seq: Sequence, error: BaseException | None) -> None:
        super().on_done(seq, error)
        self.loop.call_soon_threadsafe(self.on_finished, error)


class Admission:
    """Admits published reservations into one engine loop's batch."""

    def __init__(self, loop: EngineLoop, ttl_s: float, timers: dict[str, asyncio.TimerHandle],
                 on_finished: Callable[[Reservation, BaseException | None], None]):
        self.loop, self.engine, self.ttl_s = loop, loop.engine, ttl_s
        self._timers = timers
        """The worker's timers by transfer id (one per reservation; the worker cancels them)."""
        self._on_finished = on_finished
        self._importing = TaskSet()
        """Imports under way (a task each: nothing else waits for them; kept from the GC)."""
        self.imported: collections.OrderedDict[str, list[tuple[int, bytes | None]]] = collections.OrderedDict()
        """(physical block, prefix key) each recent hand-off registered at publication, by
        transfer id: a discard (Cancel with discard_kv) unregisters exactly these, even after
        the sequence ended (a block since evicted and reused under another key is left alone)."""

    async def start(self, res: Reservation, first_token: int) -> None:
        """Published, first token known: stream token 0, then import and join the batch;
        returns once token 0 has left (`token_0_out`), when the caller sends the prefill
        its VERDICT.

        Token 0 is in the stream's queue and the DecodeStream waiting on `res.published`
        woken at once; the engine thread's import runs as a task of its own meanwhile (the
        client had token 0 from the prefill: the decode's token 0 and its import are both
        on the way to token 1, so neither waits for the other; measured, the hand-off to
        token 1 ~1 ms shorter than importing after token 0 left). An import that fails
        ends the stream with its error (the sequence's blocks go back)."""
        start_ns = time.time_ns()  # decode.admit starts with token 0 (T_exposed ends there)
        res.sink = StreamSink(asyncio.get_running_loop(), lambda err: self._on_finished(res, err))
        res.sink.queue.put_nowait(TokenOut(first_token, 0))
        res.published.set()
        self._importing.spawn(self._import(res, first_token, start_ns))
        await self.token_0_out(res)

    @staticmethod
    async def token_0_out(res: Reservation) -> None:
        """Until the DecodeStream attached to `res` has handed token 0 to gRPC (at most
        TOKEN_0_WAIT_S; at once when no stream is attached yet). After publication the
        decode's token 0 on its way to the router (which checks it against the prefill's
        and the relayed seal before token 1 goes on) and the prefill's work once it has
        the VERDICT (its reply, spans, its blocks freed) want the cores; the second waits
        for the first (bench/results/handoff.md, 2026-12-05 sixth session: the prefill's
        CPU between publication and token 0 at the router halved, the segment ~0.3 ms
        shorter)."""
        if res.streamed and not res.token_0_out.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TOKEN_0_WAIT_S):
                    await res.token_0_out.wait()

    async def _import(self, res: Reservation, first_token: int, start_ns: int) -> None:
        res.trace.flush()  # transfer.receive
        try:
            await self.loop.call(lambda e: self._admit(res, first_token))
        except Exception as e:  # noqa: BLE001 - the stream reports it; the blocks come back
            log.error("%s: admission failed after token 0 streamed: %r", res.transfer_id, e)
            tracing.past_span(DECODE_ADMIT, start_ns, time.time_ns(), res.trace.context, error=repr(e))
            await self._give_back(res, e)
            return
        res.trace.admitted_ns = time.time_ns()
        tracing.past_span(DECODE_ADMIT, start_ns, res.trace.admitted_ns, res.trace.context)
        if not res.streamed and res.state == ResState.PUBLISHED:  # not finished at publication
            self._timers[res.transfer_id] = asyncio.get_running_loop().call_later(self.ttl_s, self._unclaimed, res)

    async def _give_back(self, res: Reservation, error: BaseException) -> None:
        """The import failed: free what the sequence holds (when the engine still runs),
        end its stream with `error`."""
        try:
            await self.loop.call(lambda e: e.free(res.seq))
        except Exception:  # the engine is gone (stopped): nothing to give back to
            log.debug("%s: blocks not freed: the engine loop is gone", res.transfer_id, exc_info=True)
        res.sink.on_done(res.seq, error)

    def _unclaimed(self, res: Reservation) -> None:
        """Published, still decoding, and no DecodeStream came for it within the TTL (its
        router died between the commit and the stream call): stop it, free its blocks."""
        if not res.streamed and res.state == ResState.PUBLISHED:
            res.abort_reason = f"published but no DecodeStream came within {self.ttl_s:g} s"
            log.warning("%s: %s; stopped", res.transfer_id, res.abort_reason)
            self.loop.cancel(res.seq)

    def _admit(self, res: Reservation, first_token: int) -> None:
        """Loop thread: import done, stream token 0, then decode (or finish). A cancel that
        came between publication and now stops it here."""
        seq, sink = res.seq, res.sink
        self.engine.commit_import(seq, first_token)  # token 0 is in the stream already (start)
        # what this hand-off registered, for a later discard
        self.imported[res.transfer_id] = self.engine.prefix_keys(seq, res.first_block, res.last_block)
        while len(self.imported) > IMPORTED_KEPT:
            self.imported.popitem(last=False)
        if res.cancelled:
            self.engine.free(seq)
            sink.on_done(seq, asyncio.CancelledError("cancelled before decoding began"))
        elif seq.is_finished:
            self.engine.free(seq)
            sink.on_done(seq, None)
        else:
            self.loop.admit_decode(Job(seq, sink.on_token, sink.on_done))

    async def discard(self, request_id: str, generation: int, reason: str) -> None:
        """The prompt blocks the hand-offs of request_id (at one generation, or all when 0)
        registered leave the prefix cache (the router found the two ends' digests differ)."""
        for tid in list(self.imported):
            ref = TransferRef.parse(tid)
            if ref.request_id != request_id or generation not in (0, ref.generation):
                continue
            imported = self.imported.pop(tid)
            await self.loop.call(lambda e, imported=imported: e.forget_prefix(imported))
            log.warning("%s: published K/V discarded from the prefix cache: %s", tid, reason)
