"""TCP backend, receiver side: TcpReceiver reads frames (tcp_wire.py) with an
asyncio BufferedProtocol per connection, payloads straight into the destination views.

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

Safety invariant: payload bytes reach a destination view only inside the
transport's read callback (`get_buffer`/`buffer_updated`), which re-checks that
the transfer is still pending each time, so after `forget`, `stop` or `Failed`
no byte is written into its views (`fence` has nothing to wait for). Every
method runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable

from services.security.tls import worker_of_ssl

from .base import ChunkArrived, ChunkKey, Expectation, KVReceiver, TransferCommit, checksum, max_body_bytes
from .common import decide
from .common import destination as _destination
from .common import emit as _emit
from .tcp_wire import (
    ABORT,
    AUTH,
    CHUNK,
    CHUNK_HEAD,
    COMMIT,
    ERROR,
    FRAME,
    MAGIC,
    MAX_ID_BYTES,
    VERDICT,
    VERSION,
    ProtocolError,
    control_frame,
    decode_commit,
    json_body,
)

# Logs under the package's `tcp` name, as before the split (log filters may name it).
log = logging.getLogger(f"{__package__}.tcp")

SENDER_ROLES = frozenset({"prefill", "mixed"})  # certificate roles that may send K/V
CONTROL_BUFFER_BYTES = 64 << 10
"""Receiver-side buffer for headers and control bodies; payloads bypass it."""
MAX_REPLY_BACKLOG_BYTES = 1 << 20
"""A sender that lets this much reply data pile up is disconnected."""
STOP_GRACE_S = 5.0
"""How long `stop` lets running commit handlers finish before cancelling them."""


class _Closed(Exception):
    """The connection ended (lost, idle, or closed by us); the message says how."""


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

    def __init__(self, receiver: TcpReceiver):
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
        self.identity: str | None = None
        """The sender's worker id from its TLS certificate (None without TLS)."""
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
        if self._receiver.ssl_context is not None:
            self.identity = worker_of_ssl(transport.get_extra_info("ssl_object"), SENDER_ROLES, self.peer)
            if self.identity is None:  # not a prefill worker's certificate (logged)
                return transport.abort()
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
                 advertise_host: str = "", ssl_context: ssl.SSLContext | None = None):
        """idle_timeout_s: a connection with pending transfers (or mid-frame) that sends
        nothing for this long is closed and its transfers fail. advertise_host: the host
        put in `address` when it differs from the bind host (e.g. 0.0.0.0)."""
        if idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be positive")
        self.host, self.port, self.idle_timeout_s = host, port, idle_timeout_s
        super().__init__()
        self.advertise_host = advertise_host or host
        self.ssl_context = ssl_context
        """Mutual TLS for every connection (None: plaintext, PD_INSECURE)."""
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
            lambda: _Inbox(self), self.host, self.port, reuse_address=True, ssl=self.ssl_context)
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
                if id_len > MAX_ID_BYTES or (kind != CHUNK and body_len > max_body_bytes(kind in (COMMIT, AUTH))):
                    raise ProtocolError(f"frame too large: id {id_len}, body {body_len} bytes")
                try:
                    tid = (await inbox.read(id_len, idle_s)).decode()
                except UnicodeDecodeError:
                    raise ProtocolError("transfer id is not utf-8") from None
                if kind == CHUNK:
                    if tid in self.pending:
                        touched.add(tid)
                    await self._on_chunk(inbox, tid, body_len)
                elif kind == COMMIT and tid not in self.pending:  # its body is not worth memory
                    await inbox.drain(body_len, idle_s)
                    inbox.reply(VERDICT, tid, {"published": False, "reason": f"transfer {tid} not expected"})
                elif kind == COMMIT:
                    self._on_commit(inbox, tid, await inbox.read(body_len, idle_s))
                elif kind == AUTH:
                    credential = json_body(await inbox.read(body_len, idle_s))
                    why = await self.admit(tid, credential, inbox.identity)
                    if why:
                        inbox.reply(ERROR, tid, {"reason": why})
                    else:
                        touched.add(tid)
                elif kind == ABORT:
                    why = json_body(await inbox.read(body_len, idle_s)).get("reason", "")
                    self._fail(tid, f"aborted by sender: {why}")
                else:
                    raise ProtocolError(f"unexpected frame type {kind}")
        except _Closed as e:
            reason = str(e)
        except ProtocolError as e:
            reason = f"protocol error from {inbox.peer}: {e}"
        except Exception as e:  # a bug here must still fail the transfers
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
            commit = decode_commit(json_body(body))
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
        verdict = await decide(exp, commit)
        inbox.reply(VERDICT, exp.transfer_id,
                    {"published": verdict.published, "reason": verdict.reason})
