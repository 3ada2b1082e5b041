from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BlockHoldState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BLOCK_HOLD_STATE_UNSPECIFIED: _ClassVar[BlockHoldState]
    BLOCK_HOLD_STATE_PREFILLING: _ClassVar[BlockHoldState]
    BLOCK_HOLD_STATE_SENDING: _ClassVar[BlockHoldState]
    BLOCK_HOLD_STATE_RESERVED: _ClassVar[BlockHoldState]
    BLOCK_HOLD_STATE_RECEIVING: _ClassVar[BlockHoldState]
    BLOCK_HOLD_STATE_PUBLISHED: _ClassVar[BlockHoldState]
    BLOCK_HOLD_STATE_DECODING: _ClassVar[BlockHoldState]
    BLOCK_HOLD_STATE_UNOWNED: _ClassVar[BlockHoldState]
BLOCK_HOLD_STATE_UNSPECIFIED: BlockHoldState
BLOCK_HOLD_STATE_PREFILLING: BlockHoldState
BLOCK_HOLD_STATE_SENDING: BlockHoldState
BLOCK_HOLD_STATE_RESERVED: BlockHoldState
BLOCK_HOLD_STATE_RECEIVING: BlockHoldState
BLOCK_HOLD_STATE_PUBLISHED: BlockHoldState
BLOCK_HOLD_STATE_DECODING: BlockHoldState
BLOCK_HOLD_STATE_UNOWNED: BlockHoldState

class BlockRange(_message.Message):
    __slots__ = ("start", "count")
    START_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    start: int
    count: int
    def __init__(self, start: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class BlockHolding(_message.Message):
    __slots__ = ("request_id", "tenant", "transfer_id", "generation", "state", "age_s", "num_blocks", "charged_blocks", "ranges", "orphan", "orphan_reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CHARGED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    transfer_id: str
    generation: int
    state: BlockHoldState
    age_s: float
    num_blocks: int
    charged_blocks: int
    ranges: _containers.RepeatedCompositeFieldContainer[BlockRange]
    orphan: bool
    orphan_reason: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., transfer_id: _Optional[str] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[BlockHoldState, str]] = ..., age_s: _Optional[float] = ..., num_blocks: _Optional[int] = ..., charged_blocks: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[BlockRange, _Mapping]]] = ..., orphan: _Optional[bool] = ..., orphan_reason: _Optional[str] = ...) -> None: ...

class WorkerBlocksRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class WorkerBlocks(_message.Message):
    __slots__ = ("worker_id", "epoch", "total_blocks", "free_blocks", "cached_prefix_blocks", "reserved_blocks", "active_blocks", "holdings", "orphan_blocks", "error", "role")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PREFIX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    epoch: int
    total_blocks: int
    free_blocks: int
    cached_prefix_blocks: int
    reserved_blocks: int
    active_blocks: int
    holdings: _containers.RepeatedCompositeFieldContainer[BlockHolding]
    orphan_blocks: int
    error: str
    role: str
    def __init__(self, worker_id: _Optional[str] = ..., epoch: _Optional[int] = ..., total_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., cached_prefix_blocks: _Optional[int] = ..., reserved_blocks: _Optional[int] = ..., active_blocks: _Optional[int] = ..., holdings: _Optional[_Iterable[_Union[BlockHolding, _Mapping]]] = ..., orphan_blocks: _Optional[int] = ..., error: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...
