"""The DirectoryStore contract, part two: worker leases and epochs, route epochs,
nonces, and atomicity when attempts race."""

from __future__ import annotations

import threading

from runtime.directory.records import LoadReport, WorkerInfo
from runtime.directory.states import Outcome, TxnState
from tests.support.directory.harness import CHUNKS, KV, ContractBase, drive, make_spec, register


class LeaseContract(ContractBase):
    """Workers live by their leases; what dies with a lease is aborted."""

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
        # Published K/V went with the old process: released, not aborted (docs/design.md, The transaction).
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
        assert 0 < d.load_reported_ms <= store.snapshot().now_ms  # the registration's report is dated
        harness.advance(0.02)
        beat = store.heartbeat("d0", d.epoch, load)
        assert beat.outcome == Outcome.APPLIED and beat.lease_expiry_ms >= d.lease_expiry_ms
        snap = store.snapshot()
        assert [w.worker_id for w in snap.workers] == ["d0", "p0"]
        assert snap.worker("d0").load == load and snap.worker("p0").load == LoadReport()
        # Dated on the snapshot's clock, by the heartbeat that carried it (the router reads ages).
        assert d.load_reported_ms + 20 <= snap.worker("d0").load_reported_ms <= snap.now_ms
        assert snap.worker("p0").load_reported_ms == p.load_reported_ms
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
        # A decode worker killed after publication leaves nothing PUBLISHED (docs/design.md, The transaction).
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

    def test_a_nonce_check_run_again_under_its_attempt_is_not_a_replay(self, harness):
        """The call that consumed a nonce, run again with its attempt token (the store's
        retry after a lost reply), is told APPLIED; any other call, a DUPLICATE."""
        store = harness.open()
        assert store.consume_nonce("n1", 30, attempt="a1") == Outcome.APPLIED
        assert store.consume_nonce("n1", 30, attempt="a1") == Outcome.APPLIED
        assert store.consume_nonce("n1", 30, attempt="a2") == Outcome.DUPLICATE
        assert store.consume_nonce("n1", 30) == Outcome.DUPLICATE
        assert store.consume_nonce("n2", 30) == Outcome.APPLIED
        assert store.consume_nonce("n2", 30, attempt="") == Outcome.DUPLICATE
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
