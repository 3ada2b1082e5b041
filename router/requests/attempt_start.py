"""How an attempt starts (steps 1-3 of router/requests/attempts.py): a split attempt's job,
the decode's Reserve, the directory's Reserve and the grant, the DecodeStream once the
directory answered; a colocated attempt's Generate. A mixin of AttemptRunner, whose state
it uses."""

from __future__ import annotations

import asyncio
import logging

from opentelemetry import trace

from pdserve_client import spans as S
from router.requests.admission import Admitted
from router.requests.attempt import (
    Attempt,
    AttemptFailed,
    Diverged,
    PrefillFailed,
    PrefillReturned,
    Stage,
    advance,
    judge_reserve,
    pump,
)
from router.requests.handoff import build_manifest, job_manifest, reserve_call, transfer_id
from router.types import (
    PrefillCall,
    PrefillDone,
    Route,
    RouterError,
    Started,
    StatusCode,
    StreamCall,
    TokenLogprobs,
    WorkerCallError,
)

log = logging.getLogger("router.requests.attempts")  # (its records keep their logger's name)


class AttemptStart:
    """Starting an attempt: the calls that leave, each one's answer into the attempt's queue."""

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
        self._inflight.confirm(blocks)  # D allocated them before answering
        attempt_span = trace.get_current_span()  # router.attempt (a no-op one while tracing is off)
        attempt_span.add_event(S.EVENT_RESERVED)
        if reservation.reservation_id and reservation.reservation_id != tid:
            log.warning("%s: reservation id %r != transfer id %r", att.describe(), reservation.reservation_id, tid)
        manifest = build_manifest(request_id=req.request_id, tenant=req.tenant, generation=g, prompt=req.prompt,
                                  prefill=p, decode=d, reservation=reservation, route_epoch=att.route_epoch, job=job)
        # One-way (docs/design.md, "The protocol is one-way"): the directory's Reserve leaves
        # first, then the grant (P computes, sends and commits; nothing of P's needs the record),
        # and the DecodeStream only once the directory answered APPLIED: the decode publishes,
        # and checks a capability against the record, only after its stream came, so no party
        # ever asks about a transaction the directory does not hold yet.
        advance(att, Stage.DIRECTORY_RESERVE)
        att.reserve_task = asyncio.create_task(self._directory.reserve_txn(
            manifest, self._timeout(self._cfg.directory_timeout_s)))
        capability = self._mint(manifest, reservation) if self._mint is not None else b""
        grant.set_result(PrefillCall(manifest, req.prompt, reservation.data_plane_address or d.data_plane_address,
                                     req.sampling, capability, att.transfer_key))
        attempt_span.add_event(S.EVENT_GRANTED)
        try:
            answer = await asyncio.shield(att.reserve_task)  # (teardown waits for it when cut short)
        except WorkerCallError as exc:
            answer = exc
        judge_reserve(att, answer, req.request_id, self._view)
        advance(att, Stage.PREFILL)
        self._started(att)
        attempt_span.add_event(S.EVENT_RECORDED)
        att.stream_task = asyncio.create_task(pump(self._workers.decode_stream(d, StreamCall(
            req.request_id, g, req.max_tokens, req.sampling, transfer_id=tid, capability=capability),
            self._timeout(None)), queue))

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
            done = await self._workers.prefill(
                att.prefill, call, self._timeout(self._cfg.prefill_timeout_s), grant,
                lambda token, logprobs=None: self._prefill_token_0(att, token, queue, logprobs), job_sent)
            queue.put_nowait(PrefillReturned(done))
            return done
        except WorkerCallError as exc:
            queue.put_nowait(PrefillFailed(exc))
        except Exception as exc:  # noqa: BLE001 - a gateway bug must not hang the attempt
            queue.put_nowait(PrefillFailed(WorkerCallError(StatusCode.INTERNAL, repr(exc))))

    def _prefill_token_0(self, att: Attempt, token: int, queue: asyncio.Queue,
                         logprobs: TokenLogprobs | None = None) -> None:
        """P's token 0, out as soon as it is read: before the decode's Reserve answered too
        (with its log-probabilities, which only P has: `AttemptDrive._from_stream`)."""
        try:
            out = self._output.offer(att.first_index, token, att.generation, decoding=False, logprobs=logprobs)
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
