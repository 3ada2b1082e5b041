"""S and LS of the transfer harness (tests/support/transfer): the commands a spawned
sender process serves. S prefills on a real engine and sends its chunks, with a
fault at a chosen chunk when asked; LS sends made-up chunks and keeps the connection.

Only light imports at module level: LS imports this module and starts in a blink.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

from runtime.transfer import TOKEN_FOLLOWS, Chunk, ChunkKey, TransferCommit, TransferError, TransferKey, chunk_checksum
from runtime.transfer.factory import make_sender
from tests.support.transfer.engines import IO_TIMEOUT_S, MAX_TOKENS, engine_for, sampling
from tests.support.transfer.kept import alive

_state: dict = {"senders": {}, "sends": {}, "keep": {}}


async def s_prefill(tid: str, spec: str, prompt: list[int]) -> dict:
    """Compute the prompt (tiny), or fill it with seeded random K/V and import it (wide)."""
    import torch

    engine = engine_for(spec)
    seq = engine.add_request(tid, prompt, MAX_TOKENS, sampling())
    if spec == "tiny":
        first = engine.prefill(seq)
    else:  # a 4095-token prefill is too slow for a test; the bytes are what matter here
        engine.cache.kv.normal_(generator=torch.Generator().manual_seed(len(prompt)))
        first = 5
        engine.commit_import(seq, first)
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


async def s_kept() -> int:
    """Outgoing transfers S's ucx senders still hold (after every test: none)."""
    from runtime.transfer.ucx.outgoing import Outgoing
    return await alive(Outgoing)


async def s_send(tid: str, dest: str, first_block: int, last_block: int, per_chunk: int,
                 backend: str, fault: str = "", at: int = 0, as_tid: str = "",
                 io_timeout_s: float = IO_TIMEOUT_S, window_bytes: int = 0, many: bool = False,
                 early: str = "", hold: bool = False, announce: str = "", key: str = "") -> dict:
    """Send every chunk then commit; `fault` at chunk index `at`:
    checksum | payload (corrupt), replay, abort, bad_key, short, pause (return; see s_resume).
    `many`: every chunk in one `send_many` call (the backend may pack them; not with pause/abort);
    `hold`: with hold_last (the last batch may carry the COMMIT); fault "abort_held": ABORT
    after it, no COMMIT. `announce`: with `hold`, the plan's (key, bytes) given to send_many
    as `keys` (ucx announces them: `announced` in the result counts its announced batches);
    "ahead": `announce` first, before any chunk is hashed; "only": announce, then commit
    without sending them.
    `early`: commit ahead of the first token (TOKEN_FOLLOWS), then "token" ("token_now":
    through `commit_now`): the token's
    COMMIT, or "abort": ABORT instead. `key`: the transfer's secret (hex), as the prefill's
    grant brings it: presented first (as a prefill does, no capability: security is off
    here), every chunk's checksum keyed with it."""
    from runtime.transfer.chunks import chunk_views, describe_chunk, plan_chunks
    st = _state["sends"][tid]
    engine, _seq = st["engine"], st["seq"]
    keys = plan_chunks(engine.model_cfg.num_hidden_layers, first_block, last_block, per_chunk)
    sender = _sender(backend, io_timeout_s, window_bytes)
    st.update(secret=bytes.fromhex(key), tkey=TransferKey.of(as_tid or tid, bytes.fromhex(key)))
    try:
        await sender.present(dest, as_tid or tid, None, st["secret"])
        if announce in ("ahead", "only"):
            from runtime.transfer.chunks import chunk_bytes
            _state["announced_before"] = getattr(sender, "stats", {}).get("announced_batches", 0)
            await sender.announce(dest, as_tid or tid, [(k, chunk_bytes(engine, k)) for k in keys])
    except TransferError as e:
        await sender.abort(dest, as_tid or tid, f"send failed: {e}")
        return dict(published=None, reason="", error=str(e), sent=0)
    st.update(dest=dest, keys=keys, next=0, chunks=[], wire_tid=as_tid or tid,
              sender=_sender(backend, io_timeout_s, window_bytes), fault=fault, at=at, many=[] if many else None,
              early=early, hold=hold, announce=announce)
    try:
        return await _pump(st, describe_chunk, chunk_views)
    finally:
        _state.pop("announced_before", None)


async def s_commit_ghost(dest: str, backend: str, n_chunks: int, io_timeout_s: float = IO_TIMEOUT_S) -> dict:
    """Present and commit a transfer R never expected, listing n_chunks made-up chunks (a
    large body); published None and the error when no verdict came."""
    chunks = tuple(Chunk(ChunkKey(i % 4, i // 4, 1), 4096, f"{i:016x}") for i in range(n_chunks))
    sender, t0 = _sender(backend, io_timeout_s), time.monotonic()
    try:
        await sender.present(dest, "ghost/commit", None, os.urandom(32))
        verdict = await sender.commit(dest, TransferCommit("ghost/commit", "ghost", 1, "abi", chunks, "digest", 7))
    except TransferError as e:
        await sender.abort(dest, "ghost/commit", "no verdict")
        return dict(published=None, reason="", error=str(e), elapsed_s=time.monotonic() - t0)
    return dict(published=verdict.published, reason=verdict.reason, error="")


async def s_recommit(tid: str) -> dict:
    """Present and commit `tid` once more, its chunk list and its token (after it ended at R)."""
    st = _state["sends"][tid]
    engine, seq = st["engine"], st["seq"]
    try:
        await st["sender"].present(st["dest"], st["wire_tid"], None, st["secret"])
        verdict = await st["sender"].commit(st["dest"], TransferCommit(
            st["wire_tid"], seq.request_id, 1, engine.abi.digest, tuple(st["chunks"]), engine.kv_digest(seq),
            st["first"]))
    except TransferError as e:
        await st["sender"].abort(st["dest"], st["wire_tid"], "refused")
        return dict(published=False, reason=str(e))
    return dict(published=verdict.published, reason=verdict.reason)


async def s_resume(tid: str) -> dict:
    from runtime.transfer.chunks import chunk_views, describe_chunk
    st = _state["sends"][tid]
    st["fault"] = ""
    return await _pump(st, describe_chunk, chunk_views)


def _faulted(fault: str, key, chunk, views):
    """(chunk, views) as fault `fault` sends them ("" or a fault of the whole stream: as they are)."""
    if fault == "checksum":  # flip one hex digit of the frame's checksum
        chunk = dataclasses.replace(chunk, checksum=chunk.checksum[:-1] + ("0" if chunk.checksum[-1] != "0" else "1"))
    elif fault == "payload":  # flip one payload byte, keep the honest checksum
        data = bytearray(b"".join(bytes(v) for v in views))
        data[len(data) // 2] ^= 0x40
        views = [memoryview(data)]
    elif fault == "bad_key":
        chunk = dataclasses.replace(chunk, key=ChunkKey(key.layer, 10_000, key.block_count))
    elif fault == "short":
        data = b"".join(bytes(v) for v in views)[:-8]
        chunk, views = dataclasses.replace(chunk, num_bytes=len(data)), [memoryview(data)]
    return chunk, views


async def _pump(st: dict, describe_chunk, chunk_views) -> dict:
    engine, seq, sender = st["engine"], st["seq"], st["sender"]
    dest, wire = st["dest"], st["wire_tid"]
    t0 = time.monotonic()
    out = dict(published=None, reason="", error="")
    try:
        while st["next"] < len(st["keys"]) and st.get("announce") != "only":
            i, key = st["next"], st["keys"][st["next"]]
            chunk, views = describe_chunk(engine, seq, key, st["tkey"]), chunk_views(engine, seq, key)
            fault = st["fault"] if i == st["at"] else ""
            if fault == "pause":
                return dict(out, sent=i, paused=True)
            if fault == "abort":
                await sender.abort(dest, wire, "prefill cancelled")
                return dict(out, sent=i, aborted=True)
            chunk, views = _faulted(fault, key, chunk, views)
            for _ in range(2 if fault == "replay" else 1):
                if st["many"] is not None:
                    st["many"].append((chunk, views))
                else:
                    await sender.send(dest, wire, chunk, views)
            st["chunks"].append(chunk)
            st["next"] += 1
        if st["many"]:
            from runtime.transfer.chunks import chunk_bytes
            keys = [(k, chunk_bytes(engine, k)) for k in st["keys"]] if st.get("announce") else ()
            before = _state.pop("announced_before", getattr(sender, "stats", {}).get("announced_batches", 0))
            await sender.send_many(dest, wire, st["many"], hold_last=st.get("hold", False), keys=keys)
            out["announced"] = getattr(sender, "stats", {}).get("announced_batches", 0) - before
        if st["fault"] == "abort_held":
            await sender.abort(dest, wire, "prefill cancelled before its commit")
            return dict(out, sent=st["next"], aborted=True)
        listed, token = tuple(st["chunks"]), st["first"]
        if st.get("early"):
            ahead = await sender.commit(dest, TransferCommit(
                wire, seq.request_id, 1, engine.abi.digest, listed, engine.kv_digest(seq), TOKEN_FOLLOWS))
            out.update(ahead_published=ahead.published, ahead_reason=ahead.reason)
            if not ahead.published:
                return dict(out, published=False, reason=ahead.reason, sent=st["next"])
            if st["early"] == "abort":
                await sender.abort(dest, wire, "prefill failed after its commit")
                return dict(out, sent=st["next"], aborted=True)
            listed = ()  # the token's COMMIT lists no chunk
        commit = TransferCommit(wire, seq.request_id, 1, engine.abi.digest, listed, engine.kv_digest(seq), token)
        if st.get("early") == "token_now":  # posted from this turn of the loop where the backend can
            posted = sender.commit_now(dest, commit)
            out.update(posted_now=posted is not None,
                       unknown_dest_now=sender.commit_now(dest + "x", commit) is None)
            verdict = await (posted if posted is not None else sender.commit(dest, commit))
        else:
            verdict = await sender.commit(dest, commit)
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


async def ls_send(dest: str, tid: str, keys: list, block_bytes: int, backend: str, secret: str = "") -> int:
    """Light sender: send made-up (correctly sized and keyed-summed) chunks; keep the connection.
    Returns once the chunks are at R (ucx: every credit is back, i.e. each chunk VISIBLE)."""
    sender = _state["keep"]["sender"] = make_sender(backend)
    keep = _state["keep"].setdefault("data", [])
    tkey = TransferKey.of(tid, bytes.fromhex(secret))
    await sender.present(dest, tid, None, bytes.fromhex(secret))
    for key in keys:
        data = memoryview(os.urandom(key.block_count * block_bytes))
        keep.append(data)
        await sender.send(dest, tid, Chunk(key, data.nbytes, chunk_checksum(tkey, key, [data])), [data])
    while backend == "ucx" and any(w.in_flight for w in sender.credit_windows().values()):
        await asyncio.sleep(0.01)
    return len(keys)


async def at_exit() -> None:
    for sender in [*_state["senders"].values(), _state["keep"].get("sender")]:
        if sender is not None:
            await sender.close()
