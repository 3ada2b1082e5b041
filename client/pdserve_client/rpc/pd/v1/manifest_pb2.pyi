from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TxnState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TXN_STATE_UNSPECIFIED: _ClassVar[TxnState]
    TXN_STATE_RESERVED: _ClassVar[TxnState]
    TXN_STATE_TRANSFERRING: _ClassVar[TxnState]
    TXN_STATE_VALIDATED: _ClassVar[TxnState]
    TXN_STATE_PUBLISHED: _ClassVar[TxnState]
    TXN_STATE_ABORTED: _ClassVar[TxnState]
    TXN_STATE_RELEASED: _ClassVar[TxnState]
TXN_STATE_UNSPECIFIED: TxnState
TXN_STATE_RESERVED: TxnState
TXN_STATE_TRANSFERRING: TxnState
TXN_STATE_VALIDATED: TxnState
TXN_STATE_PUBLISHED: TxnState
TXN_STATE_ABORTED: TxnState
TXN_STATE_RELEASED: TxnState

class TokenInterval(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class ChunkSpec(_message.Message):
    __slots__ = ("layer", "block_start", "block_count", "num_bytes", "checksum")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_START_FIELD_NUMBER: _ClassVar[int]
    BLOCK_COUNT_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    layer: int
    block_start: int
    block_count: int
    num_bytes: int
    checksum: str
    def __init__(self, layer: _Optional[int] = ..., block_start: _Optional[int] = ..., block_count: _Optional[int] = ..., num_bytes: _Optional[int] = ..., checksum: _Optional[str] = ...) -> None: ...

class HandoffManifest(_message.Message):
    __slots__ = ("request_id", "tenant", "generation", "attempt", "prompt_digest", "token_interval", "cache_abi_digest", "block_size", "expected_chunks", "source_worker_id", "source_epoch", "destination_worker_id", "destination_epoch", "transfer_id", "reservation_id", "route_epoch", "checksum_algorithm", "destination_block_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TOKEN_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_ABI_DIGEST_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    generation: int
    attempt: int
    prompt_digest: str
    token_interval: TokenInterval
    cache_abi_digest: str
    block_size: int
    expected_chunks: _containers.RepeatedCompositeFieldContainer[ChunkSpec]
    source_worker_id: str
    source_epoch: int
    destination_worker_id: str
    destination_epoch: int
    transfer_id: str
    reservation_id: str
    route_epoch: int
    checksum_algorithm: str
    destination_block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., generation: _Optional[int] = ..., attempt: _Optional[int] = ..., prompt_digest: _Optional[str] = ..., token_interval: _Optional[_Union[TokenInterval, _Mapping]] = ..., cache_abi_digest: _Optional[str] = ..., block_size: _Optional[int] = ..., expected_chunks: _Optional[_Iterable[_Union[ChunkSpec, _Mapping]]] = ..., source_worker_id: _Optional[str] = ..., source_epoch: _Optional[int] = ..., destination_worker_id: _Optional[str] = ..., destination_epoch: _Optional[int] = ..., transfer_id: _Optional[str] = ..., reservation_id: _Optional[str] = ..., route_epoch: _Optional[int] = ..., checksum_algorithm: _Optional[str] = ..., destination_block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("request_id", "transfer_id", "tenant", "generation", "attempt", "state", "source_worker_id", "source_epoch", "destination_worker_id", "destination_epoch", "reservation_id", "chunks_expected", "kv_digest", "abort_reason", "created_unix_ms", "updated_unix_ms", "manifest")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ABORT_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    tenant: str
    generation: int
    attempt: int
    state: TxnState
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
    manifest: HandoffManifest
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ..., tenant: _Optional[str] = ..., generation: _Optional[int] = ..., attempt: _Optional[int] = ..., state: _Optional[_Union[TxnState, str]] = ..., source_worker_id: _Optional[str] = ..., source_epoch: _Optional[int] = ..., destination_worker_id: _Optional[str] = ..., destination_epoch: _Optional[int] = ..., reservation_id: _Optional[str] = ..., chunks_expected: _Optional[int] = ..., kv_digest: _Optional[str] = ..., abort_reason: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., updated_unix_ms: _Optional[int] = ..., manifest: _Optional[_Union[HandoffManifest, _Mapping]] = ...) -> None: ...
