"""Settings of the router: one pydantic-settings class (runtime/common/settings.py)."""

from __future__ import annotations

import functools
import math

from pydantic import field_validator, model_validator

from pdserve_client import contract
from runtime.common.settings import MemberSettings, env

MODES = contract.MODES
"""Router modes (see router/requests/planner.py). bench/goodput.py and PD_ROUTER_MODE use these names."""

DEFAULT_SCORER_WEIGHTS = "ttft_slack=1,tpot_slack=1,queue=0.25,kv_headroom=0.25,prefix_hit=0.25"


class RouterConfig(MemberSettings):
    """Everything the router needs to run; build with ``from_env()``. The directory
    address, the model (only its tokenizer is used here) and the log level are
    MemberSettings'."""

    listen_addr: str = env("PD_ROUTER_LISTEN", contract.DEFAULT_ROUTER_ADDRESS)
    """gRPC listen address of the Router and Admin services."""

    http_listen: str = env("PD_ROUTER_HTTP_LISTEN", "")
    """Listen address of the OpenAI-compatible HTTP front (router/http; HTTPS with this
    router's certificate unless PD_INSECURE); empty: no front."""

    api_keys_file: str = env("PD_ROUTER_API_KEYS", "")
    """The front's API key file: ``<tenant> sha256:<hex>`` a line (router/http/keys.py;
    `pdserve api-key create`). Empty with security on: the front refuses every request 401."""

    served_model_name: str = env("PD_ROUTER_SERVED_MODEL_NAME", "")
    """The model name the front answers to and lists (empty: the preset's name, or the
    checkpoint directory's)."""

    http_cors_origins: str = env("PD_ROUTER_HTTP_CORS_ORIGINS", "")
    """Origins a browser page may call the front from (comma-separated, ``*`` for any;
    empty: none, and no CORS headers are sent). Keys still apply: CORS only lets the
    browser send the request."""

    http_max_body_bytes: int = env("PD_ROUTER_HTTP_MAX_BODY_BYTES", 16 << 20, ge=1024)
    """Largest request body the front reads; a bigger one is refused 413 before it is read."""

    default_mode: str = env("PD_ROUTER_MODE", "disaggregated")
    """Mode of requests with mode UNSPECIFIED: ``disaggregated`` / ``colocated``
    (forced routes), ``auto`` (per-request choice from predicted TTFT/TPOT, may
    reject), ``shadow`` (score disaggregated, execute colocated) or ``canary``
    (``canary_fraction`` of requests disaggregated). Admin.SetMode changes it at
    run time: PINNED -> colocated, ACTIVE -> auto, SHADOW -> shadow, CANARY -> canary."""

    canary_fraction: float = env("PD_ROUTER_CANARY_FRACTION", 0.0, ge=0, le=1)
    """Share of canary-mode requests routed disaggregated, in [0, 1] (by request id hash)."""

    slo_ttft_ms: float = env("PD_ROUTER_SLO_TTFT_MS", 0.0, ge=0)
    """Default TTFT target of requests that name none; 0 = no target."""

    slo_tpot_ms: float = env("PD_ROUTER_SLO_TPOT_MS", 0.0, ge=0)
    """Default TPOT target of requests that name none; 0 = no target."""

    tenant_slos: str = env("PD_ROUTER_TENANT_SLOS", "")
    """Per-tenant default targets, ``tenant=ttft_ms:tpot_ms,...`` (e.g. ``gold=300:30``);
    they override slo_ttft_ms / slo_tpot_ms for that tenant; a request's own Slo wins."""

    scorer_weights: str = env("PD_ROUTER_SCORER_WEIGHTS", DEFAULT_SCORER_WEIGHTS)
    """Weights of the route scorers (router/pricing/scorers), ``name=weight,...``; unnamed ones weigh 0."""

    disaggregation_margin: float = env("PD_ROUTER_DISAGGREGATION_MARGIN", 0.05, ge=0)
    """Auto mode disaggregates only when the best split route outscores the best
    colocated one by more than this (ties stay colocated: no transfer, fewer failure modes)."""

    decode_prefill_tokens: int = env("PD_ROUTER_DECODE_PREFILL_TOKENS", 256, ge=0)
    """Auto mode colocates a request on a decode worker (role DECODE) while a prefill worker
    could take it only when the decode worker computes at most this many of its prompt
    tokens and has no prefill queued (router/pricing/decision.py `by_role`): a short prompt
    skips the hand-off, a longer one stalls the streams there and delays every hand-off
    to it. 0: never while a split route exists. Mixed workers have no such limit."""

    reject_slack: float = env("PD_ROUTER_REJECT_SLACK", 0.5, ge=0)
    """Auto mode rejects (RESOURCE_EXHAUSTED) only when even the closest candidate's
    prediction exceeds a target by more than this fraction of it (0.5: predicted
    > 1.5x the target); a nearer miss runs that candidate. A wrong rejection costs
    more than a late request, and predictions are estimates."""

    stream_start_windows: bool = env("PD_ROUTER_STREAM_START_WINDOWS", False)
    """Let a prefill run beside a stream this router planned when the prefill is
    predicted to end before that stream's earliest start (router/requests/streams.py): the
    second prompt of a burst can prefill on the worker that will decode the first
    one. Off: a planned stream counts as decoding from its plan until it ends (and
    never vanishes between a heartbeat and its start, as it did before the book).
    Off by default: on the local cluster the windows cut long prompts' median
    TTFT by a third and cost a quarter of the streams their TPOT (predicted
    starts are estimates, and prefills side by side on a shared host run slower
    than alone); measured in bench/results/goodput.md."""

    stream_start_share: float = env("PD_ROUTER_STREAM_START_SHARE", 0.75, ge=0, le=1)
    """With `stream_start_windows`: the share of a planned stream's earliest start
    (predicted TTFT less the queue ahead of its prefill) that is booked, so a
    window closes that much before the predicted start (a margin for prefills
    that run slower side by side, and for starts that come early). Measured on
    the local cluster: 0.75 gave joint 0.78-0.97 where 1.0 gave 0.64-0.69
    (bench/results/goodput.md)."""

    reject_unconfirmed: bool = env("PD_ROUTER_REJECT_UNCONFIRMED", False)
    """Reject also on prices no completion on this router has confirmed yet (the
    candidate's prefill not yet corrected, or its decode worker's price not yet
    backed by several agreeing recent streams: router/pricing/cost_model.py
    `decode_confirmed`; start-up calibration alone can be several times off on a
    shared host). Off: such a request runs, and its completion corrects the
    prices that would have rejected it. Either way, a TPOT prediction never
    rejects while the decode worker's recent streams ran well under the target."""

    reject_evidence_s: float = env("PD_ROUTER_REJECT_EVIDENCE_S", 30.0, gt=0)
    """How long a completion confirms a worker's price for auto mode's rejections: a decode
    price is confirmed only by streams that ended at most this long ago, a prefill price
    only by a correction at most this old. Only executed requests correct prices, so
    without an age an overload's prices, once confirmed, rejected every later request on
    an idle cluster and nothing ever corrected them back."""

    candidate_top_k: int = env("PD_ROUTER_CANDIDATE_TOP_K", 4, gt=0)
    """Prefill and decode workers kept after the cheap per-worker bound; pairs are their product."""

    cost_ewma_alpha: float = env("PD_ROUTER_COST_EWMA_ALPHA", 0.2, gt=0, le=1)
    """Weight of each new observation in the online cost corrections (EWMA)."""

    default_prefill_ms_per_token: float = env("PD_ROUTER_DEFAULT_PREFILL_MS_PER_TOKEN", 0.5, gt=0)
    """Prefill cost of a worker that declared no profile, per prompt token."""

    default_decode_step_ms: float = env("PD_ROUTER_DEFAULT_DECODE_STEP_MS", 20.0, gt=0)
    """Decode step time of a worker that declared no profile."""

    transfer_latency_ms: float = env("PD_ROUTER_TRANSFER_LATENCY_MS", 1.0, ge=0)
    """Fixed cost of one K/V hand-off before online correction."""

    transfer_mb_per_s: float = env("PD_ROUTER_TRANSFER_MB_PER_S", 1000.0, gt=0)
    """K/V transfer bandwidth (MB/s, 10^6 bytes) before online correction."""

    disaggregated_overhead_ms: float = env("PD_ROUTER_DISAGGREGATED_OVERHEAD_MS", 5.0, ge=0)
    """TTFT overhead of a split route (the job's and token 0's hops through the prefill)
    before correction."""

    colocated_overhead_ms: float = env("PD_ROUTER_COLOCATED_OVERHEAD_MS", 1.0, ge=0)
    """TTFT overhead of a colocated route before correction."""

    handoff_overhead_ms: float = env("PD_ROUTER_HANDOFF_OVERHEAD_MS", 5.0, ge=0)
    """How much later than the prefill's token 0 a split route's decode streams, beyond the
    transfer and the admission (the hand-off's control plane), before correction."""

    decision_log_size: int = env("PD_ROUTER_DECISION_LOG_SIZE", 4096, gt=0)
    """Decisions kept for Admin.Decisions (predicted vs observed), oldest dropped first."""

    prefix_index_blocks: int = env("PD_ROUTER_PREFIX_INDEX_BLOCKS", 0, ge=0)
    """Blocks the router's approximate prefix index remembers per worker; 0 = the
    worker's total_blocks."""

    router_id: str = env("PD_ROUTER_ID", "router", min_length=1)
    """Name the router gives as worker_id in directory calls it makes (Abort);
    the directory fences only a transaction's own ends by epoch."""

    default_tenant: str = env("PD_ROUTER_DEFAULT_TENANT", "default", min_length=1)
    """Tenant of requests that name none (the directory requires one)."""

    max_tokens_limit: int = env("PD_ROUTER_MAX_TOKENS", 4096, ge=1)
    """Largest max_tokens a request may ask for."""

    intake_bytes: int = env("PD_ROUTER_INTAKE_BYTES", 64 << 20, ge=1)
    """Bytes of Generate requests read at once between receipt and admission (router/edge/
    budget.py); one that would pass it is refused RESOURCE_EXHAUSTED before it is parsed.
    A request alone is always read."""

    max_attempts: int = env("PD_ROUTER_MAX_ATTEMPTS", 3, ge=1)
    """Generations one request may use in total (disaggregated plus colocated)."""

    max_disaggregated_attempts: int = env("PD_ROUTER_MAX_DISAGGREGATED_ATTEMPTS", 2, ge=0)
    """Of those, how many may be disaggregated (each on a distinct (P, D) pair);
    the rest are colocated recomputes on decode-capable workers."""

    default_deadline_ms: int = env("PD_ROUTER_DEADLINE_MS", 120_000, ge=0)
    """Request time budget when GenerateRequest.deadline_ms is 0; 0 = none."""

    reserve_timeout_s: float = env("PD_ROUTER_RESERVE_TIMEOUT_S", 5.0, gt=0)
    """Deadline of Decode.Reserve."""

    directory_timeout_s: float = env("PD_ROUTER_DIRECTORY_TIMEOUT_S", 2.0, gt=0)
    """Deadline of each directory call (snapshot, reserve, abort, list)."""

    prefill_timeout_s: float = env("PD_ROUTER_PREFILL_TIMEOUT_S", 60.0, gt=0)
    """Deadline of Prefill.Prefill (compute plus hand-off)."""

    first_token_timeout_s: float = env("PD_ROUTER_FIRST_TOKEN_TIMEOUT_S", 60.0, gt=0)
    """Longest wait for token 0 of an attempt (DecodeStream or Generate)."""

    token_timeout_s: float = env("PD_ROUTER_TOKEN_TIMEOUT_S", 30.0, gt=0)
    """Longest gap between two tokens of one attempt before it counts as failed."""

    resume_mid_stream: bool = env("PD_ROUTER_RESUME_MID_STREAM", True)
    """An attempt after tokens went out resumes after them: its prompt is the request's
    followed by all but the last token given, replayed as decode computed them (exact
    kernels: the same bits; router/requests/output.py). Off: it regenerates from token
    0 and every token given is checked again (an engine whose replayed K/V is not decode's
    bits; bench/migration.py's baseline)."""

    liveness_check_s: float = env("PD_ROUTER_LIVENESS_CHECK_S", 1.0, gt=0)
    """While an attempt waits for a token, check this often that its workers still hold
    their leases at the attempt's epochs: a hung (SIGSTOPped) or dead worker is noticed
    when its lease expires, not at the token timeout."""

    cancel_timeout_s: float = env("PD_ROUTER_CANCEL_TIMEOUT_S", 1.0, gt=0)
    """Deadline of each Cancel / Abort sent while tearing an attempt down."""

    snapshot_max_age_ms: int = env("PD_ROUTER_SNAPSHOT_MAX_AGE_MS", 100, ge=0)
    """A cluster snapshot younger than this is reused instead of asking the directory; one
    up to 4 times older is still served to a request while a fresh one is fetched in the
    background (router/requests/cluster_view.py STALE_FACTOR; 0: every request asks)."""

    directory_retry_ms: int = env("PD_ROUTER_DIRECTORY_RETRY_MS", 1_000, ge=0)
    """While the directory is unreachable, ask it for a snapshot at most this often; the
    requests in between are placed on the last snapshot, colocated only (a colocated
    route needs no directory), until a snapshot arrives again."""

    overlay_ttl_ms: int = env("PD_ROUTER_OVERLAY_TTL_MS", 5_000, ge=0)
    """Longest the router counts its own dispatch against a worker's load before
    trusting the worker's heartbeat to show it (backstop if heartbeats are not
    detected)."""

    failure_cooldown_ms: int = env("PD_ROUTER_FAILURE_COOLDOWN_MS", 3_000, ge=0)
    """After a worker's own call fails (unreachable or hung), new requests avoid
    it for this long unless nothing else can serve them (its lease may not have
    expired in the directory yet)."""

    unreachable_wait_ms: int = env("PD_ROUTER_UNREACHABLE_WAIT_MS", 1_500, ge=0)
    """When every worker that could take a request's next attempt already failed to
    answer in this request (connection refused, a stream cut, a lease lapsed), how long
    the request waits for the cluster to change (the worker restarts and registers
    again, another joins) before it fails UNAVAILABLE naming them; bounded by the
    request's deadline less its predicted service time."""

    queue_per_tenant: int = env("PD_ROUTER_QUEUE_PER_TENANT", 256, gt=0)
    """Most requests of one tenant waiting for K/V room in the admission queue; one
    more is rejected RESOURCE_EXHAUSTED at once (router/requests/queueing.py)."""

    queue_poll_ms: int = env("PD_ROUTER_QUEUE_POLL_MS", 50, gt=0)
    """While requests wait for room, re-check it at least this often (an attempt
    ending in this router re-checks at once)."""

    max_requeues: int = env("PD_ROUTER_MAX_REQUEUES", 16)
    """Times one request may go back to the admission queue because the worker it
    was sent to had no room after all (a lagging snapshot); then it counts as a
    failed attempt."""

    recent_request_ids: int = env("PD_ROUTER_RECENT_REQUEST_IDS", 65_536, gt=0)
    """How many served request ids the router remembers with their last generation
    (about 200 bytes each): a client re-using one within the directory's retention
    starts above the earlier run's generation instead of colliding with it."""

    release_poll_s: float = env("PD_RELEASE_POLL_S", 1.0, gt=0)
    """How often the router reads the release record's head (router/release): a replica
    follows a promotion or a rollback within this, traffic or not."""

    rollback_lease_s: float = env("PD_ROLLBACK_LEASE_S", 10.0, gt=0)
    """A rollback's runner holds it this long past each step it records; a router that
    finds it unfinished and the lease lapsed (its runner died) resumes it."""

    rollback_drain_timeout_s: float = env("PD_ROLLBACK_DRAIN_TIMEOUT_S", 10.0, gt=0)
    """DRAIN_OR_ABORT_TRANSFERS waits this long for unpublished transfers to end on their
    own (none publishes under the retired epoch); then it aborts the rest."""

    rollback_connector_timeout_s: float = env("PD_ROLLBACK_CONNECTOR_TIMEOUT_S", 10.0, gt=0)
    """DISABLE_CONNECTOR waits this long for every live worker to report its connector off
    (workers learn it from their next heartbeat answer, and say so in the one after)."""

    rollback_reclaim_timeout_s: float = env("PD_ROLLBACK_RECLAIM_TIMEOUT_S", 15.0, gt=0)
    """RECLAIM_UNPUBLISHED waits this long for the workers to give back the blocks of
    unpublished transfers (they free them once their transport is quiet)."""

    rollback_step_pause_s: float = env("PD_ROLLBACK_STEP_PAUSE_S", 0.0, ge=0)
    """Pause after each rollback step: a drill's pacing, to watch each step land (or to
    kill the router between two and see another finish it). 0 in production."""

    canary_min_samples: int = env("PD_CANARY_MIN_SAMPLES", 20, ge=1)
    """A promotion to ACTIVE needs this many disaggregated requests completed since CANARY,
    and this many of each route with a TTFT (TPOT) target to compare their attainment."""

    canary_max_transfer_failure_rate: float = env("PD_CANARY_MAX_TRANSFER_FAILURE_RATE", 0.05, ge=0, le=1)
    """A promotion to ACTIVE needs at most this share of the canary's disaggregated attempts failed."""

    @field_validator("default_mode")
    @classmethod
    def _known_mode(cls, mode: str) -> str:
        if mode not in MODES:
            raise ValueError(f"default_mode must be one of {MODES}, got {mode!r}")
        return mode

    @field_validator("http_listen")
    @classmethod
    def _listen_form(cls, address: str) -> str:
        port = address.rpartition(":")[2]
        if address and not (":" in address and port.isdigit() and int(port) < 65536):
            raise ValueError(f"http_listen must be host:port, got {address!r}")
        return address

    def served_name(self) -> str:
        """The name the HTTP front serves the model under."""
        if self.served_model_name:
            return self.served_model_name
        return (self.model.rstrip("/").rpartition("/")[2] or self.model) if self.model else "pdserve"

    @field_validator("tenant_slos")
    @classmethod
    def _tenant_slos_parse(cls, text: str) -> str:
        parse_tenant_slos(text)
        return text

    @field_validator("scorer_weights")
    @classmethod
    def _weights_parse(cls, text: str) -> str:
        parse_weights(text)
        return text

    @model_validator(mode="after")
    def _attempts_fit(self):
        if self.max_disaggregated_attempts > self.max_attempts:
            raise ValueError("max_disaggregated_attempts must be in [0, max_attempts]")
        return self

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
