"""Every metric a pdserve process exports, defined in one place per process kind.

    RouterMetrics     routes, request latencies (first token, per token, end to end,
                      queued) and SLO attainment, prompt and generated tokens, hand-off
                      attempts and their outcomes, fallbacks, queues; drain and rollback
    WorkerMetrics     K/V bytes moved and exposed transfer time, capability denials,
                      blocks and K/V cache usage, queues and batch; the transports' own
                      figures
    DirectoryMetrics  publications the directory refused

Each object owns a `CollectorRegistry` of its own (so tests can build as many as they
like) holding its families plus the process and Python collectors of prometheus_client;
a process serves that registry on /metrics (runtime/telemetry/http.py). The table in
docs/observability.md lists exactly these families (tests/unit/telemetry/test_catalog.py
compares the two).

Histograms are observed through `observe`, which attaches the current trace id as an
exemplar when a span is being recorded (tracing on); exemplars appear only in the
OpenMetrics exposition, which /metrics serves when the scraper asks for it.

Counters and histograms carry no `_created` series: prometheus_client's would add one
per labelled child (a timestamp no dashboard reads), so importing this module turns
them off for the process (`disable_created_metrics`, the switch
PROMETHEUS_DISABLE_CREATED_SERIES sets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import trace
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from .metrics import SampleCollector, Source

disable_created_metrics()  # process-wide; every registry here is scraped without _created

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: TTFT, exposed transfer time and rollback duration (a tiny model's TTFT is ms)."""
REQUEST_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: a whole request, admission to its last token (long generations take minutes)."""
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Seconds per output token after the first."""
PROMPT_BUCKETS = (128, 512, 2048, 8192)
"""Upper edges (tokens) of the prompt-length buckets of a workload cell."""
TOKEN_BUCKETS = tuple(2 ** i for i in range(16))
"""Tokens: one request's prompt or output length, powers of 2 from 1 to 32768 (the length mix
the autoscaler reads: autoscaler/observe.py)."""


def prompt_bucket(tokens: int) -> str:
    """The workload cell's prompt-length bucket: 'le128', 'le512', ..., 'gt8192'."""
    edge = next((b for b in PROMPT_BUCKETS if tokens <= b), None)
    return f"le{edge}" if edge is not None else f"gt{PROMPT_BUCKETS[-1]}"


def trace_exemplar() -> dict[str, str] | None:
    """{'trace_id': 32 hex digits} of the span in progress; None when tracing is off."""
    ctx = trace.get_current_span().get_span_context()
    return {"trace_id": format(ctx.trace_id, "032x")} if ctx.is_valid else None


def observe(histogram: Histogram, value: float) -> None:
    """Observe `value` with the current trace id as its exemplar (when there is one)."""
    histogram.observe(value, exemplar=trace_exemplar())


def usage_ratio(free_blocks: float, total_blocks: float) -> float:
    """1 - free / total in [0, 1]: the share of a pool that requests hold (0 for no pool)."""
    return 1.0 - free_blocks / total_blocks if total_blocks > 0 else 0.0


def new_registry() -> CollectorRegistry:
    """A registry with prometheus_client's process, platform and GC collectors."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def _length_histograms(r: CollectorRegistry) -> tuple[Histogram, Histogram]:
    """The router's per-request prompt and output lengths (the length mix)."""
    return (Histogram("pd_request_prompt_tokens", "Prompt length of each completed request, tokens.",
                      buckets=TOKEN_BUCKETS, registry=r),
            Histogram("pd_request_generation_tokens", "Tokens generated for each completed request.",
                      buckets=TOKEN_BUCKETS, registry=r))


class RouterMetrics:
    """The router's families; the orchestrator calls the methods at each event."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry or new_registry()
        self.routes = Counter("pd_route", "Requests ended, by the policy they asked for, the topology "
                              "they ran on and how they ended.", ["policy", "topology", "result"], registry=r)
        self.ttft = Histogram("pd_ttft_seconds", "Time to first token of completed requests, by workload cell.",
                              ["tenant", "prompt_bucket"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.tpot = Histogram("pd_tpot_seconds", "Time per output token after the first, of completed "
                              "requests of 2 or more tokens, by workload cell.",
                              ["tenant", "prompt_bucket"], buckets=TPOT_BUCKETS_S, registry=r)
        self.e2e_latency = Histogram("pd_e2e_request_latency_seconds", "Admission to the Complete event, of "
                                     "completed requests, by workload cell.", ["tenant", "prompt_bucket"],
                                     buckets=REQUEST_BUCKETS_S, registry=r)
        self.queue_time = Histogram("pd_request_queue_time_seconds", "Admission to the first attempt's dispatch "
                                    "(the plan, and the wait for K/V room in the admission queue), by workload "
                                    "cell.", ["tenant", "prompt_bucket"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.prompt_tokens = Counter("pd_prompt_tokens", "Prompt tokens of completed requests, by tenant.",
                                     ["tenant"], registry=r)
        self.generation_tokens = Counter("pd_generation_tokens", "Tokens generated for completed requests "
                                         "(streamed to the client), by tenant.", ["tenant"], registry=r)
        self.request_prompt_tokens, self.request_generation_tokens = _length_histograms(r)
        self.slo = Counter("pd_slo_requests", "Completed requests with an SLO target, by workload cell and "
                           "whether every target was met.", ["tenant", "prompt_bucket", "attained"], registry=r)
        self.transfer_attempts = Counter("pd_kv_transfer_attempts", "Disaggregated attempts dispatched "
                                         "(each opens one K/V hand-off).", registry=r)
        self.transfer_completions = Counter("pd_kv_transfer_completions", "Hand-offs whose prefill returned: "
                                            "the K/V reached decode and was accepted.", registry=r)
        self.transfer_timeouts = Counter("pd_kv_transfer_timeouts", "Disaggregated attempts that failed with "
                                         "DEADLINE_EXCEEDED (also counted in failures).", registry=r)
        self.transfer_retries = Counter("pd_kv_transfer_retries", "Disaggregated attempts after a request's "
                                        "first attempt.", registry=r)
        self.transfer_failures = Counter("pd_kv_transfer_failures", "Disaggregated attempts that failed, by "
                                         "status code.", ["code"], registry=r)
        self.fallbacks = Counter("pd_fallbacks", "Colocated attempts of requests planned disaggregated: "
                                 "placement found no pair (placement) or an earlier attempt failed (retry).",
                                 ["reason"], registry=r)
        self.recomputes = Counter("pd_recomputes", "Attempts after one that had reached prefill: the prompt "
                                  "is computed again.", registry=r)
        self.reroutes = Counter("pd_reroutes", "Attempts after a request's first, by the route placed.",
                                ["route"], registry=r)
        self.migrations = Counter("pd_request_migrations", "Requests that moved on after an attempt failed "
                                  "mid-stream (tokens had gone to the client), by the failure's status code.",
                                  ["code"], registry=r)
        self.migration_stall = Histogram("pd_request_migration_stall_seconds", "From an attempt's failure "
                                         "mid-stream to the next token its request gave the client.",
                                         buckets=LATENCY_BUCKETS_S, registry=r)
        self.in_flight = Gauge("pd_requests_in_flight", "Requests admitted and not yet finished.", registry=r)
        self.queue_depth = Gauge("pd_admission_queue_depth", "Requests waiting for K/V room.", registry=r)
        self.http_responses = Counter("pd_http_responses", "Responses of the OpenAI-compatible front (router/"
                                      "http), by endpoint and HTTP status (499: the client left before one).",
                                      ["endpoint", "status"], registry=r)
        self.drain_depth = Gauge("pd_drain_depth", "Unpublished transfers a rollback's DRAIN_OR_ABORT_TRANSFERS "
                                 "step still waits on (0 outside a drain).", registry=r)
        self.rollback = Histogram("pd_rollback_duration_seconds", "Rollback duration by step (a step's run by "
                                  "this router), and whole rollbacks from STOP_NEW_ROUTES (step=total).",
                                  ["step"], buckets=LATENCY_BUCKETS_S, registry=r)

        self.listeners: list = []
        """Told each dispatched / attempt_failed / completed call too, with the same arguments
        (router/release/canary.py keeps a canary's record so)."""

    def bind(self, in_flight: Callable[[], float], queue_depth: Callable[[], float]) -> None:
        """Read the gauges from the orchestrator at each scrape."""
        self.in_flight.set_function(in_flight)
        self.queue_depth.set_function(queue_depth)

    def dispatched(self, number: int, route: str, planned: str, previous_stage: str | None) -> None:
        """Attempt `number` (1-based) of a request planned `planned` runs on `route`;
        `previous_stage` is where the attempt before it ended (None for the first)."""
        for listener in self.listeners:
            listener.dispatched(number, route, planned, previous_stage)
        if route == "disaggregated":
            self.transfer_attempts.inc()
            if number > 1:
                self.transfer_retries.inc()
        elif planned == "disaggregated":
            self.fallbacks.labels(reason="placement" if number == 1 else "retry").inc()
        if number > 1:
            self.reroutes.labels(route=route).inc()
            if previous_stage in ("prefill", "decode", "colocated generate"):
                self.recomputes.inc()

    def attempt_failed(self, route: str, code: str, published_other_kv: bool = False) -> None:
        """An attempt failed with status `code` (a retry may follow); `published_other_kv`:
        its decode published K/V other than its prefill computed (the router's digest check)."""
        for listener in self.listeners:
            listener.attempt_failed(route, code, published_other_kv)
        if route == "disaggregated":
            self.transfer_failures.labels(code=code).inc()
            if code == "DEADLINE_EXCEEDED":
                self.transfer_timeouts.inc()

    def completed(self, tenant: str, prompt_tokens: int, ttft_s: float, tpot_s: float, num_tokens: int,
                  slo_ttft_s: float, slo_tpot_s: float, route: str = "") -> None:
        """A request completed (on `route`): its latencies, and its SLO verdict when it had a target."""
        for listener in self.listeners:
            listener.completed(tenant, prompt_tokens, ttft_s, tpot_s, num_tokens, slo_ttft_s, slo_tpot_s, route)
        cell = {"tenant": tenant, "prompt_bucket": prompt_bucket(prompt_tokens)}
        self.prompt_tokens.labels(tenant=tenant).inc(prompt_tokens)
        self.generation_tokens.labels(tenant=tenant).inc(num_tokens)
        observe(self.request_prompt_tokens, prompt_tokens)
        observe(self.request_generation_tokens, num_tokens)
        observe(self.ttft.labels(**cell), ttft_s)
        if num_tokens > 1:
            observe(self.tpot.labels(**cell), tpot_s)
        if slo_ttft_s > 0 or slo_tpot_s > 0:
            met = (not slo_ttft_s or ttft_s <= slo_ttft_s) and (not slo_tpot_s or num_tokens < 2
                                                                  or tpot_s <= slo_tpot_s)
            self.slo.labels(attained="yes" if met else "no", **cell).inc()

    def queued(self, tenant: str, prompt_tokens: int, wait_s: float) -> None:
        """A request's first attempt was dispatched `wait_s` after its admission began
        (call it once per request: an attempt sent back to the queue is no new request)."""
        observe(self.queue_time.labels(tenant=tenant, prompt_bucket=prompt_bucket(prompt_tokens)), wait_s)

    def finished(self, tenant: str, prompt_tokens: int, latency_s: float) -> None:
        """A request completed `latency_s` after its admission began (its end-to-end latency)."""
        observe(self.e2e_latency.labels(tenant=tenant, prompt_bucket=prompt_bucket(prompt_tokens)), latency_s)

    def migrated(self, code: str) -> None:
        """A request's attempt failed with `code` after tokens went out; the request goes on."""
        self.migrations.labels(code=code).inc()

    def resumed(self, stall_s: float) -> None:
        """The next token of a request that migrated went out, `stall_s` after the failure."""
        observe(self.migration_stall, stall_s)

    def ended(self, policy: str, topology: str, result: str) -> None:
        """A request ended (result: ok, error, cancelled, rejected; topology none when
        it never ran)."""
        self.routes.labels(policy=policy, topology=topology, result=result).inc()


class WorkerMetrics:
    """A worker's families; its roles count events, `bind` connects the gauges."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry or new_registry()
        self.transfer_bytes = Counter("pd_kv_transfer_bytes", "K/V bytes of completed hand-offs, as sent "
                                      "by prefill and as accepted by decode.", ["direction"], registry=r)
        self.exposed_transfer = Histogram("pd_kv_exposed_transfer_seconds", "Transfer time not hidden behind "
                                          "prefill compute, per hand-off (prefill side).",
                                          buckets=LATENCY_BUCKETS_S, registry=r)
        self.capability_denials = Counter("pd_capability_denials", "Transfer capabilities refused, by the "
                                          "first failed check.", ["reason"], registry=r)
        self.free_blocks = Gauge("pd_free_blocks", "K/V blocks a new request can take now (the unreferenced "
                                  "prefix cache included).", registry=r)
        self.reserved_blocks = Gauge("pd_reserved_blocks", "K/V blocks reserved for hand-offs not yet "
                                     "published.", registry=r)
        self.total_blocks = Gauge("pd_total_blocks", "K/V blocks in the pool.", registry=r)
        self.kv_usage = Gauge("pd_kv_cache_usage_ratio", "Share of the K/V pool held by requests: "
                              "1 - free / total (the unreferenced prefix cache counts as free).", registry=r)
        self.prefill_queue = Gauge("pd_prefill_queue_tokens", "Prompt tokens waiting to be prefilled.", registry=r)
        self.prefill_pool_waits = Counter("pd_prefill_pool_waits", "Prefill jobs that found the block pool full "
                                          "and waited for room (queued, not refused).", registry=r)
        self.decode_batch = Gauge("pd_decode_batch_size", "Sequences in the decode batch.", registry=r)
        self._sources: list[Source] = []
        r.register(SampleCollector(self._sources))

    def bind(self, free: Callable[[], float], reserved: Callable[[], float], total: Callable[[], float],
             prefill_queue: Callable[[], float], decode_batch: Callable[[], float],
             transports: Iterable[object] = ()) -> None:
        """Read the gauges at each scrape, and each transport's own samples and the engine loop's (their
        metrics(): credit window use, chunks, paths)."""
        for gauge, read in ((self.free_blocks, free), (self.reserved_blocks, reserved),
                            (self.total_blocks, total), (self.prefill_queue, prefill_queue),
                            (self.decode_batch, decode_batch)):
            gauge.set_function(read)
        self.kv_usage.set_function(lambda: usage_ratio(free(), total()))
        self._sources[:] = [t.metrics for t in transports if hasattr(t, "metrics")]

    def sent(self, num_bytes: int, exposed_s: float) -> None:
        """Prefill finished a hand-off: `num_bytes` sent, `exposed_s` of it not overlapped."""
        self.transfer_bytes.labels(direction="sent").inc(num_bytes)
        observe(self.exposed_transfer, exposed_s)

    def received(self, num_bytes: int) -> None:
        """Decode accepted a hand-off of `num_bytes`."""
        self.transfer_bytes.labels(direction="received").inc(num_bytes)

    def denied(self, reason: str) -> None:
        """A capability was refused for `reason`."""
        self.capability_denials.labels(reason=reason).inc()


class DirectoryMetrics:
    """The directory's families."""

    REJECT_REASONS = {"STALE_GENERATION": "stale", "DUPLICATE": "duplicate", "CHECKSUM_CONFLICT": "digest",
                      "ILLEGAL_TRANSITION": "illegal", "NOT_FOUND": "not_found", "LEASE_LOST": "lease_lost"}
    """Outcome name -> reason label."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry or new_registry()
        self.publication_rejects = Counter("pd_publication_rejects", "Validated and Publish calls not applied, "
                                           "by reason (stale generation, duplicate, digest conflict, ...).",
                                           ["reason"], registry=r)
        self.seal_refusals = Counter("pd_seal_refusals", "Publish calls whose relayed source seal was refused "
                                     "(no_key: the source registered none at its epoch; not_opened: not its "
                                     "seal over what the destination holds).", ["reason"], registry=r)
        self.store_inline_calls = Counter(
            "pd_directory_store_inline_calls", "Hand-off store calls made by the inline twin (on the event loop, or "
            "as its probe): answered within budget, slow (kept; the pool takes the calls for the cool-off), "
            "unavailable (made again on the pool).", ["outcome"], registry=r)

    def seal_refused(self, reason: str) -> None:
        """A relayed seal was refused: `no_key` or `not_opened` (kv_directory/seals.py)."""
        self.seal_refusals.labels(reason=reason).inc()

    def store_inline(self, outcome: str) -> None:
        """The inline twin made a call: `answered`, `slow` or `unavailable` (kv_directory/store_calls.py)."""
        self.store_inline_calls.labels(outcome=outcome).inc()

    def publication(self, outcome_name: str) -> None:
        """A Validated or Publish call answered `outcome_name` (an Outcome's name)."""
        reason = self.REJECT_REASONS.get(outcome_name)
        if reason is not None:
            self.publication_rejects.labels(reason=reason).inc()
