"""A GenerateRequest's sizes, read from its wire bytes without parsing it.

Parsing a prompt of token ids costs more than its bytes: protobuf holds 4 bytes per
id, and once the ids are Python ints each costs ~40 bytes (an int object and a tuple
slot) against 1-3 on the wire. Everything the intake refuses on size alone (the
request id, the tenant, the prompt's length) is read here instead: the top-level
fields are walked (their payloads skipped by length) and a packed field of ids is
counted, not decoded: every varint ends in the one byte of it below 0x80.

`sizes` reads the encoding every protobuf library writes (ids packed, few top-level
fields). For anything else it answers None and the caller parses the message, which
is always right, only dearer.
"""

from __future__ import annotations

import dataclasses

# Must match proto/pd/v1/router.proto (GenerateRequest) and common.proto (TokenIds).
REQUEST_ID, TENANT, PROMPT_TEXT, PROMPT_TOKEN_IDS = 1, 2, 3, 4
TOKEN_IDS = 1

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
MAX_FIELDS = 64
"""Top-level fields (or unpacked ids) walked before giving the message to the parser:
a GenerateRequest has nine, and a walk in Python must not cost what parsing saves."""
COUNT_CHUNK_BYTES = 1 << 20
"""Packed ids are counted a chunk at a time: the count's own memory stays this small."""
_CONTINUATION_BYTES = bytes(range(0x80, 0x100))


@dataclasses.dataclass(frozen=True, slots=True)
class RequestSizes:
    """What the intake checks before parsing a GenerateRequest."""

    request_id_bytes: int
    tenant_bytes: int
    prompt_tokens: int | None
    """Token ids in the prompt; None for a text prompt (or none)."""


class _NotPlain(ValueError):
    """The bytes are not in the plain encoding (or not a message): the parser decides."""


def sizes(data: bytes) -> RequestSizes | None:
    """The sizes of the GenerateRequest encoded in `data`; None when the parser must read it."""
    try:
        return _sizes(memoryview(data))
    except _NotPlain:
        return None


def _sizes(data: memoryview) -> RequestSizes:
    request_id = tenant = 0
    tokens: int | None = None
    for number, wire_type, value, end in _fields(data, 0, len(data)):
        if number == REQUEST_ID and wire_type == LENGTH_DELIMITED:
            request_id = end - value  # proto3: the last occurrence of a scalar wins
        elif number == TENANT and wire_type == LENGTH_DELIMITED:
            tenant = end - value
        elif number == PROMPT_TEXT and wire_type == LENGTH_DELIMITED:
            tokens = None  # a later member of the oneof replaces an earlier one
        elif number == PROMPT_TOKEN_IDS and wire_type == LENGTH_DELIMITED:
            tokens = (tokens or 0) + _count_ids(data, value, end)  # occurrences of a message merge
    return RequestSizes(request_id, tenant, tokens)


def _count_ids(data: memoryview, start: int, end: int) -> int:
    """Token ids in the TokenIds message data[start:end], packed or not."""
    count = 0
    for number, wire_type, value, field_end in _fields(data, start, end):
        if number == TOKEN_IDS and wire_type == LENGTH_DELIMITED:
            count += _varints(data, value, field_end)
        elif number == TOKEN_IDS and wire_type == VARINT:
            count += 1
    return count


def _varints(data: memoryview, start: int, end: int) -> int:
    """How many varints data[start:end] holds: its bytes that end one (below 0x80)."""
    if end > start and data[end - 1] >= 0x80:
        raise _NotPlain("a packed field ends inside a varint")
    count = 0
    for at in range(start, end, COUNT_CHUNK_BYTES):
        chunk = data[at:min(at + COUNT_CHUNK_BYTES, end)].tobytes()
        count += len(chunk.translate(None, _CONTINUATION_BYTES))
    return count


def _fields(data: memoryview, start: int, end: int):
    """(number, wire type, value, end) of each field in data[start:end]: a varint's value
    (end unused), or a payload's first byte and its end; at most MAX_FIELDS of them."""
    at, seen = start, 0
    while at < end:
        seen += 1
        if seen > MAX_FIELDS:
            raise _NotPlain("more fields than a plain GenerateRequest has")
        key, at = _varint(data, at, end)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value, at = _varint(data, at, end)
            yield number, wire_type, value, at
            continue
        if wire_type == LENGTH_DELIMITED:
            length, at = _varint(data, at, end)
            value, at = at, at + length
        elif wire_type in (FIXED64, FIXED32):
            value, at = at, at + (8 if wire_type == FIXED64 else 4)
        else:
            raise _NotPlain(f"wire type {wire_type}")
        if at > end or number == 0:
            raise _NotPlain("a field runs past its message")
        yield number, wire_type, value, at


def _varint(data: memoryview, at: int, end: int) -> tuple[int, int]:
    """The varint at `at` and the position after it."""
    value = shift = 0
    while at < end and shift < 70:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise _NotPlain("a varint is cut short or longer than 10 bytes")
