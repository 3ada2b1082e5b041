"""The router's domain values: workers, the cluster view, requests, attempts' wire
shapes and the events it streams to clients. No gRPC and no protobuf here;
`router.convert` maps these to and from pd.v1 messages.
"""

from __future__ import annotations

import dataclasses
import enum

from pdserve_client.rpc.pd.v1 import manifest_pb2
from runtime.directory.records import WorkerRecord
from runtime.directory.states import Outcome


class StatusCode(enum.Enum):
    """Status classes the router uses; names equal `grpc.StatusCode` member names."""

    OK = "OK"
    CANCELLED = "CANCELLED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    UNKNOWN = "UNKNOWN"


class RouterError(Exception):
    """A request ends with this status; the servicer aborts the RPC with it."""

    def __init__(self, code: StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class WorkerCallError(Exception):
    """A call to a worker or the directory failed (gRPC status or in-band Error)."""

    def __init__(self, code: StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class Mode(enum.Enum):
    """Serving mode a client asks for (pd.v1.Mode); UNSPECIFIED means the router default."""

    UNSPECIFIED = 0
    DISAGGREGATED = 1
    COLOCATED = 2
    AUTO = 3
    SHADOW = 4
    CANARY = 5


class Route(enum.Enum):
    """Path a request attempt takes (pd.v1.Route)."""

    DISAGGREGATED = 1
    COLOCATED = 2


class FinishReason(enum.Enum):
    """Why a token stream ended normally (pd.v1.FinishReason)."""

    STOP = 1
    LENGTH = 2
    CANCELLED = 3


def free_blocks_after(worker: WorkerRecord, extra_blocks: int) -> int:
    """`worker`'s free K/V blocks as it last reported them (its capacity before the first
    heartbeat), less `extra_blocks` a router counts beside the report (negative: blocks the
    report still holds that have been given back since); may be negative, never above
    the worker's total."""
    load, total = worker.load, worker.load.total_blocks or worker.capacity.total_blocks
    free = (load.free_blocks if load.total_blocks else worker.capacity.total_blocks) - extra_blocks
    return min(free, total) if total else free


@dataclasses.dataclass(frozen=True, slots=True)
class TxnAnswer:
    """The directory's answer to Reserve."""

    outcome: Outcome
    current_generation: int = 0
    """The request's generation after the call. A refused reserve at or below it
    means the request id ran before (within the directory's retention): the next
    attempt must go above it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters, passed verbatim to every attempt (pd.v1.SamplingParams)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    first_step: int = 0
    """The prompt's last first_step tokens are outputs already given (a resumed stream)."""
    logprobs: int | None = None
    """Log-probabilities with every token (TokenLogprobs): None, none; 0, the chosen token's
    only; k, also the k most likely (admission takes 0..contract.MAX_LOGPROBS)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One output token's log-probabilities (pd.v1.TokenLogprobs): the model's raw
    log-softmax at its position, before temperature, top-k and top-p (vLLM's default, not
    OpenAI's distribution sampled), float32 values as Python floats."""

    logprob: float
    """The token's own."""
    top: tuple[tuple[int, float], ...] = ()
    """(token id, log-probability) of the Sampling.logprobs most likely tokens, most likely
    first, ties by lower id; the token itself is among them when it ranks that high."""


@dataclasses.dataclass(frozen=True, slots=True)
class Slo:
    """Latency targets of one request (pd.v1.Slo); 0 means no target."""

    ttft_ms: float = 0.0
    tpot_ms: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class GenerateParams:
    """A client request as the router received it (before validation)."""

    request_id: str = ""
    tenant: str = ""
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    max_tokens: int = 0
    sampling: Sampling = Sampling()
    mode: Mode = Mode.UNSPECIFIED
    deadline_ms: int = 0
    slo: Slo = Slo()
    """Targets the request names (0 fields fall back to its tenant's defaults)."""
    priority: int = 0
    """Order in its tenant's admission queue: higher goes first, equal ones in arrival order."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reservation:
    """Destination blocks granted by Decode.Reserve."""

    reservation_id: str
    block_ids: tuple[int, ...] = ()
    data_plane_address: str = ""
    destination_worker_id: str = ""
    destination_epoch: int = 0
    visible_prefix_blocks: int = 0
    ttl_ms: int = 0
    expected_chunks: tuple[manifest_pb2.ChunkSpec, ...] = ()
    """The transfer set in chunks as the destination planned it: goes into the manifest."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReserveCall:
    """Arguments of Decode.Reserve."""

    request_id: str
    tenant: str
    generation: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    cache_abi_digest: str
    transfer_key: bytes = b""
    """The attempt's transfer secret (runtime/transfer/keys.py)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillCall:
    """Arguments of Prefill.Prefill."""

    manifest: manifest_pb2.HandoffManifest
    """The hand-off manifest, as recorded with Directory.Reserve."""
    prompt_token_ids: tuple[int, ...]
    destination_data_plane_address: str
    sampling: Sampling
    """Sampling of token 0, the one token prefill samples."""
    capability: bytes = b""
    """The signed transfer capability for this attempt (runtime/security/capability.py)."""
    transfer_key: bytes = b""
    """The attempt's transfer secret, the one its Decode.Reserve carried (runtime/transfer/keys.py)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillDone:
    """What Prefill.Prefill returned (the parts the router looks at)."""

    transfer_id: str = ""
    first_token_id: int = 0
    computed_tokens: int = 0
    reused_tokens: int = 0
    kv_digest: str = ""
    """Digest over the checksums of the chunks sent."""
    compute_ms: float = 0.0
    """PrefillTimings.compute_ms: the forward pass over the compute set."""
    transfer_ms: float = 0.0
    """PrefillTimings.transfer_ms: exposed (not overlapped) transfer time."""
    sent_bytes: int = 0
    """Logical K/V bytes sent (the transfer set)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamCall:
    """Arguments of Decode.DecodeStream (disaggregated) or Decode.Generate (colocated)."""

    request_id: str
    generation: int
    max_tokens: int
    sampling: Sampling
    transfer_id: str = ""
    """DecodeStream only."""
    tenant: str = ""
    """Generate only."""
    prompt_token_ids: tuple[int, ...] = ()
    """Generate only."""
    capability: bytes = b""
    """DecodeStream only: the attempt's transfer capability (checked ahead of the sender's AUTH)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamToken:
    """One token event from a worker stream."""

    token_id: int
    index: int
    kv_digest: str = ""
    """Token 0 of a hand-off: the destination's digest of the published prompt K/V."""
    source_seal: bytes = b""
    """Token 0 of a hand-off the source sealed: its seal over its declaration, relayed."""
    chunks: tuple = ()
    """The chunk list (ChunkSpecs with checksums) the seal covers."""
    logprobs: TokenLogprobs | None = None
    """When the request asked; None on a hand-off's token 0 (the prefill's carries them)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamComplete:
    """The normal end of a worker stream."""

    finish_reason: FinishReason
    num_tokens: int
    kv_digest: str = ""
    """Digest of the K/V the decode worker published (empty for colocated)."""


StreamItem = StreamToken | StreamComplete


@dataclasses.dataclass(frozen=True, slots=True)
class Started:
    """Client event: an attempt started on this route."""

    route: Route
    prefill_worker_id: str
    decode_worker_id: str
    generation: int
    route_epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class TokenOut:
    """Client event: one generated token."""

    token_id: int
    text: str
    index: int
    time_since_start_ms: float
    decoding: bool = True
    """A decode worker streamed it (False: a prefill's token 0, before any decode step)."""
    logprobs: TokenLogprobs | None = None
    """Its log-probabilities, when the request asked (Sampling.logprobs), else None. A top
    alternative is an id: its text is the tokenizer's decoding of that id alone."""


@dataclasses.dataclass(frozen=True, slots=True)
class Completed:
    """Client event: the request finished normally."""

    finish_reason: FinishReason
    ttft_ms: float
    tpot_ms: float
    num_tokens: int
    route: Route
    attempts: int
    prefill_kv_digest: str = ""
    """Disaggregated only: the digest of the K/V prefill sent ..."""
    decode_kv_digest: str = ""
    """... and of the K/V decode published; equal when the hand-off was exact."""
    failed_attempts: str = ""
    """Why the attempts before the last failed ('; '-joined); empty when the first succeeded."""
    decode_ttft_ms: float | None = None
    """When the decode's token 0 came (a hand-off's: the prefill's token 0 went out before it;
    None: at `ttft_ms`). Less `ttft_ms`, the hand-off's lag the cost model learns; with
    `decode_tpot_ms`, the decode's own cadence (its step price, no lag in it)."""
    decode_tpot_ms: float | None = None
    """(latency - decode_ttft_ms) / (n - 1): the decode's cadence (None: `tpot_ms`)."""
    text_tail: str = ""
    """What the tokens' text pieces held back at the end: bytes of a character no later token
    completed, as the whole output's decoding shows them (U+FFFD); pieces + tail = the
    decoding of every token (router/requests/text.py Detokenizer.rest)."""

    @property
    def decoding_ttft_ms(self) -> float:
        return self.ttft_ms if self.decode_ttft_ms is None else self.decode_ttft_ms

    @property
    def decoding_tpot_ms(self) -> float:
        return self.tpot_ms if self.decode_tpot_ms is None else self.decode_tpot_ms


Event = Started | TokenOut | Completed
