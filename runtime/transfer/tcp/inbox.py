"""One accepted connection of the TCP receiver (receiver.py): an asyncio
BufferedProtocol that reads headers into a small buffer and payloads straight into
the destination views, and the coroutine-side reads the receiver's loop awaits.

Safety invariant (see receiver.py): a payload byte reaches a view only inside
`get_buffer`/`buffer_updated`, through a sink that re-checks the transfer is alive.
With TLS, only a prefill worker's certificate may connect (`SENDER_ROLES`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from runtime.security.tls import worker_of_ssl

from .wire import control_frame

log = logging.getLogger(f"{__package__}.tcp")

SENDER_ROLES = frozenset({"prefill", "mixed"})
"""Certificate roles that may send K/V (with TLS on)."""
CONTROL_BUFFER_BYTES = 64 << 10
"""Receiver-side buffer for headers and control bodies; payloads bypass it."""
MAX_REPLY_BACKLOG_BYTES = 1 << 20
"""A sender that lets this much reply data pile up is disconnected."""


class Closed(Exception):
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


class Inbox(asyncio.BufferedProtocol):
    """One accepted connection: headers go to a small buffer, payloads straight into a sink."""

    def __init__(self, receiver):
        self._receiver = receiver
        self._ctl = bytearray(CONTROL_BUFFER_BYTES)
        self._ctl_view = memoryview(self._ctl)
        self._lo = self._hi = 0  # unread control bytes are _ctl[_lo:_hi]
        self._scratch = memoryview(bytearray(CONTROL_BUFFER_BYTES))
        self._sink: _Sink | None = None
        self._waiter: asyncio.Future | None = None
        self._lost: Closed | None = None
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
        self._lost = Closed(f"connection from {self.peer} lost: {exc or 'closed by peer'}")
        self._sink = None
        self._wake()

    # -- coroutine side
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait_until(self, ready: Callable[[], bool], idle_s: float | None) -> None:
        """Until ready(); Closed if the connection ends first or receives nothing for idle_s."""
        while not ready():
            if self._lost is not None:
                raise self._lost
            self._waiter = self._loop.create_future()
            try:
                async with asyncio.timeout_at(None if idle_s is None else self._last_rx + idle_s):
                    await self._waiter
            except TimeoutError:
                if not ready() and self._loop.time() >= self._last_rx + idle_s:
                    raise Closed(f"connection from {self.peer} idle for {idle_s} s") from None
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
