from pdserve_client.rpc.pd.v1 import common_pb2 as _common_pb2
from pdserve_client.rpc.pd.v1 import manifest_pb2 as _manifest_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecodeReserveRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "generation", "prompt_token_ids", "max_tokens", "sampling", "cache_abi_digest", "transfer_key")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CACHE_ABI_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    generation: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    sampling: _common_pb2.SamplingParams
    cache_abi_digest: str
    transfer_key: bytes
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., generation: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., cache_abi_digest: _Optional[str] = ..., transfer_key: _Optional[bytes] = ...) -> None: ...

class DecodeReservation(_message.Message):
    __slots__ = ("reservation_id", "block_ids", "data_plane_address", "destination_worker_id", "destination_epoch", "visible_prefix_blocks", "ttl_ms", "expected_chunks")
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_PREFIX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    reservation_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    data_plane_address: str
    destination_worker_id: str
    destination_epoch: int
    visible_prefix_blocks: int
    ttl_ms: int
    expected_chunks: _containers.RepeatedCompositeFieldContainer[_manifest_pb2.ChunkSpec]
    def __init__(self, reservation_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., data_plane_address: _Optional[str] = ..., destination_worker_id: _Optional[str] = ..., destination_epoch: _Optional[int] = ..., visible_prefix_blocks: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., expected_chunks: _Optional[_Iterable[_Union[_manifest_pb2.ChunkSpec, _Mapping]]] = ...) -> None: ...

class DecodeReserveResponse(_message.Message):
    __slots__ = ("request_id", "reservation", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reservation: DecodeReservation
    error: _common_pb2.Error
    def __init__(self, request_id: _Optional[str] = ..., reservation: _Optional[_Union[DecodeReservation, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...

class TransferStatusRequest(_message.Message):
    __slots__ = ("request_id", "transfer_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ...) -> None: ...

class TransferStatusResponse(_message.Message):
    __slots__ = ("request_id", "transfer_id", "state", "chunks_received", "chunks_expected", "received_bytes", "expected_bytes", "reserved_kv_digest")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    state: _manifest_pb2.TxnState
    chunks_received: int
    chunks_expected: int
    received_bytes: int
    expected_bytes: int
    reserved_kv_digest: str
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ..., state: _Optional[_Union[_manifest_pb2.TxnState, str]] = ..., chunks_received: _Optional[int] = ..., chunks_expected: _Optional[int] = ..., received_bytes: _Optional[int] = ..., expected_bytes: _Optional[int] = ..., reserved_kv_digest: _Optional[str] = ...) -> None: ...

class DecodeStreamRequest(_message.Message):
    __slots__ = ("request_id", "generation", "transfer_id", "max_tokens", "sampling", "capability")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    generation: int
    transfer_id: str
    max_tokens: int
    sampling: _common_pb2.SamplingParams
    capability: bytes
    def __init__(self, request_id: _Optional[str] = ..., generation: _Optional[int] = ..., transfer_id: _Optional[str] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., capability: _Optional[bytes] = ...) -> None: ...

class DecodeGenerateRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "generation", "prompt_token_ids", "max_tokens", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    generation: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    sampling: _common_pb2.SamplingParams
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., generation: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class TokenEvent(_message.Message):
    __slots__ = ("request_id", "token", "complete", "error")
    class Token(_message.Message):
        __slots__ = ("token_id", "index", "time_since_start_ms", "kv_digest", "source_seal", "chunks", "logprobs")
        TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
        INDEX_FIELD_NUMBER: _ClassVar[int]
        TIME_SINCE_START_MS_FIELD_NUMBER: _ClassVar[int]
        KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
        SOURCE_SEAL_FIELD_NUMBER: _ClassVar[int]
        CHUNKS_FIELD_NUMBER: _ClassVar[int]
        LOGPROBS_FIELD_NUMBER: _ClassVar[int]
        token_id: int
        index: int
        time_since_start_ms: float
        kv_digest: str
        source_seal: bytes
        chunks: _containers.RepeatedCompositeFieldContainer[_manifest_pb2.ChunkSpec]
        logprobs: _common_pb2.TokenLogprobs
        def __init__(self, token_id: _Optional[int] = ..., index: _Optional[int] = ..., time_since_start_ms: _Optional[float] = ..., kv_digest: _Optional[str] = ..., source_seal: _Optional[bytes] = ..., chunks: _Optional[_Iterable[_Union[_manifest_pb2.ChunkSpec, _Mapping]]] = ..., logprobs: _Optional[_Union[_common_pb2.TokenLogprobs, _Mapping]] = ...) -> None: ...
    class Complete(_message.Message):
        __slots__ = ("finish_reason", "num_tokens", "first_token_ms", "total_ms", "kv_digest")
        FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
        NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
        FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
        TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
        KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
        finish_reason: _common_pb2.FinishReason
        num_tokens: int
        first_token_ms: float
        total_ms: float
        kv_digest: str
        def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., num_tokens: _Optional[int] = ..., first_token_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., kv_digest: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token: TokenEvent.Token
    complete: TokenEvent.Complete
    error: _common_pb2.Error
    def __init__(self, request_id: _Optional[str] = ..., token: _Optional[_Union[TokenEvent.Token, _Mapping]] = ..., complete: _Optional[_Union[TokenEvent.Complete, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...
