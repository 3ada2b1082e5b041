"""TCP backend, receiver side: TcpReceiver reads frames (wire.py) with an
asyncio BufferedProtocol per connection (inbox.py), payloads straight into the
destination views.

Receiver rules:
  AUTH                      the transfer's capability, checked before any chunk of this
                            connection lands (KVReceiver.admit); refused: ERROR only
  unknown transfer id, or   payload drained, nothing written; ERROR (a COMMIT gets
  a connection without an   VERDICT(published=False) instead, an ABORT nothing): the
  accepted AUTH (security   transfer goes on for the sender holding the capability
  on)
  duplicate key, unresolvable key (the resolver raised), wrong payload length,
  checksum mismatch         Failed for the transfer; payload drained; ERROR
  ABORT                     Failed("aborted by sender: ...")
  COMMIT                    the transfer leaves `pending`, on_commit runs in its
                            own task (a slow publish does not stall the
                            connection), its Verdict is the reply;
                            published with TOKEN_FOLLOWS: pending again, for
                            the token's COMMIT
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
import ssl

from runtime.common.tasks import TaskSet

from ..base import (
    UNAUTHORIZED,
    ChunkArrived,
    ChunkKey,
    Expectation,
    KVReceiver,
    TransferCommit,
    chunk_checksum,
    max_body_bytes,
    trusts,
)
from ..common import decide
from ..common import destination as _destination
from ..common import emit as _emit
from .inbox import Closed as _Closed
from .inbox import Inbox as _Inbox
from .wire import (
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
    commit_for,
    json_body,
)

# Logs under the package's `tcp` name, as before the split (log filters may name it).
log = logging.getLogger(f"{__package__}.tcp")

STOP_GRACE_S = 5.0
"""How long `stop` lets running commit handlers finish before cancelling them."""


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
        self._commits = TaskSet()

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
        await self._commits.settle(STOP_GRACE_S, also=[i.task for i in self._inboxes if i.task])
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
                    if tid in self.pending and trusts(self.pending[tid], inbox):
                        touched.add(tid)
                    await self._on_chunk(inbox, tid, body_len)
                elif kind == COMMIT and tid not in self.pending:  # its body is not worth memory
                    await inbox.drain(body_len, idle_s)
                    inbox.reply(VERDICT, tid, {"published": False, "reason": f"transfer {tid} not expected"})
                elif kind == COMMIT:
                    self._on_commit(inbox, tid, await inbox.read(body_len, idle_s))
                elif kind == AUTH:
                    credential = json_body(await inbox.read(body_len, idle_s))
                    why = await self.admit(tid, credential, inbox.identity, inbox)
                    if why:
                        inbox.reply(ERROR, tid, {"reason": why})
                    else:
                        touched.add(tid)
                elif kind == ABORT:
                    why = json_body(await inbox.read(body_len, idle_s)).get("reason", "")
                    if tid in self.pending and trusts(self.pending[tid], inbox):
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
        if exp is None or not trusts(exp, inbox):
            inbox.reply(ERROR, tid, {"reason": f"transfer {tid} not expected" if exp is None else UNAUTHORIZED})
            return await inbox.drain(payload_len, idle_s)
        views, problem = _destination(exp, key, payload_len)
        if problem:
            self._fail(tid, problem)
            inbox.reply(ERROR, tid, {"reason": problem})
            return await inbox.drain(payload_len, idle_s)
        if not await inbox.read_into(views, payload_len, lambda: self.pending.get(tid) is exp,
                                     idle_s):
            return  # failed or forgotten meanwhile: the rest went nowhere
        got = chunk_checksum(exp.tkey, key, views)
        if got != sent_hex:  # (never the value computed: the one-time key's second string, keys.py)
            problem = f"checksum mismatch in chunk {key}: sender {sent_hex}, received other bytes"
            self._fail(tid, problem)
            inbox.reply(ERROR, tid, {"reason": problem})
            return
        arrived = ChunkArrived(tid, key, payload_len, got)
        exp.received[key] = arrived
        _emit(exp, arrived)

    def _on_commit(self, inbox: _Inbox, tid: str, body: bytes) -> None:
        exp = self.pending.get(tid)
        if exp is None or not trusts(exp, inbox):
            inbox.reply(VERDICT, tid, {"published": False,
                                       "reason": f"transfer {tid} not expected" if exp is None else UNAUTHORIZED})
            return
        try:
            commit, why = commit_for(json_body(body), tid)
        except ProtocolError as e:
            commit, why = None, f"malformed commit: {e}"
        if why:
            self._fail(tid, why)
            inbox.reply(ERROR, tid, {"reason": why})
            return
        del self.pending[tid]  # ends here: no more chunks, no Failed from stop/idle
        self._commits.spawn(self._decide(inbox, exp, commit))

    async def _decide(self, inbox: _Inbox, exp: Expectation, commit: TransferCommit) -> None:
        verdict = await decide(exp, commit)
        self._reopen(exp, commit, verdict)
        inbox.reply(VERDICT, exp.transfer_id,
                    {"published": verdict.published, "reason": verdict.reason})
