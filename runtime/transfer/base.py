"""Data-plane interface: move a transfer's K/V chunks from a sender to a receiver.

Roles (one ABC each):
  KVSender   — prefill side: `send` chunks from cache views, then `commit`
               (or `abort`). `commit` returns the receiver's verdict.
  KVReceiver — decode side: `expect` a transfer (how to resolve each chunk to
               destination views, and whom to tell), receive bytes straight
               into those views, report events, answer the commit.

Push model: the sender writes into the receiver's reserved blocks. A pull
backend would add `KVSource.serve(transfer_id, resolve)` on the prefill side and
`KVReceiver.fetch(...)` on the decode side; chunk identity, checksums and the
commit/verdict step stay as they are.

A chunk's bytes are the K bytes of its blocks in logical order, then the V
bytes; each side turns a chunk into a list of views of its own cache memory
(runs of consecutive physical blocks), so chunk bytes never need one buffer.

Failure semantics: a transfer ends exactly once, in `Committed` (verdict
given) or `Failed` (abort frame, peer gone, bad frame, checksum mismatch,
timeout). After `Failed` or `forget`, the receiver writes no more bytes for the
transfer and holds no reference to its views.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import xxhash

from .keys import TransferKey

log = logging.getLogger(__name__)

CHECKSUM_ALGORITHM = "gmac-aes256-64"
"""A chunk's checksum (HandoffManifest.checksum_algorithm): keyed by the transfer's secret
(`keys.TransferKey.checksum`), 64 bits, 16 hex digits. `checksum` below (xxh3_64, unkeyed)
is the benchmarks' floors' and the tests' plain hash, never a chunk's."""

MAX_COMMIT_BODY_BYTES = 8 << 20
"""Largest COMMIT body on any data plane (the same cap as a control-plane message).
A commit lists every chunk (~60 bytes each): 8 MiB is ~140,000 chunks, far above a
1M-token prompt on 80 layers in 64-block chunks (~80,000)."""
MAX_SMALL_BODY_BYTES = 64 << 10
"""Largest ABORT / VERDICT / ERROR body (a reason string) and a CHUNK header's."""


def max_body_bytes(is_commit: bool) -> int:
    """The cap of a control body: a commit's, or a small message's."""
    return MAX_COMMIT_BODY_BYTES if is_commit else MAX_SMALL_BODY_BYTES


def short_reason(obj: dict, limit: int = 4096) -> dict:
    """`obj` with its "reason" cut to `limit` characters (a reason may quote a peer's input)."""
    reason = obj.get("reason")
    if isinstance(reason, str) and len(reason) > limit:
        return {**obj, "reason": reason[:limit] + f"... ({len(reason) - limit} more characters)"}
    return obj


def checksum(buffers: Sequence[memoryview]) -> str:
    """xxh3_64 of the concatenation of `buffers` (hex), without concatenating: a plain hash,
    not a chunk's checksum (`chunk_checksum`)."""
    h = xxhash.xxh3_64()
    for b in buffers:
        h.update(b)
    return h.hexdigest()


def chunk_checksum(key: TransferKey, chunk_key: ChunkKey, buffers: Sequence[memoryview]) -> str:
    """A chunk's checksum (CHECKSUM_ALGORITHM): its bytes keyed by the transfer's key, so that
    only a holder of the secret can make one (docs/design.md, Security)."""
    return key.checksum(chunk_key, buffers)


class ChunkKey(NamedTuple):
    """Layer `layer`, logical blocks [block_start, block_start + block_count) of the prompt.

    A named tuple, not a dataclass: a transfer hashes and compares its keys ~5 times per chunk
    on each side (claimed, received, manifest checks), and a frozen dataclass's __hash__ and
    __eq__ are Python functions (69 of a 1 MiB batch's 343 µs on the receiver)."""

    layer: int
    block_start: int
    block_count: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """One unit of transfer, as listed in the manifest."""

    key: ChunkKey
    num_bytes: int
    checksum: str

    @property
    def row(self) -> tuple[int, int, int, int, str]:
        """(layer, block_start, block_count, num_bytes, checksum): the chunk as a COMMIT, a
        packed batch's header and the directory's evidence list it."""
        return (*self.key, self.num_bytes, self.checksum)

    @staticmethod
    def of_row(e: object) -> Chunk:
        """Inverse of `row` for a received [layer, start, count, bytes, checksum] (a COMMIT's
        entry, a packed batch's); ValueError unless it is exactly that: JSON ints and a string,
        no bool, float or number as text."""
        if type(e) is not list or len(e) != 5 or type(e[4]) is not str or not (
                type(e[0]) is type(e[1]) is type(e[2]) is type(e[3]) is int):
            raise ValueError(f"chunk entry {e!r} is not [layer, start, count, bytes, checksum]")
        return Chunk(ChunkKey(e[0], e[1], e[2]), e[3], e[4])


@dataclass(frozen=True, slots=True)
class TransferCommit:
    """Sent after the last chunk: what the receiver must validate before publishing."""

    transfer_id: str
    request_id: str
    generation: int
    cache_abi_digest: str
    chunks: tuple[Chunk, ...]
    kv_digest: str
    """Digest of the whole prompt K/V at the source (engine.kv_digest)."""
    first_token: int
    """Token sampled by prefill from the last prompt position; TOKEN_FOLLOWS in a commit
    sent before it was sampled (then a second COMMIT brings it, and only it)."""
    source_worker_id: str = ""
    source_epoch: int = 0
    trace: tuple[tuple[str, str], ...] = ()
    """The sender's trace context as W3C headers (traceparent, baggage): the data plane is
    not gRPC, so the receiver's validate/publish spans join the request's trace through
    this (runtime/telemetry/tracing.py). Empty while tracing is off."""
    seal: bytes = b""
    """The source's seal over its declaration of `kv_digest` and `chunks`
    (runtime/security/seal.py): the destination relays it with its Publish, and the
    directory opens it against what the destination holds. Empty in a token-only COMMIT
    and from a source that declared with Begin."""


TOKEN_FOLLOWS = -1
"""`TransferCommit.first_token` of a commit sent before the prefill sampled its first token
(layer streaming: every layer's K/V is final and sent while the compute's tail — the last
layer's MLP, the norm, the head — still runs). The receiver judges it as any commit (the
destination validates and publishes); published, the transfer stays pending for one more
COMMIT, which lists no chunk and carries the token: the token alone is what is left on the
path once the compute ends. Until then the transfer can still fail (ABORT, connection
lost, `forget`) like any pending one, and a chunk is refused by the listener's resolver."""


def token_follows(commit: TransferCommit) -> bool:
    """Was `commit` sent ahead of its first token (a second COMMIT brings it)?"""
    return commit.first_token == TOKEN_FOLLOWS


MAX_TRACE_HEADERS, MAX_TRACE_HEADER_CHARS = 4, 1024
"""Bounds on a commit's trace headers (a sender cannot make the receiver parse much)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The receiver's answer to a commit."""

    published: bool
    reason: str = ""
    """Why not, when not published (stale generation, checksum mismatch, ...)."""


@dataclass(frozen=True, slots=True)
class ChunkArrived:
    """Event: every byte of `chunk` is in the destination views (checksum computed)."""

    transfer_id: str
    key: ChunkKey
    num_bytes: int
    checksum: str


@dataclass(frozen=True, slots=True)
class Failed:
    """Event: the transfer cannot complete; the receiver has let go of its views."""

    transfer_id: str
    reason: str


# Resolve a chunk key to destination views (K runs then V runs), or raise KeyError.
Resolver = Callable[[ChunkKey], Sequence[memoryview]]
EventSink = Callable[[object], None]
CommitHandler = Callable[[TransferCommit], Awaitable[Verdict]]
# Check a sender's credential (its capability, runtime/security/capability.py) before
# any byte of the transfer may land; `peer` is the sender's name when the transport
# authenticated it (TLS), else None. Raises with the reason to refuse.
Authorizer = Callable[[dict, "str | None"], Awaitable[None]]


@dataclass
class Expectation:
    """What a receiver knows about one expected transfer."""

    transfer_id: str
    resolve: Resolver
    on_event: EventSink
    on_commit: CommitHandler
    received: dict[ChunkKey, ChunkArrived] = field(default_factory=dict)
    authorize: Authorizer | None = None
    """None: chunks are accepted without a credential (security off)."""
    senders: set = field(default_factory=set)
    """Senders (a TLS connection; over UCX, the holder of the transfer's key) whose
    credential passed `authorize`: only their chunks, commit and abort count; anyone else's
    are refused without touching the transfer (a forged credential must not end the
    victim's transfer either)."""
    key: bytes = b""
    """The transfer's secret (keys.py), the router's, handed with Decode.Reserve: every chunk's
    checksum is keyed with it, and over UCX every message. Empty: `TransferKey.public`
    (security off; a UCX receiver refuses it for a transfer with an `authorize`)."""
    tkey: TransferKey = field(init=False, repr=False)
    """`key` as a TransferKey (what the receiver checks chunks and messages with)."""

    def __post_init__(self) -> None:
        self.tkey = TransferKey.of(self.transfer_id, self.key)


class MissingTransferKey(RuntimeError):
    """A transfer that must come with its key (`KVReceiver.key_required`) came without one."""


class TransferError(RuntimeError):
    """A send, commit or abort could not be carried out (peer gone, refused, timed out)."""


class KVSender(abc.ABC):
    """Prefill side of a push transfer."""

    async def start(self) -> None:
        """Get ready to send (backends with setup cost do it here, not on the first send)."""

    @abc.abstractmethod
    async def send(self, dest: str, transfer_id: str, chunk: Chunk,
                   buffers: Sequence[memoryview]) -> None:
        """Write `chunk` (bytes = concatenation of buffers) into the destination's views."""

    async def send_many(self, dest: str, transfer_id: str,
                        items: Iterable[tuple[Chunk, Sequence[memoryview]]], hold_last: bool = False,
                        keys: Sequence[tuple[ChunkKey, int]] = ()) -> None:
        """`send` each (chunk, buffers) in order; a backend may pack small ones together.
        `items` may be lazy (a generator): each is taken once the ones before it are on their
        way (or held for packing), so a caller that hashes a chunk as it is taken hashes it
        while the chunk before moves. `hold_last`: the caller commits next, and a backend may
        keep the last packed message until then, to send the COMMIT in it. `keys`: with
        `hold_last`, every item's (key, bytes) in order, known before any is hashed: a backend
        may announce them first, so that the receiver makes their memory ready while the
        caller hashes, and check them against the COMMIT's checksums; an item that is not the
        one announced fails the transfer (TransferError)."""
        for chunk, buffers in items:
            await self.send(dest, transfer_id, chunk, buffers)

    async def announce(self, dest: str, transfer_id: str, keys: Sequence[tuple[ChunkKey, int]]) -> None:
        """Tell the receiver now which chunks ((key, bytes), in order) the transfer's last
        `send_many(hold_last=True, keys=keys)` will bring (after `present`; before they exist:
        while the prefill computes), so it makes their memory ready off the hand-off's
        path. A backend may do nothing; one that did takes only those chunks next."""

    @abc.abstractmethod
    async def present(self, dest: str, transfer_id: str, credential: dict | None, key: bytes = b"",
                      confirm: bool = False) -> None:
        """Open the transfer at the receiver before its first chunk: its credential (AUTH;
        None with security off) and its secret `key` (keys.py: the router's, from the grant;
        b"": the public key). Not acknowledged unless `confirm`: a refusal comes back like a
        refused chunk (TransferError on a later `send` or `commit`, with the reason); with
        `confirm` it returns once the receiver admitted the sender (TransferError if not).
        The caller computes the chunks' checksums with the same key (`chunk_checksum`)."""

    @abc.abstractmethod
    async def commit(self, dest: str, commit: TransferCommit) -> Verdict:
        """Hand over the manifest after the last chunk; returns the receiver's verdict."""

    def commit_now(self, dest: str, commit: TransferCommit) -> asyncio.Future | None:
        """`commit`, posted from the caller's turn of the loop: the verdict's future, or None
        when this backend (or its connection to dest) cannot (then `commit`)."""
        return None

    @abc.abstractmethod
    async def abort(self, dest: str, transfer_id: str, reason: str) -> None:
        """Tell the receiver to drop the transfer (best effort; never raises)."""

    async def close(self) -> None:
        """Release connections."""


def emit(exp: Expectation, event: object) -> None:
    """Deliver an event to the expectation's listener; a listener's bug is logged, not raised."""
    try:
        exp.on_event(event)
    except Exception:  # a listener's bug must not break the transport
        log.exception("on_event of %s raised", exp.transfer_id)


class KVReceiver(abc.ABC):
    """Decode side of a push transfer.

    The bookkeeping every backend shares lives here: ``pending`` (the transfers it
    accepts chunks of), ``expect``, ``forget`` and ``_fail`` (a transfer ends once:
    it leaves ``pending``, the backend drops its state in ``_drop``, and the
    listener hears ``Failed``). Backends implement the wire.
    """

    def __init__(self) -> None:
        self.pending: dict[str, Expectation] = {}
        """Transfers this receiver accepts chunks of, by transfer id."""

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """Where senders reach this receiver (registered in the directory)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Begin accepting transfers."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop accepting; every pending transfer ends in Failed."""

    def key_required(self, secured: bool) -> bool:
        """Must a transfer come with its key (`Expectation.key`) to be expected here, security
        on (`secured`) or off? Yes where nothing else binds its messages to its sender."""
        return False

    def expect(self, expectation: Expectation) -> None:
        """Accept chunks of `expectation.transfer_id` from now on."""
        self.pending[expectation.transfer_id] = expectation

    def forget(self, transfer_id: str) -> None:
        """Stop accepting the transfer and drop its views (idempotent)."""
        self.pending.pop(transfer_id, None)
        self._drop(transfer_id)

    def _drop(self, transfer_id: str) -> None:
        """Drop the backend's own state of a transfer that ended (forgotten or failed)."""

    async def admit(self, transfer_id: str, credential: dict, peer: str | None, sender: object) -> str:
        """`sender`'s AUTH: '' once its chunks may land, else why not. Nothing is exposed to
        a sender before this returned '' for it; a refusal leaves the transfer as it was."""
        exp = self.pending.get(transfer_id)
        if exp is None:
            return f"transfer {transfer_id} not expected"
        if exp.authorize is None or sender in exp.senders:
            return ""
        try:
            await exp.authorize(credential, peer)
        except Exception as e:  # noqa: BLE001 - any refusal or unreadable credential
            return str(e) or type(e).__name__
        if self.pending.get(transfer_id) is not exp:
            return f"transfer {transfer_id} ended while its credential was checked"
        exp.senders.add(sender)
        return ""

    def _reopen(self, exp: Expectation, commit: TransferCommit, verdict: Verdict) -> None:
        """After the verdict on `commit`, before the sender hears it: a published commit
        whose token follows leaves its transfer pending, for the token's COMMIT (same
        senders; its chunks are all in, so a chunk now is the resolver's to refuse)."""
        if verdict.published and token_follows(commit) and exp.transfer_id not in self.pending:
            self.pending[exp.transfer_id] = exp

    def _fail(self, transfer_id: str, reason: str) -> None:
        """End a pending transfer with Failed(reason); nothing if it already ended."""
        exp = self.pending.pop(transfer_id, None)
        self._drop(transfer_id)
        if exp is not None:
            log.info("transfer %s failed: %s", transfer_id, reason)
            emit(exp, Failed(transfer_id, reason))

    async def fence(self, transfer_id: str) -> None:
        """Return once no write into the transfer's views is in progress.

        Safety invariant: call after `forget` and before freeing the blocks, so
        a chunk that was mid-write cannot land in blocks reused by another
        request. Backends that write synchronously need not override it.
        """


def trusts(exp: Expectation, sender: object) -> bool:
    """May `sender` write, commit or abort this transfer?"""
    return exp.authorize is None or sender in exp.senders


UNAUTHORIZED = "the sender presented no accepted capability for this transfer"
