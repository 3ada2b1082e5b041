"""The JSON a client gets: whole answers, stream chunks and usage, in OpenAI's shapes.

Completions give `choices[0].text` (object `text_completion`); chat gives
`choices[0].message` or, streamed, `choices[0].delta` (objects `chat.completion` and
`chat.completion.chunk`). Streams are Server-Sent Events: `data: <json>\\n\\n`, ended
by `data: [DONE]\\n\\n`.
"""

from __future__ import annotations

import dataclasses
import time

import orjson

DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    """One Server-Sent Event carrying `obj`."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclasses.dataclass(slots=True)
class Shape:
    """The envelope of one request's answers: its id, model and endpoint."""

    chat: bool
    id: str
    model: str
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    include_usage: bool = False
    """stream_options.include_usage: every chunk has `usage` (null) and a last one has it."""

    @classmethod
    def of(cls, chat: bool, request_id: str, model: str, include_usage: bool = False) -> Shape:
        return cls(chat, ("chatcmpl-" if chat else "cmpl-") + request_id, model, include_usage=include_usage)

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def chunk(self, text: str, finish_reason: str | None = None, first: bool = False,
              logprobs: dict | None = None) -> bytes:
        """A stream chunk adding `text` (the chat's first one also names the role) and the
        `logprobs` of the tokens it covers (router/http/logprobs.py)."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            out = self._envelope("chat.completion.chunk", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
            out = self._envelope("text_completion", [choice])
        if self.include_usage:
            out["usage"] = None
        return sse(out)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The last chunk of a stream with include_usage: no choices, the usage."""
        out = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        out["usage"] = usage(prompt_tokens, completion_tokens)
        return sse(out)

    def whole(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int,
              logprobs: dict | None = None) -> bytes:
        """The answer of a request that did not stream."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": finish_reason}
            out = self._envelope("chat.completion", [choice])
        else:
            out = self._envelope("text_completion", [{"index": 0, "text": text, "logprobs": logprobs,
                                                      "finish_reason": finish_reason}])
        out["usage"] = usage(prompt_tokens, completion_tokens)
        return orjson.dumps(out)
