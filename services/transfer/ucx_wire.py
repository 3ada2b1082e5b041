"""UCX backend wire format: tags and control messages (version 1, network byte order).

Tags (64 bits) keep the three message streams of a process's UCX worker apart:

    kind (4 bits) | nonce (28 bits) | counter (32 bits)
    CTRL   kind 1, the receiver's nonce, 0     sender -> receiver control messages
    REPLY  kind 2, the sender's nonce, 0       receiver -> sender control messages
    DATA   kind 3, the sender's nonce, n       one payload piece (the sender counts)
    BODY   kind 4, the sender's/receiver's nonce, n   an out-of-line control body

A nonce is random per sender/receiver object, so several of each can share one
process (one UCX worker) and a restarted peer never matches an old tag.

A control message is HEAD | transfer id | JSON body. A body larger than
INLINE_BODY_BYTES travels out of line: HEAD.oob_tag names the BODY tag on which
the body follows (the receiver posts a buffer of exactly body_len for it).

    HELLO    {"address": b64 UCX worker address}   sender -> receiver, first message
    CHUNK    {"serial": n, "key": [layer, start, count], "bytes": n, "checksum": hex,
              "sizes": [the sender's view sizes], "tag": DATA tag of the first piece}
             followed by one tagged message per piece (tag, tag + 1, ...); a batch of small
             chunks is {"serial", "batch": [[layer, start, count, bytes, checksum], ...],
             "sizes": [their total], "tag"}: their bytes, in order, in one message
    COMMIT   encode_commit(TransferCommit)
    ABORT    {"reason": str}
    VISIBLE  {"serials": [n, ...]}              these chunks are in the destination views
             (checksums verified); {"serial": n} from a receiver before 2026-12
    VERDICT  {"published": bool, "reason": str}
    ERROR    {"reason": str, "key": [...] or null}
"""

from __future__ import annotations

import base64
import secrets
import struct

import orjson

from .base import MAX_COMMIT_BODY_BYTES, Chunk, max_body_bytes, short_reason

MAGIC = b"PDUX"
VERSION = 1
HELLO, CHUNK, COMMIT, ABORT, VISIBLE, VERDICT, ERROR, STOP, AUTH = range(1, 10)
KIND_NAMES = {HELLO: "HELLO", CHUNK: "CHUNK", COMMIT: "COMMIT", ABORT: "ABORT",
              VISIBLE: "VISIBLE", VERDICT: "VERDICT", ERROR: "ERROR", STOP: "STOP", AUTH: "AUTH"}
HEAD = struct.Struct("!4sBBHIQQ")  # magic, version, kind, id_len, nonce, body_len, oob_tag
MAX_ID_BYTES = 1024
INLINE_BODY_BYTES = 60 << 10
MESSAGE_BUFFER_BYTES = HEAD.size + MAX_ID_BYTES + INLINE_BODY_BYTES
MAX_BODY_BYTES = MAX_COMMIT_BODY_BYTES
"""Largest control body (a COMMIT's); others are capped at MAX_SMALL_BODY_BYTES."""

CTRL, REPLY, DATA, BODY = 1, 2, 3, 4
NONCE_BITS = 28


class ProtocolError(Exception):
    """A message broke the format; it is dropped (and its transfer failed if known)."""


def new_nonce() -> int:
    return secrets.randbits(NONCE_BITS) or 1


def tag(kind: int, nonce: int, counter: int = 0) -> int:
    return (kind << 60) | ((nonce & ((1 << NONCE_BITS) - 1)) << 32) | (counter & 0xFFFFFFFF)


def encode(kind: int, transfer_id: str, nonce: int, obj: dict | None = None
           ) -> tuple[bytes, bytes]:
    """(head + id + inline body, out-of-line body or b'') — oob_tag filled in by the caller."""
    tid = transfer_id.encode()
    if len(tid) > MAX_ID_BYTES:
        raise ValueError(f"transfer id of {len(tid)} bytes exceeds {MAX_ID_BYTES}")
    body = orjson.dumps(short_reason(obj or {}))
    if len(body) > max_body_bytes(kind in (COMMIT, AUTH)):
        raise ValueError(f"control body of {len(body)} bytes exceeds {max_body_bytes(kind in (COMMIT, AUTH))}")
    inline = len(body) <= INLINE_BODY_BYTES
    head = HEAD.pack(MAGIC, VERSION, kind, len(tid), nonce, len(body), 0)
    return (head + tid + body, b"") if inline else (head + tid, body)


def with_oob_tag(message: bytes, oob_tag: int) -> bytes:
    magic, version, kind, id_len, nonce, body_len, _ = HEAD.unpack_from(message)
    return HEAD.pack(magic, version, kind, id_len, nonce, body_len, oob_tag) + message[HEAD.size:]


def decode_head(buf: memoryview) -> tuple[int, str, int, int, int]:
    """(kind, transfer id, nonce, body_len, oob_tag) of a received message."""
    magic, version, kind, id_len, nonce, body_len, oob = HEAD.unpack_from(buf)
    if magic != MAGIC or version != VERSION or kind not in KIND_NAMES:
        raise ProtocolError(f"bad message head {bytes(magic)!r}/{version}/{kind}")
    if id_len > MAX_ID_BYTES or body_len > max_body_bytes(kind in (COMMIT, AUTH)) or (
            not oob and body_len > INLINE_BODY_BYTES):
        raise ProtocolError(f"message too large: id {id_len}, body {body_len} bytes")
    try:
        tid = bytes(buf[HEAD.size:HEAD.size + id_len]).decode()
    except UnicodeDecodeError:
        raise ProtocolError("transfer id is not utf-8") from None
    return kind, tid, nonce, body_len, oob


def inline_body(buf: memoryview, transfer_id: str, body_len: int) -> bytes:
    start = HEAD.size + len(transfer_id.encode())
    return bytes(buf[start:start + body_len])


def json_body(body: bytes) -> dict:
    try:
        obj = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as e:  # invalid UTF-8 too
        raise ProtocolError(f"body is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"body is {type(obj).__name__}, not an object")
    return obj


def chunk_header(body: dict) -> tuple[int, list[Chunk], list[int], int]:
    """A CHUNK body as (serial, its chunk or its batch's chunks, the sender's view sizes, the
    first data tag); KeyError, TypeError, ValueError or IndexError if malformed."""
    if "batch" in body:
        batch = body["batch"]
        if type(batch) is not list:
            raise ValueError(f"batch is {type(batch).__name__}, not a list")
        chunks = [Chunk.of_row(e) for e in batch]
    else:
        key = body["key"]
        chunks = [Chunk.of_row([*key, body["bytes"], body["checksum"]] if type(key) is list and len(key) == 3
                               else key)]
    return int(body["serial"]), chunks, [int(x) for x in body["sizes"]], int(body["tag"])


def fits_inline(obj: dict) -> bool:
    """Does `obj` travel inline in a control message (with room for its serial, sizes, tag)?"""
    return len(orjson.dumps(obj)) <= INLINE_BODY_BYTES - 4096


def b64(raw: bytes) -> str:
    """urlsafe base64 of a UCX worker address (in an address string and in HELLO)."""
    return base64.urlsafe_b64encode(raw).decode()


def unb64(text: str) -> bytes:
    """Inverse of b64 (binascii.Error, a ValueError, if malformed)."""
    return base64.urlsafe_b64decode(text.encode())


def format_address(nonce: int, host: str, pid: int, worker_address: bytes) -> str:
    """ucx://<nonce hex>@<host>:<pid>/<urlsafe base64 of the UCX worker address>."""
    return f"ucx://{nonce:x}@{host}:{pid}/{b64(worker_address)}"


def parse_address(address: str) -> tuple[int, str, int, bytes]:
    """Inverse of format_address: (nonce, host, pid, worker address); ValueError if malformed."""
    scheme, _, rest = address.partition("://")
    who, _, encoded = rest.partition("/")
    nonce_hex, _, where = who.partition("@")
    host, _, pid = where.rpartition(":")
    try:
        if scheme != "ucx" or not encoded or not host:
            raise ValueError
        return int(nonce_hex, 16), host, int(pid), unb64(encoded)
    except ValueError:
        raise ValueError(f"{address[:80]!r} is not ucx://<nonce>@<host>:<pid>/<worker address>"
                         ) from None
