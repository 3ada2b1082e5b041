from pdserve_client.rpc.pd.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_DISAGGREGATED: _ClassVar[Mode]
    MODE_COLOCATED: _ClassVar[Mode]
    MODE_AUTO: _ClassVar[Mode]
    MODE_SHADOW: _ClassVar[Mode]
    MODE_CANARY: _ClassVar[Mode]

class Route(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTE_UNSPECIFIED: _ClassVar[Route]
    ROUTE_DISAGGREGATED: _ClassVar[Route]
    ROUTE_COLOCATED: _ClassVar[Route]
MODE_UNSPECIFIED: Mode
MODE_DISAGGREGATED: Mode
MODE_COLOCATED: Mode
MODE_AUTO: Mode
MODE_SHADOW: Mode
MODE_CANARY: Mode
ROUTE_UNSPECIFIED: Route
ROUTE_DISAGGREGATED: Route
ROUTE_COLOCATED: Route

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "prompt_text", "prompt_token_ids", "max_tokens", "sampling", "mode", "slo", "deadline_ms", "priority")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    prompt_text: str
    prompt_token_ids: _common_pb2.TokenIds
    max_tokens: int
    sampling: _common_pb2.SamplingParams
    mode: Mode
    slo: _common_pb2.Slo
    deadline_ms: int
    priority: int
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., prompt_text: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[_common_pb2.TokenIds, _Mapping]] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., mode: _Optional[_Union[Mode, str]] = ..., slo: _Optional[_Union[_common_pb2.Slo, _Mapping]] = ..., deadline_ms: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("request_id", "started", "token", "complete", "error")
    class Started(_message.Message):
        __slots__ = ("route", "prefill_worker_id", "decode_worker_id", "generation", "route_epoch")
        ROUTE_FIELD_NUMBER: _ClassVar[int]
        PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
        DECODE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
        GENERATION_FIELD_NUMBER: _ClassVar[int]
        ROUTE_EPOCH_FIELD_NUMBER: _ClassVar[int]
        route: Route
        prefill_worker_id: str
        decode_worker_id: str
        generation: int
        route_epoch: int
        def __init__(self, route: _Optional[_Union[Route, str]] = ..., prefill_worker_id: _Optional[str] = ..., decode_worker_id: _Optional[str] = ..., generation: _Optional[int] = ..., route_epoch: _Optional[int] = ...) -> None: ...
    class Token(_message.Message):
        __slots__ = ("token_id", "text", "index", "time_since_start_ms", "logprobs")
        TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
        TEXT_FIELD_NUMBER: _ClassVar[int]
        INDEX_FIELD_NUMBER: _ClassVar[int]
        TIME_SINCE_START_MS_FIELD_NUMBER: _ClassVar[int]
        LOGPROBS_FIELD_NUMBER: _ClassVar[int]
        token_id: int
        text: str
        index: int
        time_since_start_ms: float
        logprobs: _common_pb2.TokenLogprobs
        def __init__(self, token_id: _Optional[int] = ..., text: _Optional[str] = ..., index: _Optional[int] = ..., time_since_start_ms: _Optional[float] = ..., logprobs: _Optional[_Union[_common_pb2.TokenLogprobs, _Mapping]] = ...) -> None: ...
    class Complete(_message.Message):
        __slots__ = ("finish_reason", "ttft_ms", "tpot_ms", "num_tokens", "route", "attempts", "prefill_kv_digest", "decode_kv_digest", "failed_attempts", "text_tail")
        FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
        TTFT_MS_FIELD_NUMBER: _ClassVar[int]
        TPOT_MS_FIELD_NUMBER: _ClassVar[int]
        NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
        ROUTE_FIELD_NUMBER: _ClassVar[int]
        ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
        PREFILL_KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
        DECODE_KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
        FAILED_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
        TEXT_TAIL_FIELD_NUMBER: _ClassVar[int]
        finish_reason: _common_pb2.FinishReason
        ttft_ms: float
        tpot_ms: float
        num_tokens: int
        route: Route
        attempts: int
        prefill_kv_digest: str
        decode_kv_digest: str
        failed_attempts: str
        text_tail: str
        def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., num_tokens: _Optional[int] = ..., route: _Optional[_Union[Route, str]] = ..., attempts: _Optional[int] = ..., prefill_kv_digest: _Optional[str] = ..., decode_kv_digest: _Optional[str] = ..., failed_attempts: _Optional[str] = ..., text_tail: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    started: GenerateEvent.Started
    token: GenerateEvent.Token
    complete: GenerateEvent.Complete
    error: _common_pb2.Error
    def __init__(self, request_id: _Optional[str] = ..., started: _Optional[_Union[GenerateEvent.Started, _Mapping]] = ..., token: _Optional[_Union[GenerateEvent.Token, _Mapping]] = ..., complete: _Optional[_Union[GenerateEvent.Complete, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...
