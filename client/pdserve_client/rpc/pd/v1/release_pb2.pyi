from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReleaseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEASE_MODE_UNSPECIFIED: _ClassVar[ReleaseMode]
    RELEASE_MODE_PINNED: _ClassVar[ReleaseMode]
    RELEASE_MODE_SHADOW: _ClassVar[ReleaseMode]
    RELEASE_MODE_CANARY: _ClassVar[ReleaseMode]
    RELEASE_MODE_ACTIVE: _ClassVar[ReleaseMode]
    RELEASE_MODE_ROLLED_BACK: _ClassVar[ReleaseMode]

class RollbackStep(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLBACK_STEP_UNSPECIFIED: _ClassVar[RollbackStep]
    ROLLBACK_STEP_STOP_NEW_ROUTES: _ClassVar[RollbackStep]
    ROLLBACK_STEP_ADVANCE_ROUTE_EPOCH: _ClassVar[RollbackStep]
    ROLLBACK_STEP_DRAIN_OR_ABORT_TRANSFERS: _ClassVar[RollbackStep]
    ROLLBACK_STEP_ENABLE_COLOCATED_FALLBACK: _ClassVar[RollbackStep]
    ROLLBACK_STEP_DISABLE_CONNECTOR: _ClassVar[RollbackStep]
    ROLLBACK_STEP_REVOKE_CAPABILITIES: _ClassVar[RollbackStep]
    ROLLBACK_STEP_RECLAIM_UNPUBLISHED: _ClassVar[RollbackStep]
    ROLLBACK_STEP_ROLLBACK_COMPLETE: _ClassVar[RollbackStep]
RELEASE_MODE_UNSPECIFIED: ReleaseMode
RELEASE_MODE_PINNED: ReleaseMode
RELEASE_MODE_SHADOW: ReleaseMode
RELEASE_MODE_CANARY: ReleaseMode
RELEASE_MODE_ACTIVE: ReleaseMode
RELEASE_MODE_ROLLED_BACK: ReleaseMode
ROLLBACK_STEP_UNSPECIFIED: RollbackStep
ROLLBACK_STEP_STOP_NEW_ROUTES: RollbackStep
ROLLBACK_STEP_ADVANCE_ROUTE_EPOCH: RollbackStep
ROLLBACK_STEP_DRAIN_OR_ABORT_TRANSFERS: RollbackStep
ROLLBACK_STEP_ENABLE_COLOCATED_FALLBACK: RollbackStep
ROLLBACK_STEP_DISABLE_CONNECTOR: RollbackStep
ROLLBACK_STEP_REVOKE_CAPABILITIES: RollbackStep
ROLLBACK_STEP_RECLAIM_UNPUBLISHED: RollbackStep
ROLLBACK_STEP_ROLLBACK_COMPLETE: RollbackStep

class DeploymentManifest(_message.Message):
    __slots__ = ("model", "model_identity", "tokenizer_identity", "cache_abi_digests", "transports", "roles", "route_epoch", "allowed_modes", "fallback_mode", "digest")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    CACHE_ABI_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_MODES_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_MODE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    model: str
    model_identity: _containers.RepeatedScalarFieldContainer[str]
    tokenizer_identity: str
    cache_abi_digests: _containers.RepeatedScalarFieldContainer[str]
    transports: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[str]
    route_epoch: int
    allowed_modes: _containers.RepeatedScalarFieldContainer[str]
    fallback_mode: str
    digest: str
    def __init__(self, model: _Optional[str] = ..., model_identity: _Optional[_Iterable[str]] = ..., tokenizer_identity: _Optional[str] = ..., cache_abi_digests: _Optional[_Iterable[str]] = ..., transports: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[str]] = ..., route_epoch: _Optional[int] = ..., allowed_modes: _Optional[_Iterable[str]] = ..., fallback_mode: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...

class RollbackStepRecord(_message.Message):
    __slots__ = ("step", "started_unix_ms", "ended_unix_ms", "counts", "detail")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    step: RollbackStep
    started_unix_ms: int
    ended_unix_ms: int
    counts: _containers.ScalarMap[str, int]
    detail: str
    def __init__(self, step: _Optional[_Union[RollbackStep, str]] = ..., started_unix_ms: _Optional[int] = ..., ended_unix_ms: _Optional[int] = ..., counts: _Optional[_Mapping[str, int]] = ..., detail: _Optional[str] = ...) -> None: ...

class RollbackRecord(_message.Message):
    __slots__ = ("from_mode", "started_unix_ms", "reason", "by", "steps", "retired_epoch", "owner", "owner_until_unix_ms")
    FROM_MODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RETIRED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    OWNER_UNTIL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    from_mode: ReleaseMode
    started_unix_ms: int
    reason: str
    by: str
    steps: _containers.RepeatedCompositeFieldContainer[RollbackStepRecord]
    retired_epoch: int
    owner: str
    owner_until_unix_ms: int
    def __init__(self, from_mode: _Optional[_Union[ReleaseMode, str]] = ..., started_unix_ms: _Optional[int] = ..., reason: _Optional[str] = ..., by: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[RollbackStepRecord, _Mapping]]] = ..., retired_epoch: _Optional[int] = ..., owner: _Optional[str] = ..., owner_until_unix_ms: _Optional[int] = ...) -> None: ...

class ReleaseTransition(_message.Message):
    __slots__ = ("from_mode", "to_mode", "at_unix_ms", "by", "reason", "gates")
    FROM_MODE_FIELD_NUMBER: _ClassVar[int]
    TO_MODE_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GATES_FIELD_NUMBER: _ClassVar[int]
    from_mode: ReleaseMode
    to_mode: ReleaseMode
    at_unix_ms: int
    by: str
    reason: str
    gates: str
    def __init__(self, from_mode: _Optional[_Union[ReleaseMode, str]] = ..., to_mode: _Optional[_Union[ReleaseMode, str]] = ..., at_unix_ms: _Optional[int] = ..., by: _Optional[str] = ..., reason: _Optional[str] = ..., gates: _Optional[str] = ...) -> None: ...

class ReleaseRecord(_message.Message):
    __slots__ = ("mode", "version", "manifest", "canary_fraction", "history", "rollback")
    MODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    mode: ReleaseMode
    version: int
    manifest: DeploymentManifest
    canary_fraction: float
    history: _containers.RepeatedCompositeFieldContainer[ReleaseTransition]
    rollback: RollbackRecord
    def __init__(self, mode: _Optional[_Union[ReleaseMode, str]] = ..., version: _Optional[int] = ..., manifest: _Optional[_Union[DeploymentManifest, _Mapping]] = ..., canary_fraction: _Optional[float] = ..., history: _Optional[_Iterable[_Union[ReleaseTransition, _Mapping]]] = ..., rollback: _Optional[_Union[RollbackRecord, _Mapping]] = ...) -> None: ...
