"""TCP backend: chunks pushed over one framed TCP connection per (sender, receiver).

Wire format, version 1, network byte order. Every frame is

    FRAME    magic b"PDKV" | version u8 | type u8 | id_len u16 | body_len u64
             transfer id (id_len bytes, utf-8)
             body (body_len bytes):
    CHUNK    CHUNK_HEAD: layer u32 | block_start u32 | block_count u32 | payload_len u64
             | checksum u64 (the sender's xxh3_64 of the payload); then the payload
    COMMIT   JSON TransferCommit (encode_commit)                  sender -> receiver
    ABORT    JSON {"reason": str}                                 sender -> receiver
    VERDICT  JSON {"published": bool, "reason": str}              receiver -> sender
    ERROR    JSON {"reason": str}                                 receiver -> sender

Replies. A CHUNK is not acknowledged; a rejected one gets an ERROR, and the
sender raises TransferError for that transfer on its next `send`, at the latest
on `commit`: the receiver handles a connection's frames in order, so every ERROR
for a transfer is on the wire before its VERDICT. Chunks thus stream back to
back with no round trip each; TCP flow control bounds the bytes in flight, and
the receiver reads straight into reserved views, so there is no staging memory
for a credit window (0x06B) to protect. COMMIT gets VERDICT (or ERROR when the
commit is malformed); ABORT gets nothing.

Receiver rules:
  unknown transfer id       payload drained, nothing written; ERROR
                            (a COMMIT gets VERDICT(published=False) instead)
  duplicate key, unresolvable key (the resolver raised), wrong payload length,
  checksum mismatch         Failed for the transfer; payload drained; ERROR
  ABORT                     Failed("aborted by sender: ...")
  COMMIT                    the transfer leaves `pending`, on_commit runs in its
                            own task (a slow publish does not stall the
                            connection), its Verdict is the reply
  connection lost, or no    Failed for every pending transfer that sent chunks on
  byte for idle_timeout_s   this connection; mid-frame the timeout always applies,
                            between frames only while such a transfer is pending
  bad magic/version/frame   the connection is closed (then as above)

Sender: one connection per destination, opened on first use and reopened after
it dies; frames are written whole under a per-connection lock; a task reads
replies. `send` returns once the kernel holds every byte (the caller may reuse
its memory). Connect, write progress and the wait for a verdict are bounded by
connect_timeout_s / io_timeout_s; a timeout or a lost connection fails every
unsettled transfer on it (TransferError on its next send/commit). After a
TransferError call `abort` (it never raises): it also drops the sender's record.

Safety invariant: payload bytes reach a destination view only inside the
transport's read callback (`get_buffer`/`buffer_updated`), which re-checks that
the transfer is still pending each time, so after `forget`, `stop` or `Failed`
no byte is written into its views (`fence` has nothing to wait for). Every
method runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from typing import Callable, Sequence

from .base import (CHECKSUM_ALGORITHM, Chunk, ChunkArrived, ChunkKey, Expectation, Failed,
                   KVReceiver, KVSender, TransferCommit, TransferError, Verdict, checksum)

log = logging.getLogger(__name__)

MAGIC = b"PDKV"
VERSION = 1
CHUNK, COMMIT, ABORT, VERDICT, ERROR = 1, 2, 3, 4, 5
FRAME = struct.Struct("!4sBBHQ")
CHUNK_HEAD = struct.Struct("!IIIQQ")
# The checksum travels as a u64: must match CHECKSUM_ALGORITHM in base.py (a new
# algorithm is a new VERSION).
assert CHECKSUM_ALGORITHM == "xxh3_64"

MAX_ID_BYTES = 1024
MAX_CONTROL_BODY_BYTES = 64 << 20
"""Largest COMMIT/ABORT/VERDICT/ERROR body (a commit lists every chunk)."""
CONTROL_BUFFER_BYTES = 64 << 10
"""Receiver-side buffer for headers and control bodies; payloads bypass it."""
WRITE_PIECE_BYTES = 4 << 20
"""The sender's io timeout bounds the progress of each piece this large."""
COALESCE_BYTES = 64 << 10
"""Frames up to this size are written as one buffer (one syscall, one segment)."""
MAX_REPLY_BACKLOG_BYTES = 1 << 20
"""A sender that lets this much reply data pile up is disconnected."""
STOP_GRACE_S = 5.0
"""How long `stop` lets running commit handlers finish before cancelling them."""


class ProtocolError(Exception):
    """The peer broke the framing; the connection is closed."""


class _Closed(Exception):
    """The connection ended (lost, idle, or closed by us); the message says how."""


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
    """A frame whose body is JSON."""
    return frame(kind, transfer_id, json.dumps(obj, separators=(",", ":")).encode())


def encode_commit(c: TransferCommit) -> dict:
    """TransferCommit as plain JSON types (chunks as [layer, start, count, bytes, checksum])."""
    return dict(transfer_id=c.transfer_id, request_id=c.request_id, generation=c.generation,
                cache_abi_digest=c.cache_abi_digest, kv_digest=c.kv_digest,
                first_token=c.first_token, source_worker_id=c.source_worker_id,
                source_epoch=c.source_epoch,
                chunks=[[ch.key.layer, ch.key.block_start, ch.key.block_count, ch.num_bytes,
                         ch.checksum] for ch in c.chunks])


def decode_commit(d: dict) -> TransferCommit:
    """Inverse of encode_commit; ValueError naming the first bad field."""
    def get(name, kind):
        v = d.get(name) if isinstance(d, dict) else None
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise ValueError(f"commit field {name!r} is {v!r}, not {kind.__name__}")
        return v

    chunks = []
    for e in get("chunks", list):
        if (not isinstance(e, list) or len(e) != 5 or not isinstance(e[4], str)
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in e[:4])):
            raise ValueError(f"commit chunk entry {e!r} is not [layer, start, count, bytes, sum]")
        chunks.append(Chunk(ChunkKey(e[0], e[1], e[2]), e[3], e[4]))
    return TransferCommit(get("transfer_id", str), get("request_id", str), get("generation", int),
                          get("cache_abi_digest", str), tuple(chunks), get("kv_digest", str),
                          get("first_token", int), get("source_worker_id", str),
                          get("source_epoch", int))


def _json(body: bytes) -> dict:
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"body is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"body is {type(obj).__name__}, not an object")
    return obj


def _byte_view(buf) -> memoryview:
    v = memoryview(buf)
    return v if v.format == "B" and v.ndim == 1 else v.cast("B")


def parse_address(address: str) -> tuple[str, int]:
    """'tcp://host:port' (host may be [v6]) -> (host, port)."""
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not tcp://host:port")
    return host.strip("[]"), int(port)


# ---- receiver ----------------------------------------------------------------------


class _Sink:
    """Where the next `nbytes` of the stream go: `views` in order while `alive()`, else nowhere."""

    def __init__(self, views: list[memoryview], nbytes: int, alive: Callable[[], bool],
                 scratch: memoryview):
        self.views = [v for v in views if v.nbytes]
        self.remaining = nbytes
        self.alive = alive
        self.intact = True
        self._scratch = scratch
        self._i = self._off = 0

    def buffer(self) -> memoryview:
        """Memory for the next bytes (never longer than what this sink still takes)."""
        if self.intact and (self._i == len(self.views) or not self.alive()):
            self.intact = False  # from now on everything is discarded
        if not self.intact:
            return self._scratch[:min(len(self._scratch), self.remaining)]
        return self.views[self._i][self._off:]

    def advance(self, n: int) -> bool:
        """n bytes landed in the last `buffer()`; True once the sink is full."""
        self.remaining -= n
        if self.intact:
            self._off += n
            if self._off == self.views[self._i].nbytes:
                self._i, self._off = self._i + 1, 0
        return self.remaining == 0

    def feed(self, data: memoryview) -> None:
        """Take bytes that were already buffered."""
        while data:
            buf = self.buffer()
            k = min(len(buf), len(data))
            buf[:k] = data[:k]
            self.advance(k)
            data = data[k:]


class _Inbox(asyncio.BufferedProtocol):
    """One accepted connection: headers go to a small buffer, payloads straight into a sink."""

    def __init__(self, receiver: "TcpReceiver"):
        self._receiver = receiver
        self._ctl = bytearray(CONTROL_BUFFER_BYTES)
        self._ctl_view = memoryview(self._ctl)
        self._lo = self._hi = 0  # unread control bytes are _ctl[_lo:_hi]
        self._scratch = memoryview(bytearray(CONTROL_BUFFER_BYTES))
        self._sink: _Sink | None = None
        self._waiter: asyncio.Future | None = None
        self._lost: _Closed | None = None
        self._paused = False
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.task: asyncio.Task | None = None

    # -- transport callbacks (synchronous: a view check and the write into it are atomic)
    def connection_made(self, transport) -> None:
        self.transport = transport
        self._loop = asyncio.get_running_loop()
        self._last_rx = self._loop.time()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = str(transport.get_extra_info("peername"))
        self._receiver._inboxes.add(self)
        self.task = self._loop.create_task(self._receiver._serve(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._sink is not None:
            return self._sink.buffer()
        if self._hi == len(self._ctl):  # move unread bytes to the front
            n = self._hi - self._lo
            self._ctl[:n] = self._ctl[self._lo:self._hi]
            self._lo, self._hi = 0, n
        return self._ctl_view[self._hi:]

    def buffer_updated(self, nbytes: int) -> None:
        self._last_rx = self._loop.time()
        if self._sink is not None:
            if self._sink.advance(nbytes):
                self._sink = None
                self._wake()
            return
        self._hi += nbytes
        if self._lo == 0 and self._hi == len(self._ctl):
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc) -> None:
        self._lost = _Closed(f"connection from {self.peer} lost: {exc or 'closed by peer'}")
        self._sink = None
        self._wake()

    # -- coroutine side
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait_until(self, ready: Callable[[], bool], idle_s: float | None) -> None:
        """Until ready(); _Closed if the connection ends first or receives nothing for idle_s."""
        while not ready():
            if self._lost is not None:
                raise self._lost
            self._waiter = self._loop.create_future()
            try:
                async with asyncio.timeout_at(None if idle_s is None else self._last_rx + idle_s):
                    await self._waiter
            except TimeoutError:
                if not ready() and self._loop.time() >= self._last_rx + idle_s:
                    raise _Closed(f"connection from {self.peer} idle for {idle_s} s") from None
            finally:
                self._waiter = None

    def _resume(self) -> None:
        if self._paused and self._lost is None:
            self._paused = False
            self.transport.resume_reading()

    async def read(self, n: int, idle_s: float | None) -> bytes:
        """The next n bytes."""
        if n > len(self._ctl):
            out = bytearray(n)
            await self.read_into([memoryview(out)], n, lambda: True, idle_s)
            return bytes(out)
        await self._wait_until(lambda: self._hi - self._lo >= n, idle_s)
        data = bytes(self._ctl_view[self._lo:self._lo + n])
        self._lo += n
        if self._lo == self._hi:
            self._lo = self._hi = 0
        self._resume()
        return data

    async def read_into(self, views: list[memoryview], nbytes: int, alive: Callable[[], bool],
                        idle_s: float | None) -> bool:
        """Put the next nbytes into views (discarding them once alive() is False); intact?"""
        sink = _Sink(views, nbytes, alive, self._scratch)
        take = min(self._hi - self._lo, nbytes)
        if take:
            sink.feed(self._ctl_view[self._lo:self._lo + take])
            self._lo += take
            if self._lo == self._hi:
                self._lo = self._hi = 0
        if sink.remaining:
            if self._lost is not None:
                raise self._lost
            self._sink = sink
            self._resume()
            await self._wait_until(lambda: self._sink is not sink, idle_s)
        return sink.intact and alive()

    async def drain(self, nbytes: int, idle_s: float | None) -> None:
        """Read and discard nbytes."""
        await self.read_into([], nbytes, lambda: False, idle_s)

    def reply(self, kind: int, transfer_id: str, obj: dict) -> None:
        """Send a VERDICT or ERROR (dropped if the connection is gone)."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size() > MAX_REPLY_BACKLOG_BYTES:
            log.warning("tcp receiver: %s does not read replies; closing", self.peer)
            self.transport.abort()
            return
        self.transport.write(control_frame(kind, transfer_id, obj))


class TcpReceiver(KVReceiver):
    """Accepts transfers on host:port; `address` is tcp://host:port once started."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, idle_timeout_s: float = 30.0,
                 advertise_host: str = ""):
        """idle_timeout_s: a connection with pending transfers (or mid-frame) that sends
        nothing for this long is closed and its transfers fail. advertise_host: the host
        put in `address` when it differs from the bind host (e.g. 0.0.0.0)."""
        if idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be positive")
        self.host, self.port, self.idle_timeout_s = host, port, idle_timeout_s
        self.advertise_host = advertise_host or host
        self.pending: dict[str, Expectation] = {}
        self._server: asyncio.AbstractServer | None = None
        self._inboxes: set[_Inbox] = set()
        self._commits: set[asyncio.Task] = set()

    @property
    def address(self) -> str:
        if self._server is None:
            raise RuntimeError("TcpReceiver.address: not started")
        host = self.advertise_host
        return f"tcp://[{host}]:{self.port}" if ":" in host else f"tcp://{host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Inbox(self), self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for tid in list(self.pending):
            self._fail(tid, "receiver stopped")
        for inbox in list(self._inboxes):
            inbox.transport.abort()
        tasks = [i.task for i in self._inboxes if i.task] + list(self._commits)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
            for t in late:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def expect(self, expectation: Expectation) -> None:
        self.pending[expectation.transfer_id] = expectation

    def forget(self, transfer_id: str) -> None:
        self.pending.pop(transfer_id, None)

    def _fail(self, transfer_id: str, reason: str) -> None:
        exp = self.pending.pop(transfer_id, None)
        if exp is not None:
            log.info("transfer %s failed: %s", transfer_id, reason)
            _emit(exp, Failed(transfer_id, reason))

    # -- one connection
    async def _serve(self, inbox: _Inbox) -> None:
        touched: set[str] = set()  # pending transfers that sent chunks on this connection
        idle_s = self.idle_timeout_s
        reason = "receiver stopped"
        try:
            while True:
                busy = any(t in self.pending for t in touched)
                magic, version, kind, id_len, body_len = FRAME.unpack(
                    await inbox.read(FRAME.size, idle_s if busy else None))
                if magic != MAGIC or version != VERSION:
                    raise ProtocolError(f"bad magic/version {magic!r}/{version}")
                if id_len > MAX_ID_BYTES or (kind != CHUNK and body_len > MAX_CONTROL_BODY_BYTES):
                    raise ProtocolError(f"frame too large: id {id_len}, body {body_len} bytes")
                try:
                    tid = (await inbox.read(id_len, idle_s)).decode()
                except UnicodeDecodeError:
                    raise ProtocolError("transfer id is not utf-8") from None
                if kind == CHUNK:
                    if tid in self.pending:
                        touched.add(tid)
                    await self._on_chunk(inbox, tid, body_len)
                elif kind == COMMIT:
                    self._on_commit(inbox, tid, await inbox.read(body_len, idle_s))
                elif kind == ABORT:
                    why = _json(await inbox.read(body_len, idle_s)).get("reason", "")
                    self._fail(tid, f"aborted by sender: {why}")
                else:
                    raise ProtocolError(f"unexpected frame type {kind}")
        except _Closed as e:
            reason = str(e)
        except ProtocolError as e:
            reason = f"protocol error from {inbox.peer}: {e}"
        except Exception as e:  # noqa: BLE001 - a bug here must still fail the transfers
            log.exception("tcp receiver: connection from %s", inbox.peer)
            reason = f"receiver error: {e!r}"
        finally:
            inbox.transport.abort()
            self._inboxes.discard(inbox)
            for tid in touched:
                self._fail(tid, reason)

    async def _on_chunk(self, inbox: _Inbox, tid: str, body_len: int) -> None:
        idle_s = self.idle_timeout_s
        layer, start, count, payload_len, sent = CHUNK_HEAD.unpack(
            await inbox.read(CHUNK_HEAD.size, idle_s))
        if body_len != CHUNK_HEAD.size + payload_len:
            raise ProtocolError(f"CHUNK body_len {body_len} != header + payload {payload_len}")
        key, sent_hex = ChunkKey(layer, start, count), f"{sent:016x}"
        exp = self.pending.get(tid)
        if exp is None:
            inbox.reply(ERROR, tid, {"reason": f"transfer {tid} not expected"})
            return await inbox.drain(payload_len, idle_s)
        views, problem = _destination(exp, key, payload_len)
        if problem:
            self._fail(tid, problem)
            inbox.reply(ERROR, tid, {"reason": problem})
            return await inbox.drain(payload_len, idle_s)
        if not await inbox.read_into(views, payload_len, lambda: self.pending.get(tid) is exp,
                                     idle_s):
            return  # failed or forgotten meanwhile: the rest went nowhere
        got = checksum(views)
        if got != sent_hex:
            problem = f"checksum mismatch in chunk {key}: sender {sent_hex}, received {got}"
            self._fail(tid, problem)
            inbox.reply(ERROR, tid, {"reason": problem})
            return
        arrived = ChunkArrived(tid, key, payload_len, got)
        exp.received[key] = arrived
        _emit(exp, arrived)

    def _on_commit(self, inbox: _Inbox, tid: str, body: bytes) -> None:
        exp = self.pending.get(tid)
        if exp is None:
            inbox.reply(VERDICT, tid, {"published": False,
                                       "reason": f"transfer {tid} not expected"})
            return
        try:
            commit = decode_commit(_json(body))
            if commit.transfer_id != tid:
                raise ValueError(f"commit names transfer {commit.transfer_id}")
        except (ValueError, ProtocolError) as e:
            self._fail(tid, f"malformed commit: {e}")
            inbox.reply(ERROR, tid, {"reason": f"malformed commit: {e}"})
            return
        del self.pending[tid]  # ends here: no more chunks, no Failed from stop/idle
        task = asyncio.get_running_loop().create_task(self._decide(inbox, exp, commit))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)

    async def _decide(self, inbox: _Inbox, exp: Expectation, commit: TransferCommit) -> None:
        try:
            verdict = await exp.on_commit(commit)
        except asyncio.CancelledError:
            _emit(exp, Failed(exp.transfer_id, "receiver stopped during commit"))
            raise
        except Exception as e:  # noqa: BLE001 - the handler's bug must not kill the connection
            log.exception("on_commit of %s raised", exp.transfer_id)
            verdict = Verdict(False, f"commit handler failed: {e!r}")
            _emit(exp, Failed(exp.transfer_id, verdict.reason))
        inbox.reply(VERDICT, exp.transfer_id,
                    {"published": verdict.published, "reason": verdict.reason})


def _destination(exp: Expectation, key: ChunkKey, payload_len: int
                 ) -> tuple[list[memoryview], str]:
    """(views, '') to write `key` into, or ([], why the chunk is rejected)."""
    if key in exp.received:
        return [], f"duplicate chunk {key}"
    try:
        views = [_byte_view(v) for v in exp.resolve(key)]
    except Exception as e:  # noqa: BLE001 - KeyError by contract; range errors from the engine
        return [], f"unexpected chunk {key}: {e!r}"
    if any(v.readonly for v in views):
        return [], f"chunk {key} resolves to read-only memory"
    size = sum(v.nbytes for v in views)
    if size != payload_len:
        return [], f"chunk {key} is {payload_len} bytes, expected {size}"
    return views, ""


def _emit(exp: Expectation, event: object) -> None:
    try:
        exp.on_event(event)
    except Exception:  # noqa: BLE001 - a listener's bug must not break the connection
        log.exception("on_event of %s raised", exp.transfer_id)


# ---- sender ------------------------------------------------------------------------


class _Link:
    """One connection to a receiver: frame writes under a lock, a task reading replies."""

    def __init__(self, dest: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.dest, self.reader, self.writer = dest, reader, writer
        self.lock = asyncio.Lock()
        self.transfers: set[str] = set()  # sent frames here and not settled yet
        self.verdicts: dict[str, asyncio.Future] = {}
        self.dead = ""
        self.task: asyncio.Task | None = None


class TcpSender(KVSender):
    """Pushes chunks to TcpReceivers: one connection per destination, reopened on demand."""

    def __init__(self, connect_timeout_s: float = 5.0, io_timeout_s: float = 30.0):
        """io_timeout_s bounds each write of up to WRITE_PIECE_BYTES and the wait for a
        verdict; any timeout drops the connection (its other transfers fail too)."""
        self.connect_timeout_s, self.io_timeout_s = connect_timeout_s, io_timeout_s
        self._links: dict[str, _Link] = {}
        self._connecting: dict[str, asyncio.Future] = {}
        self._failed: dict[tuple[str, str], str] = {}  # (dest, transfer id) -> why

    async def send(self, dest: str, transfer_id: str, chunk: Chunk,
                   buffers: Sequence[memoryview]) -> None:
        views = [_byte_view(b) for b in buffers]
        nbytes = sum(v.nbytes for v in views)
        if nbytes != chunk.num_bytes:
            raise ValueError(f"chunk {chunk.key} says {chunk.num_bytes} bytes, "
                             f"its buffers hold {nbytes}")
        head = chunk_frame(transfer_id, chunk.key, nbytes, chunk.checksum)
        self._raise_if_failed(dest, transfer_id)
        link = await self._link(dest)
        link.transfers.add(transfer_id)
        await self._write(link, [memoryview(head), *views])
        self._raise_if_failed(dest, transfer_id)

    async def commit(self, dest: str, commit: TransferCommit) -> Verdict:
        tid = commit.transfer_id
        link = fut = None
        try:
            self._raise_if_failed(dest, tid)
            link = await self._link(dest)
            fut = link.verdicts[tid] = asyncio.get_running_loop().create_future()
            link.transfers.add(tid)
            await self._write(link, [control_frame(COMMIT, tid, encode_commit(commit))])
            try:
                async with asyncio.timeout(self.io_timeout_s):
                    return await fut
            except TimeoutError:
                reason = f"no verdict for {tid} from {dest} in {self.io_timeout_s} s"
                self._kill(link, reason)
                raise TransferError(reason) from None
        finally:
            self._failed.pop((dest, tid), None)
            if link is not None:
                link.verdicts.pop(tid, None)
                link.transfers.discard(tid)
            if fut is not None and fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: set by _kill while the write failed

    async def abort(self, dest: str, transfer_id: str, reason: str) -> None:
        self._failed.pop((dest, transfer_id), None)
        try:
            # Reconnect if need be: the receiver may expect a transfer that sent nothing yet.
            link = await self._link(dest)
            link.transfers.discard(transfer_id)
            await self._write(link, [control_frame(ABORT, transfer_id, {"reason": reason})])
        except Exception as e:  # noqa: BLE001 - abort is best effort by contract
            log.info("abort of %s at %s not delivered: %s", transfer_id, dest, e)

    async def close(self) -> None:
        links = list(self._links.values())
        for link in links:
            self._kill(link, "sender closed")
        await asyncio.gather(*(l.task for l in links if l.task), return_exceptions=True)

    def _raise_if_failed(self, dest: str, transfer_id: str) -> None:
        reason = self._failed.get((dest, transfer_id))
        if reason is not None:
            raise TransferError(f"transfer {transfer_id} to {dest}: {reason}")

    # -- connections
    async def _link(self, dest: str) -> _Link:
        link = self._links.get(dest)
        if link is not None and not link.dead:
            return link
        fut = self._connecting.get(dest)
        if fut is None:  # one connect per destination, shared by concurrent callers
            fut = self._connecting[dest] = asyncio.ensure_future(self._connect(dest))
            fut.add_done_callback(lambda _: self._connecting.pop(dest, None))
        return await asyncio.shield(fut)

    async def _connect(self, dest: str) -> _Link:
        try:
            host, port = parse_address(dest)
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError, ValueError) as e:
            raise TransferError(f"cannot connect to {dest}: {e!r}") from None
        writer.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # drain() returns only once the transport holds none of our bytes, so a send()
        # that returned never leaves a reference to the caller's cache memory behind.
        writer.transport.set_write_buffer_limits(high=0, low=0)
        link = self._links[dest] = _Link(dest, reader, writer)
        link.task = asyncio.get_running_loop().create_task(self._read_replies(link))
        return link

    def _kill(self, link: _Link, reason: str) -> None:
        """Drop the connection; its unsettled transfers fail with `reason`."""
        if link.dead:
            return
        link.dead = reason
        link.writer.transport.abort()
        for tid in link.transfers:
            self._failed.setdefault((link.dest, tid), reason)
        link.transfers.clear()
        for fut in link.verdicts.values():
            if not fut.done():
                fut.set_exception(TransferError(reason))
        link.verdicts.clear()
        if self._links.get(link.dest) is link:
            del self._links[link.dest]
        if link.task is not None and link.task is not asyncio.current_task():
            link.task.cancel()

    async def _write(self, link: _Link, parts: list) -> None:
        """Write one frame whole, even if the caller is cancelled meanwhile.

        Safety invariant: a half-written frame would corrupt the stream for every
        transfer on the connection, so a cancelled caller's frame is finished in
        the background, its remaining payload as zeros (the caller's memory may be
        reused): the receiver fails that transfer on the checksum; others go on.
        """
        cancelled = [False]
        job = asyncio.ensure_future(self._write_frame(link, parts, cancelled))
        job.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            cancelled[0] = True
            raise

    async def _write_frame(self, link: _Link, parts: list, cancelled: list) -> None:
        if sum(map(len, parts)) <= COALESCE_BYTES:  # parts are bytes or 1-D byte views
            parts = [b"".join(parts)]
        async with link.lock:
            if link.dead:
                raise TransferError(f"connection to {link.dest}: {link.dead}")
            if cancelled[0]:
                return  # nothing of it was written
            try:
                for part in parts:
                    part = memoryview(part)
                    for off in range(0, part.nbytes, WRITE_PIECE_BYTES):
                        piece = part[off:off + WRITE_PIECE_BYTES]
                        link.writer.write(bytes(len(piece)) if cancelled[0] else piece)
                        async with asyncio.timeout(self.io_timeout_s):
                            await link.writer.drain()
            except (OSError, TimeoutError) as e:
                why = (f"no write progress in {self.io_timeout_s} s"
                       if isinstance(e, TimeoutError) else repr(e))
                reason = f"write to {link.dest} failed: {why}"
                self._kill(link, reason)
                raise TransferError(reason) from None
            except BaseException:
                self._kill(link, "write interrupted mid-frame")
                raise

    async def _read_replies(self, link: _Link) -> None:
        try:
            while True:
                magic, version, kind, id_len, body_len = FRAME.unpack(
                    await link.reader.readexactly(FRAME.size))
                if (magic != MAGIC or version != VERSION or kind not in (VERDICT, ERROR)
                        or id_len > MAX_ID_BYTES or body_len > MAX_CONTROL_BODY_BYTES):
                    raise ProtocolError(f"bad reply frame {magic!r}/{version}/{kind}")
                tid = (await link.reader.readexactly(id_len)).decode(errors="replace")
                body = _json(await link.reader.readexactly(body_len))
                fut = link.verdicts.pop(tid, None)
                if kind == VERDICT:
                    result = Verdict(bool(body.get("published")), str(body.get("reason", "")))
                    if fut is not None and not fut.done():
                        fut.set_result(result)
                    continue
                reason = str(body.get("reason", "rejected"))
                if tid in link.transfers:  # settled transfers need no record
                    self._failed.setdefault((link.dest, tid), reason)
                if fut is not None and not fut.done():
                    fut.set_exception(TransferError(f"transfer {tid} to {link.dest}: {reason}"))
        except (asyncio.IncompleteReadError, OSError, ProtocolError) as e:
            why = "closed by peer" if isinstance(e, asyncio.IncompleteReadError) else repr(e)
            self._kill(link, f"connection to {link.dest} lost: {why}")
        except Exception as e:  # noqa: BLE001 - never leave a link without its reader
            log.exception("tcp sender: replies from %s", link.dest)
            self._kill(link, f"reply reader failed: {e!r}")
