"""The UCX data plane under attack (fault suite), on a local cluster secure by default (UCX,
1 prefill + 1 decode). The attacker is a process of its own (tests/support/ucx_attacker.py)
holding no certificate and no transfer key; it knows the decode worker's data-plane
address and, where a test gives them, the victims' transfer ids and a genuine message it
captured. The test plays the router for the transfers it holds (tests/support/router_role.py).

After each attack:
  - the victim's reserved blocks' K/V digest is what it was, and its reservation waits for
    its own sender, who is admitted at once;
  - requests through the router during the attack succeed at attempt 1, with the tokens
    they have without it (nothing of the attacker is published);
  - the decode worker answered a genuine AUTH within 100 ms throughout;
  - nothing answered the attacker, the receiver made no endpoint for it, and every drop is
    counted (pd_dataplane_rejected_total{reason});
  - and, last, no block or transaction is left anywhere.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from runtime.transfer.keys import TO_RECEIVER
from runtime.transfer.ucx import wire
from runtime.transfer.ucx.sender import UcxSender
from tests.support import ucx_loop
from tests.support.cluster import _directory, assert_cluster_clean, client, start_cluster
from tests.support.metrics import scrape_process
from tests.support.router_role import assert_untouched, credential, hold, mint, release, status
from tests.support.spawned import spawned

PROMPTS = [[3 + (7 * i + j) % 500 for j in range(40 + 9 * i)] for i in range(4)]
AUTH_ANSWER_S = 0.1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("ucx-attacks"), prefill=1, decode=1, transport="ucx")
    yield c
    c.down()


@pytest.fixture(scope="module")
def attacker(cluster):
    with spawned(("attacker", "tests.support.ucx_attacker")) as (a,):
        yield a
    assert a  # (closed: it exited 0)


@pytest.fixture(scope="module")
def dest(cluster) -> str:
    snap, _ = _directory(cluster)
    [d] = [w for w in snap.workers if w.worker_id == "decode-0"]
    return d.data_plane_address


@pytest.fixture(scope="module")
def reference(cluster) -> list[list[int]]:
    """The prompts' tokens with no attacker about."""
    return [r.token_ids for r in _requests(cluster, [uuid.uuid4().hex for _ in PROMPTS])]


def _requests(cluster, rids: list[str]) -> list:
    with client(cluster, timeout_s=60) as sdk:
        return [sdk.generate_full(prompt_ids=p, max_tokens=8, mode="disaggregated", ignore_eos=True, request_id=rid)
                for p, rid in zip(PROMPTS, rids)]


def rejected(cluster) -> dict[str, float]:
    """decode-0's pd_dataplane_rejected_total by reason (its receiver's and its runtime's sweeps)."""
    out: dict[str, float] = {}
    for s in scrape_process(cluster, "decode-0").samples("pd_dataplane_rejected_total"):
        out[s.labels["reason"]] = out.get(s.labels["reason"], 0) + s.value
    return out


def endpoints(cluster) -> float:
    return scrape_process(cluster, "decode-0").value("pd_dataplane_endpoints", backend="ucx")


class Prober:
    """A genuine sender admitted for one held attempt, which keeps presenting its AUTH (with
    confirm: the receiver answers ADMITTED) from a thread until stopped: every answer's time."""

    def __init__(self, cluster):
        self.cluster, self.held = cluster, hold(cluster, ucx_loop.run)
        self.tx = UcxSender(io_timeout_s=5)
        self.times: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> float:
        h = self.held

        async def go():
            t0 = time.perf_counter()
            await self.tx.present(h.reservation.data_plane_address, h.manifest.transfer_id,
                                  credential(mint(self.cluster, h), h), h.key, confirm=True)
            return time.perf_counter() - t0
        return ucx_loop.run(go())

    def __enter__(self) -> Prober:
        self.once()  # admitted: its capability checked, its nonce consumed (a directory round trip)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.times.append(self.once())
            except Exception as e:  # noqa: BLE001 - an AUTH not answered: the test fails on it, not the thread
                self.errors.append(repr(e))
                self.times.append(float("inf"))
            self._stop.wait(0.02)

    def __exit__(self, *exc) -> None:
        deadline = time.monotonic() + 10
        while len(self.times) < 3 and time.monotonic() < deadline:  # a few answers at least, however short the attack
            time.sleep(0.02)
        self._stop.set()
        self._thread.join(10)
        ucx_loop.run(self.tx.close())
        release(self.cluster, self.held)

    def assert_answered(self) -> None:
        assert len(self.times) >= 3 and max(self.times) < AUTH_ANSWER_S, \
            f"genuine AUTH answered in {[round(t * 1000, 1) for t in self.times]} ms {self.errors}"


def test_forged_messages_for_a_held_transfer_change_nothing(cluster, attacker, dest):
    """Attack 1 (bytes into a victim's blocks), 3 (a message that aborts it) and the AUTH
    attacks (garbage capability, no key): once the victim's own sender was admitted, CHUNK
    (its data, and more, sprayed on guessed tags), COMMIT, ABORT and AUTH for its transfer
    id under the genuine sender's mailbox nonce and made-up keys, and the same in wire 1
    under that nonce. The victim's blocks are untouched, and its own sender's chunk lands."""
    victim = hold(cluster, ucx_loop.run)
    tx = UcxSender(io_timeout_s=5)
    try:
        with Prober(cluster) as probe:
            _present(cluster, victim, tx)  # admitted: the attacker now poses as this very sender
            before, eps = rejected(cluster), endpoints(cluster)  # (one to this process, now)
            assert attacker.call("a_forge", dest=dest, tids=[victim.manifest.transfer_id], rounds=20,
                                 sender=tx.nonce, timeout_s=120) > 0
        probe.assert_answered()
        assert_untouched(status(cluster, victim.manifest.transfer_id), victim)
        after = rejected(cluster)
        assert after.get("bad_mac", 0) - before.get("bad_mac", 0) >= 20 * 4, after
        assert after.get("malformed", 0) - before.get("malformed", 0) >= 20 * 4, after  # the wire-1 messages
        assert endpoints(cluster) == eps and attacker.call("a_heard") == 0
        assert _genuine_chunk_lands(cluster, victim, tx)
    finally:
        ucx_loop.run(tx.close())
        release(cluster, victim)


def _present(cluster, held, tx: UcxSender) -> None:
    """The held attempt's own sender presents its capability and is admitted."""
    h = held
    ucx_loop.run(tx.present(h.reservation.data_plane_address, h.manifest.transfer_id,
                            credential(mint(cluster, h), h), h.key, confirm=True))


def _genuine_chunk_lands(cluster, held, tx: UcxSender | None = None) -> bool:
    """The held attempt's own sender (admitted now, unless `tx` was): its first chunk lands
    (the victim goes on)."""
    from runtime.transfer.base import Chunk, ChunkKey, chunk_checksum
    from runtime.transfer.keys import TransferKey
    spec, m = held.manifest.expected_chunks[0], held.manifest
    key = ChunkKey(spec.layer, spec.block_start, spec.block_count)
    payload = memoryview(bytes(range(256)) * (spec.num_bytes // 256))
    own = tx is None
    if own:
        tx = UcxSender(io_timeout_s=5)
        _present(cluster, held, tx)

    async def go():
        try:
            chunk = Chunk(key, spec.num_bytes, chunk_checksum(TransferKey(m.transfer_id, held.key), key, [payload]))
            await tx.send(held.reservation.data_plane_address, m.transfer_id, chunk, [payload])
            for _ in range(100):
                if status(cluster, m.transfer_id).chunks_received == 1:
                    return True
                await asyncio.sleep(0.02)
            return False
        finally:
            if own:
                await tx.close()
    return ucx_loop.run(go())


def test_requests_succeed_at_attempt_1_while_their_transfers_are_forged_at(cluster, attacker, dest, reference):
    """The attacker knows the transfer ids of the requests to come (request id / 1) and sends
    forged AUTH, CHUNK, COMMIT and ABORT for them, in wire 2 and wire 1, the whole time they
    run: each succeeds at its first attempt with its own tokens."""
    rids = [uuid.uuid4().hex for _ in PROMPTS]
    forging = attacker.start("a_forge", dest=dest, tids=[f"{rid}/1" for rid in rids], rounds=40, spray=8)
    time.sleep(0.3)
    with Prober(cluster) as probe:
        results = _requests(cluster, rids)
    assert attacker.result(forging, timeout_s=120) > 0
    probe.assert_answered()
    assert [(r.route, r.attempts, r.failed_attempts) for r in results] == [("disaggregated", 1, "")] * len(PROMPTS)
    assert [r.token_ids for r in results] == reference
    assert attacker.call("a_heard") == 0


def test_a_body_that_never_comes_deafens_nobody(cluster, attacker, dest, reference):
    """Attack 2: heads announcing an out-of-line body that is never sent. From the attacker
    (no key) they are dropped before any body is waited for; from a key's holder (here the
    test, for one held transfer) the wait is that transfer's own, in its lane: the decode
    worker answers AUTH at once and requests succeed at attempt 1 meanwhile."""
    stalled = hold(cluster, ucx_loop.run)
    try:
        _stall_own(stalled)  # a genuine key's holder stalls its own transfer's lane
        with Prober(cluster) as probe:
            assert attacker.call("a_stall", dest=dest, tids=[stalled.manifest.transfer_id, "other/1"]) == 6
            results = _requests(cluster, [uuid.uuid4().hex for _ in PROMPTS])
        probe.assert_answered()
        assert [r.attempts for r in results] == [1] * len(PROMPTS)
        assert [r.token_ids for r in results] == reference
        assert_untouched(status(cluster, stalled.manifest.transfer_id), stalled)
    finally:
        release(cluster, stalled)


def _stall_own(held) -> None:
    """A COMMIT head of the held transfer, under its key, whose 200 KB body is never sent."""
    m = held.manifest

    async def go():
        from runtime.transfer.keys import TransferKey
        from runtime.transfer.ucx.runtime import runtime
        rt = runtime()
        nonce, _, _, address = wire.parse_address(held.reservation.data_plane_address)
        msg, _, _ = wire.encode(wire.COMMIT, m.transfer_id, wire.new_nonce(), time.time_ns(), {"pad": "x" * 200_000},
                                TransferKey(m.transfer_id, held.key), TO_RECEIVER,
                                lambda: wire.tag(wire.BODY, TransferKey(m.transfer_id, held.key).tag_bits, 5))
        await asyncio.wait([rt.post_send(await rt.endpoint(address), msg, wire.tag(wire.CTRL, nonce))], timeout=5)
    ucx_loop.run(go())


def test_a_replayed_or_reflected_message_is_dropped(cluster, attacker, dest):
    """A genuine AUTH captured on its way (here made by the test, which holds the key) and
    sent again by the attacker, and a reply-direction message under the transfer's own key:
    dropped (replay, bad_mac); the victim is untouched."""
    victim = hold(cluster, ucx_loop.run)
    try:
        from runtime.transfer.keys import TransferKey
        m = victim.manifest
        auth, _, _ = wire.encode(wire.AUTH, m.transfer_id, wire.new_nonce(), time.time_ns(),
                                 {"reply": {"address": "AAAA"}}, TransferKey(m.transfer_id, victim.key), TO_RECEIVER)
        before = rejected(cluster)
        assert attacker.call("a_replay", dest=dest, payloads_hex=[auth.hex()], times=3) == 3
        assert attacker.call("a_reflect", dest=dest, tid=m.transfer_id, key_hex=victim.key.hex()) == 1
        after = rejected(cluster)
        assert after.get("replay", 0) - before.get("replay", 0) == 2, after  # the first copy was taken
        assert after.get("bad_mac", 0) - before.get("bad_mac", 0) == 1, after
        assert_untouched(status(cluster, m.transfer_id), victim)
        assert _genuine_chunk_lands(cluster, victim)
    finally:
        release(cluster, victim)


def test_a_flood_keeps_no_state_and_the_unexpected_queue_is_swept(cluster, attacker, dest):
    """Bounded state: 3,000 messages of garbage, wire-1 HELLOs and wire-2 AUTHs with reply
    addresses (each HELLO once cost a record kept for good) leave the receiver's endpoints as
    they were; 300 messages on tags nobody receives are swept off UCX's unexpected queue and
    counted. The decode worker answers AUTH within 100 ms throughout."""
    with Prober(cluster) as probe:
        before, eps = rejected(cluster), endpoints(cluster)
        assert attacker.call("a_flood", dest=dest, n=3000, timeout_s=120) == 3000
        assert attacker.call("a_unexpected", dest=dest, n=300, timeout_s=120) == 300
        deadline = time.monotonic() + 10
        while rejected(cluster).get("unexpected", 0) - before.get("unexpected", 0) < 300 \
                and time.monotonic() < deadline:
            time.sleep(0.2)
    probe.assert_answered()
    after = rejected(cluster)
    assert after.get("unexpected", 0) - before.get("unexpected", 0) >= 300, after
    dropped = sum(after.values()) - sum(before.values())
    assert dropped >= 3000 + 300, after
    assert endpoints(cluster) == eps and attacker.call("a_heard") == 0


def test_no_nonce_key_or_capability_in_logs_or_labels(cluster, dest):
    """The decode worker's mailbox nonce and worker address (its data-plane address), the
    transfer keys and the capabilities' nonces appear in no process's log, and the prefill's
    /metrics names its peer by host and a short hash, not by nonce."""
    assert _requests(cluster, [uuid.uuid4().hex])[0].attempts == 1  # the prefill has talked to the decode
    held = hold(cluster, ucx_loop.run)
    try:
        assert _genuine_chunk_lands(cluster, held)
        raw = mint(cluster, held)
        cap_nonce = credential(raw, held)["nonce"]
    finally:
        release(cluster, held)
    nonce, _, _, address = wire.parse_address(dest)
    secrets = {"mailbox nonce": f"{nonce:x}@", "worker address": wire.b64(address)[8:40],
               "transfer key": held.key.hex(), "capability nonce": cap_nonce}
    for name, proc in cluster.procs.items():
        text = open(proc.log, errors="replace").read()
        for what, value in secrets.items():
            assert value not in text, f"{name}'s log holds the {what}"
    labels = [v for s in scrape_process(cluster, "prefill-0").samples("pd_transfer_path_info")
              for v in s.labels.values()]
    assert labels and not any(f"{nonce:x}" in v for v in labels), labels


def test_nothing_leaks(cluster):
    """Last in the module: every block and transaction of every attack is back."""
    assert_cluster_clean(cluster)
