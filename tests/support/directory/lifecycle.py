"""The DirectoryStore contract, part one: a transaction's lifecycle (every legal and
illegal move) and its generations (supersede, stale, retry by transfer id)."""

from __future__ import annotations

import pytest

from runtime.directory.records import WorkerInfo, chunk_list_digest
from runtime.directory.states import Outcome, TxnState, check_transition
from tests.support.directory.harness import CHUNKS, KV, LAYOUT, OPS, ContractBase, drive, make_spec, register


class LifecycleContract(ContractBase):
    """Transactions move only by legal steps, and the newest generation wins."""

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

    def test_validate_publish_is_both_moves_or_the_first_refusal(self, harness, ends):
        """The destination's one call: TRANSFERRING -> VALIDATED -> PUBLISHED, each move
        under its own rules; a refusal of the first applies nothing after it."""
        store, p, d = ends
        store.reserve(make_spec(p, d))
        early = store.validate_publish("t1", 1, KV, CHUNKS)  # RESERVED: nothing moved yet
        assert (early.outcome, early.txn.state) == (Outcome.ILLEGAL_TRANSITION, TxnState.RESERVED)
        store.begin("t1", KV)
        wrong = store.validate_publish("t1", 1, "f" * 32, CHUNKS)
        assert (wrong.outcome, wrong.txn.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        partial = store.validate_publish("t1", 1, KV, chunk_list_digest(LAYOUT[:1]))
        assert (partial.outcome, partial.txn.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        stale = store.validate_publish("t1", 2, KV, CHUNKS)  # not the transaction's generation
        assert stale.outcome == Outcome.STALE_GENERATION
        assert store.lookup("t1").state != TxnState.PUBLISHED
        both = store.validate_publish("t1", 1, KV, CHUNKS)
        assert (both.outcome, both.txn.state) == (Outcome.APPLIED, TxnState.PUBLISHED)
        again = store.validate_publish("t1", 1, KV, CHUNKS)  # a retried call
        assert (again.outcome, again.txn.state) == (Outcome.DUPLICATE, TxnState.PUBLISHED)
        store.release("t1")
        assert store.validate_publish("t1", 1, KV, CHUNKS).outcome == Outcome.DUPLICATE
        harness.assert_no_leaks(store)

    def test_declaring_validate_publish_moves_from_reserved_or_transferring(self, harness, ends):
        """declare=True (the servicer opened the source's seal): the declaration goes first,
        in the same step, from RESERVED as from TRANSFERRING without one; it never
        overwrites another declaration, and a refusal after it leaves it declared only."""
        store, p, d = ends
        store.reserve(make_spec(p, d))
        both = store.validate_publish("t1", 1, KV, CHUNKS, declare=True)  # straight from RESERVED
        assert (both.outcome, both.txn.state, both.txn.kv_digest) == (Outcome.APPLIED, TxnState.PUBLISHED, KV)
        again = store.validate_publish("t1", 1, KV, CHUNKS, declare=True)  # a retried call
        assert (again.outcome, again.txn.state) == (Outcome.DUPLICATE, TxnState.PUBLISHED)
        store.reserve(make_spec(p, d, tid="t2", rid="r2"))
        store.begin("t2")  # streamed: opened, not declared
        assert store.validate_publish("t2", 1, KV, CHUNKS, declare=True).txn.state == TxnState.PUBLISHED
        store.reserve(make_spec(p, d, tid="t3", rid="r3"))
        store.begin("t3", "f" * 32)  # declared otherwise (by a Begin)
        other = store.validate_publish("t3", 1, KV, CHUNKS, declare=True)
        assert (other.outcome, other.txn.state, other.txn.kv_digest) == (
            Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING, "f" * 32)
        store.reserve(make_spec(p, d, tid="t4", rid="r4"))
        partial = store.validate_publish("t4", 1, KV, chunk_list_digest(LAYOUT[:1]), declare=True)
        assert (partial.outcome, partial.txn.state) == (Outcome.CHECKSUM_CONFLICT, TxnState.TRANSFERRING)
        assert store.lookup("t4").kv_digest == KV
        for tid in ("t3", "t4"):
            store.abort(tid, "test over")
        for tid in ("t1", "t2"):
            store.release(tid)
        harness.assert_no_leaks(store)

    def test_a_seal_key_is_its_epochs_own(self, harness, ends):
        """seal_key answers the key registered with that epoch, b'' for any other epoch or
        for a worker that registered none."""
        store, p, _d = ends
        assert store.seal_key("p0", p.epoch) == b""
        key = bytes(range(32))
        again = store.register_worker(WorkerInfo("p0", "prefill", "p0:1", "p0:2", "abi-1", seal_key=key))
        assert store.seal_key("p0", again.epoch) == key
        assert store.seal_key("p0", p.epoch) == b""  # the old epoch's
        assert store.seal_key("nobody", again.epoch) == b""
        harness.assert_no_leaks(store)

    def test_validate_publish_of_a_validated_transaction_only_publishes(self, harness, ends):
        store, p, d = ends
        store.reserve(make_spec(p, d))
        store.begin("t1", KV)
        assert store.validated("t1", KV, CHUNKS).outcome == Outcome.APPLIED
        r = store.validate_publish("t1", 1, KV, CHUNKS)
        assert (r.outcome, r.txn.state) == (Outcome.APPLIED, TxnState.PUBLISHED)
        store.release("t1")
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

    def test_a_reserve_run_again_under_its_attempt_answers_applied(self, harness, ends):
        """The same call run twice (the store's retry after a reply lost to a timeout) is
        told APPLIED both times; another call with the same bytes, or none, a DUPLICATE;
        other bytes under the same attempt a CHECKSUM_CONFLICT."""
        store, p, d = ends
        first = store.reserve(make_spec(p, d, tid="t1"), attempt="a1")
        again = store.reserve(make_spec(p, d, tid="t1"), attempt="a1")
        assert (first.outcome, again.outcome) == (Outcome.APPLIED, Outcome.APPLIED)
        assert (again.txn.state, again.request_generation) == (TxnState.RESERVED, 1)
        assert store.reserve(make_spec(p, d, tid="t1"), attempt="a2").outcome == Outcome.DUPLICATE
        assert store.reserve(make_spec(p, d, tid="t1")).outcome == Outcome.DUPLICATE
        assert store.reserve(make_spec(p, d, tid="t1", chunks=((0, 0, 1, 9),)), attempt="a1").outcome == \
            Outcome.CHECKSUM_CONFLICT
        assert store.reserve(make_spec(p, d, tid="t2", gen=2)).outcome == Outcome.APPLIED  # no attempt
        assert store.reserve(make_spec(p, d, tid="t2", gen=2), attempt="").outcome == Outcome.DUPLICATE
        store.abort("t2", "cleanup")
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
