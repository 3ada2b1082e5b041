"""How an attempt runs (steps 3-5 of router/requests/attempts.py): its typed events consumed
in one `match` (router/requests/attempt.py), tokens out once the two ends' digests agree,
the liveness of its workers checked while it waits. A mixin of AttemptRunner."""

from __future__ import annotations

import asyncio
import logging

from opentelemetry import trace

from pdserve_client import spans as S
from router.requests.attempt import (
    Attempt,
    AttemptEvent,
    AttemptFailed,
    Diverged,
    FromStream,
    PrefillFailed,
    PrefillReturned,
    Stage,
    StreamEnded,
    StreamFailed,
    advance,
    blame,
)
from router.requests.seals import reply_against_seal, reply_against_token, sealed_token_0
from router.types import (
    PrefillDone,
    Route,
    RouterError,
    StatusCode,
    StreamComplete,
    StreamItem,
    StreamToken,
    WorkerCallError,
)

log = logging.getLogger("router.requests.attempts")  # (its records keep their logger's name)


class AttemptDrive:
    """Driving an attempt to its complete event."""

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
        hand-off's, unless its seal came with token 0 and no log-probabilities wait for the
        prefill's token 0), or the complete event returned."""
        split = att.route is Route.DISAGGREGATED
        if split and not att.held and not self._awaits_prefill_logprobs(att) \
                and sealed_token_0(att, item, self.req.request_id):  # a relayed seal must open
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

    def _awaits_prefill_logprobs(self, att: Attempt) -> bool:
        """Whether the hand-off's token 0 the client has not had yet must be the prefill's:
        asked with log-probabilities, only its FirstToken carries them (the decode did not
        sample it). The decode's stream is then held as without a seal, until the Prefill's
        reply, which leaves after its FirstToken: the prefill's token 0 goes out first, the
        decode's replays it. Rare: the FirstToken most often comes first."""
        return self.req.sampling.logprobs is not None and len(self._output.tokens) <= att.first_index

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

    def _on_token(self, att: Attempt, tok: StreamToken) -> None:
        if tok.index != att.tokens_seen:
            raise AttemptFailed(att.stage.value, StatusCode.INTERNAL,
                                f"token index {tok.index} out of order (expected {att.tokens_seen})",
                                culprit=att.decode)
        if att.tokens_seen == 0 and att.route is Route.DISAGGREGATED:
            reply_against_token(att, tok)
        if att.tokens_seen == 0:
            if att.route is Route.COLOCATED:
                self._inflight.release((att.prefill_handle,))  # W finished the prompt
                self._inflight.confirm(att.overlay_handles[0] if att.overlay_handles else None)  # and holds its blocks
            if att.route is Route.DISAGGREGATED:  # D streams only from PUBLISHED K/V; D releases it
                advance(att, Stage.DECODE)
        att.tokens_seen += 1
        out = self._output.offer(att.first_index + tok.index, tok.token_id, att.generation, logprobs=tok.logprobs)
        if out is not None:
            self._emit(out)

    def _prefill_returned(self, att: Attempt, done: PrefillDone) -> None:
        """The Prefill's reply, before the complete event or after it (token 0 went out by
        the prefill's seal): its digest (against that seal), its tokens' room given back,
        the orchestrator told (the transfer counted, the planner's cost model)."""
        trace.get_current_span().add_event(S.EVENT_PREFILL_DONE)
        att.prefill_reply = done
        reply_against_seal(att)
        self._inflight.release((att.prefill_handle,))
        if self._on_prefill is not None:
            self._on_prefill(att, done)
