"""The request bodies of /v1/completions and /v1/chat/completions, and their checks.

Types are strict (a string is not a number, 1 is not true; NaN and infinities are
refused), so a wrong type is a 400 naming the field, never a value silently coerced.
Fields of OpenAI's API that pdserve cannot honour are refused when set to anything but
their neutral value (`n` other than 1, penalties, logit_bias, tools...), so a
client never gets a result that ignored what it asked for. Unknown fields are ignored,
as OpenAI's clients add new ones faster than servers learn them.

pdserve's own options ride in the body beside OpenAI's (`extra_body` in the openai SDK):
`mode`, `slo_ttft_ms`, `slo_tpot_ms`, `priority`, `deadline_ms`, `ignore_eos`, `top_k`,
`tenant` (must be the key's own) and `request_id` (or the x-request-id header).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pdserve_client import contract

from .errors import ApiError, bad_request

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
U64 = (1 << 64) - 1

NonNegative = Annotated[float, Field(ge=0)]


class StreamOptions(BaseModel):
    """`stream_options`: usage in a last chunk of the stream."""

    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class Common(BaseModel):
    """What both endpoints take."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = Field(None, ge=0, le=U64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = None
    presence_penalty: Literal[0] = 0
    frequency_penalty: Literal[0] = 0
    logit_bias: dict[str, Any] | None = None
    # pdserve's own (extra_body)
    ignore_eos: bool = False
    mode: Literal[contract.MODES] | None = None  # type: ignore[valid-type]
    slo_ttft_ms: NonNegative = 0.0
    slo_tpot_ms: NonNegative = 0.0
    priority: int = Field(0, ge=-contract.MAX_PRIORITY, le=contract.MAX_PRIORITY)
    deadline_ms: int = Field(0, ge=0, le=(1 << 32) - 1)
    tenant: str | None = None
    request_id: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, bias: dict[str, Any] | None) -> None:
        if bias:
            raise ValueError("logit_bias is not supported")
        return None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(Common):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=contract.MAX_LOGPROBS)
    """The chosen token's logprob and the top `logprobs` others', per output token."""
    best_of: Literal[1] | None = None
    suffix: None = None
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions

    @property
    def logprobs_asked(self) -> int | None:
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        """The one prompt (a batch of one is taken; more is refused: n=1 per request)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise bad_request(f"prompt: one prompt per request, got a batch of {len(p)}", "prompt")
            p = p[0]
        if not p:
            raise bad_request("prompt is empty", "prompt")
        return p


class TextPart(BaseModel):
    """A content part of a chat message (only text is served)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    type: str
    text: str | None = None


class Message(BaseModel):
    """One chat message; the template decides what its fields mean."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]


class ChatRequest(Common):
    """POST /v1/chat/completions."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=contract.MAX_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, top: int | None, info) -> int | None:
        if top is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return top

    @property
    def logprobs_asked(self) -> int | None:
        """Sampling.logprobs: None (none), 0 (the chosen token's), k (and the top k)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def token_budget(self) -> int | None:
        """max_completion_tokens, or the older max_tokens; None: up to the model's length."""
        return self.max_completion_tokens or self.max_tokens


def parse(model: type[Common], body: bytes) -> Any:
    """`body` validated as `model`; ApiError 400 naming the first bad field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise _first_error(exc) from None


_UNION_BRANCH = re.compile(r"(str|int|float|bool|none|[a-z-]+\[.*\])$")
"""The names pydantic puts in an error's location for a union's branch (`str`, `list[int]`,
`function-after[...]`), which are not fields: a field's name may begin like one (`stream`)."""


def _first_error(exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first['msg']}")
    if first["type"] == "model_type" or not first["loc"]:
        return bad_request("the body must be a JSON object")
    param = ".".join(str(p) for p in first["loc"] if not _UNION_BRANCH.match(str(p)))
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return bad_request(f"{param or 'body'}: {first['msg']}{more}", param or None)
