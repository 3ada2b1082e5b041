"""One attempt (one generation) of a request, on one route, and its teardown.

Disaggregated attempt on (P, D), generation g, transfer id "{request_id}/{g}":

    1. concurrently, the job leaving first
         Prefill.Prefill on P, the job -> computes meanwhile (a transfer too small to
                                        stream; one that may stream waits for its grant)
         Decode.Reserve on D         -> reservation (blocks, data-plane address)
    2. concurrently, leaving in this order (the order they are needed in)
         the Prefill's grant         -> manifest, destination, capability; P sends token 0
                                        as soon as it is sampled, sends and commits the
                                        K/V; returns after D accepted the commit
         Decode.DecodeStream on D    -> waits for PUBLISHED, then tokens 0, 1, ...
         Directory.Reserve(manifest) -> must be APPLIED        [txn RESERVED]; Started
    3. P's token 0                   -> out as soon as it is read, D's Reserve answered or not
                                        (P's own result; a retry reproduces it)
    4. D's token 0 arrives           -> published (D releases it); equal to P's; D's tokens
                                        go out once the two ends' digests compared (P's
                                        seal relayed with D's token 0, or P's reply)
    5. complete event                -> done

Colocated attempt on W: Started event, Decode.Generate on W, tokens, complete.

Every failure, cancellation or deadline runs one teardown (`_teardown`), in this order:
Directory.Abort (only while the transaction may be unpublished; after the Reserve's answer),
Decode.Cancel, close the stream call, Prefill.Cancel; in its own task under `asyncio.shield`
(a second cancellation cannot cut it short). Failures become `AttemptFailed` (the
orchestrator retries elsewhere) unless retrying cannot help: a worker's INVALID_ARGUMENT
about the client's request and output divergence raise `RouterError` directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from opentelemetry import trace

from pdserve_client import spans as S
from router.config import RouterConfig
from router.gateway import DirectoryGateway, WorkerGateway
from router.requests.admission import Admitted
from router.requests.attempt import (
    Attempt,
    AttemptEvent,
    AttemptFailed,
    DirectoryAnswered,
    Diverged,
    FromStream,
    PrefillFailed,
    PrefillReturned,
    Stage,
    StreamEnded,
    StreamFailed,
    advance,
    blame,
    judge_reserve,
    pump,
)
from router.requests.cluster_view import ClusterView
from router.requests.handoff import build_manifest, job_manifest, reserve_call, transfer_id
from router.requests.inflight import InFlight
from router.requests.output import OutputLog
from router.requests.seals import reply_against_seal, reply_against_token, sealed_token_0
from router.types import (
    Event,
    PrefillCall,
    PrefillDone,
    Route,
    RouterError,
    Started,
    StatusCode,
    StreamCall,
    StreamComplete,
    StreamItem,
    StreamToken,
    WorkerCallError,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class RouterReach:
    """What every request's attempts use of their router (one per router: the Orchestrator's)."""

    workers: WorkerGateway
    directory: DirectoryGateway
    inflight: InFlight
    config: RouterConfig
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]
    """Runs a teardown that must finish even when the request's task is cancelled."""
    view: ClusterView | None = None
    """The cluster view (liveness of an attempt's workers; routes stopped), if any."""
    mint: Callable[..., bytes] | None = None
    """(manifest, reservation) -> the attempt's signed transfer capability; None: none."""


class AttemptRunner:
    """Runs the attempts of one request; `current` is the attempt in flight."""

    def __init__(self, req: Admitted, reach: RouterReach, output: OutputLog, emit: Callable[[Event], None],
                 remaining_s: Callable[[], float | None],
                 on_prefill: Callable[[Attempt, PrefillDone], None] | None = None):
        self.req = req
        self._mint = reach.mint
        self._workers, self._directory, self._inflight = reach.workers, reach.directory, reach.inflight
        self._cfg, self._output, self._emit, self._spawn = reach.config, output, emit, reach.spawn
        self._remaining_s = remaining_s
        self._on_prefill = on_prefill  # told each PrefillResult (the cost model learns from its timings)
        self._view = reach.view
        self.current: Attempt | None = None
        self.last: Attempt | None = None
        """The latest attempt started (kept after it ends, for error messages)."""

    async def run(self, att: Attempt) -> StreamComplete:
        """Run `att` to its complete event; raises AttemptFailed or RouterError
        (after teardown), or CancelledError (after teardown)."""
        self.current = self.last = att
        try:
            queue: asyncio.Queue = asyncio.Queue()
            req = self.req.replaying(self._output.tokens[:att.first_index])  # a resumed attempt's request
            if att.route is Route.DISAGGREGATED:
                await self._start_disaggregated(att, req, queue)
            else:
                self._start_colocated(att, req, queue)
            done = await self._drive(att, queue)
            await self._settle_prefill(att)
            return done
        except BaseException as exc:
            reason = f"{att.describe()} cancelled" if isinstance(exc, asyncio.CancelledError) else \
                f"{att.describe()} failed: {exc}"
            await asyncio.shield(self._spawn(self._teardown(att, reason)))
            raise
        finally:
            self._inflight.release((*att.overlay_handles, att.prefill_handle))
            for task in (att.stream_task, att.prefill_task, att.reserve_task):
                if task is not None and not task.done():
                    task.cancel()
            self.current = None

    def _timeout(self, limit_s: float | None) -> float | None:
        """A call's deadline: `limit_s` capped by what is left of the request's
        (None: neither applies, as for streams of requests without a deadline)."""
        left = self._remaining_s()
        if left is None:
            return limit_s
        return max(0.001, left if limit_s is None else min(limit_s, left))

    async def _start_disaggregated(self, att: Attempt, req: Admitted, queue: asyncio.Queue) -> None:
        p, d, g = att.prefill, att.decode, att.generation
        tid = transfer_id(req.request_id, g)
        blocks, att.prefill_handle = self._inflight.hold_route(req, p, d)
        att.overlay_handles.append(blocks)
        advance(att, Stage.DECODE_RESERVE)
        # P gets the job before D's Reserve and computes meanwhile; its grant follows on the same call
        # once D answered. A failed Reserve cancels the call: nothing read or sent, the compute cached.
        grant, job_sent = asyncio.get_running_loop().create_future(), asyncio.get_running_loop().create_future()
        job = job_manifest(request_id=req.request_id, tenant=req.tenant, generation=g, prompt=req.prompt, prefill=p)
        att.prefill_task = asyncio.create_task(self._prefill(
            att, PrefillCall(job, req.prompt, "", req.sampling), queue, grant, job_sent))
        await job_sent  # P's job leaves before D's Reserve (its write waits for the call's headers): P's way is longer
        try:
            reservation = await self._workers.reserve(d, reserve_call(req, g, p, att.transfer_key),
                                                      self._timeout(self._cfg.reserve_timeout_s))
        except WorkerCallError as exc:
            if exc.code is StatusCode.INVALID_ARGUMENT:
                raise RouterError(exc.code, exc.message) from exc  # the client's to fix: verbatim
            raise AttemptFailed(att.stage.value, exc.code, exc.message, culprit=d) from exc
        attempt_span = trace.get_current_span()  # router.attempt (a no-op one while tracing is off)
        attempt_span.add_event(S.EVENT_RESERVED)
        if reservation.reservation_id and reservation.reservation_id != tid:
            log.warning("%s: reservation id %r != transfer id %r", att.describe(), reservation.reservation_id, tid)
        manifest = build_manifest(request_id=req.request_id, tenant=req.tenant, generation=g, prompt=req.prompt,
                                  prefill=p, decode=d, reservation=reservation, route_epoch=att.route_epoch, job=job)
        advance(att, Stage.DIRECTORY_RESERVE)
        att.txn_open = True  # until the directory says otherwise
        # The record is awaited where it is needed (the decode's nonce check of P's AUTH, a
        # streamed prefill's Begin, the Publish): nothing publishes without it.
        capability = self._mint(manifest, reservation) if self._mint is not None else b""
        # They leave in the order they are needed: the grant first (P's compute ends soon),
        # the DecodeStream (its copy of the capability has D consume the nonce before P's
        # AUTH asks), the directory's Reserve last (needed at publication, or by a streamed
        # P's Begin, which asks again): each one's setup here would delay the one before.
        grant.set_result(PrefillCall(manifest, req.prompt, reservation.data_plane_address or d.data_plane_address,
                                     req.sampling, capability, att.transfer_key))
        attempt_span.add_event(S.EVENT_GRANTED)
        att.stream_task = asyncio.create_task(pump(self._workers.decode_stream(d, StreamCall(
            req.request_id, g, req.max_tokens, req.sampling, transfer_id=tid, capability=capability),
            self._timeout(None)), queue))
        att.reserve_task = asyncio.create_task(self._reserve_txn(manifest, queue))  # judged by _drive

    async def _reserve_txn(self, manifest, queue: asyncio.Queue) -> None:
        """Directory.Reserve of the attempt's manifest; its answer (or error) to the queue."""
        try:
            queue.put_nowait(DirectoryAnswered(await self._directory.reserve_txn(
                manifest, self._timeout(self._cfg.directory_timeout_s))))
        except WorkerCallError as exc:
            queue.put_nowait(DirectoryAnswered(exc))

    def _start_colocated(self, att: Attempt, req: Admitted, queue: asyncio.Queue) -> None:
        w = att.decode
        blocks, att.prefill_handle = self._inflight.hold_route(req, w, w)
        att.overlay_handles.append(blocks)
        advance(att, Stage.COLOCATED)
        self._emit(Started(Route.COLOCATED, "", w.worker_id, att.generation, att.route_epoch))
        att.stream_task = asyncio.create_task(pump(self._workers.generate(w, StreamCall(
            req.request_id, att.generation, req.max_tokens, req.sampling, tenant=req.tenant,
            prompt_token_ids=req.prompt), self._timeout(None)), queue))

    async def _prefill(self, att: Attempt, call: PrefillCall, queue: asyncio.Queue,
                       grant: asyncio.Future[PrefillCall] | None = None,
                       job_sent: asyncio.Future | None = None) -> PrefillDone | None:
        try:
            done = await self._workers.prefill(att.prefill, call, self._timeout(self._cfg.prefill_timeout_s), grant,
                                               lambda token: self._prefill_token_0(att, token, queue), job_sent)
            queue.put_nowait(PrefillReturned(done))
            return done
        except WorkerCallError as exc:
            queue.put_nowait(PrefillFailed(exc))
        except Exception as exc:  # noqa: BLE001 - a gateway bug must not hang the attempt
            queue.put_nowait(PrefillFailed(WorkerCallError(StatusCode.INTERNAL, repr(exc))))

    async def _next(self, att: Attempt, queue: asyncio.Queue) -> AttemptEvent:
        """The attempt's next event. While waiting, checks every liveness_check_s that its
        workers still hold their leases; raises AttemptFailed at the token timeout."""
        limit = self._cfg.first_token_timeout_s if att.tokens_seen == 0 else self._cfg.token_timeout_s
        loop = asyncio.get_running_loop()
        give_up = loop.time() + limit
        while True:
            wait = min(self._cfg.liveness_check_s, give_up - loop.time())
            try:
                # Not wait_for: on Python 3.11 it returns an item that arrives with a cancel
                # and drops the cancel (the request then decodes on after its client left).
                async with asyncio.timeout(max(wait, 0.0)):
                    return await queue.get()
            except TimeoutError:
                pass
            if loop.time() >= give_up:
                raise AttemptFailed(att.stage.value, StatusCode.DEADLINE_EXCEEDED,
                                    f"no token {att.tokens_seen} within {limit:g} s",
                                    **blame(att, StatusCode.DEADLINE_EXCEEDED))
            await self._check_leases(att)

    async def _check_leases(self, att: Attempt) -> None:
        """AttemptFailed(UNAVAILABLE) when a worker of `att` no longer holds its lease at
        the attempt's epoch (the directory expired it: dead, or hung past its lease)."""
        if self._view is None:
            return
        try:
            cluster = await self._view.get()
        except RouterError:
            return  # no snapshot to judge by: the token timeout still applies
        live = {w.worker_id: w.epoch for w in cluster.workers}
        p_done = att.prefill is None or att.prefill_done or att.tokens_seen  # token 0 out: P's part is done
        waiting_on = [att.decode] if p_done else [att.decode, att.prefill]
        for w in waiting_on:
            if live.get(w.worker_id) != w.epoch:
                now = "registered at another epoch" if w.worker_id in live else "gone from the directory"
                raise AttemptFailed(att.stage.value, StatusCode.UNAVAILABLE,
                                    f"{w.worker_id}'s lease at epoch {w.epoch} expired ({now}): dead or hung",
                                    culprit=w)

    async def _drive(self, att: Attempt, queue: asyncio.Queue) -> StreamComplete:
        """Consume the attempt's events until its complete event. A hand-off's stream is held
        from token 0 until prefill returned (or its seal came with token 0): digests first."""
        while True:
            match await self._next(att, queue):
                case Diverged(error):  # P's token 0 is not the one the client has (_prefill_token_0)
                    raise error
                case DirectoryAnswered(answer) if att.stage is Stage.DIRECTORY_RESERVE:
                    judge_reserve(att, answer, self.req.request_id, self._view)  # (D's token 0 tells the same)
                    self._reserved(att)
                case FromStream(item):
                    if (done := self._from_stream(att, item)) is not None:
                        return done
                case PrefillReturned(done):
                    if (complete := self._release_held(att, done)) is not None:
                        return complete
                case PrefillFailed(error) if att.tokens_seen == 0:
                    # Prefill reports its own failures and the hand-off's alike: either end.
                    raise AttemptFailed("prefill", error.code, error.message,
                                        frozenset({att.prefill.worker_id, att.decode.worker_id})) from error
                case PrefillFailed(error):
                    log.warning("%s: prefill failed after token 0 (ignored): %s", att.describe(), error)
                case StreamFailed(error):
                    raise self._stream_failed(att, error) from error
                case StreamEnded() if not att.held:  # (held: its complete event is held with the tokens)
                    raise AttemptFailed(att.stage.value, StatusCode.UNAVAILABLE,
                                        f"stream ended after {att.tokens_seen} tokens without a complete event",
                                        culprit=att.decode)

    @staticmethod
    def _stream_failed(att: Attempt, error: WorkerCallError) -> RouterError | AttemptFailed:
        """The stream's failure as the attempt's: a colocated worker's INVALID_ARGUMENT
        before any token is the client's to fix (verbatim, no retry)."""
        if error.code is StatusCode.INVALID_ARGUMENT and att.route is Route.COLOCATED and att.tokens_seen == 0:
            return RouterError(error.code, error.message)
        stage = att.stage.value + (f" after {att.tokens_seen} tokens" if att.tokens_seen else "")
        return AttemptFailed(stage, error.code, error.message, **blame(att, error.code))

    def _from_stream(self, att: Attempt, item: StreamItem) -> StreamComplete | None:
        """A stream item: a token out (or held until the prefill's digest is known: a
        hand-off's, unless its seal came with token 0), or the complete event returned."""
        split = att.route is Route.DISAGGREGATED
        if split and not att.held and sealed_token_0(att, item, self.req.request_id):  # a relayed seal must open
            self._on_token(att, item)
            return None
        if split and not att.prefill_done and not att.sealed_kv_digest \
                and (att.held or isinstance(item, StreamToken)):
            if not att.held:
                trace.get_current_span().add_event(S.EVENT_TOKEN_HELD)
            att.held.append(item)
            return None
        if isinstance(item, StreamToken):
            self._on_token(att, item)
            return None
        self._output.check_finished(att.first_index + att.tokens_seen, att.generation)
        return item

    def _release_held(self, att: Attempt, done: PrefillDone) -> StreamComplete | None:
        """The prefill returned: its digest judged, the items held since token 0 go out (the
        complete event among them returned)."""
        self._prefill_returned(att, done)
        held, att.held = att.held, []
        for item in held:
            if isinstance(item, StreamToken):
                self._on_token(att, item)
            else:
                self._output.check_finished(att.first_index + att.tokens_seen, att.generation)
                return item
        return None

    def _reserved(self, att: Attempt) -> None:  # the directory holds the transaction: the hand-off runs
        advance(att, Stage.PREFILL)
        self._started(att)

    def _prefill_token_0(self, att: Attempt, token: int, queue: asyncio.Queue) -> None:
        """P's token 0, out as soon as it is read: before the decode's Reserve answered too."""
        try:
            out = self._output.offer(att.first_index, token, att.generation, decoding=False)
        except RouterError as exc:  # raised where the attempt's events are judged
            queue.put_nowait(Diverged(exc))
            return
        self._started(att)
        if out is not None:
            self._emit(out)

    def _started(self, att: Attempt) -> None:
        """A disaggregated attempt's Started event, once: at its Reserve's answer or first token."""
        if not att.started:
            att.started = True
            self._emit(Started(Route.DISAGGREGATED, att.prefill.worker_id, att.decode.worker_id, att.generation,
                               att.route_epoch))

    def _on_token(self, att: Attempt, tok: StreamToken) -> None:
        if tok.index != att.tokens_seen:
            raise AttemptFailed(att.stage.value, StatusCode.INTERNAL,
                                f"token index {tok.index} out of order (expected {att.tokens_seen})",
                                culprit=att.decode)
        if att.tokens_seen == 0 and att.route is Route.DISAGGREGATED:
            reply_against_token(att, tok)
        if att.tokens_seen == 0:
            att.txn_open = False  # D streams only from PUBLISHED K/V; D releases the transaction
            if att.route is Route.COLOCATED:
                self._inflight.release((att.prefill_handle,))  # W finished the prompt
            if att.route is Route.DISAGGREGATED:
                if att.stage is Stage.DIRECTORY_RESERVE:  # published: the directory's answer is on its way
                    self._reserved(att)
                advance(att, Stage.DECODE)
        att.tokens_seen += 1
        out = self._output.offer(att.first_index + tok.index, tok.token_id, att.generation)
        if out is not None:
            self._emit(out)

    def _prefill_returned(self, att: Attempt, done: PrefillDone) -> None:
        """The Prefill's reply, before the complete event or after it (token 0 went out by
        the prefill's seal): its digest (against that seal), its tokens' room given back,
        the orchestrator told (the transfer counted, the planner's cost model)."""
        trace.get_current_span().add_event(S.EVENT_PREFILL_DONE)
        att.prefill_done, att.prefill_kv_digest = True, done.kv_digest
        reply_against_seal(att)
        self._inflight.release((att.prefill_handle,))
        if self._on_prefill is not None:
            self._on_prefill(att, done)

    async def _settle_prefill(self, att: Attempt) -> None:
        """After a complete event, give a still-running Prefill call a moment to
        return (its reply can trail a short decode), then cancel it."""
        task = att.prefill_task
        if task is None or att.prefill_done:
            return
        await asyncio.wait({task}, timeout=self._cfg.cancel_timeout_s)
        if task.done():
            if task.result() is not None:  # its event was queued behind the complete event
                self._prefill_returned(att, task.result())
            return
        task.cancel()
        await self._quietly(self._workers.cancel_prefill(att.prefill, self.req.request_id, att.generation,
                                                         "request complete", self._cfg.cancel_timeout_s))

    async def _teardown(self, att: Attempt, reason: str) -> None:
        """Release everything `att` holds, in the contract's order; never raises."""
        rid, g, limit = self.req.request_id, att.generation, self._cfg.cancel_timeout_s
        if att.reserve_task is not None:  # the Reserve answered first: an Abort must not overtake it
            await asyncio.wait({att.reserve_task}, timeout=self._cfg.directory_timeout_s)
        if att.txn_open:
            await self._quietly(self._directory.abort_txn(rid, transfer_id(rid, g), g, reason, limit))
            att.txn_open = False
        calls = []
        if att.decode_engaged:
            calls.append(asyncio.create_task(self._quietly(
                self._workers.cancel_decode(att.decode, rid, g, reason, limit, discard_kv=att.discard_kv))))
        if att.stream_task is not None:
            att.stream_task.cancel()
        if att.prefill_engaged and att.prefill is not None:
            calls.append(asyncio.create_task(self._quietly(
                self._workers.cancel_prefill(att.prefill, rid, g, reason, limit))))
        if att.prefill_task is not None:
            att.prefill_task.cancel()
        await asyncio.gather(*calls)
        for task in (att.stream_task, att.prefill_task):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    async def _quietly(call: Coroutine[Any, Any, Any]) -> None:
        try:
            await call
        except WorkerCallError as exc:
            log.warning("teardown call failed: %s", exc)
        except Exception:
            log.exception("teardown call raised")
