from pdserve_client.rpc.pd.v1 import blocks_pb2 as _blocks_pb2
from pdserve_client.rpc.pd.v1 import common_pb2 as _common_pb2
from pdserve_client.rpc.pd.v1 import manifest_pb2 as _manifest_pb2
from pdserve_client.rpc.pd.v1 import release_pb2 as _release_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
from pdserve_client.rpc.pd.v1.release_pb2 import DeploymentManifest as DeploymentManifest
from pdserve_client.rpc.pd.v1.release_pb2 import RollbackStepRecord as RollbackStepRecord
from pdserve_client.rpc.pd.v1.release_pb2 import RollbackRecord as RollbackRecord
from pdserve_client.rpc.pd.v1.release_pb2 import ReleaseTransition as ReleaseTransition
from pdserve_client.rpc.pd.v1.release_pb2 import ReleaseRecord as ReleaseRecord
from pdserve_client.rpc.pd.v1.release_pb2 import ReleaseMode as ReleaseMode
from pdserve_client.rpc.pd.v1.release_pb2 import RollbackStep as RollbackStep

DESCRIPTOR: _descriptor.FileDescriptor
RELEASE_MODE_UNSPECIFIED: _release_pb2.ReleaseMode
RELEASE_MODE_PINNED: _release_pb2.ReleaseMode
RELEASE_MODE_SHADOW: _release_pb2.ReleaseMode
RELEASE_MODE_CANARY: _release_pb2.ReleaseMode
RELEASE_MODE_ACTIVE: _release_pb2.ReleaseMode
RELEASE_MODE_ROLLED_BACK: _release_pb2.ReleaseMode
ROLLBACK_STEP_UNSPECIFIED: _release_pb2.RollbackStep
ROLLBACK_STEP_STOP_NEW_ROUTES: _release_pb2.RollbackStep
ROLLBACK_STEP_ADVANCE_ROUTE_EPOCH: _release_pb2.RollbackStep
ROLLBACK_STEP_DRAIN_OR_ABORT_TRANSFERS: _release_pb2.RollbackStep
ROLLBACK_STEP_ENABLE_COLOCATED_FALLBACK: _release_pb2.RollbackStep
ROLLBACK_STEP_DISABLE_CONNECTOR: _release_pb2.RollbackStep
ROLLBACK_STEP_REVOKE_CAPABILITIES: _release_pb2.RollbackStep
ROLLBACK_STEP_RECLAIM_UNPUBLISHED: _release_pb2.RollbackStep
ROLLBACK_STEP_ROLLBACK_COMPLETE: _release_pb2.RollbackStep

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("workers", "free_blocks", "reserved_blocks", "open_transactions", "mode", "canary_fraction", "route_epoch", "total_blocks", "router_mode")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    OPEN_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_MODE_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[_common_pb2.WorkerInfo]
    free_blocks: int
    reserved_blocks: int
    open_transactions: int
    mode: _release_pb2.ReleaseMode
    canary_fraction: float
    route_epoch: int
    total_blocks: int
    router_mode: str
    def __init__(self, workers: _Optional[_Iterable[_Union[_common_pb2.WorkerInfo, _Mapping]]] = ..., free_blocks: _Optional[int] = ..., reserved_blocks: _Optional[int] = ..., open_transactions: _Optional[int] = ..., mode: _Optional[_Union[_release_pb2.ReleaseMode, str]] = ..., canary_fraction: _Optional[float] = ..., route_epoch: _Optional[int] = ..., total_blocks: _Optional[int] = ..., router_mode: _Optional[str] = ...) -> None: ...

class SetModeRequest(_message.Message):
    __slots__ = ("mode", "canary_fraction", "reason")
    MODE_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    mode: _release_pb2.ReleaseMode
    canary_fraction: float
    reason: str
    def __init__(self, mode: _Optional[_Union[_release_pb2.ReleaseMode, str]] = ..., canary_fraction: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class SetModeResponse(_message.Message):
    __slots__ = ("previous_mode", "mode", "route_epoch", "steps")
    PREVIOUS_MODE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    previous_mode: _release_pb2.ReleaseMode
    mode: _release_pb2.ReleaseMode
    route_epoch: int
    steps: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, previous_mode: _Optional[_Union[_release_pb2.ReleaseMode, str]] = ..., mode: _Optional[_Union[_release_pb2.ReleaseMode, str]] = ..., route_epoch: _Optional[int] = ..., steps: _Optional[_Iterable[str]] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("states", "tenant", "limit")
    STATES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_manifest_pb2.TxnState]
    tenant: str
    limit: int
    def __init__(self, states: _Optional[_Iterable[_Union[_manifest_pb2.TxnState, str]]] = ..., tenant: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[_manifest_pb2.Transaction]
    def __init__(self, transactions: _Optional[_Iterable[_Union[_manifest_pb2.Transaction, _Mapping]]] = ...) -> None: ...

class DecisionsRequest(_message.Message):
    __slots__ = ("request_id", "limit")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    limit: int
    def __init__(self, request_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class DecisionRecord(_message.Message):
    __slots__ = ("request_id", "tenant", "mode", "outcome", "prefill_worker_id", "decode_worker_id", "predicted_ttft_ms", "predicted_tpot_ms", "observed_ttft_ms", "observed_tpot_ms", "slo_ttft_ms", "slo_tpot_ms", "shadow_prefill_worker_id", "shadow_decode_worker_id", "shadow_predicted_ttft_ms", "shadow_predicted_tpot_ms", "prompt_tokens", "compute_tokens", "transfer_tokens", "decision_us", "reason", "finished")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    SLO_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    SLO_TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SHADOW_DECODE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SHADOW_PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_PREDICTED_TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECISION_US_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    mode: str
    outcome: str
    prefill_worker_id: str
    decode_worker_id: str
    predicted_ttft_ms: float
    predicted_tpot_ms: float
    observed_ttft_ms: float
    observed_tpot_ms: float
    slo_ttft_ms: float
    slo_tpot_ms: float
    shadow_prefill_worker_id: str
    shadow_decode_worker_id: str
    shadow_predicted_ttft_ms: float
    shadow_predicted_tpot_ms: float
    prompt_tokens: int
    compute_tokens: int
    transfer_tokens: int
    decision_us: float
    reason: str
    finished: bool
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., mode: _Optional[str] = ..., outcome: _Optional[str] = ..., prefill_worker_id: _Optional[str] = ..., decode_worker_id: _Optional[str] = ..., predicted_ttft_ms: _Optional[float] = ..., predicted_tpot_ms: _Optional[float] = ..., observed_ttft_ms: _Optional[float] = ..., observed_tpot_ms: _Optional[float] = ..., slo_ttft_ms: _Optional[float] = ..., slo_tpot_ms: _Optional[float] = ..., shadow_prefill_worker_id: _Optional[str] = ..., shadow_decode_worker_id: _Optional[str] = ..., shadow_predicted_ttft_ms: _Optional[float] = ..., shadow_predicted_tpot_ms: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., compute_tokens: _Optional[int] = ..., transfer_tokens: _Optional[int] = ..., decision_us: _Optional[float] = ..., reason: _Optional[str] = ..., finished: _Optional[bool] = ...) -> None: ...

class DecisionsResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[DecisionRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[DecisionRecord, _Mapping]]] = ...) -> None: ...

class BlocksRequest(_message.Message):
    __slots__ = ("request_id", "worker_id", "orphans_only")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ORPHANS_ONLY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    worker_id: str
    orphans_only: bool
    def __init__(self, request_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., orphans_only: _Optional[bool] = ...) -> None: ...

class BlocksResponse(_message.Message):
    __slots__ = ("workers", "orphan_holdings", "in_flight_requests", "open_transactions")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ORPHAN_HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    OPEN_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[_blocks_pb2.WorkerBlocks]
    orphan_holdings: int
    in_flight_requests: int
    open_transactions: int
    def __init__(self, workers: _Optional[_Iterable[_Union[_blocks_pb2.WorkerBlocks, _Mapping]]] = ..., orphan_holdings: _Optional[int] = ..., in_flight_requests: _Optional[int] = ..., open_transactions: _Optional[int] = ...) -> None: ...

class ReleaseStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseStatusResponse(_message.Message):
    __slots__ = ("record", "router_mode", "routes_stopped", "router_id", "route_epoch", "manifest_drift", "canary")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    ROUTER_MODE_FIELD_NUMBER: _ClassVar[int]
    ROUTES_STOPPED_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DRIFT_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    record: _release_pb2.ReleaseRecord
    router_mode: str
    routes_stopped: bool
    router_id: str
    route_epoch: int
    manifest_drift: str
    canary: CanaryNeeds
    def __init__(self, record: _Optional[_Union[_release_pb2.ReleaseRecord, _Mapping]] = ..., router_mode: _Optional[str] = ..., routes_stopped: _Optional[bool] = ..., router_id: _Optional[str] = ..., route_epoch: _Optional[int] = ..., manifest_drift: _Optional[str] = ..., canary: _Optional[_Union[CanaryNeeds, _Mapping]] = ...) -> None: ...

class CanaryNeeds(_message.Message):
    __slots__ = ("min_samples", "slo_ttft_ms", "slo_tpot_ms")
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SLO_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    SLO_TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    min_samples: int
    slo_ttft_ms: float
    slo_tpot_ms: float
    def __init__(self, min_samples: _Optional[int] = ..., slo_ttft_ms: _Optional[float] = ..., slo_tpot_ms: _Optional[float] = ...) -> None: ...

class GateResult(_message.Message):
    __slots__ = ("name", "passed", "measured", "threshold", "detail")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    passed: bool
    measured: float
    threshold: float
    detail: str
    def __init__(self, name: _Optional[str] = ..., passed: _Optional[bool] = ..., measured: _Optional[float] = ..., threshold: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("target", "canary_fraction", "reason")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    target: _release_pb2.ReleaseMode
    canary_fraction: float
    reason: str
    def __init__(self, target: _Optional[_Union[_release_pb2.ReleaseMode, str]] = ..., canary_fraction: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("reason", "wait")
    REASON_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    wait: bool
    def __init__(self, reason: _Optional[str] = ..., wait: _Optional[bool] = ...) -> None: ...

class ReleaseChange(_message.Message):
    __slots__ = ("previous_mode", "record", "gates")
    PREVIOUS_MODE_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    GATES_FIELD_NUMBER: _ClassVar[int]
    previous_mode: _release_pb2.ReleaseMode
    record: _release_pb2.ReleaseRecord
    gates: _containers.RepeatedCompositeFieldContainer[GateResult]
    def __init__(self, previous_mode: _Optional[_Union[_release_pb2.ReleaseMode, str]] = ..., record: _Optional[_Union[_release_pb2.ReleaseRecord, _Mapping]] = ..., gates: _Optional[_Iterable[_Union[GateResult, _Mapping]]] = ...) -> None: ...
