"""Configuration of the router: one frozen dataclass, env overrides in one table."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

from pdserve_client import contract
from services.common.config import env_overrides

MODES = contract.MODES
"""Router modes (see router/requests/planner.py). bench/goodput.py and PD_ROUTER_MODE use these names."""

DEFAULT_SCORER_WEIGHTS = "ttft_slack=1,tpot_slack=1,queue=0.25,kv_headroom=0.25,prefix_hit=0.25"


@dataclasses.dataclass(frozen=True, slots=True)
class RouterConfig:
    """Everything the router needs to run; build with ``from_env()``."""

    listen_addr: str = contract.DEFAULT_ROUTER_ADDRESS
    """gRPC listen address of the Router and Admin services."""

    directory_addr: str = contract.DEFAULT_DIRECTORY_ADDRESS
    """host:port of the directory service."""

    default_mode: str = "disaggregated"
    """Mode of requests with mode UNSPECIFIED: ``disaggregated`` / ``colocated``
    (forced routes), ``auto`` (per-request choice from predicted TTFT/TPOT, may
    reject), ``shadow`` (score disaggregated, execute colocated) or ``canary``
    (``canary_fraction`` of requests disaggregated). Admin.SetMode changes it at
    run time: PINNED -> colocated, ACTIVE -> auto, SHADOW -> shadow, CANARY -> canary."""

    canary_fraction: float = 0.0
    """Share of canary-mode requests routed disaggregated, in [0, 1] (by request id hash)."""

    slo_ttft_ms: float = 0.0
    """Default TTFT target of requests that name none; 0 = no target."""

    slo_tpot_ms: float = 0.0
    """Default TPOT target of requests that name none; 0 = no target."""

    tenant_slos: str = ""
    """Per-tenant default targets, ``tenant=ttft_ms:tpot_ms,...`` (e.g. ``gold=300:30``);
    they override slo_ttft_ms / slo_tpot_ms for that tenant; a request's own Slo wins."""

    scorer_weights: str = DEFAULT_SCORER_WEIGHTS
    """Weights of the route scorers (router/pricing/scorers), ``name=weight,...``; unnamed ones weigh 0."""

    disaggregation_margin: float = 0.05
    """Auto mode disaggregates only when the best split route outscores the best
    colocated one by more than this (ties stay colocated: no transfer, fewer failure modes)."""

    reject_slack: float = 0.5
    """Auto mode rejects (RESOURCE_EXHAUSTED) only when even the closest candidate's
    prediction exceeds a target by more than this fraction of it (0.5: predicted
    > 1.5x the target); a nearer miss runs that candidate. A wrong rejection costs
    more than a late request, and predictions are estimates."""

    stream_start_windows: bool = False
    """Let a prefill run beside a stream this router planned when the prefill is
    predicted to end before that stream's earliest start (router/requests/streams.py): the
    second prompt of a burst can prefill on the worker that will decode the first
    one. Off: a planned stream counts as decoding from its plan until it ends (and
    never vanishes between a heartbeat and its start, as it did before the book).
    Off by default: on the local cluster the windows cut long prompts' median
    TTFT by a third and cost a quarter of the streams their TPOT (predicted
    starts are estimates, and prefills side by side on a shared host run slower
    than alone); measured in bench/results/goodput.md."""

    stream_start_share: float = 0.75
    """With `stream_start_windows`: the share of a planned stream's earliest start
    (predicted TTFT less the queue ahead of its prefill) that is booked, so a
    window closes that much before the predicted start (a margin for prefills
    that run slower side by side, and for starts that come early). Measured on
    the local cluster: 0.75 gave joint 0.78-0.97 where 1.0 gave 0.64-0.69
    (bench/results/goodput.md)."""

    reject_unconfirmed: bool = False
    """Reject also on prices no completion on this router has confirmed yet (the
    candidate's prefill not yet corrected, or its decode worker's price not yet
    backed by several agreeing recent streams: router/pricing/cost_model.py
    `decode_confirmed`; start-up calibration alone can be several times off on a
    shared host). Off: such a request runs, and its completion corrects the
    prices that would have rejected it. Either way, a TPOT prediction never
    rejects while the decode worker's recent streams ran well under the target."""

    candidate_top_k: int = 4
    """Prefill and decode workers kept after the cheap per-worker bound; pairs are their product."""

    cost_ewma_alpha: float = 0.2
    """Weight of each new observation in the online cost corrections (EWMA)."""

    default_prefill_ms_per_token: float = 0.5
    """Prefill cost of a worker that declared no profile, per prompt token."""

    default_decode_step_ms: float = 20.0
    """Decode step time of a worker that declared no profile."""

    transfer_latency_ms: float = 1.0
    """Fixed cost of one K/V hand-off before online correction."""

    transfer_mb_per_s: float = 1000.0
    """K/V transfer bandwidth (MB/s, 10^6 bytes) before online correction."""

    disaggregated_overhead_ms: float = 5.0
    """TTFT overhead of a split route (reserve, directory, two RPC hops) before correction."""

    colocated_overhead_ms: float = 1.0
    """TTFT overhead of a colocated route before correction."""

    decision_log_size: int = 4096
    """Decisions kept for Admin.Decisions (predicted vs observed), oldest dropped first."""

    prefix_index_blocks: int = 0
    """Blocks the router's approximate prefix index remembers per worker; 0 = the
    worker's total_blocks."""

    model: str = ""
    """Checkpoint directory or preset name. Only the tokenizer is used here: a
    directory with ``tokenizer.json`` enables text prompts and token text;
    presets have no tokenizer."""

    router_id: str = "router"
    """Name the router gives as worker_id in directory calls it makes (Abort);
    the directory fences only a transaction's own ends by epoch."""

    default_tenant: str = "default"
    """Tenant of requests that name none (the directory requires one)."""

    max_tokens_limit: int = 4096
    """Largest max_tokens a request may ask for."""

    max_attempts: int = 3
    """Generations one request may use in total (disaggregated plus colocated)."""

    max_disaggregated_attempts: int = 2
    """Of those, how many may be disaggregated (each on a distinct (P, D) pair);
    the rest are colocated recomputes on decode-capable workers."""

    default_deadline_ms: int = 120_000
    """Request time budget when GenerateRequest.deadline_ms is 0; 0 = none."""

    reserve_timeout_s: float = 5.0
    """Deadline of Decode.Reserve."""

    directory_timeout_s: float = 2.0
    """Deadline of each directory call (snapshot, reserve, abort, list)."""

    prefill_timeout_s: float = 60.0
    """Deadline of Prefill.Prefill (compute plus hand-off)."""

    first_token_timeout_s: float = 60.0
    """Longest wait for token 0 of an attempt (DecodeStream or Generate)."""

    token_timeout_s: float = 30.0
    """Longest gap between two tokens of one attempt before it counts as failed."""

    liveness_check_s: float = 1.0
    """While an attempt waits for a token, check this often that its workers still hold
    their leases at the attempt's epochs: a hung (SIGSTOPped) or dead worker is noticed
    when its lease expires, not at the token timeout."""

    cancel_timeout_s: float = 1.0
    """Deadline of each Cancel / Abort sent while tearing an attempt down."""

    snapshot_max_age_ms: int = 100
    """A cluster snapshot younger than this is reused instead of asking the directory."""

    directory_retry_ms: int = 1_000
    """While the directory is unreachable, ask it for a snapshot at most this often; the
    requests in between are placed on the last snapshot, colocated only (a colocated
    route needs no directory), until a snapshot arrives again."""

    overlay_ttl_ms: int = 5_000
    """Longest the router counts its own dispatch against a worker's load before
    trusting the worker's heartbeat to show it (backstop if heartbeats are not
    detected)."""

    failure_cooldown_ms: int = 3_000
    """After a worker's own call fails (unreachable or hung), new requests avoid
    it for this long unless nothing else can serve them (its lease may not have
    expired in the directory yet)."""

    unreachable_wait_ms: int = 5_000
    """When every worker that could take a request's next attempt already failed to
    answer in this request (connection refused, lease about to lapse), how long the
    request waits for the cluster to change (the worker restarts and registers again,
    its lease lapses, another joins) before dispatching into it anyway; bounded by the
    request's deadline less its predicted service time. 0 retries at once."""

    queue_per_tenant: int = 256
    """Most requests of one tenant waiting for K/V room in the admission queue; one
    more is rejected RESOURCE_EXHAUSTED at once (router/requests/queueing.py)."""

    queue_poll_ms: int = 50
    """While requests wait for room, re-check it at least this often (an attempt
    ending in this router re-checks at once)."""

    max_requeues: int = 16
    """Times one request may go back to the admission queue because the worker it
    was sent to had no room after all (a lagging snapshot); then it counts as a
    failed attempt."""

    recent_request_ids: int = 65_536
    """How many served request ids the router remembers with their last generation
    (about 200 bytes each): a client re-using one within the directory's retention
    starts above the earlier run's generation instead of colliding with it."""

    log_level: str = "INFO"
    """Python logging level name."""

    def __post_init__(self) -> None:
        if self.default_mode not in MODES:
            raise ValueError(f"default_mode must be one of {MODES}, got {self.default_mode!r}")
        for name in ("default_tenant", "router_id", "directory_addr"):
            if not getattr(self, name):
                raise ValueError(f"{name} must be non-empty")
        for name in ("max_tokens_limit", "max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.canary_fraction <= 1:
            raise ValueError(f"canary_fraction must be in [0, 1], got {self.canary_fraction!r}")
        for name in ("slo_ttft_ms", "slo_tpot_ms", "disaggregation_margin", "transfer_latency_ms",
                     "disaggregated_overhead_ms", "colocated_overhead_ms", "prefix_index_blocks",
                     "reject_slack"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("default_prefill_ms_per_token", "default_decode_step_ms", "transfer_mb_per_s",
                     "candidate_top_k", "decision_log_size", "recent_request_ids", "queue_per_tenant",
                     "queue_poll_ms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.stream_start_share <= 1:
            raise ValueError(f"stream_start_share must be in [0, 1], got {self.stream_start_share!r}")
        if not 0 < self.cost_ewma_alpha <= 1:
            raise ValueError(f"cost_ewma_alpha must be in (0, 1], got {self.cost_ewma_alpha!r}")
        parse_tenant_slos(self.tenant_slos)
        parse_weights(self.scorer_weights)
        if not 0 <= self.max_disaggregated_attempts <= self.max_attempts:
            raise ValueError("max_disaggregated_attempts must be in [0, max_attempts]")
        for name in ("reserve_timeout_s", "directory_timeout_s", "prefill_timeout_s",
                     "first_token_timeout_s", "token_timeout_s", "cancel_timeout_s", "liveness_check_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("default_deadline_ms", "snapshot_max_age_ms", "directory_retry_ms",
                     "overlay_ttl_ms", "failure_cooldown_ms", "unreachable_wait_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> RouterConfig:
        """Defaults, then ``PD_*`` variables from ``env`` (default os.environ), then ``overrides``."""
        kwargs = env_overrides(cls, ENV_OVERRIDES, env)
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kwargs)


    def slo_for(self, tenant: str) -> tuple[float, float]:
        """(ttft_ms, tpot_ms) defaults of `tenant` (0 = no target)."""
        return parse_tenant_slos(self.tenant_slos).get(tenant, (self.slo_ttft_ms, self.slo_tpot_ms))

    def weights(self) -> dict[str, float]:
        """Scorer name -> weight."""
        return parse_weights(self.scorer_weights)


@functools.lru_cache(maxsize=32)
def parse_tenant_slos(text: str) -> dict[str, tuple[float, float]]:
    """``gold=300:30,free=2000:0`` -> {tenant: (ttft_ms, tpot_ms)}; ValueError names the bad entry."""
    out: dict[str, tuple[float, float]] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        tenant, _, targets = item.partition("=")
        ttft, _, tpot = targets.partition(":")
        try:
            pair = (float(ttft), float(tpot or 0))
        except ValueError:
            raise ValueError(f"tenant_slos entry {item!r}: expected tenant=ttft_ms:tpot_ms") from None
        if not tenant or min(pair) < 0 or not all(map(math.isfinite, pair)):
            raise ValueError(f"tenant_slos entry {item!r}: expected tenant=ttft_ms:tpot_ms, both >= 0")
        out[tenant] = pair
    return out


@functools.lru_cache(maxsize=32)
def parse_weights(text: str) -> dict[str, float]:
    """``ttft_slack=1,queue=0.25`` -> {name: weight}; ValueError on unknown names or bad numbers."""
    from router.pricing.scorers import SCORERS  # scorers import nothing from config; lazy to keep config light

    out: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, raw = item.partition("=")
        if name not in SCORERS:
            raise ValueError(f"scorer_weights: unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}")
        try:
            weight = float(raw)
        except ValueError:
            raise ValueError(f"scorer_weights entry {item!r}: expected name=weight") from None
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"scorer_weights entry {item!r}: weight must be finite and >= 0")
        out[name] = weight
    return out


# The one table of environment overrides: variable -> field.
ENV_OVERRIDES: dict[str, str] = {
    "PD_ROUTER_LISTEN": "listen_addr",
    contract.DIRECTORY_ADDRESS_ENV: "directory_addr",
    "PD_ROUTER_MODE": "default_mode",
    "PD_MODEL": "model",
    "PD_ROUTER_ID": "router_id",
    "PD_ROUTER_DEFAULT_TENANT": "default_tenant",
    "PD_ROUTER_MAX_TOKENS": "max_tokens_limit",
    "PD_ROUTER_MAX_ATTEMPTS": "max_attempts",
    "PD_ROUTER_MAX_DISAGGREGATED_ATTEMPTS": "max_disaggregated_attempts",
    "PD_ROUTER_DEADLINE_MS": "default_deadline_ms",
    "PD_ROUTER_RESERVE_TIMEOUT_S": "reserve_timeout_s",
    "PD_ROUTER_DIRECTORY_TIMEOUT_S": "directory_timeout_s",
    "PD_ROUTER_PREFILL_TIMEOUT_S": "prefill_timeout_s",
    "PD_ROUTER_FIRST_TOKEN_TIMEOUT_S": "first_token_timeout_s",
    "PD_ROUTER_TOKEN_TIMEOUT_S": "token_timeout_s",
    "PD_ROUTER_LIVENESS_CHECK_S": "liveness_check_s",
    "PD_ROUTER_CANCEL_TIMEOUT_S": "cancel_timeout_s",
    "PD_ROUTER_SNAPSHOT_MAX_AGE_MS": "snapshot_max_age_ms",
    "PD_ROUTER_DIRECTORY_RETRY_MS": "directory_retry_ms",
    "PD_ROUTER_OVERLAY_TTL_MS": "overlay_ttl_ms",
    "PD_ROUTER_FAILURE_COOLDOWN_MS": "failure_cooldown_ms",
    "PD_ROUTER_UNREACHABLE_WAIT_MS": "unreachable_wait_ms",
    "PD_ROUTER_CANARY_FRACTION": "canary_fraction",
    "PD_ROUTER_SLO_TTFT_MS": "slo_ttft_ms",
    "PD_ROUTER_SLO_TPOT_MS": "slo_tpot_ms",
    "PD_ROUTER_TENANT_SLOS": "tenant_slos",
    "PD_ROUTER_SCORER_WEIGHTS": "scorer_weights",
    "PD_ROUTER_DISAGGREGATION_MARGIN": "disaggregation_margin",
    "PD_ROUTER_CANDIDATE_TOP_K": "candidate_top_k",
    "PD_ROUTER_REJECT_SLACK": "reject_slack",
    "PD_ROUTER_REJECT_UNCONFIRMED": "reject_unconfirmed",
    "PD_ROUTER_STREAM_START_WINDOWS": "stream_start_windows",
    "PD_ROUTER_STREAM_START_SHARE": "stream_start_share",
    "PD_ROUTER_COST_EWMA_ALPHA": "cost_ewma_alpha",
    "PD_ROUTER_DEFAULT_PREFILL_MS_PER_TOKEN": "default_prefill_ms_per_token",
    "PD_ROUTER_DEFAULT_DECODE_STEP_MS": "default_decode_step_ms",
    "PD_ROUTER_TRANSFER_LATENCY_MS": "transfer_latency_ms",
    "PD_ROUTER_TRANSFER_MB_PER_S": "transfer_mb_per_s",
    "PD_ROUTER_DISAGGREGATED_OVERHEAD_MS": "disaggregated_overhead_ms",
    "PD_ROUTER_COLOCATED_OVERHEAD_MS": "colocated_overhead_ms",
    "PD_ROUTER_DECISION_LOG_SIZE": "decision_log_size",
    "PD_ROUTER_PREFIX_INDEX_BLOCKS": "prefix_index_blocks",
    "PD_ROUTER_RECENT_REQUEST_IDS": "recent_request_ids",
    "PD_ROUTER_QUEUE_PER_TENANT": "queue_per_tenant",
    "PD_ROUTER_QUEUE_POLL_MS": "queue_poll_ms",
    "PD_ROUTER_MAX_REQUEUES": "max_requeues",
    "PD_LOG_LEVEL": "log_level",
}

