"""A request's spans at the router (docs/observability.md; names in pdserve_client/spans.py).

    router.request     admitted -> the terminal event (root of the request's trace, or a
                       child of the client's own span when its Generate carried traceparent);
                       events first_token, retry{pd.reason}, fallback{pd.reason}, rejected
      router.decide    the mode's plan: pd.route, predicted TTFT/TPOT, chosen workers
      router.attempt   one per attempt: pd.generation, pd.transfer_id, pd.route, workers,
                       pd.replayed_tokens (outputs a resumed attempt replays as prompt);
                       its worker and directory calls are its children (gRPC spans)
      router.migration an attempt failed after tokens went out, and the request moved on:
                       from the failure to the next token the client gets (or the end),
                       pd.migration.from_worker, .tokens_sent, .cause

The request's identity travels as W3C baggage set here, replacing anything a client
sent, so every span downstream in every process carries pd.request_id and pd.tenant
(and, under an attempt, pd.generation, pd.transfer_id and pd.route).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace

from pdserve_client import spans as S
from router.requests.admission import Admitted
from router.requests.handoff import transfer_id
from router.types import Route, RouterError
from runtime.telemetry import tracing


class RequestTrace:
    """The router.request span of one request and the context its work runs under."""

    __slots__ = ("on", "span", "context", "first_token_seen", "ids", "_token", "migration")

    def __init__(self, req: Admitted):
        self.on = tracing.enabled()
        self.ids = {S.REQUEST_ID: req.request_id, S.TENANT: req.tenant}
        self.first_token_seen = False
        self.span, self.context, self._token = trace.INVALID_SPAN, None, None
        self.migration: trace.Span | None = None
        if self.on:
            trace.get_current_span().set_attributes(self.ids)  # the Generate RPC's own span
            base = tracing.with_request(self.ids)
            self.span = tracing.tracer().start_span(S.ROUTER_REQUEST, context=base, attributes={
                S.REQUEST_ID: req.request_id, S.TENANT: req.tenant, S.PROMPT_TOKENS: len(req.prompt),
                "pd.max_tokens": req.max_tokens, "pd.mode": req.mode})
            self.context = trace.set_span_in_context(self.span, base)

    def attach(self) -> None:
        """Run the calling task under the request's context until `detach` (a task
        created meanwhile keeps it: the request's own task runs under it)."""
        if self.on:
            self._token = otel_context.attach(self.context)

    def detach(self) -> None:
        """Back to the context `attach` found."""
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None

    @contextlib.contextmanager
    def decide(self) -> Iterator[trace.Span]:
        """The span of the mode's decision (its plan's facts are set by `decided`)."""
        with tracing.span_in(S.ROUTER_DECIDE, self.context) as span:
            yield span

    @staticmethod
    def decided(span: trace.Span, plan) -> None:
        """What the decision chose, and what it predicted."""
        if not span.is_recording():
            return
        span.set_attributes({S.ROUTE: plan.route.name.lower(), S.POLICY: plan.mode, "pd.outcome": plan.outcome.name,
                             "pd.decision_reason": plan.reason})
        if plan.predicted is not None:
            span.set_attributes({S.PREDICTED_TTFT_MS: plan.predicted.ttft_ms,
                                 S.PREDICTED_TPOT_MS: plan.predicted.tpot_ms})
        for key, worker in ((S.PREFILL_WORKER, plan.prefill), (S.DECODE_WORKER, plan.decode)):
            if worker is not None:
                span.set_attribute(key, worker.worker_id)

    @contextlib.contextmanager
    def attempt(self, att, number: int, wanted: Route) -> Iterator[None]:
        """One attempt's span, with its identity in the baggage of every call it makes; a
        failure is its ERROR status and a retry event on the request."""
        if not self.on:
            yield
            return
        attrs = {S.GENERATION: att.generation, S.ROUTE: att.route.name.lower()}
        if att.route is Route.DISAGGREGATED:
            attrs[S.TRANSFER_ID] = transfer_id(self.ids[S.REQUEST_ID], att.generation)
        if number > 1 and att.route is not wanted:
            self.span.add_event(S.EVENT_FALLBACK, {S.REASON: f"attempt {number} runs {att.route.name.lower()}"})
        ctx = tracing.with_request({**self.ids, **attrs}, self.context)
        workers = {S.DECODE_WORKER: att.decode.worker_id, "pd.attempt": number, S.REPLAYED_TOKENS: att.first_index}
        if att.prefill is not None:
            workers[S.PREFILL_WORKER] = att.prefill.worker_id
        try:
            with tracing.span_in(S.ROUTER_ATTEMPT, ctx, {**attrs, **workers}):
                yield
        except Exception as exc:
            self.span.add_event(S.EVENT_RETRY, {S.REASON: str(exc)[:500], S.GENERATION: att.generation})
            raise

    def migrating(self, from_worker: str, tokens_sent: int, cause: str) -> None:
        """An attempt failed after `tokens_sent` tokens went out: the router.migration span
        starts (and ends at `resumed`)."""
        if self.on:
            self.resumed()
            self.migration = tracing.tracer().start_span(S.ROUTER_MIGRATION, context=self.context, attributes={
                "pd.migration.from_worker": from_worker, "pd.migration.tokens_sent": tokens_sent,
                "pd.migration.cause": cause})

    def resumed(self) -> None:
        """The request's next token went out (or it ended): the migration span ends."""
        if self.migration is not None:
            self.migration.end()
            self.migration = None

    def first_token(self) -> None:
        """The first token left for the client."""
        if self.on and not self.first_token_seen:
            self.first_token_seen = True
            self.span.add_event(S.EVENT_FIRST_TOKEN)

    def ended(self, outcome) -> None:
        """The terminal event (a Completed or a RouterError) went to the client."""
        if not self.on:
            return
        self.resumed()
        if isinstance(outcome, RouterError):
            tracing.failed(self.span, f"{outcome.code.name}: {outcome.message}")
            if outcome.code.name == "RESOURCE_EXHAUSTED":
                self.span.add_event(S.EVENT_REJECTED, {S.REASON: outcome.message[:500]})
        else:
            self.span.set_attributes({S.ROUTE: outcome.route.name.lower(), "pd.attempts": outcome.attempts,
                                      "pd.finish_reason": outcome.finish_reason.name})
        self.span.end()
