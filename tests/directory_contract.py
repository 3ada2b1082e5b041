"""The DirectoryStore contract, run against every implementation.

A test module subclasses ``DirectoryContract`` and provides a ``harness``
fixture (a ``Harness``): the memory store in tests/unit, Redis in
tests/integration. Every test ends with ``harness.assert_no_leaks(store)``:
no transaction outside PUBLISHED / ABORTED / RELEASED.
"""

from __future__ import annotations

import abc
import threading

import pytest

from kv_directory.store import DirectoryStore
from services.directory.records import (
    LoadReport,
    Transaction,
    TransferSpec,
    WorkerInfo,
    WorkerRecord,
    chunk_list_digest,
)
from services.directory.states import Outcome, TxnState, check_transition

FINAL_OK = {TxnState.PUBLISHED, TxnState.ABORTED, TxnState.RELEASED}


class Harness(abc.ABC):
    """How the contract opens a store, moves time and inspects raw state."""

    @abc.abstractmethod
    def open(self, **config: object) -> DirectoryStore:
        """A fresh, empty store; ``config`` overrides DirectoryConfig fields."""

    @abc.abstractmethod
    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on the store's clock (fake or real)."""

    @abc.abstractmethod
    def all_transactions(self, store: DirectoryStore) -> list[Transaction]:
        """Every stored transaction record, bypassing the store's indexes."""

    def assert_no_leaks(self, store: DirectoryStore) -> None:
        """Leak check: nothing open, nothing stored outside the final states."""
        assert store.list_open() == []
        stuck = [(t.transfer_id, t.state.name) for t in self.all_transactions(store) if t.state not in FINAL_OK]
        assert stuck == [], f"leaked transactions: {stuck}"


def register(store: DirectoryStore, worker_id: str, role: str = "decode") -> WorkerRecord:
    """Register a worker with placeholder addresses."""
    return store.register_worker(WorkerInfo(worker_id, role, f"{worker_id}:1", f"{worker_id}:2", "abi-1"))


LAYOUT = ((0, 0, 2, 4096), (1, 0, 2, 4096))
"""The expected chunks of the specs below: two layers of two blocks."""
CHUNKS = chunk_list_digest(LAYOUT)
KV = "kv" * 16
"""The K/V digest the source declares and the destination matches."""


def make_spec(p: WorkerRecord, d: WorkerRecord, tid: str = "t1", gen: int = 1, rid: str = "r1",
              tenant: str = "acme", chunks: tuple = LAYOUT, route_epoch: int = 0) -> TransferSpec:
    """A TransferSpec from ``p`` to ``d`` at their current epochs."""
    digest = chunk_list_digest(chunks)
    return TransferSpec(tid, rid, tenant, gen, p.ref, d.ref, f"manifest-{digest[:16]}", digest, route_epoch)


# op name -> (target state, call)
OPS = {
    "begin": (TxnState.TRANSFERRING, lambda s, tid, gen: s.begin(tid, KV)),
    "validated": (TxnState.VALIDATED, lambda s, tid, gen: s.validated(tid, KV, CHUNKS)),
    "publish": (TxnState.PUBLISHED, lambda s, tid, gen: s.publish(tid, gen, KV)),
    "release": (TxnState.RELEASED, lambda s, tid, gen: s.release(tid)),
    "abort": (TxnState.ABORTED, lambda s, tid, gen: s.abort(tid, "test")),
}
PATH_TO = {
    TxnState.RESERVED: [],
    TxnState.TRANSFERRING: ["begin"],
    TxnState.VALIDATED: ["begin", "validated"],
    TxnState.PUBLISHED: ["begin", "validated", "publish"],
    TxnState.RELEASED: ["begin", "validated", "publish", "release"],
    TxnState.ABORTED: ["abort"],
}


def drive(store: DirectoryStore, tid: str, gen: int, state: TxnState) -> None:
    """Move a freshly reserved transaction to ``state`` by legal steps."""
    for op in PATH_TO[state]:
        target, call = OPS[op]
        result = call(store, tid, gen)
        assert result.outcome == Outcome.APPLIED and result.txn.state == target, (op, result)


class DirectoryContract:
    """Tests every DirectoryStore must pass. Subclasses supply ``harness``."""

    @pytest.fixture
    def ends(self, harness):
        store = harness.open()
        return store, register(store, "p0", "prefill"), register(store, "d0", "decode")

    # ---- transaction lifecycle -------------------------------------------

    def test_full_lifecycle_and_idempotent_repeats(self, harness, ends):
        store, p, d = ends
        assert store.reserve(make_spec(p, d)).outcome == Outcome.APPLIED
        for op in ["begin", "validated", "publish", "release"]:
            target, call = OPS[op]
            first, again = call(store, "t1", 1), call(store, "t1", 1)
            assert (first.outcome, first.txn.state) == (Outcome.APPLIED, target)
            assert (again.outcome, again.txn.state) == (Outcome.DUPLICATE, target)
        assert store.publish("t1", 1, KV).outcome == Outcome.DUPLICATE  # late duplicate after release
        assert store.lookup("t1").state == TxnState.RELEASED
        harness.assert_no_leaks(store)

    def test_a_wrong_kv_digest_or_chunk_list_is_refused_and_changes_nothing(self, harness, ends):
        store, p, d = ends
        store.reserve(make_spec(p, d))
        assert store.begin("t1").outcome == Outcome.APPLIED  # streaming: opened before the digest exists
        undeclared = store.validated("t1", KV, CHUNKS)
        assert (undeclared.outcome, undeclared.txn.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        declared = store.begin("t1", KV)  # the source declares it once computed
        assert (declared.outcome, declared.txn.kv_digest) == (Outcome.APPLIED, KV)
        assert store.begin("t1", KV).outcome == Outcome.DUPLICATE
        assert store.begin("t1", "other").outcome == Outcome.CHECKSUM_CONFLICT  # written once
        wrong = store.validated("t1", "f" * 32, CHUNKS)
        assert (wrong.outcome, wrong.txn.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        partial = store.validated("t1", KV, chunk_list_digest(LAYOUT[:1]))
        assert (partial.outcome, partial.txn.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        assert store.validated("t1", KV, CHUNKS).outcome == Outcome.APPLIED
        assert store.validated("t1", "f" * 32, CHUNKS).outcome == Outcome.CHECKSUM_CONFLICT
        assert store.validated("t1", KV, CHUNKS).outcome == Outcome.DUPLICATE
        assert store.publish("t1", 1, "f" * 32).outcome == Outcome.CHECKSUM_CONFLICT
        assert store.lookup("t1").state == TxnState.VALIDATED
        assert store.publish("t1", 1, KV).outcome == Outcome.APPLIED
        assert store.lookup("t1").kv_digest == KV
        store.release("t1")
        harness.assert_no_leaks(store)

    def test_one_begin_opens_and_declares(self, harness, ends):
        store, p, d = ends
        store.reserve(make_spec(p, d))
        r = store.begin("t1", KV)
        assert (r.outcome, r.txn.state, r.txn.kv_digest) == (Outcome.APPLIED, TxnState.TRANSFERRING, KV)
        assert store.validated("t1", KV, CHUNKS).outcome == Outcome.APPLIED
        store.abort("t1", "test over")
        harness.assert_no_leaks(store)

    @pytest.mark.parametrize("state", list(TxnState), ids=lambda s: s.name)
    @pytest.mark.parametrize("op", list(OPS))
    def test_transition_matrix(self, harness, ends, state, op):
        """Every (state, operation) pair: legal moves apply, repeats are
        DUPLICATE, everything else is ILLEGAL_TRANSITION and changes nothing."""
        store, p, d = ends
        store.reserve(make_spec(p, d))
        drive(store, "t1", 1, state)
        target, call = OPS[op]
        result = call(store, "t1", 1)
        if state == target or (op == "publish" and state == TxnState.RELEASED):
            want = Outcome.DUPLICATE
        elif check_transition(state, target):
            want = Outcome.APPLIED
        else:
            want = Outcome.ILLEGAL_TRANSITION
        assert result.outcome == want
        assert result.txn.state == (target if want == Outcome.APPLIED else state)
        assert store.lookup("t1").state == result.txn.state
        if store.lookup("t1").state.is_unpublished:
            store.abort("t1", "cleanup")
        harness.assert_no_leaks(store)

    def test_named_illegal_moves(self, harness, ends):
        store, p, d = ends
        store.reserve(make_spec(p, d))
        assert store.publish("t1", 1, KV).outcome == Outcome.ILLEGAL_TRANSITION  # from RESERVED
        assert store.release("t1").outcome == Outcome.ILLEGAL_TRANSITION  # before publish
        store.abort("t1", "client gone")
        assert store.begin("t1", KV).outcome == Outcome.ILLEGAL_TRANSITION  # after ABORTED
        assert store.lookup("t1").abort_reason == "client gone"
        store.reserve(make_spec(p, d, tid="t2", gen=2))
        drive(store, "t2", 2, TxnState.PUBLISHED)
        assert store.abort("t2", "late").outcome == Outcome.ILLEGAL_TRANSITION  # after PUBLISHED
        assert store.lookup("t2").state == TxnState.PUBLISHED
        harness.assert_no_leaks(store)

    def test_unknown_transfer_is_not_found(self, harness):
        store = harness.open()
        for op, (_, call) in OPS.items():
            assert call(store, "nope", 1).outcome == Outcome.NOT_FOUND, op
        assert store.lookup("nope") is None
        harness.assert_no_leaks(store)

    # ---- generations and idempotency -------------------------------------

    def test_newer_generation_supersedes_and_stale_publish_is_rejected(self, harness, ends):
        store, p, d = ends
        store.reserve(make_spec(p, d, tid="t1", gen=1))
        drive(store, "t1", 1, TxnState.VALIDATED)
        assert store.reserve(make_spec(p, d, tid="t2", gen=2)).outcome == Outcome.APPLIED
        old = store.lookup("t1")
        assert (old.state, old.abort_reason) == (TxnState.ABORTED, "superseded")
        # The late completion of the abandoned route is rejected as stale.
        assert store.publish("t1", 1, KV).outcome == Outcome.STALE_GENERATION
        assert store.begin("t1", KV).outcome == Outcome.STALE_GENERATION
        # An attempt that is not newer than the current one cannot reserve.
        assert store.reserve(make_spec(p, d, tid="t3", gen=2)).outcome == Outcome.STALE_GENERATION
        assert store.reserve(make_spec(p, d, tid="t4", gen=1)).outcome == Outcome.STALE_GENERATION
        assert store.lookup("t3") is None and store.lookup("t4") is None
        drive(store, "t2", 2, TxnState.VALIDATED)
        wrong = store.publish("t2", 1, KV)  # caller's generation is not the txn's: no change
        assert (wrong.outcome, wrong.txn.state) == (Outcome.STALE_GENERATION, TxnState.VALIDATED)
        assert store.publish("t2", 2, KV).outcome == Outcome.APPLIED
        harness.assert_no_leaks(store)

    def test_published_generation_is_stale_after_reroute(self, harness, ends):
        store, p, d = ends
        store.reserve(make_spec(p, d, tid="t1", gen=1))
        drive(store, "t1", 1, TxnState.PUBLISHED)
        assert store.reserve(make_spec(p, d, tid="t2", gen=2)).outcome == Outcome.APPLIED
        assert store.lookup("t1").state == TxnState.PUBLISHED  # published is never aborted
        assert store.publish("t1", 1, KV).outcome == Outcome.STALE_GENERATION
        drive(store, "t2", 2, TxnState.PUBLISHED)
        assert store.release("t1").outcome == Outcome.APPLIED
        harness.assert_no_leaks(store)
    def test_reserve_answers_the_requests_current_generation(self, harness, ends):
        """A request id re-used after its run finished: the reserve of generation 1
        learns the generation to go above (the router re-reserves there)."""
        store, p, d = ends
        assert store.reserve(make_spec(p, d, tid="r1/1", gen=1)).request_generation == 1
        assert store.reserve(make_spec(p, d, tid="r1/3", gen=3)).request_generation == 3
        drive(store, "r1/3", 3, TxnState.PUBLISHED)
        store.release("r1/3")
        again = store.reserve(make_spec(p, d, tid="r1/1", gen=1))  # same bytes: the old record
        assert (again.outcome, again.txn.state, again.request_generation) == \
            (Outcome.DUPLICATE, TxnState.ABORTED, 3)
        other = store.reserve(make_spec(p, d, tid="r1/2", gen=2, chunks=((0, 0, 1, 8),)))
        assert (other.outcome, other.txn, other.request_generation) == (Outcome.STALE_GENERATION, None, 3)
        conflict = store.reserve(make_spec(p, d, tid="r1/3", gen=3, chunks=((0, 0, 1, 9),)))
        assert (conflict.outcome, conflict.request_generation) == (Outcome.CHECKSUM_CONFLICT, 3)
        assert store.reserve(make_spec(p, d, tid="r1/4", gen=4)).outcome == Outcome.APPLIED
        drive(store, "r1/4", 4, TxnState.PUBLISHED)
        assert store.reserve(make_spec(p, d, tid="r9/1", gen=1, rid="r9")).request_generation == 1
        store.abort("r9/1", "cleanup")
        harness.assert_no_leaks(store)


    def test_generations_are_per_tenant_and_request(self, harness, ends):
        store, p, d = ends
        store.reserve(make_spec(p, d, tid="a", gen=5, rid="r1", tenant="acme"))
        assert store.reserve(make_spec(p, d, tid="b", gen=1, rid="r2", tenant="acme")).outcome == Outcome.APPLIED
        assert store.reserve(make_spec(p, d, tid="c", gen=1, rid="r1", tenant="zeta")).outcome == Outcome.APPLIED
        assert store.lookup("a").state == TxnState.RESERVED
        for tid in ("a", "b", "c"):
            store.abort(tid, "cleanup")
        harness.assert_no_leaks(store)

    def test_retry_by_transfer_id(self, harness, ends):
        store, p, d = ends
        first = store.reserve(make_spec(p, d))
        store.begin("t1", KV)
        again = store.reserve(make_spec(p, d))
        assert again.outcome == Outcome.DUPLICATE and again.ok
        assert again.txn.state == TxnState.TRANSFERRING and again.txn.created_ms == first.txn.created_ms
        corrupt = store.reserve(make_spec(p, d, chunks=((0, 0, 2, 4096), (1, 0, 2, 4000))))
        assert corrupt.outcome == Outcome.CHECKSUM_CONFLICT and not corrupt.ok
        other_end = store.reserve(make_spec(p, register(store, "d1"), chunks=LAYOUT))
        assert other_end.outcome == Outcome.CHECKSUM_CONFLICT
        assert store.lookup("t1") == again.txn  # the conflicting retries changed nothing
        store.abort("t1", "cleanup")
        harness.assert_no_leaks(store)

    # ---- leases and epochs -----------------------------------------------

    def test_reserve_needs_both_ends_live_at_their_epochs(self, harness, ends):
        store, p, d = ends
        d2 = register(store, "d0")  # restart: d's old epoch is fenced
        assert d2.epoch > d.epoch
        assert store.reserve(make_spec(p, d)).outcome == Outcome.LEASE_LOST
        assert store.lookup("t1") is None
        assert store.reserve(make_spec(p, d2)).outcome == Outcome.APPLIED
        store.abort("t1", "cleanup")
        harness.assert_no_leaks(store)

    def test_reregister_bumps_epoch_and_aborts_old_unpublished(self, harness, ends):
        store, p, d = ends
        store.reserve(make_spec(p, d, tid="pub", rid="r0"))
        drive(store, "pub", 1, TxnState.PUBLISHED)
        store.reserve(make_spec(p, d, tid="t1"))
        store.begin("t1", KV)
        d2 = register(store, "d0")
        assert d2.epoch > d.epoch
        t1 = store.lookup("t1")
        assert (t1.state, t1.abort_reason) == (TxnState.ABORTED, "worker_restarted")
        assert store.validated("t1", KV, CHUNKS).outcome == Outcome.LEASE_LOST
        # Published K/V went with the old process: released, not aborted (issue 15, item 5).
        pub = store.lookup("pub")
        assert (pub.state, pub.abort_reason) == (TxnState.RELEASED, "decode worker gone: worker_restarted")
        assert store.heartbeat("d0", d.epoch, LoadReport()).outcome == Outcome.LEASE_LOST
        assert store.heartbeat("d0", d2.epoch, LoadReport()).outcome == Outcome.APPLIED
        assert store.snapshot().worker("d0").epoch == d2.epoch
        assert store.deregister_worker("d0", d2.epoch) == Outcome.APPLIED
        assert store.snapshot().worker("d0") is None
        assert register(store, "d0").epoch > d2.epoch  # monotonic across a reap
        harness.assert_no_leaks(store)

    def test_heartbeat_replaces_load(self, harness, ends):
        store, p, d = ends
        load = LoadReport(pending_prefill_tokens=7, active_decode_batch=3, free_blocks=10,
                          reserved_blocks=2, total_blocks=16)
        beat = store.heartbeat("d0", d.epoch, load)
        assert beat.outcome == Outcome.APPLIED and beat.lease_expiry_ms >= d.lease_expiry_ms
        snap = store.snapshot()
        assert [w.worker_id for w in snap.workers] == ["d0", "p0"]
        assert snap.worker("d0").load == load and snap.worker("p0").load == LoadReport()
        assert snap.worker("p0").role.value == "prefill"
        harness.assert_no_leaks(store)

    def test_colocated_only_reason_is_kept(self, harness):
        store = harness.open()
        why = "lm_head: rows 0..0 computed apart differ"
        rec = store.register_worker(WorkerInfo("m0", "mixed", "m0:1", "m0:2", "abi-x", colocated_only_reason=why))
        assert rec.colocated_only_reason == why
        assert store.snapshot().worker("m0").colocated_only_reason == why
        assert register(store, "d0").colocated_only_reason == ""
        assert store.snapshot().worker("d0").colocated_only_reason == ""

    def test_lease_expiry_hides_worker_and_aborts_its_transactions(self, harness):
        store = harness.open(lease_ttl_s=1.0)
        p, d = register(store, "p0", "prefill"), register(store, "d0")
        store.reserve(make_spec(p, d))
        store.begin("t1", KV)
        store.reserve(make_spec(p, d, tid="pub", rid="r0"))
        drive(store, "pub", 1, TxnState.PUBLISHED)
        # Real sleeps only overshoot, so d0's side is safe; p0 keeps 0.5 s of slack.
        harness.advance(0.6)
        assert store.heartbeat("p0", p.epoch, LoadReport()).outcome == Outcome.APPLIED
        harness.advance(0.5)  # d0 silent for 1.1 s > ttl; p0 for 0.5 s
        snap = store.snapshot()
        assert [w.worker_id for w in snap.workers] == ["p0"]
        t1 = store.lookup("t1")
        assert (t1.state, t1.abort_reason) == (TxnState.ABORTED, "lease_expired")
        assert store.validated("t1", KV, CHUNKS).outcome == Outcome.LEASE_LOST
        # A decode worker killed after publication leaves nothing PUBLISHED (issue 15, item 5).
        pub = store.lookup("pub")
        assert (pub.state, pub.abort_reason) == (TxnState.RELEASED, "decode worker gone: lease_expired")
        assert store.release("pub").outcome == Outcome.DUPLICATE  # a late release is harmless
        assert store.heartbeat("d0", d.epoch, LoadReport()).outcome == Outcome.LEASE_LOST
        harness.assert_no_leaks(store)

    def test_reap_expired_explicitly(self, harness):
        store = harness.open(lease_ttl_s=1.0)
        p, d = register(store, "p0", "prefill"), register(store, "d0")
        store.reserve(make_spec(p, d))
        harness.advance(1.2)
        assert store.reap_expired() >= 2  # two workers (and the txn with them)
        assert store.reap_expired() == 0
        assert store.lookup("t1").state == TxnState.ABORTED
        assert store.snapshot().workers == ()
        harness.assert_no_leaks(store)

    def test_unpublished_transaction_times_out(self, harness):
        store = harness.open(txn_ttl_s=1.0)
        p, d = register(store, "p0", "prefill"), register(store, "d0")
        store.reserve(make_spec(p, d))
        store.begin("t1", KV)
        harness.advance(1.2)
        assert store.validated("t1", KV, CHUNKS).outcome == Outcome.LEASE_LOST
        assert store.lookup("t1").abort_reason == "txn_timeout"
        harness.assert_no_leaks(store)

    def test_list_open_by_worker(self, harness, ends):
        store, p, d = ends
        d1 = register(store, "d1")
        store.reserve(make_spec(p, d, tid="a", rid="r1"))
        store.reserve(make_spec(p, d1, tid="b", rid="r2"))
        assert [t.transfer_id for t in store.list_open()] == ["a", "b"]
        assert [t.transfer_id for t in store.list_open("d1")] == ["b"]
        assert [t.transfer_id for t in store.list_open("p0")] == ["a", "b"]
        store.abort("a", "cleanup")
        store.abort("b", "cleanup")
        harness.assert_no_leaks(store)

    # ---- route epoch, nonces ---------------------------------

    def test_route_epoch(self, harness, ends):
        store, p, d = ends
        r0 = store.get_route_epoch()
        assert r0 == store.get_route_epoch() == store.snapshot().route_epoch  # stable until advanced
        assert 0 < r0 <= store.snapshot().now_ms  # created from the store's clock (next_fence)
        r1 = store.advance_route_epoch().route_epoch
        assert r1 > r0
        stale = store.advance_route_epoch(expected=r0)
        assert (stale.outcome, stale.route_epoch) == (Outcome.STALE_GENERATION, r1)
        r2 = store.advance_route_epoch(expected=r1).route_epoch
        assert r2 > r1 and store.snapshot().route_epoch == r2
        old_route = store.reserve(make_spec(p, d, tid="t1", route_epoch=r1))
        assert old_route.outcome == Outcome.STALE_GENERATION
        assert store.reserve(make_spec(p, d, tid="t2", route_epoch=r2)).outcome == Outcome.APPLIED
        store.abort("t2", "cleanup")
        harness.assert_no_leaks(store)

    def test_nonce_is_consumed_once(self, harness):
        store = harness.open()
        assert store.consume_nonce("n1", 30) == Outcome.APPLIED
        assert store.consume_nonce("n1", 30) == Outcome.DUPLICATE
        assert store.consume_nonce("n2", 30) == Outcome.APPLIED
        harness.assert_no_leaks(store)

    # ---- atomicity under contention --------------------------------------

    def test_concurrent_attempts_leave_newest_generation_published(self, harness, ends):
        """Attempts race through the whole lifecycle; whatever interleaving,
        the newest reserved generation publishes and nothing stays open."""
        store, p, d = ends
        results: dict[int, list[Outcome]] = {}

        def attempt(gen: int) -> None:
            tid = f"t{gen}"
            outs = [store.reserve(make_spec(p, d, tid=tid, gen=gen)).outcome]
            if outs[0] == Outcome.APPLIED:
                outs += [store.begin(tid, KV).outcome, store.validated(tid, KV, CHUNKS).outcome,
                         store.publish(tid, gen, KV).outcome]
            results[gen] = outs

        threads = [threading.Thread(target=attempt, args=(g,)) for g in range(1, 9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reserved = [g for g, outs in results.items() if outs[0] == Outcome.APPLIED]
        assert store.lookup(f"t{max(reserved)}").state == TxnState.PUBLISHED
        for g, outs in results.items():
            assert set(outs) <= {Outcome.APPLIED, Outcome.STALE_GENERATION}, (g, outs)
        harness.assert_no_leaks(store)

