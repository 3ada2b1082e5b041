"""TCP backend wire format: frame header/body encoding and the COMMIT JSON codec.

Wire format, version 2, network byte order. Every frame is

    FRAME    magic b"PDKV" | version u8 | type u8 | id_len u16 | body_len u64
             transfer id (id_len bytes, utf-8)
             body (body_len bytes):
    CHUNK    CHUNK_HEAD: layer u32 | block_start u32 | block_count u32 | payload_len u64
             | checksum u64 (the sender's chunk checksum, keyed: base.chunk_checksum); then the payload
    COMMIT   JSON TransferCommit (encode_commit)                  sender -> receiver
    ABORT    JSON {"reason": str}                                 sender -> receiver
    VERDICT  JSON {"published": bool, "reason": str}              receiver -> sender
    ERROR    JSON {"reason": str}                                 receiver -> sender
    AUTH     JSON credential (the transfer capability, base64)    sender -> receiver,
             before the transfer's first CHUNK; refused: ERROR, and the transfer failed

Replies. A CHUNK is not acknowledged; a rejected one gets an ERROR, and the
sender raises TransferError for that transfer on its next `send`, at the latest
on `commit`: the receiver handles a connection's frames in order, so every ERROR
for a transfer is on the wire before its VERDICT. Chunks thus stream back to
back with no round trip each; TCP flow control bounds the bytes in flight, and
the receiver reads straight into reserved views, so there is no staging memory
for a credit window (docs/design.md, Contracts) to protect. COMMIT gets VERDICT (or ERROR when the
commit is malformed); ABORT gets nothing.

What the receiver does with each frame is in receiver.py; the sender's
connections and timeouts are in sender.py.
"""

from __future__ import annotations

import struct

import orjson

from runtime.security.seal import SEAL_BYTES

from ..base import (
    CHECKSUM_ALGORITHM,
    MAX_COMMIT_BODY_BYTES,
    MAX_TRACE_HEADER_CHARS,
    MAX_TRACE_HEADERS,
    Chunk,
    ChunkKey,
    TransferCommit,
    max_body_bytes,
    short_reason,
)
from ..common import byte_view  # noqa: F401 - part of this module's names

MAGIC = b"PDKV"
VERSION = 2  # 2: the chunk checksum is keyed (gmac-aes256-64; 1 was xxh3_64)
CHUNK, COMMIT, ABORT, VERDICT, ERROR, AUTH = 1, 2, 3, 4, 5, 6
FRAME = struct.Struct("!4sBBHQ")
CHUNK_HEAD = struct.Struct("!IIIQQ")
# The checksum travels as a u64: must match CHECKSUM_ALGORITHM in base.py (a new
# algorithm is a new VERSION).
assert CHECKSUM_ALGORITHM == "gmac-aes256-64"

MAX_ID_BYTES = 1024
MAX_CONTROL_BODY_BYTES = MAX_COMMIT_BODY_BYTES
"""Largest control body (a COMMIT's); ABORT/VERDICT/ERROR are capped at
MAX_SMALL_BODY_BYTES (`max_body_bytes`)."""


class ProtocolError(Exception):
    """The peer broke the framing; the connection is closed."""


# ---- encoding ----------------------------------------------------------------------


def frame(kind: int, transfer_id: str, body: bytes = b"", body_len: int | None = None) -> bytes:
    """A frame's header and transfer id, followed by `body` (payloads follow separately)."""
    tid = transfer_id.encode()
    if len(tid) > MAX_ID_BYTES:
        raise ValueError(f"transfer id of {len(tid)} bytes exceeds {MAX_ID_BYTES}")
    n = len(body) if body_len is None else body_len
    return FRAME.pack(MAGIC, VERSION, kind, len(tid), n) + tid + body


def chunk_frame(transfer_id: str, key: ChunkKey, payload_len: int, checksum_hex: str) -> bytes:
    """Everything of a CHUNK frame but its payload."""
    if len(checksum_hex) != 16:
        raise ValueError(f"checksum {checksum_hex!r} is not a {CHECKSUM_ALGORITHM} hex digest")
    head = CHUNK_HEAD.pack(key.layer, key.block_start, key.block_count, payload_len,
                           int(checksum_hex, 16))
    return frame(CHUNK, transfer_id, head, CHUNK_HEAD.size + payload_len)


def control_frame(kind: int, transfer_id: str, obj: dict) -> bytes:
    """A frame whose body is JSON; ValueError when the body is over its kind's cap."""
    body = orjson.dumps(short_reason(obj))
    if len(body) > max_body_bytes(kind in (COMMIT, AUTH)):
        raise ValueError(f"control body of {len(body)} bytes exceeds {max_body_bytes(kind == COMMIT)}")
    return frame(kind, transfer_id, body)


def encode_commit(c: TransferCommit) -> dict:
    """TransferCommit as plain JSON types (chunks as [layer, start, count, bytes, checksum])."""
    return dict(transfer_id=c.transfer_id, request_id=c.request_id, generation=c.generation,
                cache_abi_digest=c.cache_abi_digest, kv_digest=c.kv_digest,
                first_token=c.first_token, source_worker_id=c.source_worker_id,
                source_epoch=c.source_epoch, trace=dict(c.trace), seal=c.seal.hex(),
                chunks=[list(ch.row) for ch in c.chunks])


def decode_commit(d: dict, chunks: tuple[Chunk, ...] | None = None) -> TransferCommit:
    """Inverse of encode_commit; ValueError naming the first bad field. `chunks`: its chunk
    list, already decoded by the caller from rows equal to d["chunks"] (a COMMIT carried in
    a packed batch's header lists that batch), so not decoded twice."""
    def get(name, kind):
        v = d.get(name) if isinstance(d, dict) else None
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise ValueError(f"commit field {name!r} is {v!r}, not {kind.__name__}")
        return v

    if chunks is None:
        chunks = tuple(Chunk.of_row(e) for e in get("chunks", list))
    trace = d.get("trace", {})
    if not isinstance(trace, dict) or len(trace) > MAX_TRACE_HEADERS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) + len(v) <= MAX_TRACE_HEADER_CHARS
            for k, v in trace.items()):
        raise ValueError(f"commit field 'trace' is not at most {MAX_TRACE_HEADERS} short string headers")
    seal = d.get("seal", "")
    if not isinstance(seal, str) or len(seal) > 2 * SEAL_BYTES:
        raise ValueError(f"commit field 'seal' is not at most {SEAL_BYTES} bytes as hex")
    try:
        sealed = bytes.fromhex(seal)
    except ValueError:
        raise ValueError("commit field 'seal' is not hex") from None
    return TransferCommit(get("transfer_id", str), get("request_id", str), get("generation", int),
                          get("cache_abi_digest", str), chunks, get("kv_digest", str),
                          get("first_token", int), get("source_worker_id", str),
                          get("source_epoch", int), tuple(trace.items()), sealed)


def commit_for(raw: object, transfer_id: str, chunks: tuple[Chunk, ...] | None = None
               ) -> tuple[TransferCommit | None, str]:
    """A received COMMIT body of transfer `transfer_id`: (it, '') or (None, why it is malformed).
    `chunks`: as for decode_commit."""
    try:
        commit = decode_commit(raw, chunks)
    except ValueError as e:
        return None, f"malformed commit: {e}"
    if commit.transfer_id != transfer_id:
        return None, f"malformed commit: it names transfer {commit.transfer_id}"
    return commit, ""


def json_body(body: bytes) -> dict:
    """A control frame's body as a JSON object; ProtocolError if it is not one."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:  # invalid UTF-8 too
        raise ProtocolError(f"body is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"body is {type(obj).__name__}, not an object")
    return obj




def parse_address(address: str) -> tuple[str, int]:
    """'tcp://host:port' (host may be [v6]) -> (host, port)."""
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not tcp://host:port")
    return host.strip("[]"), int(port)
