from pdserve_client.rpc.pd.v1 import common_pb2 as _common_pb2
from pdserve_client.rpc.pd.v1 import manifest_pb2 as _manifest_pb2
from pdserve_client.rpc.pd.v1 import release_pb2 as _release_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TxnOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TXN_OUTCOME_UNSPECIFIED: _ClassVar[TxnOutcome]
    TXN_OUTCOME_APPLIED: _ClassVar[TxnOutcome]
    TXN_OUTCOME_DUPLICATE: _ClassVar[TxnOutcome]
    TXN_OUTCOME_STALE_GENERATION: _ClassVar[TxnOutcome]
    TXN_OUTCOME_ILLEGAL_TRANSITION: _ClassVar[TxnOutcome]
    TXN_OUTCOME_CHECKSUM_CONFLICT: _ClassVar[TxnOutcome]
    TXN_OUTCOME_NOT_FOUND: _ClassVar[TxnOutcome]
    TXN_OUTCOME_STALE_EPOCH: _ClassVar[TxnOutcome]
    TXN_OUTCOME_ROUTES_STOPPED: _ClassVar[TxnOutcome]

class LeaseStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATUS_UNSPECIFIED: _ClassVar[LeaseStatus]
    LEASE_STATUS_OK: _ClassVar[LeaseStatus]
    LEASE_STATUS_LOST: _ClassVar[LeaseStatus]
TXN_OUTCOME_UNSPECIFIED: TxnOutcome
TXN_OUTCOME_APPLIED: TxnOutcome
TXN_OUTCOME_DUPLICATE: TxnOutcome
TXN_OUTCOME_STALE_GENERATION: TxnOutcome
TXN_OUTCOME_ILLEGAL_TRANSITION: TxnOutcome
TXN_OUTCOME_CHECKSUM_CONFLICT: TxnOutcome
TXN_OUTCOME_NOT_FOUND: TxnOutcome
TXN_OUTCOME_STALE_EPOCH: TxnOutcome
TXN_OUTCOME_ROUTES_STOPPED: TxnOutcome
LEASE_STATUS_UNSPECIFIED: LeaseStatus
LEASE_STATUS_OK: LeaseStatus
LEASE_STATUS_LOST: LeaseStatus

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "role", "grpc_address", "data_plane_address", "cache_abi_digest", "capacity", "profile", "colocated_only_reason", "model_identity", "seal_key")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CACHE_ABI_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    COLOCATED_ONLY_REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SEAL_KEY_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: _common_pb2.WorkerRole
    grpc_address: str
    data_plane_address: str
    cache_abi_digest: str
    capacity: _common_pb2.WorkerCapacity
    profile: _common_pb2.CostProfile
    colocated_only_reason: str
    model_identity: str
    seal_key: bytes
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ..., grpc_address: _Optional[str] = ..., data_plane_address: _Optional[str] = ..., cache_abi_digest: _Optional[str] = ..., capacity: _Optional[_Union[_common_pb2.WorkerCapacity, _Mapping]] = ..., profile: _Optional[_Union[_common_pb2.CostProfile, _Mapping]] = ..., colocated_only_reason: _Optional[str] = ..., model_identity: _Optional[str] = ..., seal_key: _Optional[bytes] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("epoch", "lease_ttl_ms", "route_epoch", "routes_stopped")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUTES_STOPPED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    lease_ttl_ms: int
    route_epoch: int
    routes_stopped: bool
    def __init__(self, epoch: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., route_epoch: _Optional[int] = ..., routes_stopped: _Optional[bool] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "epoch", "load")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    epoch: int
    load: _common_pb2.LoadReport
    def __init__(self, worker_id: _Optional[str] = ..., epoch: _Optional[int] = ..., load: _Optional[_Union[_common_pb2.LoadReport, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("status", "lease_ttl_ms", "route_epoch", "routes_stopped")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUTES_STOPPED_FIELD_NUMBER: _ClassVar[int]
    status: LeaseStatus
    lease_ttl_ms: int
    route_epoch: int
    routes_stopped: bool
    def __init__(self, status: _Optional[_Union[LeaseStatus, str]] = ..., lease_ttl_ms: _Optional[int] = ..., route_epoch: _Optional[int] = ..., routes_stopped: _Optional[bool] = ...) -> None: ...

class DeregisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "epoch")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    epoch: int
    def __init__(self, worker_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class DeregisterWorkerResponse(_message.Message):
    __slots__ = ("deregistered",)
    DEREGISTERED_FIELD_NUMBER: _ClassVar[int]
    deregistered: bool
    def __init__(self, deregistered: _Optional[bool] = ...) -> None: ...

class TxnReserveRequest(_message.Message):
    __slots__ = ("manifest",)
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    manifest: _manifest_pb2.HandoffManifest
    def __init__(self, manifest: _Optional[_Union[_manifest_pb2.HandoffManifest, _Mapping]] = ...) -> None: ...

class TxnTransitionRequest(_message.Message):
    __slots__ = ("request_id", "transfer_id", "generation", "worker_id", "worker_epoch", "reason", "kv_digest", "chunks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    generation: int
    worker_id: str
    worker_epoch: int
    reason: str
    kv_digest: str
    chunks: _containers.RepeatedCompositeFieldContainer[_manifest_pb2.ChunkSpec]
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ..., generation: _Optional[int] = ..., worker_id: _Optional[str] = ..., worker_epoch: _Optional[int] = ..., reason: _Optional[str] = ..., kv_digest: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[_manifest_pb2.ChunkSpec, _Mapping]]] = ...) -> None: ...

class TxnPublishRequest(_message.Message):
    __slots__ = ("request_id", "transfer_id", "generation", "destination_worker_id", "destination_epoch", "kv_digest", "chunks", "source_seal")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SEAL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    generation: int
    destination_worker_id: str
    destination_epoch: int
    kv_digest: str
    chunks: _containers.RepeatedCompositeFieldContainer[_manifest_pb2.ChunkSpec]
    source_seal: bytes
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ..., generation: _Optional[int] = ..., destination_worker_id: _Optional[str] = ..., destination_epoch: _Optional[int] = ..., kv_digest: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[_manifest_pb2.ChunkSpec, _Mapping]]] = ..., source_seal: _Optional[bytes] = ...) -> None: ...

class TxnResponse(_message.Message):
    __slots__ = ("request_id", "transfer_id", "outcome", "state", "current_generation")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_GENERATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    outcome: TxnOutcome
    state: _manifest_pb2.TxnState
    current_generation: int
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ..., outcome: _Optional[_Union[TxnOutcome, str]] = ..., state: _Optional[_Union[_manifest_pb2.TxnState, str]] = ..., current_generation: _Optional[int] = ...) -> None: ...

class TxnLookupRequest(_message.Message):
    __slots__ = ("request_id", "transfer_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ...) -> None: ...

class TxnLookupResponse(_message.Message):
    __slots__ = ("found", "transaction")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    found: bool
    transaction: _manifest_pb2.Transaction
    def __init__(self, found: _Optional[bool] = ..., transaction: _Optional[_Union[_manifest_pb2.Transaction, _Mapping]] = ...) -> None: ...

class ClusterSnapshotRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: _common_pb2.WorkerRole
    def __init__(self, role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ...) -> None: ...

class ClusterSnapshotResponse(_message.Message):
    __slots__ = ("workers", "route_epoch", "snapshot_unix_ms", "release_version", "release_mode", "routes_stopped")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    RELEASE_MODE_FIELD_NUMBER: _ClassVar[int]
    ROUTES_STOPPED_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkerInfo]
    route_epoch: int
    snapshot_unix_ms: int
    release_version: int
    release_mode: _release_pb2.ReleaseMode
    routes_stopped: bool
    def __init__(self, workers: _Optional[_Iterable[_Union[_common_pb2.WorkerInfo, _Mapping]]] = ..., route_epoch: _Optional[int] = ..., snapshot_unix_ms: _Optional[int] = ..., release_version: _Optional[int] = ..., release_mode: _Optional[_Union[_release_pb2.ReleaseMode, str]] = ..., routes_stopped: _Optional[bool] = ...) -> None: ...

class GetRouteEpochRequest(_message.Message):
    __slots__ = ("publications_of",)
    PUBLICATIONS_OF_FIELD_NUMBER: _ClassVar[int]
    publications_of: int
    def __init__(self, publications_of: _Optional[int] = ...) -> None: ...

class AdvanceRouteEpochRequest(_message.Message):
    __slots__ = ("expected_route_epoch", "reason")
    EXPECTED_ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    expected_route_epoch: int
    reason: str
    def __init__(self, expected_route_epoch: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RouteEpochResponse(_message.Message):
    __slots__ = ("route_epoch", "advanced", "publications")
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADVANCED_FIELD_NUMBER: _ClassVar[int]
    PUBLICATIONS_FIELD_NUMBER: _ClassVar[int]
    route_epoch: int
    advanced: bool
    publications: int
    def __init__(self, route_epoch: _Optional[int] = ..., advanced: _Optional[bool] = ..., publications: _Optional[int] = ...) -> None: ...

class ConsumeNonceRequest(_message.Message):
    __slots__ = ("nonce", "expires_unix_ms", "transfer_id", "route_epoch", "capability")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    expires_unix_ms: int
    transfer_id: str
    route_epoch: int
    capability: bytes
    def __init__(self, nonce: _Optional[str] = ..., expires_unix_ms: _Optional[int] = ..., transfer_id: _Optional[str] = ..., route_epoch: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class ConsumeNonceResponse(_message.Message):
    __slots__ = ("consumed", "stale_route_epoch", "not_recorded")
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    STALE_ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NOT_RECORDED_FIELD_NUMBER: _ClassVar[int]
    consumed: bool
    stale_route_epoch: bool
    not_recorded: bool
    def __init__(self, consumed: _Optional[bool] = ..., stale_route_epoch: _Optional[bool] = ..., not_recorded: _Optional[bool] = ...) -> None: ...

class ListOpenTransactionsRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class ListOpenTransactionsResponse(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[_manifest_pb2.Transaction]
    def __init__(self, transactions: _Optional[_Iterable[_Union[_manifest_pb2.Transaction, _Mapping]]] = ...) -> None: ...

class GetReleaseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReleaseResponse(_message.Message):
    __slots__ = ("found", "record")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    found: bool
    record: _release_pb2.ReleaseRecord
    def __init__(self, found: _Optional[bool] = ..., record: _Optional[_Union[_release_pb2.ReleaseRecord, _Mapping]] = ...) -> None: ...

class WriteReleaseRequest(_message.Message):
    __slots__ = ("expected_version", "record")
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    expected_version: int
    record: _release_pb2.ReleaseRecord
    def __init__(self, expected_version: _Optional[int] = ..., record: _Optional[_Union[_release_pb2.ReleaseRecord, _Mapping]] = ...) -> None: ...

class WriteReleaseResponse(_message.Message):
    __slots__ = ("outcome", "current", "message")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    outcome: TxnOutcome
    current: _release_pb2.ReleaseRecord
    message: str
    def __init__(self, outcome: _Optional[_Union[TxnOutcome, str]] = ..., current: _Optional[_Union[_release_pb2.ReleaseRecord, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...
