"""The design floor's skeleton processes (bench/_handoff_floor.py measures with them): one
`Node` per role (router, prefill, decode, directory), spawned by bench/_spawned.py, each a
gRPC server with the hops of a disaggregated hand-off and none of pdserve's work; the
variants' options (TLS, the nonce call, the pool and record reads, the engine's compute,
the decode's own record, one call, the held-open record call) change what each hop does.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hashlib
import os
import random
import struct
import sys
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
"""Variant e's prompt: bench/handoff.py's default (the hand-off target's 16-token prompt)."""


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
        self._kv_bytes, self._tls, self._nonce = kv_bytes, tls_files(tls_dir, self.role), nonce or merged
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
            from runtime.transfer.ucx import runtime as ucx_runtime
            self._ucx = ucx_runtime.runtime()
            address = self._ucx.address
        return {"port": port, "ucx": address, "iterations": self._iterations,
                "engine": self._engine.engine.name if self._engine is not None else ""}

    async def connect(self, ports: dict[str, int], decode_ucx: bytes = b"") -> None:
        for role, port in ports.items():
            ch = (grpc.aio.secure_channel(f"127.0.0.1:{port}", channel_credentials(self._tls)) if self._tls
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
    (runtime/kernels/exact.cpp), the Python between them holds it, as in a worker while
    its event loop serves the hand-off."""

    def __init__(self, preset: str):
        from runtime.engine.config import EngineConfig  # torch: only where variant e runs
        from runtime.engine.engine import Engine
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


def tls_files(tls_dir: str, name: str) -> tuple[bytes, bytes, bytes] | None:
    """(CA, certificate, key) of `name` in `tls_dir` (made by `measure`), None for plaintext."""
    if not tls_dir:
        return None
    d = Path(tls_dir)
    return (d / "ca.crt").read_bytes(), (d / f"{name}.crt").read_bytes(), (d / f"{name}.key").read_bytes()


def channel_credentials(tls: tuple[bytes, bytes, bytes]) -> grpc.ChannelCredentials:
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
