"""The directory's judge of relayed seals (kv_directory/seals.py) over the memory store:
it opens a seal only with the key the source registered at the manifest's source epoch,
and leaves a transaction past any declaration to the store's own answer."""

from __future__ import annotations

from kv_directory.memory_store import MemoryDirectoryStore
from kv_directory.seals import SealJudge
from runtime.directory.records import WorkerInfo
from runtime.security.seal import Sealer
from tests.support.directory.harness import CHUNKS, KV, make_spec, register

HELD = KV + "+" + "ab" * 32


def _ends(sealer: Sealer | None):
    store = MemoryDirectoryStore()
    p = store.register_worker(WorkerInfo("p0", "prefill", "p0:1", "p0:2", "abi-1",
                                         seal_key=sealer.public if sealer else b""))
    d = register(store, "d0", "decode")
    store.reserve(make_spec(p, d))
    return store, p


def test_the_sources_seal_opens_and_any_other_does_not():
    sealer = Sealer()
    store, p = _ends(sealer)
    refused = []
    judge, txn = SealJudge(refused.append), store.lookup("t1")
    assert judge.why_not(store, txn, sealer.seal("t1", 1, "p0", p.epoch, HELD), HELD) == ""
    assert "does not open" in judge.why_not(store, txn, sealer.seal("t1", 1, "p0", p.epoch, HELD), KV + "+" + "cd" * 32)
    assert "does not open" in judge.why_not(store, txn, Sealer().seal("t1", 1, "p0", p.epoch, HELD), HELD)
    assert "does not open" in judge.why_not(store, txn, sealer.seal("t1", 1, "p0", p.epoch + 1, HELD), HELD)
    assert refused == ["not_opened"] * 3  # counted (pd_seal_refusals_total), the opened one not


def test_a_source_without_a_key_at_that_epoch_cannot_be_judged():
    store, p = _ends(None)
    refused = []
    assert "registered no seal key" in SealJudge(refused.append).why_not(
        store, store.lookup("t1"), Sealer().seal("t1", 1, "p0", p.epoch, HELD), HELD)
    assert refused == ["no_key"]
    # restarted with a key: the transaction of the old epoch (aborted by the restart) is not judged
    store.register_worker(WorkerInfo("p0", "prefill", "p0:1", "p0:2", "abi-1", seal_key=Sealer().public))
    assert SealJudge().why_not(store, store.lookup("t1"), b"\0" * 64, HELD) == ""


def test_a_published_transaction_is_left_to_the_store():
    sealer = Sealer()
    store, p = _ends(sealer)
    seal = sealer.seal("t1", 1, "p0", p.epoch, HELD)
    assert store.validate_publish("t1", 1, HELD, CHUNKS, declare=True).txn.state.name == "PUBLISHED"
    # the source restarts: its key is gone, and a retried Publish is still DUPLICATE, not a conflict
    store.register_worker(WorkerInfo("p0", "prefill", "p0:1", "p0:2", "abi-1", seal_key=Sealer().public))
    assert SealJudge().why_not(store, store.lookup("t1"), seal, HELD) == ""
    assert store.validate_publish("t1", 1, HELD, CHUNKS, declare=True).outcome.name == "DUPLICATE"
