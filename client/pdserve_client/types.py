"""Plain values the SDK hands to callers: token events, results, status, errors.

Nothing here imports gRPC or protobuf; `wire.py` converts to and from `pd.v1`.
Latency fields follow docs/design.md "Measurement": TTFT is the time to the first
token, TPOT = (latency - TTFT) / (output_tokens - 1), 0 with fewer than two
tokens. Client-side values (`ttft_ms`, `tpot_ms`, `latency_ms`, `t_ms`) are
measured with `time.perf_counter` from the moment `generate` is called; the
router's own view is kept next to them as `server_*`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


class PdError(Exception):
    """Every failure the SDK reports: a stream `error` event, a gRPC status, or a bad argument.

    `code` is the error class by name: the gRPC status name for gRPC errors
    (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, ...), and the pd.v1
    ErrorCode name without its prefix for stream errors, which uses the same
    names where the classes coincide and adds pdserve's own (ADMISSION_REJECTED,
    CACHE_ABI_MISMATCH, STALE_GENERATION, CAPABILITY_DENIED, TRANSFER_FAILED).
    `grpc_code` is always the nearest gRPC status name, for callers that only
    know those. `message` is the server's text, unmodified.
    """

    def __init__(self, code: str, message: str, *, retryable: bool = False, grpc_code: str | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.grpc_code = grpc_code or code


class InvalidArgumentError(PdError, ValueError):
    """An argument the SDK refuses before sending anything (`GenerateOptions`, a prompt, a
    name it does not know): a PdError with code INVALID_ARGUMENT, and a ValueError for
    callers that check arguments the Python way."""

    def __init__(self, message: str):
        super().__init__("INVALID_ARGUMENT", message)


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token as the client received it."""

    index: int
    """Position in the output, from 0 (the router's numbering)."""
    token_id: int
    """Token id."""
    text: str
    """Text this token adds; may be empty mid-character or without a tokenizer."""
    t_ms: float
    """Client-side ms from the `generate` call to this token's arrival."""
    server_t_ms: float = 0.0
    """Router-side ms from request receipt to this token."""
    logprobs: TokenLogprobs | None = None
    """Its log-probabilities, when the request asked (GenerateOptions.logprobs)."""


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A token's log-probabilities: the model's own log-softmax at its position (before
    temperature, top-k and top-p), float32 values."""

    logprob: float
    """The token's own."""
    top: tuple[tuple[int, float], ...] = ()
    """(token id, log-probability) of the GenerateOptions.logprobs most likely tokens, most
    likely first, ties by lower id."""


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """The route the router announced in its latest `started` event."""

    route: str
    """'disaggregated' or 'colocated'."""
    prefill_worker: str
    """Prefill worker id; empty for colocated."""
    decode_worker: str
    """Decode worker id."""
    generation: int
    """Request generation of this route (grows on reroute)."""
    route_epoch: int
    """Route epoch the route was chosen under."""


@dataclass(slots=True)
class GenerationResult:
    """A finished generation with client- and router-side latencies."""

    request_id: str
    """Request id (client-chosen or generated)."""
    token_ids: list[int]
    """Generated token ids in order."""
    text: str
    """Concatenated token text."""
    finish_reason: str
    """'stop', 'length' or 'cancelled'."""
    ttft_ms: float
    """Client-side time to first token, ms (0 when no token arrived)."""
    tpot_ms: float
    """Client-side (latency - TTFT) / (n - 1), ms; 0 when n <= 1."""
    route: str
    """Path that produced the tokens: 'disaggregated' or 'colocated'."""
    attempts: int
    """Generations the router tried (1 when the first route succeeded)."""
    prefill_worker: str
    """Prefill worker of the final route; empty for colocated."""
    decode_worker: str
    """Decode worker of the final route."""
    server_ttft_ms: float
    """TTFT measured at the router, ms."""
    server_tpot_ms: float
    """TPOT measured at the router, ms."""
    latency_ms: float
    """Client-side ms from the `generate` call to the end of the stream."""
    token_times_ms: list[float] = field(default_factory=list)
    """Client-side arrival time of each token, ms from the call."""
    generation: int = 0
    """Request generation of the final route."""
    route_epoch: int = 0
    """Route epoch of the final route."""
    prefill_kv_digest: str = ""
    """Digest of the prompt K/V the prefill worker produced (disaggregated only)."""
    decode_kv_digest: str = ""
    """Digest of the prompt K/V the decode worker published; equal when the hand-off was exact."""
    failed_attempts: str = ""
    """Why the router's earlier attempts failed ('; '-joined); empty when the first succeeded.
    Says why a request that asked for a disaggregated route came back colocated."""

    @property
    def num_tokens(self) -> int:
        """Tokens generated."""
        return len(self.token_ids)

    def to_dict(self) -> dict:
        """JSON-ready dict of every field plus `num_tokens`."""
        return {**asdict(self), "num_tokens": self.num_tokens}


def client_tpot_ms(latency_ms: float, ttft_ms: float, num_tokens: int) -> float:
    """TPOT = (latency - TTFT) / (n - 1); 0 when n <= 1 (no inter-token interval exists)."""
    if num_tokens <= 1:
        return 0.0
    return (latency_ms - ttft_ms) / (num_tokens - 1)


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One live worker and its latest load report."""

    worker_id: str
    """Stable worker name."""
    role: str
    """'prefill', 'decode' or 'mixed' (both phases)."""
    address: str
    """host:port of the worker's gRPC server."""
    epoch: int
    """Registration epoch."""
    free_blocks: int
    """K/V blocks that can be allocated now (the unreferenced prefix cache included)."""
    reserved_blocks: int
    """K/V blocks held by unpublished reservations."""
    total_blocks: int
    """K/V blocks the worker owns."""
    pending_prefill_tokens: int
    """Prompt tokens queued or running on the prefill side."""
    active_decode_batch: int
    """Requests in the current decode batch."""
    lease_expires_unix_ms: int
    """Wall-clock lease expiry, Unix ms."""
    colocated_only_reason: str = ""
    """Why the worker serves colocated requests only and never exchanges K/V (its
    start-up kernel self-check failed); empty: hand-offs allowed."""
    active_blocks: int = 0
    """K/V blocks held by running work (prefills in flight, sequences decoding):
    free + reserved + active == total, so a worker at rest shows 0 here."""
    cached_blocks: int = 0
    """Of the free blocks, those holding a reusable prompt prefix."""
    capacity: dict[str, int] = field(default_factory=dict)
    """What it declared at registration (pd.v1.WorkerCapacity by field name: total_blocks,
    max_decode_batch, max_prefill_tokens, block_size, vocab_size, max_model_len)."""
    profile: dict[str, float | str] = field(default_factory=dict)
    """The cost profile it measured and registered (pd.v1.CostProfile by field name; empty:
    none declared): what `pdctl profile save` keeps for the simulator."""


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """The router's Admin.Status answer."""

    workers: list[WorkerStatus]
    """Every live worker."""
    free_blocks: int
    """Sum of free blocks over decode-capable workers."""
    reserved_blocks: int
    """Sum of reserved blocks over decode-capable workers."""
    total_blocks: int
    """Sum of total blocks over decode-capable workers."""
    open_transactions: int
    """Transactions not yet ABORTED or RELEASED."""
    mode: str
    """Release mode: 'pinned', 'shadow', 'canary', 'active' or 'rolled_back'."""
    canary_fraction: float
    """Canary share in [0, 1]."""
    route_epoch: int
    """Current route epoch."""

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """One transfer transaction as the directory records it (manifest omitted)."""

    request_id: str
    transfer_id: str
    tenant: str
    generation: int
    attempt: int
    state: str
    """'reserved', 'transferring', 'validated', 'published', 'aborted' or 'released'."""
    source_worker_id: str
    source_epoch: int
    destination_worker_id: str
    destination_epoch: int
    reservation_id: str
    chunks_expected: int
    kv_digest: str
    abort_reason: str
    created_unix_ms: int
    updated_unix_ms: int

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ModeChange:
    """Result of Admin.SetMode."""

    previous_mode: str
    """Release mode before the call."""
    mode: str
    """Release mode after the call."""
    route_epoch: int
    """Route epoch after the call (advanced on rollback)."""
    steps: list[str]
    """Steps the router executed, in order."""

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)
