"""Refusals: the status and message a request the router will not serve ends with, and
how a message may quote the client's input.

A refusal's message travels in the call's trailer. gRPC clients accept 8-16 KiB of
metadata: a message that repeated a 1 MB tenant was dropped at the client, which saw
RESOURCE_EXHAUSTED "received metadata size exceeds hard limit" instead (a retryable
status for a permanent error). So a message quotes client input only through `quote`,
at most QUOTE_CHARS of it with its full length, and `bounded` cuts any message to
MAX_MESSAGE_CHARS before it leaves (docs/design.md, "Refuse early, with the reason").
"""

from __future__ import annotations

import dataclasses

from router.types import RouterError, StatusCode

QUOTE_CHARS = 64
"""Most characters (or bytes) of a client's value a message repeats."""
MAX_MESSAGE_CHARS = 1024
"""Longest refusal message sent; far below what any gRPC client accepts in a trailer."""


def quote(value: str | bytes, limit: int = QUOTE_CHARS) -> str:
    """`value` as a message may show it: its repr, or the repr of its first `limit`
    characters (bytes) and its length when it is longer."""
    if len(value) <= limit:
        return repr(value)
    unit = "bytes" if isinstance(value, bytes | bytearray) else "characters"
    return f"{value[:limit]!r}... ({len(value)} {unit})"


def bounded(message: str) -> str:
    """`message`, cut to MAX_MESSAGE_CHARS (saying so) when longer."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return f"{message[:MAX_MESSAGE_CHARS]}... (message cut from {len(message)} characters)"


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """The status a request ends with, as a value: the intake returns it rather than raising,
    so no traceback keeps the frames that hold the request's bytes (docs/design.md, Failures)."""

    code: StatusCode
    message: str

    @classmethod
    def of(cls, error: RouterError) -> Refusal:
        """The refusal `error` names (its traceback is not kept)."""
        return cls(error.code, error.message)


def too_long(field: str, size: int, limit: int) -> Refusal:
    """INVALID_ARGUMENT for a field of `size` UTF-8 bytes over its `limit`; the value itself is not quoted."""
    return Refusal(StatusCode.INVALID_ARGUMENT, f"{field} is {size} bytes in UTF-8; at most {limit}")
