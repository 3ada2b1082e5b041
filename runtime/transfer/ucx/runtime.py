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

Messages nobody receives. A message whose tag matches no posted receive waits in UCX's
unexpected queue until one is posted: for a legitimate piece that is a moment (its
header is on its way through a mailbox), for anything else forever. So the mailboxes
and the transfers register the tags they will receive (`expect_tags`: a kind and the
28 bits after it), and every SWEEP_INTERVAL_S the runtime takes each unexpected message
on a tag nobody registered off the queue (probed, received truncated into one byte) and
counts it (`stats["unexpected"]`). A registered one is left where it is.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading

from . import wire

log = logging.getLogger(f"{__package__}.ucx")

_runtime: UcxRuntime | None = None
FULL_MASK = (1 << 64) - 1
FUTURE_REFILL_EVERY = 32
"""Posts between two refills of ucxx's future pool (it holds 100 and refills below 50)."""
PROGRESS_ROUNDS = 64
"""Progress rounds in one loop callback before it yields to the loop's other work."""
SWEEP_INTERVAL_S = 1.0
"""How often the unexpected queue is swept of messages on tags nobody registered."""
SWEEP_MAX = 4096
"""Most messages one sweep drains (the next sweep takes the rest)."""


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
        self._Array, self._Tag, self._Mask, self._ucx = Array, Tag, ucx.UCXXTagMask, ucx
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
        self._expected: collections.Counter[tuple[int, int]] = collections.Counter()
        self.stats = {"unexpected": 0}
        """Messages the sweeps drained (on a tag nobody registered)."""
        self.exporter: object | None = None
        """The transfer object that reports this runtime's stats (the first to ask)."""
        self._sweep = loop.call_later(SWEEP_INTERVAL_S, self.sweep)
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

    @property
    def endpoints(self) -> int:
        """Endpoints this process holds (to peers, and one to itself)."""
        return len(self._eps)

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

    def expect_tags(self, kind: int, bits: int, count: int = 1) -> None:
        """Messages on tags of `kind` with these 28 `bits` will be received (a mailbox's
        nonce, a transfer's tag bits): sweeps leave them queued. `count` -1 takes one back."""
        key = (kind, bits)
        self._expected[key] += count
        if self._expected[key] <= 0:
            del self._expected[key]

    def expected(self, t: int) -> bool:
        """Does somebody receive on tag `t` (its kind and 28 bits registered)?"""
        return wire.tag_parts(t)[:2] in self._expected

    def sweep(self) -> int:
        """Drain the unexpected messages on tags nobody expects; returns how many. Per tag
        kind, oldest first, up to the first one somebody expects (UCX shows no further)."""
        self._sweep = self.loop.call_later(SWEEP_INTERVAL_S, self.sweep)
        drained = 0
        try:
            for kind in range(16):
                while drained < SWEEP_MAX:
                    seen = self.worker.tag_probe(self._Tag(kind << 60), self._Mask(0xF << 60), False)
                    if not seen.matched or self.expected(seen.sender_tag.value):
                        break
                    taken = self.worker.tag_probe(seen.sender_tag, self._Mask(FULL_MASK), True)
                    if not taken.matched:
                        break
                    sink = bytearray(1)  # completes truncated (its error retrieved by _future)
                    _future(self.worker.tag_recv_with_handle(self._Array(sink), taken), sink)
                    drained += 1
        except Exception:  # a sweep must never stop the next one
            log.exception("ucx: sweeping the unexpected queue failed")
        if drained:
            self.stats["unexpected"] += drained
            log.info("ucx: drained %d unexpected messages (tags nobody receives)", drained)
            self._kick()
        return drained

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


def runtime_samples(rt: UcxRuntime | None, owner: object) -> list[tuple[str, dict, float]]:
    """The runtime's own figures, reported by one transfer object per process: the messages
    its sweeps drained, and the endpoints it holds (one per peer process that proved itself)."""
    if rt is None or rt.exporter is not owner:
        return []
    return [("pd_dataplane_rejected_total", {"backend": "ucx", "side": "runtime", "reason": "unexpected"},
             rt.stats["unexpected"]), ("pd_dataplane_endpoints", {"backend": "ucx"}, rt.endpoints)]
