"""The design's floor for issue 21's first target, measured in bench/handoff.py's run: the
hops of a disaggregated hand-off with no work in them, on this machine's cores.

Four skeleton processes (bench/_spawned.py) and a redis-server, laid out as the local
cluster is, with the libraries pdserve uses (grpc.aio on loopback, ucxx through pdserve's
own runtime, Redis with Lua compare-and-sets) and none of its work: no spans, no
signatures, no checks, no model; bytes in, bytes out. Each prompt's compute is the same
calibrated GIL-free burst (sha256 over 16 KiB blocks) on a thread of its own, in whichever
process computes it:

    colocated      client -> router -> decode Generate: compute, token 0 -> router -> client
    disaggregated  client -> router -> prefill Prefill (job now; the grant after D's
                   Reserve, on the same call) and decode Reserve (posts the receive);
                   then directory Reserve (a Lua script) and decode DecodeStream;
                   prefill: compute, one UCX message (the prompt's K/V bytes) -> decode:
                   a digest, directory Publish (a Lua compare-and-set) -> token 0 on the
                   DecodeStream -> router -> client; after the last token, directory Release

That is the transaction's shape (reserve, transfer, validate, publish, release) with the
fewest calls: no seal, no Begin. Options add what pdserve's contract or its implementation
adds per hop: `tls` (every call over mutual TLS), `nonce` (the decode consumes the
capability's nonce in Redis through the directory as its stream opens: the contract's
replay and revocation check), `pool` and `read` (the directory's store calls on a thread
pool with a synchronous client, and a record read before each script, as
kv_directory/server.py does), `engine` (the compute is pdserve's own engine on a preset
model instead of the burst: its kernels release the GIL, the Python between them holds it,
as in a worker whose event loop serves the hand-off beside it), `watch` (the router's
record call stays open and the directory answers the publication on it; the decode's
token 0 leaves once validated and the router sends it on at the directory's word). Its overhead
(disaggregated - colocated median TTFT, pairs alternating as in the cluster run) is what
the hops alone cost here, waking one process after another on shared cores. Where it is
above the target, the target is out of reach on this machine at this design's number of
hops, whatever pdserve's handlers do; where it is below, the rest of pdserve's overhead is
pdserve's own work per hop (spans, signatures, checks, its handlers). `python
bench/_handoff_floor.py` alternates the variants in one sitting (JSON lines).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import hashlib
import itertools
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import redis
import redis.asyncio as aioredis
import xxhash

SERVICE = "floor.v1.Node"
TOKEN = b"\x00\x00\x00\x07"
LUA_RESERVE = "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end redis.call('SET', KEYS[1], 'R') return 1"
LUA_NONCE = "return redis.call('SET', KEYS[1], 1, 'NX', 'PX', 60000) and 1 or 0"
LUA_MOVE = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end redis.call('SET', KEYS[1], ARGV[2]) return 1"
SCRIPTS = {"reserve": LUA_RESERVE, "move": LUA_MOVE, "nonce": LUA_NONCE}
DIRECTORY_METHODS = ("Reserve", "Publish", "Release", "Nonce")
ENGINE_PROMPT_TOKENS = 16
"""Variant e's prompt: bench/handoff.py's default (issue 21's short prompt)."""


_BLOCK = bytes(16384)


def _burst(iterations: int) -> None:
    """Single-threaded work that releases the GIL, as the engine's kernels do."""
    for _ in range(iterations):
        hashlib.sha256(_BLOCK)


class Node:
    """One skeleton process (a Spawned namespace): `role` is router, prefill, decode or
    directory. `serve` starts its gRPC server (and UCX runtime); `connect` its channels."""

    def __init__(self, role: str):
        sys.stdout.flush()
        os.dup2(2, 1)  # UCX's teardown warnings would land in the bench's JSON lines
        self.role = role
        self._compute = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compute")
        self._iterations = {"prompt": 0, "step": 0}
        self._stubs: dict[str, object] = {}
        self._published: dict[int, asyncio.Future] = {}
        self._validated: dict[int, asyncio.Future] = {}  # variant w: the decode's token 0 may leave
        self._watched: dict[bytes, asyncio.Future] = {}  # variant w: the directory's publications
        self._served: collections.Counter[str] = collections.Counter()  # hand-off calls of the variants' shapes
        self._tasks: set[asyncio.Task] = set()
        self._server: grpc.aio.Server | None = None
        self._redis = None
        self._engine: _EnginePrompt | None = None
        self._ucx = None
        self._ep = None

    async def serve(self, compute_ms: float = 0.0, step_ms: float = 0.0, kv_bytes: int = 4096,
                    redis_port: int = 0, tls_dir: str = "", pool: bool = False, read: bool = False,
                    nonce: bool = False, merged: bool = False, sync: bool = False, engine: str = "",
                    one: bool = False, watch: bool = False) -> dict:
        self._kv_bytes, self._tls, self._nonce = kv_bytes, _tls_files(tls_dir, self.role), nonce or merged
        self._merged, self._one, self._watch = merged, one, watch
        assert not (watch and (sync or one or merged)), "variant w runs with the router's record on grpc.aio"
        if engine and self.role in ("prefill", "decode"):
            self._engine = _EnginePrompt(engine)
        for name, ms in (("prompt", compute_ms), ("step", step_ms)):  # the engine computes prompts itself
            busy = ms > 0 and not (name == "prompt" and self._engine is not None)
            self._iterations[name] = _calibrate(ms) if busy else 0
        prefix = "sync" if sync and self.role == "directory" else "dir"
        handlers = {
            "router": {"Generate": grpc.unary_stream_rpc_method_handler(self.router_generate)},
            "prefill": {"Prefill": grpc.stream_unary_rpc_method_handler(self.prefill)},
            "decode": {"Generate": grpc.unary_stream_rpc_method_handler(self.decode_generate),
                       "Reserve": grpc.unary_unary_rpc_method_handler(self.decode_reserve),
                       "DecodeStream": grpc.unary_stream_rpc_method_handler(self.decode_stream),
                       "Handoff": grpc.stream_stream_rpc_method_handler(self.decode_handoff)},
            "directory": {**{name: grpc.unary_unary_rpc_method_handler(getattr(self, f"{prefix}_{name.lower()}"))
                             for name in DIRECTORY_METHODS},
                          "ReserveWatch": grpc.unary_stream_rpc_method_handler(self.dir_reserve_watch)},
        }[self.role]
        if self.role == "directory":
            await self._store(redis_port, sync, pool, read)
        self._server = (_SyncServer(grpc.server(concurrent.futures.ThreadPoolExecutor(16))) if prefix == "sync"
                        else grpc.aio.server())
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        port = (self._server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
            [(self._tls[2], self._tls[1])], root_certificates=self._tls[0], require_client_auth=True))
            if self._tls else self._server.add_insecure_port("127.0.0.1:0"))
        await self._server.start()
        address = b""
        if self.role in ("prefill", "decode"):
            from services.transfer import ucx_runtime
            self._ucx = ucx_runtime.runtime()
            address = self._ucx.address
        return {"port": port, "ucx": address, "iterations": self._iterations,
                "engine": self._engine.engine.name if self._engine is not None else ""}

    async def connect(self, ports: dict[str, int], decode_ucx: bytes = b"") -> None:
        for role, port in ports.items():
            ch = (grpc.aio.secure_channel(f"127.0.0.1:{port}", _channel_credentials(self._tls)) if self._tls
                  else grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
            await ch.channel_ready()
            self._stubs[role] = ch
        if decode_ucx and self._ucx is not None:
            self._ep = await self._ucx.endpoint(decode_ucx)

    async def _store(self, port: int, sync: bool, pool: bool, read: bool) -> None:
        """The directory's scripts: `self._slua` called inline by the thread-pool server's
        handlers (sync), else `self._lua` awaited by the event loop's, run on a thread pool
        with a synchronous client (pool) or by an asyncio client; with `read`, after a read
        of the record (kv_directory/server.py: lookup, then call)."""
        if sync:
            self._sync = redis.Redis(host="127.0.0.1", port=port)
            self._slua = {name: self._sync.register_script(src) for name, src in SCRIPTS.items()}
        elif pool:
            self._pool = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="store")
            self._sync = redis.Redis(host="127.0.0.1", port=port)
            self._lua = {name: self._pooled(self._sync.register_script(src), read) for name, src in SCRIPTS.items()}
        else:
            self._redis = aioredis.Redis(host="127.0.0.1", port=port)
            self._lua = {name: self._read_first(self._redis.register_script(src)) if read else
                         self._redis.register_script(src) for name, src in SCRIPTS.items()}
            await self._redis.ping()

    def _pooled(self, script, read: bool):
        def job(keys, args):
            if read:  # the record read before the script (kv_directory/server.py: lookup, then call)
                self._sync.get(keys[0])
            return script(keys=keys, args=args)

        async def call(keys, args=()):
            return await asyncio.get_running_loop().run_in_executor(self._pool, job, keys, list(args))
        return call

    def _read_first(self, script):
        async def call(keys, args=()):
            await self._redis.get(keys[0])
            return await script(keys=keys, args=args)
        return call

    def _call(self, role: str, method: str, kind: str = "unary_unary"):
        return getattr(self._stubs[role], kind)(f"/{SERVICE}/{method}")

    async def _run(self, what: str) -> None:
        if what == "prompt" and self._engine is not None:
            await asyncio.get_running_loop().run_in_executor(self._compute, self._engine.prefill)
            return
        n = self._iterations[what]
        if n:
            await asyncio.get_running_loop().run_in_executor(self._compute, _burst, n)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- router --------------------------------------------------------------------
    async def router_generate(self, request: bytes, context):
        mode, tid = request[:1], request[1:9]
        if mode == b"C":
            async for msg in self._call("decode", "Generate", "unary_stream")(request):
                yield msg
            return
        prefill = self._call("prefill", "Prefill", "stream_unary")()
        await prefill.write(request)  # the job: P computes meanwhile
        if self._one:  # the Reserve and the stream as one call: its first answer is the reservation
            handoff = self._call("decode", "Handoff", "stream_stream")()
            await handoff.write(tid)
            await handoff.read()
        else:
            await self._call("decode", "Reserve")(tid)
        await prefill.write(tid)  # the grant
        await prefill.done_writing()
        published = None
        if self._watch:  # the record's call stays open and brings the publication
            published = asyncio.ensure_future(self._publication_of(tid))
        elif not self._merged:
            self._spawn(self._call("directory", "Reserve")(tid))
        if self._one:
            await handoff.write(tid)  # the capability's copy: the decode reads no more
            while (msg := await handoff.read()) is not grpc.aio.EOF:
                yield msg
        else:
            async for msg in self._call("decode", "DecodeStream", "unary_stream")(tid):
                if published is not None:  # token 0 came validated, not yet published: wait for it
                    await published
                    published = None
                yield msg
        await prefill

    async def _publication_of(self, tid: bytes) -> None:
        """Variant w: the directory's record made, then its publication, on one call."""
        async for msg in self._call("directory", "ReserveWatch", "unary_stream")(tid):
            if msg == b"published":
                return
        raise RuntimeError("the record's call ended before its publication")

    # ---- prefill -------------------------------------------------------------------
    async def prefill(self, requests, context) -> bytes:
        it = requests.__aiter__()
        job = await it.__anext__()
        computing = asyncio.ensure_future(self._run("prompt"))
        await it.__anext__()  # the grant
        await computing
        await self._ucx.post_send(self._ep, job[1:9] + bytes(self._kv_bytes), 7)
        return b"done"

    # ---- decode --------------------------------------------------------------------
    async def decode_generate(self, request: bytes, context):
        await self._run("prompt")
        yield TOKEN
        await self._run("step")
        yield TOKEN

    async def decode_reserve(self, tid: bytes, context) -> bytes:
        self._served["Reserve"] += 1
        buf = bytearray(8 + self._kv_bytes)
        landed = self._ucx.post_recv(buf, 7)
        key = struct.unpack("<Q", tid)[0]
        published = self._published[key] = asyncio.get_running_loop().create_future()
        validated = self._validated[key] = asyncio.get_running_loop().create_future()

        async def receive() -> None:
            await landed
            xxhash.xxh3_128_hexdigest(buf)
            validated.set_result(True)
            ok = await self._call("directory", "Publish")(bytes(buf[:8]))
            published.set_result(ok)
        self._spawn(receive())
        return b"reserved"

    async def decode_handoff(self, requests, context):
        """Variant o: Reserve, then the DecodeStream, on one bidirectional call."""
        self._served["Handoff"] += 1
        it = requests.__aiter__()
        tid = await it.__anext__()
        yield await self.decode_reserve(tid, context)
        await it.__anext__()  # the router's copy of the capability
        async for msg in self.decode_stream(tid, context):
            yield msg

    async def decode_stream(self, tid: bytes, context):
        self._served["DecodeStream"] += 1
        key = struct.unpack("<Q", tid)[0]
        if self._nonce:  # the capability's nonce consumed in the directory as the stream opens
            await self._call("directory", "Nonce")(tid)
        if self._watch:  # token 0 once validated: the router waits for the directory's word
            await self._validated[key]
            yield TOKEN
        await self._published[key]
        if not self._watch:
            yield TOKEN
        await self._run("step")
        yield TOKEN
        del self._published[key], self._validated[key]
        self._spawn(self._call("directory", "Release")(tid))

    # ---- directory -----------------------------------------------------------------
    async def dir_reserve(self, tid: bytes, context) -> bytes:
        return b"%d" % await self._lua["reserve"](keys=[b"txn:" + tid])

    async def dir_publish(self, tid: bytes, context) -> bytes:
        for _ in range(100):  # the record is the router's, made beside the stream: wait for it
            if await self._lua["move"](keys=[b"txn:" + tid], args=["R", "P"]):
                if self._watch:
                    self._watch_of(tid).set_result(True)
                return b"1"
            await asyncio.sleep(0.0005)
        return b"0"

    def _watch_of(self, tid: bytes) -> asyncio.Future:
        if tid not in self._watched:
            self._watched[tid] = asyncio.get_running_loop().create_future()
        return self._watched[tid]

    async def dir_reserve_watch(self, tid: bytes, context):
        """Variant w: the router's Reserve, its call held open until the Publish lands here."""
        self._served["ReserveWatch"] += 1
        yield b"%d" % await self._lua["reserve"](keys=[b"txn:" + tid])
        await self._watch_of(tid)
        del self._watched[tid]
        yield b"published"

    async def dir_nonce(self, tid: bytes, context) -> bytes:
        if self._merged:  # the record made in the same call (one script each here; one job)
            await self._lua["reserve"](keys=[b"txn:" + tid])
        return b"%d" % await self._lua["nonce"](keys=[b"nonce:" + tid])

    async def dir_release(self, tid: bytes, context) -> bytes:
        return b"%d" % await self._lua["move"](keys=[b"txn:" + tid], args=["P", "X"])

    def sync_reserve(self, tid: bytes, context) -> bytes:
        return b"%d" % self._slua["reserve"](keys=[b"txn:" + tid])

    def sync_publish(self, tid: bytes, context) -> bytes:
        for _ in range(100):
            if self._slua["move"](keys=[b"txn:" + tid], args=["R", "P"]):
                return b"1"
            time.sleep(0.0005)
        return b"0"

    def sync_nonce(self, tid: bytes, context) -> bytes:
        if self._merged:
            self._slua["reserve"](keys=[b"txn:" + tid])
        return b"%d" % self._slua["nonce"](keys=[b"nonce:" + tid])

    def sync_release(self, tid: bytes, context) -> bytes:
        return b"%d" % self._slua["move"](keys=[b"txn:" + tid], args=["P", "X"])

    def calls(self) -> dict[str, int]:
        return dict(self._served)

    async def at_exit(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.stop(0)
        if self._redis is not None:
            await self._redis.aclose()
        self._compute.shutdown(wait=False)


class _EnginePrompt:
    """The compute as pdserve's own engine does it (variant e): a fresh random prompt's
    prefill and token 0 on the preset model, as the cluster's workers run it (float32,
    one torch thread); its blocks freed at once. The exact kernels release the GIL
    (services/kernels/exact.cpp), the Python between them holds it, as in a worker while
    its event loop serves the hand-off."""

    def __init__(self, preset: str):
        from services.engine.config import EngineConfig  # torch: only where variant e runs
        from services.engine.engine import Engine
        self.engine = Engine.from_preset(preset, cfg=EngineConfig(torch_threads=1, dtype="float32"))
        self.rng = random.Random(0)
        for _ in range(3):  # warm: the first forwards allocate
            self.prefill()

    def prefill(self) -> int:
        vocab = self.engine.model_cfg.vocab_size
        seq = self.engine.add_request("floor", [self.rng.randrange(3, vocab) for _ in range(ENGINE_PROMPT_TOKENS)],
                                      2, reuse_prefix=False)
        try:
            return self.engine.prefill(seq)
        finally:
            self.engine.free(seq)


class _SyncServer:
    """grpc.server behind grpc.aio.server's start/stop (awaitable) for `Node`."""

    def __init__(self, server):
        self._s = server

    def __getattr__(self, name):
        return getattr(self._s, name)

    async def start(self) -> None:
        self._s.start()

    async def stop(self, grace) -> None:
        self._s.stop(grace)


def overheads(ttft: dict[str, list[float]]) -> tuple[dict[str, float], float, float]:
    """From TTFTs (ms) by mode, pairs in order: the median per mode, the overhead (median
    disaggregated - median colocated) and the median of the pairs' differences."""
    med = {m: statistics.median(ttft[m]) for m in ("colocated", "disaggregated")}
    paired = statistics.median(d - c for d, c in zip(ttft["disaggregated"], ttft["colocated"], strict=True))
    return med, med["disaggregated"] - med["colocated"], paired


def cpu_s(pid: int) -> float:
    """CPU seconds every thread of process `pid` ran so far, from the scheduler's nanosecond
    counters (/proc/PID/task/*/schedstat: psutil's cpu_times tick in 10 ms, too coarse for
    one call's cost); threads that ended meanwhile are not counted."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended while we read
    return total / 1e9


def _records(port: int, expected: int, wait_s: float = 5.0) -> dict[str, int]:
    """The hand-offs' records and nonces in Redis by state (the Release follows the last
    token: waits up to `wait_s` for `expected` records released): what the floor did."""
    with redis.Redis(host="127.0.0.1", port=port) as r:
        deadline = time.monotonic() + wait_s
        while True:
            states = collections.Counter(r.get(k).decode() for k in r.scan_iter("txn:*"))
            if states.get("X", 0) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return {**states, "nonces": sum(1 for _ in r.scan_iter("nonce:*"))}


def _tls_files(tls_dir: str, name: str) -> tuple[bytes, bytes, bytes] | None:
    """(CA, certificate, key) of `name` in `tls_dir` (made by `measure`), None for plaintext."""
    if not tls_dir:
        return None
    d = Path(tls_dir)
    return (d / "ca.crt").read_bytes(), (d / f"{name}.crt").read_bytes(), (d / f"{name}.key").read_bytes()


def _channel_credentials(tls: tuple[bytes, bytes, bytes]) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=tls[0], private_key=tls[2], certificate_chain=tls[1])


def _calibrate(ms: float) -> int:
    """Iterations of `_burst` that take `ms` on an idle core here (the fastest of five)."""
    _burst(50)
    best = min(_timed(200) for _ in range(5))
    return max(1, round(200 * ms / (best * 1000)))


def _timed(n: int) -> float:
    t = time.perf_counter()
    _burst(n)
    return time.perf_counter() - t


def measure(requests: int, warmup: int, compute_ms: float, step_ms: float, kv_bytes: int,
            tls: bool = False, pool: bool = False, read: bool = False, nonce: bool = False,
            merged: bool = False, sync: bool = False, engine: str = "", one: bool = False,
            watch: bool = False) -> dict:
    """Start the skeleton, serve warmup + requests alternating pairs, stop it: each TTFT
    per mode, as bench/handoff.py's cluster run takes them. `tls`: every call over mutual
    TLS (pdserve's certificates: services/security/pki.py), else plaintext."""
    from bench._spawned import Spawned
    from services.cluster.redis_proc import find_redis_server, free_port

    state = tempfile.mkdtemp(prefix="pdserve-floor-")
    tls_dir = ""
    if tls:
        from services.security.pki import Identity, LocalCA
        ca = LocalCA(Path(state) / "tls")
        for role in ("directory", "decode", "prefill", "router", "client"):
            ca.issue(Identity(role, role))
        tls_dir = str(ca.dir)
    rport = free_port()
    redis_server = subprocess.Popen([find_redis_server(), "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", state], stdout=subprocess.DEVNULL)
    nodes = {role: Spawned(f"floor-{role}", "bench._handoff_floor:Node", role=role)
             for role in ("directory", "decode", "prefill", "router")}
    try:
        info = {role: n.call("serve", compute_ms=compute_ms, step_ms=step_ms, kv_bytes=kv_bytes,
                             redis_port=rport, tls_dir=tls_dir, pool=pool, read=read,
                             nonce=nonce, merged=merged, sync=sync, engine=engine, one=one, watch=watch)
                for role, n in nodes.items()}
        ports = {role: i["port"] for role, i in info.items()}
        nodes["decode"].call("connect", ports={"directory": ports["directory"]})
        nodes["prefill"].call("connect", ports={}, decode_ucx=info["decode"]["ucx"])
        nodes["router"].call("connect", ports={r: ports[r] for r in ("decode", "prefill", "directory")})
        ttft: dict[str, list[float]] = {"C": [], "D": []}
        target = f"127.0.0.1:{ports['router']}"
        with (grpc.secure_channel(target, _channel_credentials(_tls_files(tls_dir, "client"))) if tls
              else grpc.insecure_channel(target)) as ch:
            generate = ch.unary_stream(f"/{SERVICE}/Generate")
            ids = itertools.count()

            def one(mode: bytes) -> float:
                t = time.perf_counter()
                stream = generate(mode + struct.pack("<Q", next(ids)) + bytes(64), timeout=30)
                next(stream)
                ms = (time.perf_counter() - t) * 1000
                for _ in stream:
                    pass
                return ms
            for i in range(warmup + requests):
                for mode in (b"C", b"D") if i % 2 else (b"D", b"C"):
                    ms = one(mode)
                    if i >= warmup:
                        ttft[mode.decode()].append(ms)
            pids = {**{role: n.proc.pid for role, n in nodes.items()}, "redis": redis_server.pid}
            cpu = {}
            for mode, name in ((b"C", "colocated"), (b"D", "disaggregated")):  # each mode in a row
                before = {role: cpu_s(pid) for role, pid in pids.items()}
                for _ in range(requests):
                    one(mode)
                cpu[name] = {role: (cpu_s(pid) - before[role]) * 1000 / requests for role, pid in pids.items()}
        return {"colocated": ttft["C"], "disaggregated": ttft["D"], "cpu": cpu,
                "iterations": info["prefill"]["iterations"], "engine": info["prefill"]["engine"],
                "records": _records(rport, warmup + 2 * requests), "decode_calls": nodes["decode"].call("calls"),
                "directory_calls": nodes["directory"].call("calls")}
    finally:
        for n in nodes.values():
            n.close()
        redis_server.terminate()
        redis_server.wait(10)
        shutil.rmtree(Path(state), ignore_errors=True)


def main() -> None:
    """What each of pdserve's design choices adds to the floor, alternating variants in one
    sitting: t = mutual TLS, p = the directory's store calls on a thread pool with a
    synchronous client (as kv_directory/server.py), r = a record read before each script
    (its lookup before a transition), n = the decode's nonce call to the directory as its
    stream opens, m = that call also makes the directory's record, the router making none
    (the merge issue 21 suggests), s = the directory on grpc's thread-pool server with
    synchronous handlers calling Redis inline (no event loop, no executor hop), e = the
    compute is pdserve's engine (--engine preset, a fresh 16-token prompt each) instead of
    the GIL-free burst, o = the decode's Reserve and its DecodeStream as one bidirectional
    call (the reservation its first answer, the router's copy of the capability its second
    request), w = the router's record call held open until the directory has the decode's
    Publish, which it answers on that call, while the decode sends token 0 as soon as it
    validated: token 0 leaves the router on the directory's word, not the decode's (one
    hop fewer after the publication). JSON lines."""
    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",t,tp,tr,tn,tprn", help="comma-separated; '' is the bare floor")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--compute-ms", type=float, default=3.0)
    ap.add_argument("--kv-bytes", type=int, default=8192)
    ap.add_argument("--engine", default="tiny", help="variant e's preset (the cluster's default model)")
    args = ap.parse_args()
    for rnd in range(args.rounds):
        for v in args.variants.split(","):
            r = measure(args.requests, 5, args.compute_ms, 0.3, args.kv_bytes,
                        tls="t" in v, pool="p" in v, read="r" in v, nonce="n" in v,
                        merged="m" in v, sync="s" in v, engine=args.engine if "e" in v else "", one="o" in v,
                        watch="w" in v)
            med, overhead, paired = overheads(r)
            cpu = {m: {k: round(x, 2) for k, x in r["cpu"][m].items()} for m in r["cpu"]}
            print(json.dumps({"bench": "handoff_floor", "round": rnd, "variant": v or "bare", "cpu": cpu,
                              "colocated_ttft_median_ms": round(med["colocated"], 2),
                              "disaggregated_ttft_median_ms": round(med["disaggregated"], 2),
                              "overhead_ms": round(overhead, 2), "overhead_paired_median_ms": round(paired, 2)}),
                  flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
