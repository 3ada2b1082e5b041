from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_PREFILL: _ClassVar[WorkerRole]
    WORKER_ROLE_DECODE: _ClassVar[WorkerRole]
    WORKER_ROLE_BOTH: _ClassVar[WorkerRole]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    ERROR_CODE_ADMISSION_REJECTED: _ClassVar[ErrorCode]
    ERROR_CODE_DEADLINE_EXCEEDED: _ClassVar[ErrorCode]
    ERROR_CODE_CANCELLED: _ClassVar[ErrorCode]
    ERROR_CODE_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_CACHE_ABI_MISMATCH: _ClassVar[ErrorCode]
    ERROR_CODE_STALE_GENERATION: _ClassVar[ErrorCode]
    ERROR_CODE_CAPABILITY_DENIED: _ClassVar[ErrorCode]
    ERROR_CODE_TRANSFER_FAILED: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_PREFILL: WorkerRole
WORKER_ROLE_DECODE: WorkerRole
WORKER_ROLE_BOTH: WorkerRole
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_RESOURCE_EXHAUSTED: ErrorCode
ERROR_CODE_ADMISSION_REJECTED: ErrorCode
ERROR_CODE_DEADLINE_EXCEEDED: ErrorCode
ERROR_CODE_CANCELLED: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_CACHE_ABI_MISMATCH: ErrorCode
ERROR_CODE_STALE_GENERATION: ErrorCode
ERROR_CODE_CAPABILITY_DENIED: ErrorCode
ERROR_CODE_TRANSFER_FAILED: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason

class Error(_message.Message):
    __slots__ = ("code", "message", "retryable")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    retryable: bool
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "stop_token_ids", "ignore_eos", "first_step", "logprobs")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    first_step: int
    logprobs: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., first_step: _Optional[int] = ..., logprobs: _Optional[int] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprob", "top_token_ids", "top_logprobs")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprob: _Optional[float] = ..., top_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Slo(_message.Message):
    __slots__ = ("ttft_ms", "tpot_ms")
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    ttft_ms: float
    tpot_ms: float
    def __init__(self, ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id", "generation", "reason", "discard_kv")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DISCARD_KV_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    generation: int
    reason: str
    discard_kv: bool
    def __init__(self, request_id: _Optional[str] = ..., generation: _Optional[int] = ..., reason: _Optional[str] = ..., discard_kv: _Optional[bool] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("request_id", "found")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    found: bool
    def __init__(self, request_id: _Optional[str] = ..., found: _Optional[bool] = ...) -> None: ...

class WorkerCapacity(_message.Message):
    __slots__ = ("total_blocks", "max_decode_batch", "max_prefill_tokens", "block_size", "vocab_size", "max_model_len")
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_DECODE_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    total_blocks: int
    max_decode_batch: int
    max_prefill_tokens: int
    block_size: int
    vocab_size: int
    max_model_len: int
    def __init__(self, total_blocks: _Optional[int] = ..., max_decode_batch: _Optional[int] = ..., max_prefill_tokens: _Optional[int] = ..., block_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("pending_prefill_tokens", "active_decode_batch", "free_blocks", "reserved_blocks", "total_blocks", "active_context_tokens", "active_blocks", "cached_blocks", "connector_disabled")
    PENDING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_DECODE_BATCH_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CONNECTOR_DISABLED_FIELD_NUMBER: _ClassVar[int]
    pending_prefill_tokens: int
    active_decode_batch: int
    free_blocks: int
    reserved_blocks: int
    total_blocks: int
    active_context_tokens: int
    active_blocks: int
    cached_blocks: int
    connector_disabled: int
    def __init__(self, pending_prefill_tokens: _Optional[int] = ..., active_decode_batch: _Optional[int] = ..., free_blocks: _Optional[int] = ..., reserved_blocks: _Optional[int] = ..., total_blocks: _Optional[int] = ..., active_context_tokens: _Optional[int] = ..., active_blocks: _Optional[int] = ..., cached_blocks: _Optional[int] = ..., connector_disabled: _Optional[int] = ...) -> None: ...

class CostProfile(_message.Message):
    __slots__ = ("prefill_base_ms", "prefill_ms_per_token", "prefill_ms_per_pair", "decode_base_ms", "decode_ms_per_seq", "decode_ms_per_context_token", "kv_bytes_per_block", "source")
    PREFILL_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_PER_PAIR_FIELD_NUMBER: _ClassVar[int]
    DECODE_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_PER_SEQ_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_PER_CONTEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    prefill_base_ms: float
    prefill_ms_per_token: float
    prefill_ms_per_pair: float
    decode_base_ms: float
    decode_ms_per_seq: float
    decode_ms_per_context_token: float
    kv_bytes_per_block: int
    source: str
    def __init__(self, prefill_base_ms: _Optional[float] = ..., prefill_ms_per_token: _Optional[float] = ..., prefill_ms_per_pair: _Optional[float] = ..., decode_base_ms: _Optional[float] = ..., decode_ms_per_seq: _Optional[float] = ..., decode_ms_per_context_token: _Optional[float] = ..., kv_bytes_per_block: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "role", "grpc_address", "data_plane_address", "cache_abi_digest", "capacity", "epoch", "load", "lease_expires_unix_ms", "profile", "colocated_only_reason", "model_identity", "seal_key", "load_reported_unix_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CACHE_ABI_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    COLOCATED_ONLY_REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SEAL_KEY_FIELD_NUMBER: _ClassVar[int]
    LOAD_REPORTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: WorkerRole
    grpc_address: str
    data_plane_address: str
    cache_abi_digest: str
    capacity: WorkerCapacity
    epoch: int
    load: LoadReport
    lease_expires_unix_ms: int
    profile: CostProfile
    colocated_only_reason: str
    model_identity: str
    seal_key: bytes
    load_reported_unix_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., grpc_address: _Optional[str] = ..., data_plane_address: _Optional[str] = ..., cache_abi_digest: _Optional[str] = ..., capacity: _Optional[_Union[WorkerCapacity, _Mapping]] = ..., epoch: _Optional[int] = ..., load: _Optional[_Union[LoadReport, _Mapping]] = ..., lease_expires_unix_ms: _Optional[int] = ..., profile: _Optional[_Union[CostProfile, _Mapping]] = ..., colocated_only_reason: _Optional[str] = ..., model_identity: _Optional[str] = ..., seal_key: _Optional[bytes] = ..., load_reported_unix_ms: _Optional[int] = ...) -> None: ...
