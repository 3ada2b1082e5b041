from pdserve_client.rpc.pd.v1 import common_pb2 as _common_pb2
from pdserve_client.rpc.pd.v1 import manifest_pb2 as _manifest_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("manifest", "prompt_token_ids", "destination_data_plane_address", "capability", "sampling", "transfer_key")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_DATA_PLANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_KEY_FIELD_NUMBER: _ClassVar[int]
    manifest: _manifest_pb2.HandoffManifest
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    destination_data_plane_address: str
    capability: bytes
    sampling: _common_pb2.SamplingParams
    transfer_key: bytes
    def __init__(self, manifest: _Optional[_Union[_manifest_pb2.HandoffManifest, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., destination_data_plane_address: _Optional[str] = ..., capability: _Optional[bytes] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., transfer_key: _Optional[bytes] = ...) -> None: ...

class PrefillTimings(_message.Message):
    __slots__ = ("queue_ms", "compute_ms", "transfer_ms", "total_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    compute_ms: float
    transfer_ms: float
    total_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., compute_ms: _Optional[float] = ..., transfer_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class PrefillResult(_message.Message):
    __slots__ = ("request_id", "transfer_id", "computed_tokens", "reused_tokens", "kv_digest", "timings", "sent_bytes", "sent_chunks", "first_token_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SENT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    transfer_id: str
    computed_tokens: int
    reused_tokens: int
    kv_digest: str
    timings: PrefillTimings
    sent_bytes: int
    sent_chunks: int
    first_token_id: int
    def __init__(self, request_id: _Optional[str] = ..., transfer_id: _Optional[str] = ..., computed_tokens: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., kv_digest: _Optional[str] = ..., timings: _Optional[_Union[PrefillTimings, _Mapping]] = ..., sent_bytes: _Optional[int] = ..., sent_chunks: _Optional[int] = ..., first_token_id: _Optional[int] = ...) -> None: ...

class FirstToken(_message.Message):
    __slots__ = ("token_id", "logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprobs: _common_pb2.TokenLogprobs
    def __init__(self, token_id: _Optional[int] = ..., logprobs: _Optional[_Union[_common_pb2.TokenLogprobs, _Mapping]] = ...) -> None: ...

class PrefillEvent(_message.Message):
    __slots__ = ("first_token", "result")
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    first_token: FirstToken
    result: PrefillResult
    def __init__(self, first_token: _Optional[_Union[FirstToken, _Mapping]] = ..., result: _Optional[_Union[PrefillResult, _Mapping]] = ...) -> None: ...
