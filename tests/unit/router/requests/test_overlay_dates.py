"""The dispatch overlay with dated load reports: the directory stamps each report on its
own clock, and the router places it on its own (router/requests/placement.py).

The store's clock here runs `OFFSET_MS` ahead of the router's: only differences of
store readings may matter. A snapshot read takes `RTT_S` of the router's time and the
store reads its clock half-way.
"""

from __future__ import annotations

from router.requests.placement import LoadOverlay, free_blocks
from runtime.directory.records import ClusterSnapshot, LoadReport, WorkerCapacity, WorkerRecord, WorkerRole

CAP = WorkerCapacity(total_blocks=100, max_decode_batch=8, max_prefill_tokens=512, block_size=16)
OFFSET_MS = 1_700_000_000_000
RTT_S = 0.002


class Router:
    """An overlay on a fake clock, and snapshot reads against a store clock."""

    def __init__(self, start_s: float = 10.0):
        self.now = start_s
        self.overlay = LoadOverlay(ttl_s=5.0, clock=lambda: self.now)

    def store_ms(self, router_s: float) -> int:
        return OFFSET_MS + int(router_s * 1000)

    def read(self, *reports: tuple[int, int, float]) -> None:
        """A snapshot of d0 whose report, taken at router time `at_s`, shows (batch, free)."""
        fetch = self.overlay.fetch_started()
        self.now += RTT_S
        workers = tuple(
            WorkerRecord("d0", WorkerRole.DECODE, "d0:1", "d0:2", "abi", CAP,
                         LoadReport(active_decode_batch=batch, free_blocks=free, total_blocks=100), 1, 0,
                         load_reported_ms=self.store_ms(at_s))
            for batch, free, at_s in reports)
        self.overlay.observe(ClusterSnapshot(workers, 3, self.store_ms(self.now - RTT_S / 2)), fetch)

    def dispatch(self, at_s: float = 10.010) -> int:
        """A snapshot whose report (idle) predates it, then a 4-block dispatch to d0 at `at_s`."""
        self.read((0, 100, 9.5))
        self.now = at_s
        return self.overlay.add(self.d0(), blocks=4)

    def d0(self) -> WorkerRecord:
        return WorkerRecord("d0", WorkerRole.DECODE, "d0:1", "d0:2", "abi", CAP, epoch=1)

    def seqs(self) -> int:
        """Sequences of d0's decode batch the overlay adds to its report (negative: gives back)."""
        return self.overlay.totals().get("d0", (0, 0, 0))[2]


def test_a_report_taken_during_a_short_request_and_read_after_it_ended_is_corrected():
    """The router e2e test's flake: a stream of short colocated requests, each priced
    against the report its predecessor's run left behind (batch 1, four blocks held)."""
    r = Router()
    handle, start = r.dispatch(), 10.010
    assert r.seqs() == 1  # dispatched, no report shows it yet
    r.now = 10.040
    r.overlay.remove(handle)  # the request ended before any snapshot was read
    assert r.seqs() == 0 and len(r.overlay) == 0
    r.now = 10.041
    r.read((1, 96, start + 0.010))  # taken while it ran: it shows the ended request
    assert r.overlay.totals() == {"d0": (0, -4, -1)}
    w = WorkerRecord("d0", WorkerRole.DECODE, "d0:1", "d0:2", "abi", CAP,
                     LoadReport(active_decode_batch=1, free_blocks=96,
                                total_blocks=100), 1)
    assert free_blocks(w, r.overlay) == 100
    r.now = 10.060
    r.read((0, 100, 10.050))  # taken after the end: right again, nothing to correct
    assert r.overlay.totals() == {}


def test_a_report_read_while_the_request_runs_shows_it_and_its_end_is_given_back():
    r = Router()
    handle = r.dispatch()
    r.now = 10.030
    r.read((1, 96, 10.020))
    assert r.seqs() == 0 and len(r.overlay) == 1  # shown: kept, counting nothing, for its end
    r.now = 10.050
    r.overlay.remove(handle)
    r.overlay.remove(handle)  # idempotent: given back once
    assert r.overlay.totals() == {"d0": (0, -4, -1)}
    r.now = 10.060
    r.read((1, 96, 10.020))  # the same report again: still given back
    assert r.seqs() == -1
    r.now = 10.100
    r.read((0, 100, 10.090))
    assert r.overlay.totals() == {}


def test_a_report_that_may_predate_the_dispatch_does_not_count_it_as_shown():
    r = Router()
    r.now = 10.010
    handle = r.overlay.add(r.d0(), blocks=4)
    r.now = 10.030
    r.read((0, 100, 10.010))  # stamped the very millisecond of the dispatch: maybe before it
    assert r.seqs() == 1
    r.overlay.remove(handle)
    r.now = 10.040
    r.read((0, 100, 10.010))
    assert r.seqs() == 0  # never given back: no report surely taken during it


def test_a_request_no_report_saw_ends_without_ever_counting_negative():
    r = Router()
    handle = r.dispatch()
    r.now = 10.020
    r.overlay.remove(handle)
    for at in (9.5, 10.019):  # an old report, then one that may have been taken after the end
        r.now += 0.010
        r.read((0, 100, at))
        assert r.overlay.totals().get("d0", (0, 0, 0)) == (0, 0, 0)
    r.now += 0.010
    r.read((0, 100, 10.025))  # surely after the end: the entry is gone
    assert r.overlay.totals() == {} and not r.overlay._entries


def test_an_ended_request_waiting_for_a_report_expires_after_the_ttl():
    r = Router()
    r.overlay.remove(r.dispatch())
    r.now = 15.5
    assert r.overlay.totals() == {} and not r.overlay._entries


def test_planned_holds_count_whatever_the_reports_say():
    r = Router()
    r.now = 10.010
    handle = r.overlay.add(r.d0(), blocks=4, planned=True)
    r.now = 10.100
    r.read((0, 100, 10.090))  # newer than the plan, but a plan is not on the worker
    assert r.overlay.blocks("d0") == 4
    r.overlay.remove(handle)
    assert r.overlay.totals() == {}


def test_undated_reports_from_an_older_directory_keep_the_lease_rule():
    r = Router()
    fetch = r.overlay.fetch_started()
    r.overlay.observe(ClusterSnapshot((WorkerRecord("d0", WorkerRole.DECODE, "d0:1", epoch=1,
                                                    lease_expiry_ms=1000),), 3,
                                      r.store_ms(r.now)), fetch)
    handle = r.overlay.add(r.d0(), blocks=4)
    r.now += 0.050
    r.overlay.remove(handle)  # undated: no later report can be placed in time, so dropped
    assert r.overlay.totals() == {} and not r.overlay._entries


def test_a_report_taken_before_the_worker_confirmed_the_blocks_does_not_retire_them():
    """The burst's requeues: a report taken after the call left but before the worker
    allocated (the call in flight, or queued behind a busy loop) does not show it; an
    unconfirmed dispatch counts until a report taken after the worker's confirmation."""
    r = Router()
    r.read((0, 100, 9.5))
    r.now = 10.010
    handle = r.overlay.add(r.d0(), blocks=4, confirmed=False)
    r.now = 10.040
    r.read((0, 100, 10.030))  # taken after the dispatch, before the worker allocated: 100 free
    assert r.overlay.blocks("d0") == 4  # still counted
    r.now = 10.060
    r.overlay.confirm(handle)
    r.read((1, 96, 10.050))  # taken before the confirmation: cannot prove it shows the blocks
    assert r.overlay.blocks("d0") == 4
    r.now = 10.100
    r.read((1, 96, 10.090))  # taken after it: shows them
    assert r.overlay.blocks("d0") == 0
