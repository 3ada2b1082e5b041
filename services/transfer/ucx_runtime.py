"""The process's UCX worker (through ucxx) as the UCX backend uses it.

One UCX worker per process, progressed on the thread of the event loop that
first used it: the worker's wake-up file descriptor sits in that loop's selector
(`loop.add_reader`); when it fires, and after each post, the loop runs UCX
progress and ucxx's request notifier (which completes the requests' asyncio
futures) until the worker re-arms. No progress thread and no notifier thread:
a small message costs no thread wake-ups besides the loop's own (a 64 B round trip
63–75 µs here against 510–630 µs through ucxx's progress and notifier threads;
bench/results/transfer.md). The price: UCX moves nothing while that loop runs
Python, so nothing long may run on it (pdserve's engines compute on their own
threads), and every post must be made on that loop's thread (`post_*` check it).
Progress releases the GIL, so an engine thread computes while a rendezvous
copies.

Endpoints are made from the peer's *worker address* with endpoint error
handling off: that is the only way UCX picks shared memory (sysv/posix eager,
cma rendezvous) between processes on one host — endpoints from ucxx's listener
path always take tcp. Across hosts UCX picks tcp or RDMA, on GPU pods
cuda_ipc/GPUDirect; `UCX_TLS`, `UCX_NET_DEVICES` and friends are read by UCX
itself and respected.

With error handling off UCX reports no peer failure on an endpoint: an
operation towards a dead peer may never complete. Every wait in the backend is
therefore bounded by a timeout, and a posted receive is fenced by completing it
ourselves (`drain`) when its sender is gone.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable

from . import ucx_wire as wire

log = logging.getLogger(f"{__package__}.ucx")

_runtime: UcxRuntime | None = None
RING = 64
"""Control buffers a mailbox keeps posted."""
FUTURE_REFILL_EVERY = 32
"""Posts between two refills of ucxx's future pool (it holds 100 and refills below 50)."""
PROGRESS_ROUNDS = 64
"""Progress rounds in one loop callback before it yields to the loop's other work."""
OOB_TIMEOUT_S = 30.0
"""How long a mailbox waits for an out-of-line body after its head."""


def runtime() -> UcxRuntime:
    """The process-wide runtime, created on first use (imports ucxx) and bound to the
    running event loop: every later use must be on that loop."""
    global _runtime
    if _runtime is None:
        _runtime = UcxRuntime(asyncio.get_running_loop())
    return _runtime


_advertised = ""
"""The host this process's UCX endpoints name (`advertise_host`); "" = the host name."""


def advertise_host(host: str) -> None:
    """Name `host` (PD_DATA_PLANE_ADVERTISE, e.g. the pod IP) in this process's UCX
    addresses instead of the host name; "" keeps what is set. Before the runtime starts."""
    global _advertised
    if host:
        assert _runtime is None or _runtime.host == host, "advertise_host after the UCX runtime started"
        _advertised = host


def local_host() -> str:
    """The host this process's UCX addresses name (peers on the same one may use shared memory)."""
    return _advertised or socket.gethostname()


class UcxRuntime:
    """The UCX worker progressed on `loop`, an endpoint cache, posted receives and sends
    that complete as futures of that loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        from ucxx._lib import libucxx as ucx
        from ucxx._lib.arr import Array
        from ucxx.types import Tag
        self._Array, self._Tag, self._ucx = Array, Tag, ucx
        self.loop, self._thread = loop, threading.get_ident()
        self.ctx = ucx.UCXContext({})
        # Futures on (ucxx completes each request's asyncio future in run_request_notifier,
        # here on the loop's thread); delayed submission off (it needs a progress thread).
        self.worker = ucx.UCXWorker(self.ctx, enable_delayed_submission=False, enable_python_future=True)
        self.worker.init_blocking_progress_mode()
        self.worker.populate_python_futures_pool()
        self._kicked = False
        loop.add_reader(self.worker.epoll_file_descriptor, self.progress)
        self.progress()
        self.address = bytes(self.worker.address)
        self.host = local_host()
        self._eps: dict[bytes, object] = {}
        self._posts = 0
        self.transports = _transports(self.ctx.info)
        log.info("ucx runtime: transports %s (UCX_TLS=%s), progressed on the event loop",
                 ",".join(self.transports), os.environ.get("UCX_TLS", "<all>"))

    def progress(self) -> None:
        """Progress the worker and complete finished requests' futures until it re-arms
        (its fd then wakes the loop when there is more), or, after PROGRESS_ROUNDS busy
        rounds, again on the loop's next turn."""
        self._kicked = False
        w = self.worker
        for _ in range(PROGRESS_ROUNDS):
            w.progress()
            w.run_request_notifier()
            if w.arm():
                break
        else:
            self._kick()
        w.populate_python_futures_pool()

    def _kick(self) -> None:
        """Progress on the loop's next turn (once, however many posts ask for it)."""
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon(self.progress)

    async def endpoint(self, address: bytes):
        """An endpoint to the worker at `address` (cached; error handling off)."""
        ep = self._eps.get(address)
        if ep is None:
            self._on_loop()
            ep = self._ucx.UCXEndpoint.create_from_worker_address(
                self.worker, self._ucx.UCXAddress.create_from_buffer(address), False)
            self._eps[address] = ep
            self._kick()
        return ep

    def drop(self, address: bytes) -> None:
        """Forget the endpoint to `address` (its peer is gone); later calls make a new one."""
        ep = self._eps.pop(address, None)
        if ep is not None:
            try:
                ep.close_blocking(period=10**9, max_attempts=1)
            except Exception:  # the peer is gone either way
                log.debug("ucx endpoint abort failed", exc_info=True)

    def path_to(self, host: str) -> str:
        """The data path UCX can take to a peer on `host`, as configured here."""
        shm = [t for t in self.transports if t in ("sysv", "posix", "cma", "xpmem", "knem")]
        if host == self.host and shm:
            return "shm(" + "+".join(shm) + ")"
        net = [t for t in self.transports if t not in ("self", "sysv", "posix", "cma",
                                                       "xpmem", "knem")]
        return "net(" + "+".join(net or ["none"]) + ")"

    def post_recv(self, buffer, tag: int) -> asyncio.Future:
        """Post a receive into `buffer` now; a future completing when the bytes are there
        (or failing with the UCX error). No task per operation: ucxx's own future."""
        self._posted()
        return _future(self.worker.tag_recv(self._Array(buffer), self._Tag(tag)), buffer)

    def post_send(self, ep, buffer, tag: int) -> asyncio.Future:
        """Post a send of `buffer` now; a future completing when UCX is done with it."""
        self._posted()
        return _future(ep.tag_send(self._Array(buffer), self._Tag(tag)), buffer)

    def _posted(self) -> None:
        """Before a post: on the loop's thread; progress after it; keep ucxx's pool of
        futures stocked (a burst of posts in one turn would otherwise run it dry)."""
        self._on_loop()
        self._kick()
        self._posts += 1
        if self._posts % FUTURE_REFILL_EVERY == 0:
            self.worker.populate_python_futures_pool()

    def _on_loop(self) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError("ucx: a post off the event loop that progresses the worker "
                               "(use loop.call_soon_threadsafe)")

    async def drain(self, tag: int) -> None:
        """Complete a receive posted on `tag` with one byte from ourselves (fence)."""
        ep = await self.endpoint(self.address)
        await self.post_send(ep, bytearray(1), tag)


def _future(req, buffer) -> asyncio.Future:
    """The request's asyncio future (completed by `UcxRuntime.progress`).

    Safety invariant: the request and its buffer stay referenced until the
    request completes (UCX reads or writes that memory until then; ucxx's request
    object does not keep the buffer alive). An error nobody awaits is retrieved.
    """
    fut = req.future
    fut.add_done_callback(lambda f, _keep=(req, buffer): f.cancelled() or f.exception())
    return fut


def _transports(info: str) -> list[str]:
    names = []
    for line in info.splitlines():
        if "component" in line and ":" in line and "md " not in line:
            name = line.rsplit(":", 1)[1].strip()
            if name and name not in names:
                names.append(name)
    return names


Handler = Callable[[int, str, int, dict | None], Awaitable[None] | None]


class Mailbox:
    """Receives control messages on one tag and hands them, in order, to `handler`.

    handler(kind, transfer_id, nonce, body) runs on the event loop; it must not
    block (long work goes to tasks). A malformed message is logged and dropped.
    """

    def __init__(self, rt: UcxRuntime, tag: int, handler: Handler, name: str,
                 wants_body: Callable[[int, str, int], bool] | None = None):
        """wants_body(kind, transfer_id, nonce): False for a message whose out-of-line
        body is not worth memory or waiting for (a sender that never said HELLO, a COMMIT
        for no pending transfer); that body is taken off the wire by a 1-byte receive
        and the handler gets body None."""
        self.rt, self.tag, self.handler, self.name = rt, tag, handler, name
        self.wants_body = wants_body
        self._task: asyncio.Task | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stopping = True
        msg, _ = wire.encode(wire.STOP, "", 0)
        ep = await self.rt.endpoint(self.rt.address)
        await asyncio.wait([self.rt.post_send(ep, msg, self.tag)], timeout=5)
        try:
            async with asyncio.timeout(5):
                await asyncio.shield(self._task)
        except (TimeoutError, asyncio.CancelledError):
            self._task.cancel()
        self._task = None

    async def _run(self) -> None:
        # A ring of posted buffers: UCX matches messages of one tag to posted
        # receives in posting order, so a burst lands in one wake-up, in order.
        ring = collections.deque()
        for _ in range(RING):
            buf = bytearray(wire.MESSAGE_BUFFER_BYTES)
            ring.append((buf, self.rt.post_recv(buf, self.tag)))
        while True:
            buf, fut = ring.popleft()
            try:
                await fut
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - e.g. a message larger than the buffer (truncated)
                log.warning("%s: dropped a message that could not be received: %r", self.name, e)
                ring.append((buf, self.rt.post_recv(buf, self.tag)))  # the mailbox keeps receiving
                continue
            view = memoryview(buf)
            try:
                kind, tid, nonce, body_len, oob = wire.decode_head(view)
                if kind == wire.STOP and self._stopping:
                    return
                if oob and self.wants_body is not None and not self.wants_body(kind, tid, nonce):
                    got = self.rt.post_recv(bytearray(1), oob)  # completes truncated: discarded
                    got.add_done_callback(lambda f: f.cancelled() or f.exception())
                    obj = None
                elif oob:
                    body = bytearray(body_len)
                    got = self.rt.post_recv(body, oob)
                    await asyncio.wait([got], timeout=OOB_TIMEOUT_S)  # never cancel it
                    if not got.done():
                        await self.rt.drain(oob)
                        raise asyncio.TimeoutError(f"body of {tid} not sent in {OOB_TIMEOUT_S} s")
                    got.result()
                    obj = wire.json_body(bytes(body))
                else:
                    obj = wire.json_body(wire.inline_body(view, tid, body_len))
            except (wire.ProtocolError, asyncio.TimeoutError, Exception) as e:  # noqa: BLE001
                log.warning("%s: dropped a control message: %s", self.name, e)
                continue
            finally:
                ring.append((buf, self.rt.post_recv(buf, self.tag)))
            try:
                res = self.handler(kind, tid, nonce, obj)
                if asyncio.iscoroutine(res):
                    await res
            except Exception:  # one bad message must not stop the mailbox
                log.exception("%s: handler of %s for %s failed", self.name,
                              wire.KIND_NAMES.get(kind), tid)


def post_control(rt: UcxRuntime, ep, to_tag: int, kind: int, transfer_id: str, nonce: int,
                 obj: dict | None, oob_counter: Callable[[], int]) -> list[asyncio.Future]:
    """Post one control message (its body out of line when large); its send futures.

    Messages posted on one endpoint and tag are matched in posting order, so a
    caller that does not wait still keeps the protocol's order.
    """
    msg, body = wire.encode(kind, transfer_id, nonce, obj)
    if not body:
        return [rt.post_send(ep, msg, to_tag)]
    oob = wire.tag(wire.BODY, nonce, oob_counter())
    return [rt.post_send(ep, wire.with_oob_tag(msg, oob), to_tag), rt.post_send(ep, body, oob)]


async def send_control(rt: UcxRuntime, ep, to_tag: int, kind: int, transfer_id: str, nonce: int,
                       obj: dict | None, oob_counter: Callable[[], int],
                       timeout_s: float) -> None:
    """Send one control message and wait (timeout_s) until UCX is done with it. The worker
    is progressed at once: the message leaves now, not after the loop's other ready
    callbacks (the token's COMMIT waited 0.15-0.5 ms for them behind the prefill's wake-up)."""
    futs = post_control(rt, ep, to_tag, kind, transfer_id, nonce, obj, oob_counter)
    rt.progress()
    done, pending = await asyncio.wait(futs, timeout=timeout_s)  # never cancels ucxx's futures
    if pending:
        raise TimeoutError(f"{wire.KIND_NAMES[kind]} for {transfer_id} not delivered in "
                           f"{timeout_s} s")
    for f in done:
        f.result()


async def fence_receives(rt: UcxRuntime, posted: list[tuple[int, asyncio.Future, bool]], timeout_s: float,
                         grace_s: float, what: str) -> int:
    """Until every receive of `posted` ((tag, future, into staging)) completed: one into the
    cache by itself within `timeout_s`, else drained (`UcxRuntime.drain`); one into a
    staging buffer gets no wait of its own (no byte of it reaches the cache once its
    transfer ended): drained at once when nothing else is waited for, else with the rest.
    Returns how many were drained."""
    waiting = [f for _, f, staging in posted if not f.done() and not staging]
    if waiting:
        await asyncio.wait(waiting, timeout=timeout_s)
    stuck = [(t, f) for t, f, _ in posted if not f.done()]
    if not stuck:
        return 0
    for t, _ in stuck:
        await rt.drain(t)
    _, still = await asyncio.wait([f for _, f in stuck], timeout=grace_s)
    if still:  # cannot happen unless UCX lost our own message; say so loudly
        log.error("fence of %s: %d receives still posted after drain", what, len(still))
    log.info("fence of %s drained %d posted receives", what, len(stuck))
    return len(stuck)


class Landing:
    """Counts a chunk's completed pieces; runs `then` once, when the last one completes."""

    __slots__ = ("left", "then")

    def __init__(self, pieces: int, then):
        self.left, self.then = pieces, then

    def piece_done(self, _fut) -> None:
        self.left -= 1
        if self.left == 0:
            try:
                self.then()
            except Exception:  # a bug here must not vanish in a callback
                log.exception("ucx: landing a chunk failed")
