"""An attacker on the UCX data plane, run in a process of its own (`Spawned(...,
"tests.support.ucx_attacker")`): it holds no certificate and no transfer key, and knows
what anybody can learn, a decode worker's data-plane address (the directory's snapshot,
any worker's lookup, a prefill's manifest all carry it) and, where a test says so, a
transfer id and a genuine message it captured.

Every command sends well-formed wire-2 messages (or wire-1 ones, as the attacks of the
version before were made) to the receiver's control tag, or raw messages to tags of its
choosing, and returns how many it sent. None of them waits for an answer: the attacker
also keeps a mailbox of its own and reports (`a_heard`) whether anything ever answered it.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct

from runtime.transfer.keys import TO_RECEIVER, TO_SENDER, TransferKey
from runtime.transfer.ucx import wire

_state: dict = {"heard": 0}
V1_HEAD = struct.Struct("!4sBBHIQQ")  # version 1: magic, version, kind, id_len, nonce, body_len, oob_tag


async def _rt():
    from runtime.transfer.ucx.runtime import runtime
    rt = runtime()
    if "mailbox" not in _state:
        from runtime.transfer.ucx.mailbox import Mailbox
        _state["nonce"] = wire.new_nonce()
        _state["mailbox"] = Mailbox(rt, wire.tag(wire.REPLY, _state["nonce"]), _heard, "attacker")
        _state["mailbox"].start()
    return rt


def _heard(_msg) -> None:
    _state["heard"] += 1


async def _ep(rt, dest: str):
    nonce, _, _, address = wire.parse_address(dest)
    return nonce, await rt.endpoint(address)


async def _post(rt, ep, tag: int, payloads: list[bytes]) -> None:
    """Post every payload on `tag`, then wait (bounded) until UCX took them."""
    futs = [rt.post_send(ep, p, tag) for p in payloads]
    rt.progress()
    await asyncio.wait(futs, timeout=10)


def _forged(kind: int, tid: str, body: dict, sender: int = 0, oob_len: int = 0) -> bytes:
    """A wire-2 message of `kind` for `tid` under a key the attacker made up (its MAC cannot
    hold); with `oob_len`, its head announces an out-of-line body of that size that is never sent."""
    key, sender = TransferKey(tid, os.urandom(32)), sender or _state["nonce"]  # (replies would come here)
    if not oob_len:
        msg, _, _ = wire.encode(kind, tid, sender, random.getrandbits(63), body, key, TO_RECEIVER)
        return msg
    body_tag = wire.tag(wire.BODY, random.getrandbits(28), random.getrandbits(32))
    head = wire.HEAD.pack(wire.MAGIC, wire.VERSION, kind, len(tid.encode()), sender, random.getrandbits(63), oob_len,
                          body_tag, os.urandom(16))
    return head + tid.encode() + os.urandom(wire.DIGEST_BYTES)  # the digest of a body that never comes


def _v1(kind: int, tid: str, nonce: int, body: dict) -> bytes:
    """A version-1 message: the nonce in its head was all its receiver checked."""
    import orjson
    raw, t = orjson.dumps(body), tid.encode()
    return V1_HEAD.pack(wire.MAGIC, 1, kind, len(t), nonce, len(raw), 0) + t + raw


def _chunk_body(tag: int) -> dict:
    return {"serial": 0, "key": [0, 0, 1], "bytes": 6144, "checksum": "0" * 16, "sizes": [6144], "tag": tag}


async def a_forge(dest: str, tids: list[str], rounds: int = 1, sender: int = 0, spray: int = 64) -> int:
    """For each transfer id, `rounds` times: a forged AUTH (a capability of garbage), CHUNK
    (its data on a guessed tag, and `spray` more DATA pieces on guessed tags), COMMIT and ABORT,
    under a made-up key (`sender`: the mailbox nonce to claim, e.g. the genuine sender's); and
    the same in wire 1 (a HELLO, then CHUNK, COMMIT, ABORT under that nonce)."""
    rt = await _rt()
    nonce, ep = await _ep(rt, dest)
    ctrl, sent = wire.tag(wire.CTRL, nonce), 0
    for _ in range(rounds):
        for tid in tids:
            data_tag = wire.tag(wire.DATA, random.getrandbits(28), random.getrandbits(32))
            msgs = [_forged(wire.AUTH, tid, {"capability": "AAAA", "reply": {"address": wire.b64(rt.address)}}, sender),
                    _forged(wire.CHUNK, tid, _chunk_body(data_tag), sender),
                    _forged(wire.COMMIT, tid, {"transfer_id": tid, "chunks": []}, sender),
                    _forged(wire.ABORT, tid, {"reason": "forged"}, sender),
                    _v1(1, "", sender or 7, {"address": wire.b64(rt.address)}),
                    _v1(2, tid, sender or 7, _chunk_body(data_tag)), _v1(3, tid, sender or 7, {}),
                    _v1(4, tid, sender or 7, {"reason": "forged"})]
            await _post(rt, ep, ctrl, msgs)
            pieces = [wire.tag(wire.DATA, random.getrandbits(28), random.getrandbits(32)) for _ in range(spray)]
            for t in [data_tag, *pieces]:
                await _post(rt, ep, t, [os.urandom(6144)])
            sent += len(msgs) + 1 + spray
    return sent


async def a_stall(dest: str, tids: list[str], body_bytes: int = 200_000) -> int:
    """Heads that announce an out-of-line body that never comes (AUTH, CHUNK and COMMIT per
    transfer id), under made-up keys: the attack that deafened a receiver for 30 s in wire 1."""
    rt = await _rt()
    nonce, ep = await _ep(rt, dest)
    msgs = [_forged(kind, tid, {}, oob_len=body_bytes if kind != wire.CHUNK else 62_000)  # (a CHUNK's cap: 64 KiB)
            for tid in tids for kind in (wire.AUTH, wire.CHUNK, wire.COMMIT)]
    await _post(rt, ep, wire.tag(wire.CTRL, nonce), msgs)
    return len(msgs)


async def a_flood(dest: str, n: int) -> int:
    """`n` messages of garbage on the receiver's control tag: random bytes, wire-1 HELLOs (each
    once cost the receiver an endpoint and a record), wire-2 AUTHs naming a reply address."""
    rt = await _rt()
    nonce, ep = await _ep(rt, dest)
    msgs = []
    for i in range(n):
        pick = i % 3
        msgs.append(os.urandom(random.randint(1, 200)) if pick == 0 else
                    _v1(1, "", wire.new_nonce(), {"address": wire.b64(rt.address)}) if pick == 1 else
                    _forged(wire.AUTH, f"flood/{i}", {"reply": {"address": wire.b64(rt.address)}}))
    for at in range(0, n, 256):
        await _post(rt, ep, wire.tag(wire.CTRL, nonce), msgs[at:at + 256])
    return n


async def a_unexpected(dest: str, n: int) -> int:
    """`n` messages on tags nobody receives (random kinds and bits): they would sit in UCX's
    unexpected queue for good unless swept."""
    rt = await _rt()
    _, ep = await _ep(rt, dest)
    for _ in range(n):
        t = random.getrandbits(64)
        if t >> 60 in (wire.CTRL, wire.REPLY):
            t ^= 1 << 63  # not a mailbox's tag (those are received, not swept)
        await _post(rt, ep, t, [os.urandom(64)])
    return n


async def a_replay(dest: str, payloads_hex: list[str], times: int = 3) -> int:
    """Send captured messages again, each `times` times, as they were."""
    rt = await _rt()
    nonce, ep = await _ep(rt, dest)
    msgs = [bytes.fromhex(p) for p in payloads_hex] * times
    await _post(rt, ep, wire.tag(wire.CTRL, nonce), msgs)
    return len(msgs)


async def a_reflect(dest: str, tid: str, key_hex: str) -> int:
    """A message made under the transfer's own key but for the other direction (a receiver's
    reply, as if captured on its way to the sender), sent to the receiver."""
    rt = await _rt()
    nonce, ep = await _ep(rt, dest)
    msg, _, _ = wire.encode(wire.COMMIT, tid, _state["nonce"], random.getrandbits(63), {"transfer_id": tid},
                            TransferKey(tid, bytes.fromhex(key_hex)), TO_SENDER)
    await _post(rt, ep, wire.tag(wire.CTRL, nonce), [msg])
    return 1


async def a_heard() -> int:
    """Messages that ever reached the attacker's own mailbox (nothing should answer it)."""
    await asyncio.sleep(0.2)
    return _state["heard"]


async def at_exit() -> None:
    if "mailbox" in _state:
        await _state["mailbox"].stop()
