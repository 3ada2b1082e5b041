from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransferDirection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSFER_DIRECTION_UNSPECIFIED: _ClassVar[TransferDirection]
    TRANSFER_DIRECTION_PUSH: _ClassVar[TransferDirection]
    TRANSFER_DIRECTION_PULL: _ClassVar[TransferDirection]
TRANSFER_DIRECTION_UNSPECIFIED: TransferDirection
TRANSFER_DIRECTION_PUSH: TransferDirection
TRANSFER_DIRECTION_PULL: TransferDirection

class TransferCapability(_message.Message):
    __slots__ = ("issuer", "tenant", "source_worker_id", "source_epoch", "destination_worker_id", "destination_epoch", "transfer_id", "generation", "route_epoch", "direction", "cache_abi_digest", "regions", "max_bytes", "issued_unix_ms", "expires_unix_ms", "nonce")
    ISSUER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    CACHE_ABI_DIGEST_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ISSUED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    issuer: str
    tenant: str
    source_worker_id: str
    source_epoch: int
    destination_worker_id: str
    destination_epoch: int
    transfer_id: str
    generation: int
    route_epoch: int
    direction: TransferDirection
    cache_abi_digest: str
    regions: _containers.RepeatedScalarFieldContainer[int]
    max_bytes: int
    issued_unix_ms: int
    expires_unix_ms: int
    nonce: bytes
    def __init__(self, issuer: _Optional[str] = ..., tenant: _Optional[str] = ..., source_worker_id: _Optional[str] = ..., source_epoch: _Optional[int] = ..., destination_worker_id: _Optional[str] = ..., destination_epoch: _Optional[int] = ..., transfer_id: _Optional[str] = ..., generation: _Optional[int] = ..., route_epoch: _Optional[int] = ..., direction: _Optional[_Union[TransferDirection, str]] = ..., cache_abi_digest: _Optional[str] = ..., regions: _Optional[_Iterable[int]] = ..., max_bytes: _Optional[int] = ..., issued_unix_ms: _Optional[int] = ..., expires_unix_ms: _Optional[int] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class SignedCapability(_message.Message):
    __slots__ = ("key_id", "body", "signature")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    body: bytes
    signature: bytes
    def __init__(self, key_id: _Optional[str] = ..., body: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...
