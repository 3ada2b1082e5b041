"""The two processes of bench/transfer.py: a receiver (R) and a sender (S).

Each is a `Peer` in a process of bench/_spawned.py, which runs the parent's
commands (the Peer's methods) on an asyncio loop, so the parent sequences a
transfer as R.expect -> S.send -> R.result while R's loop keeps receiving in the
background.

Both hold a K/V-cache-like tensor of the size under test:

    kv: [layers, 2, blocks, half_block_bytes] uint8   (K = [:, 0], V = [:, 1])

the engine's layout (runtime/engine/kv_cache.py, [L, 2, N, ...]). A chunk
(layer, block_start, block_count) is two contiguous views, K run then V run, as
runtime.transfer.chunks.chunk_views gives for consecutive physical blocks.
S fills its tensor with random bytes; R zeroes its own before every transfer,
so a transfer that moved nothing (or the wrong bytes) cannot match the digest.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import struct
import threading
import time
from concurrent import futures
from dataclasses import dataclass

import torch
import xxhash
from _transfer_exact import ExactFloor
from _transfer_timeline import Stamps

from runtime.transfer import (
    Chunk,
    ChunkArrived,
    ChunkKey,
    Expectation,
    Failed,
    TransferCommit,
    TransferKey,
    Verdict,
    chunk_checksum,
)
from runtime.transfer.chunks import plan_chunks

GRPC_METHOD = "/pdbench.Sink/Put"
GRPC_MAX_MESSAGE_BYTES = 64 << 20
FLOOR_DATA_TAG, FLOOR_ACK_TAG = 0xE << 60, 0xF << 60  # tag kinds pdserve's wire does not use
RAW_HEAD = struct.Struct("!Q")  # payload length, then the payload; the receiver answers one byte


@dataclass(frozen=True)
class Geometry:
    """A synthetic cache: `layers` x `blocks` blocks of `block_bytes` (K + V) per layer."""

    layers: int
    blocks: int
    block_bytes: int
    max_chunk_blocks: int

    @property
    def nbytes(self) -> int:
        return self.layers * self.blocks * self.block_bytes

    def plan(self) -> list[ChunkKey]:
        """Chunk keys as the prefill worker plans them (layer-major, block ranges)."""
        return plan_chunks(self.layers, 0, self.blocks, self.max_chunk_blocks)


def new_cache(g: Geometry) -> torch.Tensor:
    kv = torch.zeros(g.layers, 2, g.blocks, g.block_bytes // 2, dtype=torch.uint8)
    assert kv.numel() == g.nbytes and kv.is_contiguous()
    return kv


def chunk_views(kv: memoryview, g: Geometry, key: ChunkKey) -> list[memoryview]:
    """K run then V run of `key`, slices of `kv` (the cache's bytes, `_flat(new_cache(g))`),
    as the engine's KVCache.byte_views gives them (no copy)."""
    end = key.block_start + key.block_count
    if not (0 <= key.layer < g.layers and 0 <= key.block_start < end <= g.blocks):
        raise KeyError(f"{key} outside the cache")
    half = g.block_bytes // 2
    k = (2 * key.layer * g.blocks + key.block_start) * half
    v = k + g.blocks * half
    return [kv[k:k + key.block_count * half], kv[v:v + key.block_count * half]]


def _flat(t: torch.Tensor) -> memoryview:
    assert t.is_contiguous()
    return memoryview(t.numpy()).cast("B")


def digest(kv: torch.Tensor) -> str:
    """xxh3-128 of the whole cache memory (the bytes-equal check)."""
    return xxhash.xxh3_128(_flat(kv.reshape(-1))).hexdigest()


class Peer(ExactFloor):
    """Commands of either role; the parent decides which it calls."""

    def __init__(self, threads: int = 1):
        torch.set_num_threads(threads)
        self.kv: torch.Tensor | None = None
        self.kv_bytes: memoryview | None = None  # self.kv's memory, as bytes
        self.geometry: Geometry | None = None
        self.receivers: dict[str, object] = {}  # backend name -> KVReceiver
        self.senders: dict[str, object] = {}
        self.pending: dict[str, dict] = {}
        self.grpc_server = self.grpc_channel = None
        self.raw_listener: socket.socket | None = None
        self.raw_conn: socket.socket | None = None
        self.stamps = Stamps()  # bench/_transfer_timeline.py's: off until `timeline("on")`

    # ---- both roles -------------------------------------------------------
    async def alloc(self, geometry: dict, fill_seed: int | None = None) -> str:
        """A fresh cache of `geometry`; random bytes when `fill_seed` is given. Returns its digest."""
        self.kv = self.kv_bytes = None  # free the previous size first
        self.geometry = Geometry(**geometry)
        self.kv = new_cache(self.geometry)
        self.kv_bytes = _flat(self.kv.view(-1))
        if fill_seed is not None:
            gen = torch.Generator().manual_seed(fill_seed)
            flat = self.kv.view(-1)
            flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=gen))
        return digest(self.kv)

    async def zero(self) -> None:
        self.kv.zero_()

    async def digest(self) -> str:
        return digest(self.kv)

    def views_of(self, key: ChunkKey) -> list[memoryview]:
        """Chunk `key`'s K run and V run in this peer's cache."""
        return chunk_views(self.kv_bytes, self.geometry, key)

    # ---- pdserve backends: receiver ------------------------------------------
    async def pd_listen(self, kind: str) -> str:
        from runtime.transfer.factory import make_receiver
        receiver = self.receivers[kind] = make_receiver(kind, host="127.0.0.1",
                                                        name=f"bench-{kind}")
        await receiver.start()
        return receiver.address

    async def pd_expect(self, kind: str, transfer_id: str, key: str = "") -> None:
        """Zero the cache and accept `transfer_id` into it, keyed by `key` (hex: the transfer's
        secret, as the router hands it with Decode.Reserve), outside the timed window."""
        self.kv.zero_()
        kv, g, rec = self.kv_bytes, self.geometry, {"arrived": {}, "state": "pending", "reason": "",
                            "done": asyncio.Event()}
        self.pending[transfer_id] = rec

        def end(state: str, reason: str = "") -> None:
            if rec["state"] == "pending":
                rec["state"], rec["reason"] = state, reason
                rec["done"].set()

        def on_event(ev) -> None:
            if isinstance(ev, ChunkArrived):
                rec["arrived"][ev.key] = ev.checksum
            elif isinstance(ev, Failed):
                end("failed", ev.reason)

        async def on_commit(commit: TransferCommit) -> Verdict:
            # What a decode worker checks before publishing, minus the engine's own digest.
            if rec["arrived"] != {c.key: c.checksum for c in commit.chunks}:
                end("rejected", "arrived chunks or checksums differ from the manifest")
                return Verdict(False, rec["reason"])
            end("published")
            return Verdict(True)

        self.receivers[kind].expect(Expectation(transfer_id, lambda k: chunk_views(kv, g, k),
                                                on_event, on_commit, key=bytes.fromhex(key)))

    async def pd_result(self, kind: str, transfer_id: str, timeout_s: float = 60.0) -> dict:
        """How the transfer ended and the digest of what landed."""
        rec = self.pending.pop(transfer_id)
        async with asyncio.timeout(timeout_s):
            await rec["done"].wait()
        self.receivers[kind].forget(transfer_id)
        await self.receivers[kind].fence(transfer_id)
        return {"state": rec["state"], "reason": rec["reason"], "chunks": len(rec["arrived"]),
                "digest": digest(self.kv)}

    async def pd_stop(self) -> None:
        for receiver in self.receivers.values():
            await receiver.stop()
        self.receivers.clear()

    # ---- pdserve backends: sender ---------------------------------------------
    async def pd_send(self, kind: str, dest: str, transfer_id: str, kv_digest: str, key: str = "",
                      credential: dict | None = None) -> dict:
        """Send every chunk in one `send_many`, each checksummed (keyed: `key`, hex, the
        transfer's secret) as it is taken (like the prefill worker without layer streaming:
        the backend may pack small chunks, and hashes a chunk while the one before it moves;
        the last message may carry the COMMIT), then commit. The transfer is presented (AUTH:
        its key, where replies go) and its plan announced first, outside the timed window, as
        the prefill worker does while it computes (UCX: the AUTH and the batch's header leave).

        Timed from the first checksum to the verdict.
        """
        from runtime.transfer.factory import make_sender
        sender = self.senders.get(kind)
        if sender is None:
            sender = self.senders[kind] = make_sender(kind)
        plan, chunks, secret = self.geometry.plan(), [], bytes.fromhex(key)
        tkey = TransferKey.of(transfer_id, secret)

        def items():
            for k in plan:
                views = chunk_views(self.kv_bytes, self.geometry, k)
                chunks.append(Chunk(k, sum(v.nbytes for v in views), chunk_checksum(tkey, k, views)))
                yield chunks[-1], views
        keys = [(k, k.block_count * self.geometry.block_bytes) for k in plan]
        await sender.present(dest, transfer_id, credential, secret)  # the prefill worker's, while it computes
        await sender.announce(dest, transfer_id, keys)
        t0 = time.perf_counter()
        await sender.send_many(dest, transfer_id, items(), hold_last=True, keys=keys)
        verdict = await sender.commit(dest, TransferCommit(
            transfer_id, f"bench-{transfer_id}", 1, "bench-abi", tuple(chunks), kv_digest, 0))
        elapsed_s = time.perf_counter() - t0
        return {"elapsed_s": elapsed_s, "published": verdict.published, "reason": verdict.reason,
                "chunks": len(chunks)}

    async def pd_close(self) -> None:
        for sender in self.senders.values():
            await sender.close()
        self.senders.clear()

    # ---- ucxx from Python: the floor of any Python UCX hand-off ---------------
    async def floor_address(self) -> str:
        """This process's UCX worker address (the runtime pdserve's ucx backend uses)."""
        from runtime.transfer.ucx.runtime import runtime
        return base64.b64encode(runtime().address).decode()

    async def floor_expect(self, i: int, sender: str, pieces: bool = False) -> None:
        """Zero the cache, post the receives for all of it (one, or one per piece of the
        pdserve plan with `pieces`); when they completed, a 1-byte ack back to `sender`
        (outside the timed window: posted beforehand)."""
        from runtime.transfer.ucx.runtime import runtime
        rt = runtime()
        self.kv.zero_()
        ep = await rt.endpoint(base64.b64decode(sender))
        views = self._floor_views(pieces)
        got = asyncio.gather(*(rt.post_recv(v, _floor_tag(i, k)) for k, v in enumerate(views)))
        got.add_done_callback(lambda f: f.exception() or rt.post_send(ep, bytearray(b"k"), FLOOR_ACK_TAG + i))
        self.pending[f"floor-{i}"] = {"done": got}

    def _floor_views(self, pieces: bool) -> list[memoryview]:
        """The whole cache, or each chunk's K run and V run in plan order (what pdserve sends)."""
        if not pieces:
            return [_flat(self.kv.view(-1))]
        return [v for key in self.geometry.plan() for v in chunk_views(self.kv_bytes, self.geometry, key)]

    async def floor_landed(self, i: int, timeout_s: float = 60.0) -> str:
        rec = self.pending.pop(f"floor-{i}")
        async with asyncio.timeout(timeout_s):
            await rec["done"]
        return digest(self.kv)

    async def floor_send(self, dest: str, i: int, pieces: bool = False) -> dict:
        """The cache as one tagged message (or one per piece), zero copy; timed from the
        first post to the ack."""
        from runtime.transfer.ucx.runtime import runtime
        rt = runtime()
        ep = await rt.endpoint(base64.b64decode(dest))
        ack = rt.post_recv(bytearray(1), FLOOR_ACK_TAG + i)
        views = self._floor_views(pieces)
        t0 = time.perf_counter()
        sent = [rt.post_send(ep, v, _floor_tag(i, k)) for k, v in enumerate(views)]
        await ack
        elapsed_s = time.perf_counter() - t0
        await asyncio.gather(*sent)
        return {"elapsed_s": elapsed_s}

    # ---- gRPC client-stream baseline -----------------------------------------
    async def grpc_listen(self) -> int:
        """A grpcio server whose Put(stream bytes) writes the messages into the cache in order."""
        import grpc

        def put(request_iterator, context):
            flat, off = _flat(self.kv.view(-1)), 0
            for msg in request_iterator:
                flat[off:off + len(msg)] = msg
                off += len(msg)
            return off.to_bytes(8, "big")

        handler = grpc.method_handlers_generic_handler("pdbench.Sink", {
            "Put": grpc.stream_unary_rpc_method_handler(put)})
        opts = [("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES)]
        self.grpc_server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[handler],
                                       options=opts)
        port = self.grpc_server.add_insecure_port("127.0.0.1:0")
        self.grpc_server.start()
        return port

    async def grpc_send(self, port: int, message_bytes: int) -> dict:
        """One Put call streaming the cache as `message_bytes` messages (bytes copies: gRPC
        Python sends `bytes`). Timed from the call to its response."""
        import grpc
        if self.grpc_channel is None:
            opts = [("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES)]
            self.grpc_channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
            grpc.channel_ready_future(self.grpc_channel).result(timeout=30)
        put = self.grpc_channel.stream_unary(GRPC_METHOD)
        flat = _flat(self.kv.view(-1))

        def messages():
            for off in range(0, flat.nbytes, message_bytes):
                yield bytes(flat[off:off + message_bytes])

        def call() -> dict:
            t0 = time.perf_counter()
            got = int.from_bytes(put(messages(), timeout=300), "big")
            return {"elapsed_s": time.perf_counter() - t0, "received_bytes": got}

        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def grpc_stop(self) -> None:
        if self.grpc_channel is not None:
            self.grpc_channel.close()
            self.grpc_channel = None
        if self.grpc_server is not None:
            self.grpc_server.stop(grace=None)
            self.grpc_server = None

    # ---- raw TCP socket baseline -------------------------------------------
    async def raw_listen(self) -> int:
        """Accept one connection; each frame (length, payload) is recv_into'd the cache."""
        lst = self.raw_listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._raw_serve, args=(lst,), daemon=True).start()
        return lst.getsockname()[1]

    def _raw_serve(self, lst: socket.socket) -> None:
        conn, _ = lst.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while True:
                head = _recv_exactly(conn, memoryview(bytearray(RAW_HEAD.size)))
                if head is None:
                    return
                (nbytes,) = RAW_HEAD.unpack(head)
                flat = _flat(self.kv.view(-1))[:nbytes]
                if _recv_exactly(conn, flat) is None:
                    return
                conn.sendall(b"k")

    async def raw_send(self, port: int) -> dict:
        """sendall the cache memory as one frame; timed from the first byte to the ack."""
        if self.raw_conn is None:
            self.raw_conn = socket.create_connection(("127.0.0.1", port))
            self.raw_conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock, flat = self.raw_conn, _flat(self.kv.view(-1))

        def go() -> dict:
            t0 = time.perf_counter()
            sock.sendall(RAW_HEAD.pack(flat.nbytes))
            sock.sendall(flat)
            assert sock.recv(1) == b"k"
            return {"elapsed_s": time.perf_counter() - t0}

        return await asyncio.get_running_loop().run_in_executor(None, go)

    async def raw_stop(self) -> None:
        for s in (self.raw_conn, self.raw_listener):
            if s is not None:
                s.close()
        self.raw_conn = self.raw_listener = None

    # ---- instruments -----------------------------------------------------------
    async def cpu_ns(self) -> int:
        """CPU time of this process so far, every thread (part 1 charges each transfer its
        peers' CPU: the difference around it)."""
        return time.process_time_ns()

    async def timeline(self, action: str) -> list:
        """bench/_transfer_timeline.py's stamps in this process: "on", "take" (the stamps
        since the last take) or "off"."""
        if action == "on":
            self.stamps.on()
        elif action == "off":
            self.stamps.off()
        elif action == "take":
            return self.stamps.take()
        else:
            raise ValueError(f"timeline action {action!r}: on, take or off")
        return []

    async def at_exit(self) -> None:
        """Stop whatever is still open (bench/_spawned.py calls it on the way out)."""
        for stop in (self.pd_close, self.pd_stop, self.grpc_stop, self.raw_stop):
            try:
                await stop()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass


def _floor_tag(i: int, piece: int) -> int:
    return FLOOR_DATA_TAG + (i << 20) + piece


def _recv_exactly(conn: socket.socket, view: memoryview) -> memoryview | None:
    """Fill `view` from `conn` (None when the peer closed first)."""
    off = 0
    while off < view.nbytes:
        n = conn.recv_into(view[off:])
        if n == 0:
            return None
        off += n
    return view
