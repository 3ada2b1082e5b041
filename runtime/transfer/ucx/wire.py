"""UCX backend wire format: tags and control messages (version 2, network byte order).

Tags (64 bits) keep a process's UCX message streams apart:

    kind (4 bits) | 28 bits | counter (32 bits)
    CTRL   kind 1, the receiver's mailbox nonce, 0     sender -> receiver control messages
    REPLY  kind 2, the sender's mailbox nonce, 0       receiver -> sender control messages
    DATA   kind 3, the transfer's tag bits, n          one payload piece (the sender counts)
    BODY   kind 4, the transfer's tag bits, n          an out-of-line control body

A mailbox nonce only routes: it is in the receiver's address (the directory lists it) and
in the sender's AUTH, and proves nothing. A transfer's tag bits come from its secret
(keys.TransferKey.tag_bits), so nobody without the secret can name a receive posted for
the transfer; the sender starts each transfer's counter at a random value.

A control message is HEAD | transfer id | [body digest] | inline body, authenticated:

    HEAD   magic "PDUX", version 2, kind, id length, sender (u32), seq (u64), body length
           (u64), out-of-line tag (u64), MAC (16 bytes)
    sender the sending object's mailbox nonce: which of the key's holders speaks (a
           receiver takes a transfer's chunks from the one its AUTH admitted, and replies
           to it)
    MAC    the transfer key's (keys.TransferKey.mac) over HEAD without its MAC, the transfer
           id, and the inline body or, for a body out of line, its BLAKE2b-256 digest;
           personalised by direction (to the receiver, to the sender)
    seq    the sending object's message counter, started at the clock (ns) when the object
           was made: per transfer, each side accepts only a seq larger than the last it
           accepted (a replayed message is dropped)

A body larger than INLINE_BODY_BYTES travels out of line, on the BODY tag its HEAD names;
its digest comes inline, so the HEAD is checked before any byte of the body is taken.

    AUTH     {credential..., "reply": {"address": b64 worker address}, "confirm": bool}
             sender -> receiver, each transfer's first message: the capability (none with
             security off) and where replies go (that worker, the head's sender mailbox)
    CHUNK    {"serial": n, "key": [layer, start, count], "bytes": n, "checksum": hex,
              "sizes": [the sender's view sizes], "tag": DATA tag of the first piece}
             followed by one tagged message per piece (tag, tag + 1, ...); a batch of small
             chunks is {"serial", "batch": [[layer, start, count, bytes, checksum], ...],
             "sizes": [their total], "tag"}: their bytes, in order, in one message
    COMMIT   encode_commit(TransferCommit)
    ABORT    {"reason": str}
    ADMITTED {}                             the AUTH was accepted (sent when it asked to confirm)
    VISIBLE  {"serials": [n, ...]}          these chunks are in the destination views
    VERDICT  {"published": bool, "reason": str}
    ERROR    {"reason": str, "key": [...] or null}
    STOP     a mailbox's message to itself while it stops (no key: honoured only then)
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from ..base import MAX_COMMIT_BODY_BYTES, Chunk, max_body_bytes, short_reason
from ..keys import MAC_BYTES, TransferKey

MAGIC = b"PDUX"
VERSION = 2
# HELLO (1) was version 1's, unauthenticated: its number is not reused.
CHUNK, COMMIT, ABORT, VISIBLE, VERDICT, ERROR, STOP, AUTH, ADMITTED = range(2, 11)
KIND_NAMES = {CHUNK: "CHUNK", COMMIT: "COMMIT", ABORT: "ABORT", VISIBLE: "VISIBLE", VERDICT: "VERDICT",
              ERROR: "ERROR", STOP: "STOP", AUTH: "AUTH", ADMITTED: "ADMITTED"}
HEAD = struct.Struct("!4sBBHIQQQ16s")  # magic, version, kind, id_len, sender, seq, body_len, oob_tag, mac
SIGNED_HEAD_BYTES = HEAD.size - MAC_BYTES
DIGEST_BYTES = 32
MAX_ID_BYTES = 1024
INLINE_BODY_BYTES = 60 << 10
MESSAGE_BUFFER_BYTES = HEAD.size + MAX_ID_BYTES + DIGEST_BYTES + INLINE_BODY_BYTES
MAX_BODY_BYTES = MAX_COMMIT_BODY_BYTES
"""Largest control body (a COMMIT's); others are capped at MAX_SMALL_BODY_BYTES."""

CTRL, REPLY, DATA, BODY = 1, 2, 3, 4
NONCE_BITS = 28
COUNTER_SPAN = 1 << 32


class ProtocolError(Exception):
    """A message broke the format; it is dropped (and counted)."""


def new_nonce() -> int:
    return secrets.randbits(NONCE_BITS) or 1


def tag(kind: int, bits: int, counter: int = 0) -> int:
    return (kind << 60) | ((bits & ((1 << NONCE_BITS) - 1)) << 32) | (counter & 0xFFFFFFFF)


def tag_parts(t: int) -> tuple[int, int, int]:
    """(kind, 28 bits, counter) of a tag."""
    return t >> 60, (t >> 32) & ((1 << NONCE_BITS) - 1), t & 0xFFFFFFFF


def body_digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest()


def encode(kind: int, transfer_id: str, sender: int, seq: int, obj: dict | None, key: TransferKey,
           direction: bytes, body_tag: Callable[[], int] | None = None) -> tuple[bytes, bytes, int]:
    """(the message, its out-of-line body or b'', that body's tag or 0). A body too large to
    go inline goes out of line on the tag `body_tag()` gives (ValueError without it)."""
    tid = transfer_id.encode()
    if len(tid) > MAX_ID_BYTES:
        raise ValueError(f"transfer id of {len(tid)} bytes exceeds {MAX_ID_BYTES}")
    body = orjson.dumps(short_reason(obj or {}))
    cap = max_body_bytes(kind in (COMMIT, AUTH))
    if len(body) > cap:
        raise ValueError(f"control body of {len(body)} bytes exceeds {cap}")
    inline = len(body) <= INLINE_BODY_BYTES
    if not inline and body_tag is None:
        raise ValueError(f"a {KIND_NAMES.get(kind)} body of {len(body)} bytes needs an out-of-line tag")
    oob = 0 if inline else body_tag()
    tail = body if inline else body_digest(body)
    signed = HEAD.pack(MAGIC, VERSION, kind, len(tid), sender, seq, len(body), oob,
                       bytes(MAC_BYTES))[:SIGNED_HEAD_BYTES]
    mac = key.mac(direction, signed, tid, tail)
    return signed + mac + tid + tail, b"" if inline else body, oob


def encode_stop() -> bytes:
    return HEAD.pack(MAGIC, VERSION, STOP, 0, 0, 0, 0, 0, bytes(MAC_BYTES))


@dataclass(slots=True)
class Received:
    """A control message as it came, before anything of it is trusted."""

    kind: int
    transfer_id: str
    sender: int
    seq: int
    body_len: int
    oob_tag: int
    mac: bytes
    signed: bytes
    """What the MAC covers, less the transfer id: HEAD without its MAC, then the inline body
    or the out-of-line body's digest after the id (`tail`)."""
    tail: bytes

    def verify(self, key: TransferKey, direction: bytes) -> bool:
        return key.verify(self.mac, direction, self.signed, self.transfer_id.encode(), self.tail)

    def check(self, key: TransferKey, direction: bytes, last_seq: int) -> str:
        """'' if this message holds under `key` in `direction` and comes after `last_seq`
        (the caller then takes its seq), else why not: bad_mac, replay."""
        if not self.verify(key, direction):
            return "bad_mac"
        return "replay" if self.seq <= last_seq else ""

    def body(self) -> dict:
        """The inline body as a JSON object (ProtocolError if it is not one)."""
        return json_body(self.tail)

    def body_matches(self, body: bytes) -> bool:
        """Is `body` the out-of-line body this (verified) head announced?"""
        return len(body) == self.body_len and body_digest(body) == self.tail


def decode(buf: memoryview) -> Received:
    """A received message's parts (ProtocolError if it breaks the format)."""
    if buf.nbytes < HEAD.size:
        raise ProtocolError(f"message of {buf.nbytes} bytes is shorter than a head")
    magic, version, kind, id_len, sender, seq, body_len, oob, mac = HEAD.unpack_from(buf)
    if magic != MAGIC or version != VERSION or kind not in KIND_NAMES:
        raise ProtocolError(f"bad message head {bytes(magic)!r}/{version}/{kind}")
    if id_len > MAX_ID_BYTES or body_len > max_body_bytes(kind in (COMMIT, AUTH)) or (
            not oob and body_len > INLINE_BODY_BYTES) or (oob and body_len <= INLINE_BODY_BYTES):
        raise ProtocolError(f"message sizes out of bounds: id {id_len}, body {body_len} bytes")
    if oob and tag_parts(oob)[0] != BODY:
        raise ProtocolError(f"out-of-line tag {oob:#x} is not a BODY tag")
    end_id = HEAD.size + id_len
    tail_len = DIGEST_BYTES if oob else body_len
    if buf.nbytes < end_id + tail_len:
        raise ProtocolError("message shorter than its head says")
    try:
        tid = bytes(buf[HEAD.size:end_id]).decode()
    except UnicodeDecodeError:
        raise ProtocolError("transfer id is not utf-8") from None
    return Received(kind, tid, sender, seq, body_len, oob, bytes(mac), bytes(buf[:SIGNED_HEAD_BYTES]),
                    bytes(buf[end_id:end_id + tail_len]))


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
    """urlsafe base64 of a UCX worker address (in an address string and in AUTH)."""
    return base64.urlsafe_b64encode(raw).decode()


def unb64(text: str) -> bytes:
    """Inverse of b64 (binascii.Error, a ValueError, if malformed)."""
    return base64.urlsafe_b64decode(text.encode())


ADDRESS_MARK = f"w{VERSION}."
"""Before the nonce in an address: the wire version the receiver speaks. A sender of another
version refuses the address at once (a version-1 sender cannot parse it; this one names a
version-1 receiver's address for what it is), instead of timing out on messages dropped."""


def format_address(nonce: int, host: str, pid: int, worker_address: bytes) -> str:
    """ucx://w2.<nonce hex>@<host>:<pid>/<urlsafe base64 of the UCX worker address>."""
    return f"ucx://{ADDRESS_MARK}{nonce:x}@{host}:{pid}/{b64(worker_address)}"


def parse_address(address: str) -> tuple[int, str, int, bytes]:
    """Inverse of format_address: (nonce, host, pid, worker address); ValueError if malformed
    or another wire version's."""
    scheme, _, rest = address.partition("://")
    who, _, encoded = rest.partition("/")
    nonce_hex, _, where = who.partition("@")
    host, _, pid = where.rpartition(":")
    if scheme == "ucx" and "." not in nonce_hex and all(c in "0123456789abcdef" for c in nonce_hex):
        raise ValueError(f"{address[:40]!r} is a UCX wire-1 receiver's (an older pdserve): it cannot tell this "
                         f"sender from anybody; upgrade prefill and decode workers together")
    try:
        if scheme != "ucx" or not encoded or not host or not nonce_hex.startswith(ADDRESS_MARK):
            raise ValueError
        return int(nonce_hex.removeprefix(ADDRESS_MARK), 16), host, int(pid), unb64(encoded)
    except ValueError:
        raise ValueError(f"{address[:80]!r} is not ucx://{ADDRESS_MARK}<nonce>@<host>:<pid>/<worker address>"
                         ) from None


def peer_name(address: str) -> str:
    """How logs name the peer at a UCX address: host:pid, no nonce and no worker address."""
    try:
        _, host, pid, _ = parse_address(address)
    except ValueError:
        return "<bad ucx address>"
    return f"{host}:{pid}"
