"""The tcp and ucx backends between real processes: every case runs on both
(the `procs` fixture's parameter; tests/support/transfer has the processes).

Sizes go from one block to a 64 MiB transfer (a K/V-wide model filling a
~66 MiB cache). Faults: a killed or silent sender, a killed or frozen receiver,
a corrupted checksum or payload, a replayed chunk, an abort, an unexpected
transfer id, a bad key, a short payload and forget mid-stream. The tcp wire's
own faults (a silent sender mid-frame, bad framing, a send cancelled
mid-payload) are in test_transfer_tcp.py. After every test R holds no pending
transfer and no block, and S's credit windows hold no credit.
"""

from __future__ import annotations

import signal
import time

import pytest

from runtime.transfer import ChunkKey
from tests.support.transfer.engines import IDLE_TIMEOUT_S, MAX_TOKENS
from tests.support.transfer.fixtures import (
    expect_failed,
    light,
    make_prompt,
    new_tid,
    procs,
    receiver_clean,
    reserve_and_prefill,
    send,
)

__all__ = ["light", "procs", "receiver_clean"]  # fixtures: the harness's, used by every test here


@pytest.mark.parametrize("spec,prompt_len,per_chunk,reserve,many", [
    ("tiny", 9, 1, {}, False),                                   # one block, one chunk per layer
    ("tiny", 301, 3, dict(cached_prefix=64, holders=5), False),  # prefix hit at R, shifted blocks
    ("wide", 4095, 16, {}, False),                               # 256 blocks = 64 MiB, 1 MiB chunks
    ("tiny", 301, 3, {}, True),                                  # 28 small chunks, one send_many
    ("wide", 4095, 4, {}, True),                                 # 256 KiB chunks: 2 MiB batches
], ids=["1-block", "prefix-hit", "64MiB", "batched", "64MiB-batched"])
def test_transfer_is_exact(procs, spec, prompt_len, per_chunk, reserve, many):
    r, s, _ = procs
    prompt = make_prompt(prompt_len, prompt_len + many)  # another prompt: no prefix hit at R from the case before
    r.call("r_warnings")  # a case before may have warned on purpose
    tid, res, pre = reserve_and_prefill(procs, spec, prompt, per_chunk=per_chunk, **reserve)
    sent = send(procs, tid, res, per_chunk, many=many)
    assert sent["published"] is True and not sent["error"], sent
    assert r.call("r_warnings") == []  # a clean transfer warns of nothing
    n_chunks = 4 * -(-(res["last_block"] - res["first_block"]) // per_chunk)
    assert sent["sent"] == n_chunks
    if spec == "wide":
        assert n_chunks * per_chunk * res["block_bytes"] == 64 << 20
    if reserve:
        assert res["first_block"] == 4 and res["table"][4] != 4  # only blocks 4.. travel
    done_id = r.start("r_finish", tid=tid)
    mine = s.call("s_decode_self", tid=tid)
    got = r.result(done_id)
    assert got["kv_digest"] == pre["kv_digest"]
    assert got["tokens"] == mine["tokens"] and len(got["tokens"]) == MAX_TOKENS
    assert got["tokens"][0] == pre["first_token"]
    assert mine["free"] == mine["total"]


@pytest.mark.parametrize("spec,prompt_len,per_chunk", [("tiny", 9, 1), ("tiny", 301, 3), ("wide", 4095, 4)],
                         ids=["1-block", "small-chunks", "64MiB-batched"])
def test_the_last_batch_carries_the_commit(procs, spec, prompt_len, per_chunk):
    """`send_many(hold_last=True)` then `commit`: over ucx the COMMIT rides in the last batch's
    header (one message less; R counts it), over tcp it follows as before; exact either way."""
    r, s, _ = procs
    before = r.call("r_stats").get("carried_commits", 0)
    r.call("r_warnings")
    tid, res, pre = reserve_and_prefill(procs, spec, make_prompt(prompt_len, prompt_len + 17), per_chunk=per_chunk)
    sent = send(procs, tid, res, per_chunk, many=True, hold=True)
    assert sent["published"] is True and not sent["error"], sent
    assert r.call("r_warnings") == []
    assert r.call("r_stats").get("carried_commits", 0) - before == (1 if procs.backend == "ucx" else 0)
    done_id = r.start("r_finish", tid=tid)
    mine = s.call("s_decode_self", tid=tid)
    got = r.result(done_id)
    assert got["kv_digest"] == pre["kv_digest"] and got["tokens"] == mine["tokens"]


@pytest.mark.parametrize("procs", ["ucx"], indirect=True)
@pytest.mark.parametrize("spec,prompt_len,per_chunk", [("tiny", 9, 1), ("tiny", 301, 3)],
                         ids=["1-block", "small-chunks"])
@pytest.mark.parametrize("when", ["inline", "ahead"])
def test_an_announced_batch_is_exact(procs, spec, prompt_len, per_chunk, when):
    """`send_many(hold_last=True, keys=...)`: the batch's header leaves before its chunks are
    taken and hashed (inline), or earlier still with `announce` (ahead: the prefill worker's,
    while it computes); their checksums come in the COMMIT, which R checks each landed
    chunk against. One announced batch, no COMMIT carried in it, and the bytes exact."""
    r, s, _ = procs
    before = r.call("r_stats").get("carried_commits", 0)
    r.call("r_warnings")
    tid, res, pre = reserve_and_prefill(procs, spec, make_prompt(prompt_len, prompt_len + 23), per_chunk=per_chunk)
    sent = send(procs, tid, res, per_chunk, many=True, hold=True, announce=when)
    assert sent["published"] is True and sent["announced"] == 1 and not sent["error"], sent
    assert r.call("r_warnings") == [] and r.call("r_stats").get("carried_commits", 0) == before
    done_id = r.start("r_finish", tid=tid)
    mine = s.call("s_decode_self", tid=tid)
    got = r.result(done_id)
    assert got["kv_digest"] == pre["kv_digest"] and got["tokens"] == mine["tokens"]


@pytest.mark.parametrize("procs", ["ucx"], indirect=True)
@pytest.mark.parametrize("fault,at,match", [("checksum", 5, "checksum mismatch"), ("payload", 0, "checksum mismatch"),
                                            ("bad_key", 7, "not the one announced"),
                                            ("short", 2, "not the one announced"),
                                            ("replay", 3, "not the one announced")])
def test_an_announced_batch_unlike_its_commit_or_its_keys_publishes_nothing(procs, fault, at, match):
    """A chunk whose bytes differ from the COMMIT's checksum fails at R; one that is not the
    key or size announced fails at S, whose abort ends it at R. Nothing counts as arrived."""
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 29))
    sent = send(procs, tid, res, fault=fault, at=at, many=True, hold=True, announce="ahead")
    assert sent["published"] is None and match in sent["error"], sent
    out = expect_failed(procs, tid, match=match)
    assert out["arrived"] == 0, out


@pytest.mark.parametrize("procs", ["ucx"], indirect=True)
def test_a_commit_without_the_chunks_announced_fails_at_once(procs):
    """R would hold that COMMIT for chunks that never come: S refuses to send it, and its
    abort ends the transfer at R (no wait for a verdict's timeout)."""
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 31))
    t0 = time.monotonic()
    sent = send(procs, tid, res, many=True, hold=True, announce="only")
    assert sent["published"] is None and "COMMIT before the 16 chunks announced were sent" in sent["error"], sent
    assert time.monotonic() - t0 < 5
    out = expect_failed(procs, tid, match="aborted by sender")
    assert out["arrived"] == 0, out


def test_an_abort_while_the_last_batch_waits_for_its_commit_sends_none_of_it(procs):
    """The held batch never leaves; its credit comes back (the fixture checks S holds none)."""
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 13))
    sent = send(procs, tid, res, many=True, hold=True, fault="abort_held")
    assert sent["aborted"], sent
    out = expect_failed(procs, tid, match="aborted by sender: prefill cancelled before its commit")
    if procs.backend == "ucx":
        assert out["arrived"] == 0, out


@pytest.mark.parametrize("procs", ["ucx"], indirect=True)
@pytest.mark.parametrize("window_kib", [256, 1024])
def test_credit_window_bounds_bytes_in_flight(procs, window_kib):
    """64 MiB in 1 MiB chunks through a small window: the instrumented peak of bytes in
    flight never exceeds it, every credit comes back, and the bytes are exact."""
    r, s, addr = procs
    tid, res, pre = reserve_and_prefill(procs, "wide", make_prompt(4095, 4095), per_chunk=4)
    window = window_kib << 10
    sent = send(procs, tid, res, per_chunk=4, window_bytes=window)
    assert sent["published"] is True and not sent["error"], sent
    credits = {k: v for k, v in s.call("s_credits", backend="ucx").items()
               if k.startswith(f"{window}:")}
    assert credits, "the sender kept no credit window"
    for in_flight, peak, capacity in credits.values():
        chunk = 4 * res["block_bytes"]  # one chunk larger than the window goes alone
        assert capacity == window and in_flight == 0
        assert peak <= max(window, chunk) and peak >= min(window, chunk)
    assert r.call("r_finish", tid=tid)["kv_digest"] == pre["kv_digest"]
    s.call("s_decode_self", tid=tid)


@pytest.mark.parametrize("fault", ["checksum", "payload"])
def test_corrupted_chunk_fails_with_checksum_mismatch(procs, fault):
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 1))
    sent = send(procs, tid, res, fault=fault, at=3)
    assert sent["published"] is None and "checksum mismatch" in sent["error"], sent
    expect_failed(procs, tid, match="checksum mismatch")


def test_replayed_chunk_fails_as_duplicate(procs):
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 2))
    sent = send(procs, tid, res, fault="replay", at=2)
    assert "duplicate chunk" in sent["error"], sent
    expect_failed(procs, tid, match="duplicate chunk")


@pytest.mark.parametrize("fault,at,match", [("checksum", 5, "checksum mismatch"), ("payload", 0, "checksum mismatch"),
                                            ("replay", 3, "duplicate chunk"), ("bad_key", 7, "unexpected chunk"),
                                            ("short", 2, "expected")])
def test_one_bad_chunk_in_a_batch_fails_the_transfer(procs, fault, at, match):
    """`send_many` (ucx: one message for all of them): nothing of the batch is published."""
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 7))
    sent = send(procs, tid, res, fault=fault, at=at, many=True)
    assert sent["published"] is None and match in sent["error"], sent
    out = expect_failed(procs, tid, match=match)
    if procs.backend == "ucx":  # the batch lands whole or not at all
        assert out["arrived"] == 0, out


def test_abort_mid_stream_fails_the_transfer(procs):
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 3))
    sent = send(procs, tid, res, fault="abort", at=3)
    assert sent["aborted"] and sent["sent"] == 3
    out = expect_failed(procs, tid, match="aborted by sender: prefill cancelled")
    # tcp: the chunks were on the wire before the ABORT; ucx: sends are issued, and
    # the ABORT may overtake their data (the receiver fences what it posted)
    assert out["arrived"] == 3 if procs.backend == "tcp" else out["arrived"] <= 3


def test_a_commit_ahead_of_its_token_publishes_and_the_tokens_commit_finishes_it(procs):
    """Layer streaming's commit (TOKEN_FOLLOWS): published while the transfer stays open,
    then a COMMIT with the token alone; the decode is the sender's own, token for token."""
    r, s, _ = procs
    tid, res, pre = reserve_and_prefill(procs, "tiny", make_prompt(100, 11))
    sent = send(procs, tid, res, early="token")
    assert sent["ahead_published"] is True and sent["published"] is True and not sent["error"], sent
    done_id = r.start("r_finish", tid=tid)
    mine = s.call("s_decode_self", tid=tid)
    got = r.result(done_id)
    assert got["kv_digest"] == pre["kv_digest"] and got["tokens"] == mine["tokens"]
    assert got["tokens"][0] == pre["first_token"]


def test_the_tokens_commit_posted_now_finishes_it(procs):
    """`commit_now` (the prefill's token COMMIT from token 0's callback): ucx posts it from
    the caller's turn of the loop and returns the verdict's future; tcp cannot and says so
    (None: the caller commits as before); neither can to a destination it is not connected to."""
    r, s, _ = procs
    tid, res, pre = reserve_and_prefill(procs, "tiny", make_prompt(100, 14))
    sent = send(procs, tid, res, early="token_now")
    assert sent["ahead_published"] is True and sent["published"] is True and not sent["error"], sent
    assert sent["posted_now"] is (procs.backend == "ucx") and sent["unknown_dest_now"] is True
    done_id = r.start("r_finish", tid=tid)
    mine = s.call("s_decode_self", tid=tid)
    got = r.result(done_id)
    assert got["kv_digest"] == pre["kv_digest"] and got["tokens"] == mine["tokens"]


def test_an_abort_between_the_commit_and_its_token_fails_the_transfer(procs):
    """Published ahead of its token, the transfer is still pending: the sender's ABORT
    ends it (R frees its blocks), as it would before any commit."""
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 12))
    sent = send(procs, tid, res, early="abort")
    assert sent["ahead_published"] is True and sent["aborted"], sent
    expect_failed(procs, tid, match="aborted by sender: prefill failed after its commit")


def test_a_second_commit_with_chunks_after_a_token_commit_is_refused(procs):
    """Once the token's COMMIT finished the transfer, it is no longer pending: a third
    COMMIT (chunks and all) is refused, nothing is written."""
    r, s, _ = procs
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(60, 13))
    assert send(procs, tid, res, early="token")["published"] is True
    again = s.call("s_recommit", tid=tid)
    assert again["published"] is False and "not expected" in again["reason"], again
    assert r.call("r_finish", tid=tid)["state"] == "published"
    s.call("s_decode_self", tid=tid)


@pytest.mark.parametrize("fault,match", [("bad_key", "unexpected chunk"),
                                         ("short", "expected")])
def test_rejected_chunk_fails_the_transfer(procs, fault, match):
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(60, 4))
    sent = send(procs, tid, res, fault=fault, at=1)
    assert sent["error"] and sent["published"] is None, sent
    expect_failed(procs, tid, match=match)


def test_unexpected_transfer_is_refused_and_writes_nothing(procs):
    """tcp (TLS names the peer): refused with the reason. ucx: no key of R's holds for a
    transfer R never expected, so nothing of it is taken or answered (each message dropped
    and counted); the sender hears nothing and gives up after its io timeout."""
    r, s, _ = procs
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(100, 5))
    before, dropped = r.call("r_blocks_digest", tid=tid), r.call("r_stats").get("rejected_unknown_transfer", 0)
    sent = send(procs, tid, res, as_tid="ghost", io_timeout_s=1.0)  # same keys, a transfer R never expected
    if procs.backend == "tcp":
        assert "not expected" in sent["error"], sent
    else:
        assert sent["published"] is None and "in 1.0 s" in sent["error"], sent
        assert r.call("r_stats")["rejected_unknown_transfer"] - dropped >= 2, r.call("r_stats")  # AUTH, CHUNK...
    assert r.call("r_blocks_digest", tid=tid) == before
    r.call("r_forget", tid=tid)
    r.call("r_finish", tid=tid)
    s.call("s_decode_self", tid=tid)


def test_a_large_commit_for_no_transfer_is_refused_unread(procs):
    """The commit's body (here ~200 KB, out of line on ucx) is not taken into memory for a
    transfer R does not expect. tcp: the verdict says why. ucx: its head is dropped unread
    (no key of R's holds for it), nothing answers, and the body, on a tag nobody receives,
    is swept off UCX's unexpected queue within a sweep or two."""
    r, s, addr = procs
    before = r.call("r_stats")
    out = s.call("s_commit_ghost", dest=addr, backend=procs.backend, n_chunks=4000, io_timeout_s=1.0)
    if procs.backend == "tcp":
        assert out["published"] is False and "not expected" in out["reason"], out
        return
    assert out["published"] is None and "in 1.0 s" in out["error"], out
    deadline = time.monotonic() + 5
    while (after := r.call("r_stats"))["swept"] == before["swept"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after["rejected_unknown_transfer"] - before.get("rejected_unknown_transfer", 0) >= 2, after  # AUTH, COMMIT
    assert after["swept"] - before["swept"] >= 1, after


def test_forget_mid_stream_drops_later_chunks(procs):
    r, s, _ = procs
    tid, res, _ = reserve_and_prefill(procs, "tiny", make_prompt(200, 6), per_chunk=1)
    assert send(procs, tid, res, per_chunk=1, fault="pause", at=10)["paused"]
    r.call("r_forget", tid=tid)
    frozen = r.call("r_blocks_digest", tid=tid)
    rest = s.call("s_resume", tid=tid)
    assert not rest["published"], rest  # refused: an ERROR per chunk or a negative verdict
    assert r.call("r_blocks_digest", tid=tid) == frozen
    r.call("r_finish", tid=tid)
    s.call("s_decode_self", tid=tid)


def test_sender_killed_mid_transfer_fails_within_the_idle_timeout(procs, light):
    r, _, addr = procs
    ls = light("sender")
    tid = new_tid()
    res = r.call("r_reserve", tid=tid, spec="tiny", prompt=make_prompt(100, 9))
    keys = [ChunkKey(layer, 0, 2) for layer in range(3)]
    assert ls.call("ls_send", dest=addr, tid=tid, keys=keys, block_bytes=res["block_bytes"],
                   backend=procs.backend) == 3
    t0 = time.monotonic()
    ls.signal(signal.SIGKILL)
    out = r.call("r_outcome", tid=tid, timeout_s=IDLE_TIMEOUT_S + 5)
    assert out["state"] == "failed" and out["arrived"] == 3, out
    if procs.backend == "tcp":  # the kernel closes the connection at once
        assert "lost" in out["reason"] and out["at"] - t0 < IDLE_TIMEOUT_S, out
    else:  # UCX (error handling off) reports nothing: the idle watchdog fails it
        assert "idle" in out["reason"] and out["at"] - t0 < IDLE_TIMEOUT_S + 1.0, out
    r.call("r_finish", tid=tid)


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_receiver_gone_mid_transfer_raises_transfer_error(procs, light, how):
    _, s, _ = procs
    tid = new_tid()
    prompt = make_prompt(150, 10)
    s.call("s_prefill", tid=tid, spec="tiny", prompt=prompt)
    lr = light("receiver")
    io_timeout_s = 1.0
    tiny_block_bytes = 16 * 2 * 2 * 8 * 4  # 16 tokens x K,V x 2 heads x 8 dims x fp32
    dest = lr.call("lr_start", tid=tid, block_bytes=tiny_block_bytes, backend=procs.backend)
    first = s.call("s_send", tid=tid, dest=dest, first_block=0, last_block=10, per_chunk=2,
                   backend=procs.backend, fault="pause", at=5, io_timeout_s=io_timeout_s)
    assert first["paused"] and first["sent"] == 5
    lr.signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    t0 = time.monotonic()
    rest = s.call("s_resume", tid=tid, timeout_s=30)
    elapsed = time.monotonic() - t0
    assert rest["error"] and rest["published"] is None, rest
    if how == "killed":  # tcp: the peer's kernel resets the connection; ucx: a pid probe
        assert elapsed < io_timeout_s, rest
    else:
        assert io_timeout_s - 0.1 <= rest["elapsed_s"] and elapsed < io_timeout_s + 2, rest
        lr.signal(signal.SIGKILL)
    lr.proc.join(5)
    again = new_tid()
    s.call("s_prefill", tid=again, spec="tiny", prompt=prompt)
    t0 = time.monotonic()
    refused = s.call("s_send", tid=again, dest=dest, first_block=0, last_block=10, per_chunk=2,
                     backend=procs.backend, io_timeout_s=io_timeout_s)
    gone = ("cannot connect",) if procs.backend == "tcp" else ("cannot connect", "is gone")
    assert any(g in refused["error"] for g in gone) and time.monotonic() - t0 < 2.0, refused
    for t in (tid, again):
        s.call("s_decode_self", tid=t)
