"""TCP backend, sender side: TcpSender, its connections (frames per wire.py) and
the task that reads each connection's replies.

Sender: one connection per destination, opened on first use and reopened after
it dies; frames are written whole under a per-connection lock; a task reads
replies. `send` returns once the kernel holds every byte (the caller may reuse
its memory). Connect, write progress and the wait for a verdict are bounded by
connect_timeout_s / io_timeout_s; a timeout or a lost connection fails every
unsettled transfer on it (TransferError on its next send/commit). After a
TransferError call `abort` (it never raises): it also drops the sender's record.
Every method runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Sequence

from pdserve_client import contract

from ..base import MAX_SMALL_BODY_BYTES, Chunk, KVSender, TransferCommit, TransferError, Verdict
from ..common import chunk_buffers
from .wire import (
    ABORT,
    AUTH,
    COMMIT,
    ERROR,
    FRAME,
    MAGIC,
    MAX_ID_BYTES,
    VERDICT,
    VERSION,
    ProtocolError,
    chunk_frame,
    control_frame,
    encode_commit,
    json_body,
    parse_address,
)

# Logs under the package's `tcp` name, as before the split (log filters may name it).
log = logging.getLogger(f"{__package__}.tcp")

WRITE_PIECE_BYTES = 4 << 20
"""The sender's io timeout bounds the progress of each piece this large."""
COALESCE_BYTES = 64 << 10
"""Frames up to this size are written as one buffer (one syscall, one segment)."""


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

    def __init__(self, connect_timeout_s: float = 5.0, io_timeout_s: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None):
        """io_timeout_s bounds each write of up to WRITE_PIECE_BYTES and the wait for a
        verdict; any timeout drops the connection (its other transfers fail too).
        ssl_context: mutual TLS to receivers holding a decode certificate (None: plaintext)."""
        self.connect_timeout_s, self.io_timeout_s = connect_timeout_s, io_timeout_s
        self.ssl_context = ssl_context
        self._links: dict[str, _Link] = {}
        self._connecting: dict[str, asyncio.Future] = {}
        self._failed: dict[tuple[str, str], str] = {}  # (dest, transfer id) -> why

    async def send(self, dest: str, transfer_id: str, chunk: Chunk,
                   buffers: Sequence[memoryview]) -> None:
        views = chunk_buffers(chunk, buffers)
        nbytes = chunk.num_bytes
        head = chunk_frame(transfer_id, chunk.key, nbytes, chunk.checksum)
        self._raise_if_failed(dest, transfer_id)
        link = await self._link(dest)
        link.transfers.add(transfer_id)
        await self._write(link, [memoryview(head), *views])
        self._raise_if_failed(dest, transfer_id)

    async def present(self, dest: str, transfer_id: str, credential: dict | None, key: bytes = b"",
                      confirm: bool = False) -> None:
        """AUTH with the credential (none: security off, nothing to send). The key is not sent:
        TLS authenticates the connection; the chunk checksums are keyed with it all the same."""
        self._raise_if_failed(dest, transfer_id)
        if credential is None:
            return
        link = await self._link(dest)
        link.transfers.add(transfer_id)
        await self._write(link, [control_frame(AUTH, transfer_id, credential)])

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
        await asyncio.gather(*(link.task for link in links if link.task), return_exceptions=True)

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
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=self.ssl_context,
                    server_hostname=contract.server_name("decode") if self.ssl_context else None)
        except (OSError, TimeoutError, ValueError) as e:
            raise TransferError(f"cannot connect to {dest}: {e!r}") from None
        writer.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # drain() returns only once the transport holds none of our bytes, so a send()
        # that returned never leaves a reference to the caller's cache memory behind.
        # asyncio's TLS transport pauses at size >= high (plain ones at size > high), so
        # there high=1: it still holds none of our bytes once drain() returns.
        writer.transport.set_write_buffer_limits(high=1 if self.ssl_context else 0, low=0)
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
                        or id_len > MAX_ID_BYTES or body_len > MAX_SMALL_BODY_BYTES):
                    raise ProtocolError(f"bad reply frame {magic!r}/{version}/{kind}")
                tid = (await link.reader.readexactly(id_len)).decode(errors="replace")
                body = json_body(await link.reader.readexactly(body_len))
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
        except Exception as e:  # never leave a link without its reader
            log.exception("tcp sender: replies from %s", link.dest)
            self._kill(link, f"reply reader failed: {e!r}")
