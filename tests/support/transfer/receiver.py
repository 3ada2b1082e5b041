"""R and LR of the transfer harness (tests/support/transfer): the commands a spawned
receiver process serves. R reserves like a decode worker and validates commits with
the decode worker's own code; LR receives into plain buffers.

Only light imports at module level: LR imports this module and starts in a blink.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import xxhash

from runtime.transfer import ChunkArrived, ChunkKey, Expectation, Failed, TransferCommit, Verdict, token_follows
from runtime.transfer.factory import make_receiver
from tests.support.transfer.engines import ENGINES, MAX_TOKENS, engine_for, sampling
from tests.support.transfer.kept import alive

_state: dict = {"recs": {}, "ended_twice": [], "warnings": []}


class _Warnings(logging.Handler):
    """The transfer code's warnings in R, for the tests that expect none."""

    def emit(self, record: logging.LogRecord) -> None:
        _state["warnings"].append(record.getMessage())


class _Rec:
    """R's record of one reservation: a decode worker's own `Reservation`, its chunk
    admission and its commit validation (decode_worker/reservations.py), the same
    code the decode worker runs; plus what the tests inspect."""

    def __init__(self, tid, engine, seq, first_block, last_block, holders, per_chunk):
        from decode_worker.reservations import Reservation
        from runtime.transfer.chunks import chunk_bytes, plan_chunks
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
        from runtime.transfer.chunks import chunk_views
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
        if self.res.state is ResState.PUBLISHED:  # the token's COMMIT, after one published ahead of it
            reason = "" if not commit.chunks and not token_follows(commit) else "not a token COMMIT"
            if not reason:
                self.engine.commit_import(self.seq, commit.first_token)
            self._end("rejected" if reason else "published", reason)
            return Verdict(not reason, reason)
        reason = validate_commit(self.res, commit, self.engine.abi.digest)
        if not reason and self.engine.kv_digest(self.seq) != commit.kv_digest:
            reason = "kv_digest differs"
        if reason:
            self._end("rejected", reason)
            return Verdict(False, reason)
        advance(self.res, ResState.PUBLISHED)
        if token_follows(commit):
            return Verdict(True)  # the blocks stay held; the token's COMMIT (or a failure) ends it
        self.engine.commit_import(self.seq, commit.first_token)
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
    logging.getLogger("runtime.transfer").addHandler(_Warnings(logging.WARNING))
    recv = _state["receiver"] = make_receiver(backend, idle_timeout_s=idle_timeout_s)
    await recv.start()
    return recv.address


async def r_reserve(tid: str, spec: str, prompt: list[int], cached_prefix: int = 0,
                    holders: int = 0, per_chunk: int = 2, key: str = "") -> dict:
    """Reserve like a decode worker: maybe a cached prefix, maybe holes in the pool; the
    expected chunks are `per_chunk` blocks each (the sender must cut them the same); `key`:
    the transfer's secret in hex (the test plays the router; "": the public key)."""
    engine = engine_for(spec)
    if cached_prefix:
        other = prompt[:cached_prefix] + [7] * 30
        engine.generate(other, 2, sampling(), request_id=f"{tid}-earlier")
    held = [engine.add_request(f"{tid}-h{i}", [1 + i], 1, sampling()) for i in range(holders)]
    seq = engine.add_request(tid, prompt, MAX_TOKENS, sampling())
    bs = engine.block_size
    rec = _state["recs"][tid] = _Rec(tid, engine, seq, seq.num_cached_tokens // bs,
                                     -(-len(prompt) // bs), held, per_chunk)
    _state["receiver"].expect(Expectation(tid, rec.resolve, rec.on_event, rec.on_commit, key=bytes.fromhex(key)))
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
             for k, e in ENGINES.items()}
    live = {t: r.state for t, r in _state["recs"].items() if r.state == "pending"}
    kept = await alive(Expectation) - len(_state["receiver"].pending)  # of ended transfers: none
    return dict(pending=sorted(_state["receiver"].pending), live=live, pools=pools,
                ended_twice=_state["ended_twice"], kept_expectations=kept)


async def r_stats() -> dict:
    """The receiver's counters (runtime.telemetry's pd_transfer_received_*), with what it
    dropped (`rejected_<reason>`) and its process's sweeps of UCX's unexpected queue."""
    recv = _state["receiver"]
    out = dict(getattr(recv, "stats", {}))  # the tcp receiver keeps none
    out.update({f"rejected_{k}": v for k, v in getattr(recv, "rejected", {}).items()})
    if getattr(recv, "_rt", None) is not None:
        out["swept"] = recv._rt.stats["unexpected"]
    return out


async def r_warnings() -> list[str]:
    """The warnings logged since the last call (and forgets them)."""
    out, _state["warnings"] = _state["warnings"], []
    return out


async def lr_start(tid: str, block_bytes: int, backend: str) -> str:
    """Light receiver expecting `tid` into plain buffers."""
    recv = _state["receiver"] = make_receiver(backend)
    await recv.start()

    async def on_commit(commit):
        return Verdict(True)

    recv.expect(Expectation(tid, lambda k: [memoryview(bytearray(k.block_count * block_bytes))],
                            lambda ev: None, on_commit))
    return recv.address


async def at_exit() -> None:
    if "receiver" in _state:
        await _state["receiver"].stop()
