"""The DirectoryStore contract, part three: the release record (compare-and-set, the
route stop) and the route epoch's retirement of unpublished transfers (docs/design.md, The release)."""

from __future__ import annotations

from runtime.directory.records import ReleaseHead
from runtime.directory.states import Outcome, TxnState
from tests.support.directory.harness import CHUNKS, KV, ContractBase, make_spec


class ReleaseContract(ContractBase):
    """Only a writer that read the stored version writes; stopped routes refuse reserves;
    nothing reserved under a retired route epoch moves on."""

    def test_release_record_is_compare_and_set(self, harness):
        store = harness.open()
        assert store.get_release() is None
        assert store.snapshot().release == ReleaseHead()
        outcome, stored = store.put_release(0, ReleaseHead(1, 4, False), b"\x00one\xff")
        assert outcome is Outcome.APPLIED and stored.record == b"\x00one\xff"  # any bytes survive
        stale, kept = store.put_release(0, ReleaseHead(1, 1, False), b"other")  # a second writer of version 1
        assert stale is Outcome.STALE_GENERATION and kept.record == b"\x00one\xff" and kept.head.state == 4
        outcome, _ = store.put_release(1, ReleaseHead(2, 5, True), b"two")
        assert outcome is Outcome.APPLIED
        assert store.get_release().head == store.snapshot().release == ReleaseHead(2, 5, True)
        harness.assert_no_leaks(store)

    def test_stopped_routes_refuse_new_transfers_only(self, harness, ends):
        store, p, d = ends
        assert store.reserve(make_spec(p, d, tid="before")).outcome is Outcome.APPLIED
        store.put_release(0, ReleaseHead(1, 5, True), b"rolled back")
        refused = store.reserve(make_spec(p, d, tid="after", rid="r2"))
        assert (refused.outcome, refused.txn) == (Outcome.ROUTES_STOPPED, None)
        assert store.lookup("after") is None
        assert store.begin("before", KV).outcome is Outcome.APPLIED  # the stop is for new routes only
        store.put_release(1, ReleaseHead(2, 1, False), b"pinned")
        assert store.reserve(make_spec(p, d, tid="later", rid="r3")).outcome is Outcome.APPLIED
        for tid in ("before", "later"):
            store.abort(tid, "cleanup")
        harness.assert_no_leaks(store)

    def test_nothing_reserved_under_a_retired_route_epoch_moves_on(self, harness, ends):
        store, p, d = ends
        r0 = store.get_route_epoch()
        store.reserve(make_spec(p, d, tid="sending", route_epoch=r0))
        store.begin("sending", KV)
        store.reserve(make_spec(p, d, tid="waiting", rid="r2", route_epoch=r0))
        store.reserve(make_spec(p, d, tid="done", rid="r3", route_epoch=r0))
        for step in (store.begin("done", KV), store.validated("done", KV, CHUNKS), store.publish("done", 1, KV)):
            assert step.outcome is Outcome.APPLIED
        assert store.publications(r0) == 1
        advanced = store.advance_route_epoch()
        assert advanced.retired_publications == 1 and store.publications(advanced.route_epoch) == 0
        for result in (store.validated("sending", KV, CHUNKS), store.begin("waiting", KV)):
            assert result.outcome is Outcome.STALE_GENERATION
            assert (result.txn.state, result.txn.abort_reason) == (TxnState.ABORTED, "route_epoch_retired")
        assert store.publish("sending", 1, KV).outcome is Outcome.STALE_GENERATION  # and stays refused
        assert store.release("done").outcome is Outcome.APPLIED  # published caches finish under their epoch
        assert store.publications(r0) == 1  # nothing published under it since it was retired
        harness.assert_no_leaks(store)
