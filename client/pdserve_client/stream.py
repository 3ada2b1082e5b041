"""Folding a Generate event stream into token events and one result.

The sync and async token streams differ only in how they read the next
GenerateEvent; everything they compute lives here, with the clock passed in
so the latency math is testable without a server.

Stream grammar the router follows (router.proto): `started` (again, with a
larger generation, on reroute), then `token`*, then exactly one of `complete`
or `error`. A token whose index was already delivered is a replay and is
dropped, so callers see each output position once.
"""

from __future__ import annotations

from pdserve_client import wire
from pdserve_client.rpc.pd.v1 import router_pb2
from pdserve_client.types import GenerationResult, PdError, RouteInfo, TokenEvent, client_tpot_ms


class StreamTally:
    """Client-side state of one Generate stream; `feed` each event with its arrival time."""

    def __init__(self, request_id: str, t0_s: float):
        self.request_id = request_id
        self.t0_s = t0_s
        self.route: RouteInfo | None = None
        self.tokens: list[TokenEvent] = []
        self.result: GenerationResult | None = None
        self.error: PdError | None = None

    @property
    def finished(self) -> bool:
        """True once a `complete` or `error` event (or a broken stream) ended the request."""
        return self.result is not None or self.error is not None

    def elapsed_ms(self, now_s: float) -> float:
        """Client-side ms since the call started."""
        return (now_s - self.t0_s) * 1000.0

    def feed(self, event: router_pb2.GenerateEvent, now_s: float) -> TokenEvent | None:
        """Apply one event; returns the new TokenEvent, or None. Raises PdError on an `error` event."""
        assert not self.finished, "event after the end of the stream"
        if event.request_id:
            self.request_id = event.request_id  # the router's id is the one Cancel understands
        kind = event.WhichOneof("event")
        if kind == "token":
            return self._on_token(event.token, now_s)
        if kind == "started":
            s = event.started
            self.route = RouteInfo(wire.route_name(s.route), s.prefill_worker_id, s.decode_worker_id,
                                   s.generation, s.route_epoch)
        elif kind == "complete":
            self.result = self._on_complete(event.complete, now_s)
        elif kind == "error":
            return self.fail(wire.error_from_event(event.error))
        # An event kind newer than this SDK (or an empty oneof) is skipped, not fatal.
        return None

    def fail(self, error: PdError):
        """Record `error` as the end of the stream and raise it."""
        self.error = error
        raise error

    def end_of_stream(self) -> None:
        """The server closed the stream; without `complete` or `error` that is a protocol fault."""
        if not self.finished:
            self.fail(PdError("INTERNAL", "router closed the Generate stream without a complete or error event"))

    def _on_token(self, token: router_pb2.GenerateEvent.Token, now_s: float) -> TokenEvent | None:
        if token.index < len(self.tokens):
            return None  # replay of a position already delivered
        event = TokenEvent(index=token.index, token_id=token.token_id, text=token.text,
                           t_ms=self.elapsed_ms(now_s), server_t_ms=token.time_since_start_ms,
                           logprobs=wire.logprobs_from_proto(token.logprobs) if token.HasField("logprobs") else None)
        self.tokens.append(event)
        return event

    def _on_complete(self, c: router_pb2.GenerateEvent.Complete, now_s: float) -> GenerationResult:
        latency_ms = self.elapsed_ms(now_s)
        n = len(self.tokens)
        ttft_ms = self.tokens[0].t_ms if n else 0.0
        route = self.route or RouteInfo("unspecified", "", "", 0, 0)
        return GenerationResult(
            request_id=self.request_id,
            token_ids=[t.token_id for t in self.tokens],
            text="".join(t.text for t in self.tokens) + c.text_tail,
            finish_reason=wire.finish_reason_name(c.finish_reason),
            ttft_ms=ttft_ms,
            tpot_ms=client_tpot_ms(latency_ms, ttft_ms, n),
            # Complete.route is what produced the tokens; Started may predate a reroute.
            route=wire.route_name(c.route) if c.route else route.route,
            attempts=c.attempts,
            prefill_worker=route.prefill_worker,
            decode_worker=route.decode_worker,
            server_ttft_ms=c.ttft_ms,
            server_tpot_ms=c.tpot_ms,
            latency_ms=latency_ms,
            token_times_ms=[t.t_ms for t in self.tokens],
            generation=route.generation,
            route_epoch=route.route_epoch,
            prefill_kv_digest=c.prefill_kv_digest,
            decode_kv_digest=c.decode_kv_digest,
            failed_attempts=c.failed_attempts,
        )
