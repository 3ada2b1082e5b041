"""Harness of the data-plane integration tests (tests/integration/test_transfer*.py):
real processes (multiprocessing spawn, loopback; ucx over shared memory: endpoints
from worker addresses), each running an asyncio loop that executes the test's
commands:

    R   decode side: engines, a receiver; reserves a sequence, expects the
        transfer, and on commit validates (every chunk arrived once with the
        manifest's checksum, kv_digest equal) -> commit_import -> decodes
    S   prefill side: engines, a sender; prefills, sends chunks, commits,
        and continues decoding itself (the reference tokens)
    LS, LR  light sender / receiver without an engine, started per test to be
        killed (SIGKILL) or frozen (SIGSTOP)

The fixtures (`procs`: R and S per backend, module-scoped; `light`; and the
autouse `receiver_clean`: after every test R holds no pending transfer and no
block, and S's credit windows hold no credit) are imported by the test modules.
A module of its own because the spawned processes import their command
handlers by module name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import multiprocessing as mp
import os
import random
import time
import traceback

import pytest
import xxhash

# Only light imports at module level: LS/LR import this module and start in a blink.
from services.transfer import (
    Chunk,
    ChunkArrived,
    ChunkKey,
    Expectation,
    Failed,
    TransferCommit,
    TransferError,
    Verdict,
    checksum,
)
from services.transfer.factory import make_receiver, make_sender

CALL_TIMEOUT_S = 60
IDLE_TIMEOUT_S = 1.5  # R's receiver
IO_TIMEOUT_S = 5.0    # S's sender
MAX_TOKENS = 6
GREEDY_ARGS = dict(ignore_eos=True)

# ---- worker side (runs in the spawned processes) ----------------------------------

_state: dict = {"engines": {}, "recs": {}, "senders": {}, "sends": {}, "keep": {},
                "ended_twice": []}


def _engine(spec: str):
    """R and S build the same engines: tiny preset, or 'wide' (16 KiB of K/V per token)."""
    from services.engine import Engine, EngineConfig, ModelConfig
    from services.engine.presets import seeded_weights
    if spec not in _state["engines"]:
        if spec == "tiny":
            cfg = EngineConfig(num_blocks=96, block_size=16, chunk_tokens=256,
                               attn_tile_tokens=64, torch_threads=1)
            _state["engines"][spec] = Engine.from_preset("tiny", seed=3, cfg=cfg)
        else:  # 4 layers x K,V x 8 heads x 64 dims x fp32 = 16 KiB/token; 260 blocks = 65 MiB
            mc = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                             head_dim=64, max_position_embeddings=4160)
            cfg = EngineConfig(num_blocks=260, block_size=16, chunk_tokens=256,
                               attn_tile_tokens=64, torch_threads=1)
            _state["engines"][spec] = Engine(mc, seeded_weights(mc, 4), cfg, name="wide")
    return _state["engines"][spec]


def _sampling():
    from services.engine import SamplingParams
    return SamplingParams(**GREEDY_ARGS)


class _Rec:
    """R's record of one reservation: a decode worker's own `Reservation`, its chunk
    admission and its commit validation (decode_worker/reservations.py), the same
    code the decode worker runs; plus what the tests inspect."""

    def __init__(self, tid, engine, seq, first_block, last_block, holders, per_chunk):
        from decode_worker.reservations import Reservation
        from services.transfer.chunks import chunk_bytes, plan_chunks
        self.tid, self.engine, self.seq, self.holders = tid, engine, seq, holders
        layers = engine.model_cfg.num_hidden_layers
        expected = {k: chunk_bytes(engine, k) for k in plan_chunks(layers, first_block, last_block, per_chunk)}
        self.res = Reservation(tid, tid, "t", 1, seq, layers, first_block, last_block, expected,
                               deadline_s=math.inf)
        self.table = list(seq.block_table)  # kept after free, to inspect the memory
        self.state, self.reason, self.at = "pending", "", 0.0
        self.done = asyncio.Event()

    @property
    def arrived(self) -> dict:
        return self.res.received

    def resolve(self, key: ChunkKey):
        from decode_worker.reservations import ResState, advance
        from services.transfer.chunks import chunk_views
        self.res.admit_chunk_key(key)  # KeyError for a chunk not expected, or a second time
        if self.res.state is ResState.RESERVED:
            advance(self.res, ResState.RECEIVING)
        return chunk_views(self.engine, self.seq, key)

    def on_event(self, ev) -> None:
        if isinstance(ev, ChunkArrived):
            self.res.received[ev.key] = ev
        elif isinstance(ev, Failed):
            asyncio.ensure_future(self._failed(ev.reason))

    async def _failed(self, reason: str) -> None:
        """Like abort_unpublished: fence the receiver's writes, then free (in _end)."""
        await _state["receiver"].fence(self.tid)
        self._end("failed", reason)

    async def on_commit(self, commit: TransferCommit) -> Verdict:
        from decode_worker.reservations import ResState, advance, validate_commit
        from services.engine import commit_import
        reason = validate_commit(self.res, commit, self.engine.abi.digest)
        if not reason and self.engine.kv_digest(self.seq) != commit.kv_digest:
            reason = "kv_digest differs"
        if reason:
            self._end("rejected", reason)
            return Verdict(False, reason)
        commit_import(self.engine, self.seq, commit.first_token)
        advance(self.res, ResState.PUBLISHED)
        self._end("published", "")
        return Verdict(True)

    def _end(self, state: str, reason: str) -> None:
        if self.state != "pending":  # a transfer ends exactly once
            _state["ended_twice"].append(f"{self.tid}: {self.state}, then {state} {reason}")
            return
        self.state, self.reason, self.at = state, reason, time.monotonic()
        if state != "published":
            self.free()
        self.done.set()

    def free(self) -> None:
        for s in [self.seq, *self.holders]:
            self.engine.free(s)


async def r_start(idle_timeout_s: float, backend: str) -> str:
    recv = _state["receiver"] = make_receiver(backend, idle_timeout_s=idle_timeout_s)
    await recv.start()
    return recv.address


async def r_reserve(tid: str, spec: str, prompt: list[int], cached_prefix: int = 0,
                    holders: int = 0, per_chunk: int = 2) -> dict:
    """Reserve like a decode worker: maybe a cached prefix, maybe holes in the pool; the
    expected chunks are `per_chunk` blocks each (the sender must cut them the same)."""
    engine = _engine(spec)
    if cached_prefix:
        other = prompt[:cached_prefix] + [7] * 30
        engine.generate(other, 2, _sampling(), request_id=f"{tid}-earlier")
    held = [engine.add_request(f"{tid}-h{i}", [1 + i], 1, _sampling()) for i in range(holders)]
    seq = engine.add_request(tid, prompt, MAX_TOKENS, _sampling())
    bs = engine.block_size
    rec = _state["recs"][tid] = _Rec(tid, engine, seq, seq.num_cached_tokens // bs,
                                     -(-len(prompt) // bs), held, per_chunk)
    _state["receiver"].expect(Expectation(tid, rec.resolve, rec.on_event, rec.on_commit))
    return dict(first_block=rec.res.first_block, last_block=rec.res.last_block,
                block_bytes=engine.cache.block_bytes_per_layer, table=list(seq.block_table))


async def r_outcome(tid: str, timeout_s: float = 10.0) -> dict:
    rec = _state["recs"][tid]
    await asyncio.wait_for(rec.done.wait(), timeout_s)
    return dict(state=rec.state, reason=rec.reason, at=rec.at, arrived=len(rec.arrived))


async def r_finish(tid: str) -> dict:
    """Decode a published transfer to the end (digest first), free it."""
    rec = _state["recs"].pop(tid)
    out = dict(state=rec.state, reason=rec.reason)
    if rec.state == "published":
        out["kv_digest"] = rec.engine.kv_digest(rec.seq)
        while not rec.seq.is_finished:
            rec.engine.decode_step([rec.seq])
        out["tokens"] = list(rec.seq.output_ids)
        rec.free()
    return out


async def r_blocks_digest(tid: str) -> str:
    """Digest of the raw cache memory of the reservation's physical blocks."""
    import torch
    rec = _state["recs"][tid]
    blocks = torch.tensor(rec.table, dtype=torch.long)
    return xxhash.xxh3_128(rec.engine.cache.kv.index_select(2, blocks).contiguous()
                           .view(torch.uint8).numpy().data).hexdigest()


async def r_forget(tid: str) -> None:
    """Give the transfer up like a decode worker's abort_unpublished (forget, fence, free)."""
    rec = _state["recs"][tid]
    recv = _state["receiver"]
    recv.forget(tid)
    await recv.fence(tid)
    rec._end("forgotten", "")


async def r_check_clean() -> dict:
    pools = {k: (e.num_free_blocks, e.blocks.num_blocks, max(b.ref_count for b in e.blocks.blocks))
             for k, e in _state["engines"].items()}
    live = {t: r.state for t, r in _state["recs"].items() if r.state == "pending"}
    return dict(pending=sorted(_state["receiver"].pending), live=live, pools=pools,
                ended_twice=_state["ended_twice"])


async def s_prefill(tid: str, spec: str, prompt: list[int]) -> dict:
    """Compute the prompt (tiny), or fill it with seeded random K/V and import it (wide)."""
    import torch

    from services.engine import commit_import
    engine = _engine(spec)
    seq = engine.add_request(tid, prompt, MAX_TOKENS, _sampling())
    if spec == "tiny":
        first = engine.prefill(seq)
    else:  # a 4095-token prefill is too slow for a test; the bytes are what matter here
        engine.cache.kv.normal_(generator=torch.Generator().manual_seed(len(prompt)))
        first = 5
        commit_import(engine, seq, first)
    _state["sends"][tid] = dict(engine=engine, seq=seq, first=first)
    return dict(first_token=first, kv_digest=engine.kv_digest(seq))


def _sender(backend: str, io_timeout_s: float, window_bytes: int = 0):
    key = (backend, io_timeout_s, window_bytes)
    if key not in _state["senders"]:
        opts = dict(connect_timeout_s=2.0) if backend == "tcp" else (
            dict(window_bytes=window_bytes) if window_bytes else {})
        _state["senders"][key] = make_sender(backend, io_timeout_s=io_timeout_s, **opts)
    return _state["senders"][key]


async def s_credits(backend: str) -> dict:
    """Credit windows of S's ucx senders: (in flight, peak, capacity) per destination."""
    return {f"{k[2]}:{dest[-12:]}": (w.in_flight, w.peak, w.capacity)
            for k, snd in _state["senders"].items() if k[0] == backend == "ucx"
            for dest, w in snd.credit_windows().items()}


async def s_send(tid: str, dest: str, first_block: int, last_block: int, per_chunk: int,
                 backend: str, fault: str = "", at: int = 0, as_tid: str = "",
                 io_timeout_s: float = IO_TIMEOUT_S, window_bytes: int = 0) -> dict:
    """Send every chunk then commit; `fault` at chunk index `at`:
    checksum | payload (corrupt), replay, abort, bad_key, short, pause (return; see s_resume)."""
    from services.transfer.chunks import chunk_views, describe_chunk, plan_chunks
    st = _state["sends"][tid]
    engine, _seq = st["engine"], st["seq"]
    keys = plan_chunks(engine.model_cfg.num_hidden_layers, first_block, last_block, per_chunk)
    st.update(dest=dest, keys=keys, next=0, chunks=[], wire_tid=as_tid or tid,
              sender=_sender(backend, io_timeout_s, window_bytes), fault=fault, at=at)
    return await _pump(st, describe_chunk, chunk_views)


async def s_commit_ghost(dest: str, backend: str, n_chunks: int) -> dict:
    """Commit a transfer R never expected, listing n_chunks made-up chunks (a large body)."""
    chunks = tuple(Chunk(ChunkKey(i % 4, i // 4, 1), 4096, f"{i:016x}") for i in range(n_chunks))
    verdict = await _sender(backend, IO_TIMEOUT_S).commit(dest, TransferCommit(
        "ghost/commit", "ghost", 1, "abi", chunks, "digest", 7))
    return dict(published=verdict.published, reason=verdict.reason)


async def s_resume(tid: str) -> dict:
    from services.transfer.chunks import chunk_views, describe_chunk
    st = _state["sends"][tid]
    st["fault"] = ""
    return await _pump(st, describe_chunk, chunk_views)


async def _pump(st: dict, describe_chunk, chunk_views) -> dict:
    engine, seq, sender = st["engine"], st["seq"], st["sender"]
    dest, wire = st["dest"], st["wire_tid"]
    t0 = time.monotonic()
    out = dict(published=None, reason="", error="")
    try:
        while st["next"] < len(st["keys"]):
            i, key = st["next"], st["keys"][st["next"]]
            chunk, views = describe_chunk(engine, seq, key), chunk_views(engine, seq, key)
            fault = st["fault"] if i == st["at"] else ""
            if fault == "pause":
                return dict(out, sent=i, paused=True)
            if fault == "abort":
                await sender.abort(dest, wire, "prefill cancelled")
                return dict(out, sent=i, aborted=True)
            if fault == "checksum":  # flip one hex digit of the frame's checksum
                chunk = dataclasses.replace(chunk, checksum=chunk.checksum[:-1] + (
                    "0" if chunk.checksum[-1] != "0" else "1"))
            elif fault == "payload":  # flip one payload byte, keep the honest checksum
                data = bytearray(b"".join(bytes(v) for v in views))
                data[len(data) // 2] ^= 0x40
                views = [memoryview(data)]
            elif fault == "bad_key":
                chunk = dataclasses.replace(chunk, key=ChunkKey(key.layer, 10_000, key.block_count))
            elif fault == "short":
                data = b"".join(bytes(v) for v in views)[:-8]
                chunk, views = dataclasses.replace(chunk, num_bytes=len(data)), [memoryview(data)]
            await sender.send(dest, wire, chunk, views)
            if fault == "replay":
                await sender.send(dest, wire, chunk, views)
            st["chunks"].append(chunk)
            st["next"] += 1
        verdict = await sender.commit(dest, TransferCommit(
            wire, seq.request_id, 1, engine.abi.digest, tuple(st["chunks"]),
            engine.kv_digest(seq), st["first"]))
        out.update(published=verdict.published, reason=verdict.reason)
    except TransferError as e:
        out["error"] = str(e)
        await sender.abort(dest, wire, f"send failed: {e}")
    return dict(out, sent=st["next"], elapsed_s=time.monotonic() - t0)


async def s_decode_self(tid: str) -> dict:
    """The reference: S continues the request itself, then frees it."""
    st = _state["sends"].pop(tid)
    engine, seq = st["engine"], st["seq"]
    while not seq.is_finished:
        engine.decode_step([seq])
    engine.free(seq)
    return dict(tokens=list(seq.output_ids), free=engine.num_free_blocks,
                total=engine.blocks.num_blocks)


async def ls_send(dest: str, tid: str, keys: list, block_bytes: int, backend: str) -> int:
    """Light sender: send made-up (correctly sized and summed) chunks; keep the connection.
    Returns once the chunks are at R (ucx: every credit is back, i.e. each chunk VISIBLE)."""
    sender = _state["keep"]["sender"] = make_sender(backend)
    keep = _state["keep"].setdefault("data", [])
    for key in keys:
        data = memoryview(os.urandom(key.block_count * block_bytes))
        keep.append(data)
        await sender.send(dest, tid, Chunk(key, data.nbytes, checksum([data])), [data])
    while backend == "ucx" and any(w.in_flight for w in sender.credit_windows().values()):
        await asyncio.sleep(0.01)
    return len(keys)


async def lr_start(tid: str, block_bytes: int, backend: str) -> str:
    """Light receiver expecting `tid` into plain buffers."""
    recv = _state["receiver"] = make_receiver(backend)
    await recv.start()

    async def on_commit(commit):
        return Verdict(True)

    recv.expect(Expectation(tid, lambda k: [memoryview(bytearray(k.block_count * block_bytes))],
                            lambda ev: None, on_commit))
    return recv.address


def _serve(conn) -> None:
    asyncio.run(_serve_async(conn))


async def _serve_async(conn) -> None:
    """Run each (id, function, kwargs) command as a task; reply (id, status, value)."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()

    def readable():
        try:
            inbox.put_nowait(conn.recv())
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            inbox.put_nowait(None)

    async def run(i, name, kwargs):
        try:
            reply = (i, "ok", await globals()[name](**kwargs))
        except BaseException:  # noqa: BLE001 - reported to the test process
            reply = (i, "error", traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:
            pass

    loop.add_reader(conn.fileno(), readable)
    tasks = set()
    while (msg := await inbox.get()) is not None:
        task = loop.create_task(run(*msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in tasks:
        task.cancel()
    if "receiver" in _state:
        await _state["receiver"].stop()
    for sender in [*_state["senders"].values(), _state["keep"].get("sender")]:
        if sender is not None:
            await sender.close()


# ---- test side ---------------------------------------------------------------------------


class Worker:
    """A spawned process running `_serve`; `start` + `result`, or `call` for both."""

    def __init__(self, name: str):
        self.conn, child = mp.get_context("spawn").Pipe()
        self.proc = mp.get_context("spawn").Process(target=_serve, args=(child,), name=name,
                                                    daemon=True)
        self.proc.start()
        child.close()
        self._ids = itertools.count()
        self._replies: dict[int, tuple] = {}

    def start(self, fn: str, **kwargs) -> int:
        i = next(self._ids)
        self.conn.send((i, fn, kwargs))
        return i

    def result(self, i: int, timeout_s: float = CALL_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        while i not in self._replies:
            if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{self.proc.name}: no reply in {timeout_s} s")
            j, status, value = self.conn.recv()
            self._replies[j] = (status, value)
        status, value = self._replies.pop(i)
        if status != "ok":
            pytest.fail(f"{self.proc.name} failed:\n{value}")
        return value

    def call(self, fn: str, timeout_s: float = CALL_TIMEOUT_S, **kwargs):
        return self.result(self.start(fn, **kwargs), timeout_s)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


BACKENDS = ["tcp", "ucx"]


class Procs(tuple):
    """(R, S, R's address) plus the backend they run."""

    backend: str


@pytest.fixture(scope="module", params=BACKENDS)
def procs(request):
    """R (with its receiver started) and S; both import torch at their first engine."""
    r, s = Worker(f"decode-R-{request.param}"), Worker(f"prefill-S-{request.param}")
    try:
        addr = r.call("r_start", idle_timeout_s=IDLE_TIMEOUT_S, backend=request.param)
        p = Procs((r, s, addr))
        p.backend = request.param
        yield p
    finally:
        r.close()
        s.close()
    assert r.proc.exitcode == 0 and s.proc.exitcode == 0


@pytest.fixture
def light():
    """Light workers started by a test, killed at its end at the latest."""
    started: list[Worker] = []
    yield lambda name: started.append(Worker(name)) or started[-1]
    for w in started:
        w.proc.kill()
        w.proc.join()


@pytest.fixture(autouse=True)
def receiver_clean(procs):
    """Every test ends with R holding no pending transfer and every block back."""
    yield
    r, s, _ = procs
    clean = r.call("r_check_clean")
    assert clean["pending"] == [] and clean["live"] == {} and not clean["ended_twice"], clean
    for spec, (free, total, max_ref) in clean["pools"].items():
        assert free == total and max_ref == 0, f"{spec} pool leaked: {clean}"
    credits = s.call("s_credits", backend=procs.backend)
    assert all(in_flight == 0 for in_flight, _, _ in credits.values()), credits


_tids = itertools.count()


def _prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 512) for _ in range(n)]


def _reserve_and_prefill(procs, spec: str, prompt: list[int], **reserve):
    r, s, _ = procs
    tid = f"t{next(_tids)}"
    res_id = r.start("r_reserve", tid=tid, spec=spec, prompt=prompt, **reserve)
    pre = s.call("s_prefill", tid=tid, spec=spec, prompt=prompt)
    return tid, r.result(res_id), pre


def _send(procs, tid, res, per_chunk=2, dest=None, **fault):
    _, s, addr = procs
    return s.call("s_send", tid=tid, dest=dest or addr, first_block=res["first_block"],
                  last_block=res["last_block"], per_chunk=per_chunk, backend=procs.backend,
                  **fault)


def _expect_failed(procs, tid, match=""):
    """R's outcome for tid is Failed (matching `match`); S frees its side."""
    r, s, _ = procs
    out = r.call("r_outcome", tid=tid)
    assert out["state"] == "failed" and match in out["reason"], out
    assert r.call("r_finish", tid=tid)["state"] == "failed"
    s.call("s_decode_self", tid=tid)
    return out
