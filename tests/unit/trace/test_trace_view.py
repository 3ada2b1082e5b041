"""The trace view over hand-made collector lines (tests/support/traces.py): the tree,
orphans, T_exposed exactly as spans.py defines it, attempts, colocated requests,
unknown ids and malformed lines. No processes."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from pdserve_client import spans as sv
from pdserve_ops import trace_view
from tests.support import traces


def _view(spans: list[dict], request_id: str = "req-1") -> trace_view.View:
    parsed, malformed = trace_view.parse(json.dumps(s) for s in spans)
    found = trace_view.find(parsed, request_id)
    assert len(found) == 1
    return trace_view.waterfall(found[0], malformed)


def _names(view: trace_view.View) -> list[tuple[int, str]]:
    return [(r.depth, r.span.name) for r in view.rows]


def test_the_waterfall_is_a_tree_by_parent_with_siblings_by_start_whatever_the_arrival_order():
    spans = traces.disaggregated()
    expected = _names(_view(spans))
    for seed in range(5):
        random.Random(seed).shuffle(spans)
        assert _names(_view(spans)) == expected
    assert expected[:6] == [(0, sv.ROUTER_REQUEST), (1, sv.ROUTER_DECIDE), (1, sv.ROUTER_ATTEMPT),
                            (2, sv.DECODE_RESERVE), (2, sv.PREFILL_COMPUTE), (1, sv.ROUTER_ATTEMPT)]
    view = _view(spans)
    send = [i for i, r in enumerate(view.rows) if r.span.name == sv.TRANSFER_SEND][0]
    assert view.rows[send + 1].span.name == sv.TRANSFER_COMMIT and view.rows[send + 1].depth == 3
    offsets = [r.offset_ms for r in view.rows if r.depth == 2 and r.span.attributes[sv.TRANSFER_ID] == "x2"]
    assert offsets == sorted(offsets)
    assert len(view.rows) == len(spans) == view.summary.spans == 20


def test_a_span_whose_parent_is_missing_is_an_orphan_but_a_router_request_under_the_clients_span_is_not():
    spans = traces.disaggregated()
    spans[0]["parent_id"] = "c" * 16  # router.request: child of the client's span, not collected
    view = _view(spans)
    orphans = [r.span.name for r in view.rows if r.orphan]
    assert orphans == ["/pd.v1.Directory/Publish"] and view.summary.orphans == 1
    assert view.rows[-1].orphan and view.rows[-1].depth == 0
    assert not view.rows[0].orphan and view.rows[0].span.name == sv.ROUTER_REQUEST


def test_a_parent_cycle_still_shows_every_span_flagged_as_orphans():
    spans = traces.colocated()
    spans[4]["parent_id"], spans[5]["parent_id"] = spans[5]["span_id"], spans[4]["span_id"]
    view = _view(spans, "req-colo")
    assert len(view.rows) == 6 and view.summary.orphans == 1  # the cycle is entered once, from its earliest member
    assert {r.span.name for r in view.rows} == {s["name"] for s in spans}


def test_t_exposed_is_publish_end_minus_the_later_of_reserve_end_and_the_last_compute_end():
    view = _view(traces.disaggregated())
    s = view.summary
    by_id = {x.transfer_id: x for x in s.transfers}
    assert list(by_id) == ["x1", "x2"]
    assert by_id["x2"].publish_end_ms == 23.125 and by_id["x2"].decode_ready_ms == 20.25
    assert by_id["x2"].t_exposed_ms == 2.875 == s.t_exposed_ms  # 23.125 - max(14.0, 20.25)
    assert by_id["x1"].t_exposed_ms is None and by_id["x1"].missing == (sv.DECODE_PUBLISH,)
    assert by_id["x1"].decode_ready_ms == 8.0  # its own reserve (3.0) and compute (8.0), not x2's


def test_t_exposed_is_zero_when_the_transfer_was_hidden_behind_compute():
    spans = [s for s in traces.disaggregated() if s["name"] != sv.ROUTER_ATTEMPT or s["span_id"].startswith("06")]
    for s in spans:
        if s["name"] == sv.DECODE_RESERVE and s["attributes"][sv.TRANSFER_ID] == "x2":
            s["end_ns"] = traces.T0_NS + 24_000_000  # the reservation was ready after the publish
    assert _view(spans).summary.t_exposed_ms == 0.0


def test_published_ahead_of_the_first_token_the_exposure_runs_to_the_admit():
    """A commit ahead of the first token publishes while prefill computes: what is exposed
    is the wait for the token, up to decode.admit (here 23.2 - 22.0)."""
    spans = traces.disaggregated()
    for s in spans:
        if s["name"] == sv.PREFILL_COMPUTE and s["attributes"].get(sv.TRANSFER_ID) == "x2":
            s["end_ns"] = traces.T0_NS + 22_000_000  # the compute ended after the publication (23.125)...
        if s["name"] == sv.DECODE_PUBLISH:
            s["start_ns"], s["end_ns"] = traces.T0_NS + 20_500_000, traces.T0_NS + 21_000_000  # ...ahead of it
    x2 = {x.transfer_id: x for x in _view(spans).summary.transfers}["x2"]
    assert x2.decode_ready_ms == 22.0 and x2.publish_end_ms == 23.2
    assert abs(x2.t_exposed_ms - 1.2) < 1e-9


def test_spans_without_a_transfer_id_join_their_generations_transfer():
    spans = traces.disaggregated()
    for s in spans:
        if s["name"] in (sv.DECODE_RESERVE, sv.PREFILL_COMPUTE):
            del s["attributes"][sv.TRANSFER_ID]
    by_id = {x.transfer_id: x for x in _view(spans).summary.transfers}
    assert by_id["x2"].t_exposed_ms == 2.875 and by_id["x1"].decode_ready_ms == 8.0


def test_attempts_route_first_token_and_counts():
    s = _view(traces.disaggregated()).summary
    assert [(a.generation, a.route, a.transfer_id, a.outcome) for a in s.attempts] == [
        (1, "disaggregated", "x1", "error"), (2, "disaggregated", "x2", "ok")]
    assert s.attempts[0].reasons == ("retry: TRANSFER_FAILED: source prefill-0 lost",)
    assert s.route == "disaggregated" and s.total_ms == 50.0 and s.first_token_ms == 25.0
    assert s.processes == 5 and s.errors == 1 and s.request_id == "req-1"


def test_a_colocated_request_has_no_transfer_and_t_exposed_na():
    view = _view(traces.colocated(), "req-colo")
    s = view.summary
    assert s.route == "colocated" and s.transfers == () and s.t_exposed_ms is None
    assert [a.transfer_id for a in s.attempts] == [""] and s.first_token_ms == 8.0 and s.orphans == 0
    text = trace_view.render_text(view)
    assert "t_exposed_ms n/a" in text and "route colocated" in text
    assert json.loads(json.dumps(view.to_dict()))["t_exposed_ms"] is None


def test_a_missing_piece_is_named_not_guessed():
    spans = [s for s in traces.disaggregated() if s["name"] != sv.PREFILL_COMPUTE]
    x2 = {x.transfer_id: x for x in _view(spans).summary.transfers}["x2"]
    assert x2.t_exposed_ms is None and x2.missing == (sv.PREFILL_COMPUTE,) and x2.publish_end_ms == 23.125


def test_an_unknown_request_finds_nothing_and_a_request_in_two_traces_finds_both():
    spans, _ = trace_view.parse(json.dumps(s) for s in traces.disaggregated() + traces.colocated())
    assert trace_view.find(spans, "nope") == []
    assert len(trace_view.find(spans, "req-colo")[0].spans) == 6  # only its own trace's spans
    again = traces.colocated("req-1", trace="c" * 32)  # the same id, a second trace (a client retry)
    spans, _ = trace_view.parse(json.dumps(s) for s in traces.disaggregated() + again)
    assert [t.trace_id for t in trace_view.find(spans, "req-1")] == [traces.TRACE_A, "c" * 32]


def test_malformed_lines_are_skipped_and_counted_and_a_repeated_span_counts_once(tmp_path):
    good = [json.dumps(s) for s in traces.colocated()]
    lines = [good[0], "not json", '{"trace_id": "x"}', "[1, 2]", "null", "", good[1], good[1],
             '{"trace_id": "t", "span_id": "s", "name": "n", "start_ns": "soon", "end_ns": 1}',
             *good[2:], good[3][:40]]  # the last one half-written
    path = tmp_path / "spans.jsonl"
    path.write_text("\n".join(lines))
    spans, malformed = trace_view.load(path)
    assert malformed == 6 and len(spans) == 6
    view = trace_view.waterfall(trace_view.find(spans, "req-colo")[0], malformed)
    assert view.malformed_lines == 6 and "malformed_lines 6" in trace_view.render_text(view)
    assert trace_view.load(tmp_path / "absent.jsonl") == ([], 0)


def test_text_rows_carry_key_attributes_and_reasons():
    text = trace_view.render_text(_view(traces.disaggregated()))
    attempt = next(line for line in text.splitlines() if "router.attempt" in line and "error" in line)
    assert "generation=1" in attempt and "transfer_id=x1" in attempt and "[retry: TRANSFER_FAILED" in attempt
    assert "! /pd.v1.Directory/Publish" in text and "t_exposed_ms 2.875" in text
    send = next(line for line in text.splitlines() if sv.TRANSFER_SEND in line)
    assert "layers=1" in send and "bytes=4096" in send


def test_wait_for_picks_up_spans_exported_after_the_call_and_waits_for_the_rest(tmp_path):
    path = tmp_path / "spans.jsonl"
    spans = traces.disaggregated()

    def exporter():  # two batches from two processes, shortly after the request
        time.sleep(0.2)
        traces.write(path, spans[:8], "a")
        time.sleep(0.1)
        traces.write(path, spans[8:], "a")

    thread = threading.Thread(target=exporter)
    thread.start()
    found, malformed = trace_view.wait_for(path, "req-1", wait_s=10, settle_s=0.5)
    thread.join()
    assert malformed == 0 and len(found) == 1 and len(found[0].spans) == 20


def test_wait_for_waits_past_the_settle_for_the_spans_it_expects(tmp_path):
    path = tmp_path / "spans.jsonl"
    spans = traces.disaggregated()
    late = [s for s in spans if s["name"] == sv.TRANSFER_SEND]
    early = [s for s in spans if s["name"] != sv.TRANSFER_SEND]
    assert late and any(s["name"] == sv.ROUTER_REQUEST for s in early)

    def exporter():  # one process's batch comes long after the router's settled
        traces.write(path, early, "a")
        time.sleep(0.8)
        traces.write(path, late, "a")

    thread = threading.Thread(target=exporter)
    thread.start()
    found, _ = trace_view.wait_for(path, "req-1", wait_s=10, settle_s=0.2,
                                   expect=[f"pdserve-prefill:{sv.TRANSFER_SEND}"])
    thread.join()
    assert sum(len(t.spans) for t in found) == len(spans)


@pytest.mark.parametrize("wait_s", [0, 0.3])
def test_wait_for_gives_up_after_wait_s(tmp_path, wait_s):
    path = traces.write(tmp_path / "spans.jsonl", traces.colocated())
    t = time.monotonic()
    assert trace_view.wait_for(path, "nope", wait_s=wait_s) == ([], 0)
    assert time.monotonic() - t < wait_s + 1


def test_wait_for_each_waits_until_every_request_ended(tmp_path):
    path = tmp_path / "spans.jsonl"
    first, second = traces.disaggregated(), traces.colocated()
    want = {"req-1", "req-colo"}

    def exporter():  # the second request's spans come later
        traces.write(path, first, "a")
        time.sleep(0.4)
        traces.write(path, second, "a")

    thread = threading.Thread(target=exporter)
    thread.start()
    found, malformed = trace_view.wait_for_each(path, sorted(want), wait_s=10, settle_s=0.3)
    thread.join()
    assert malformed == 0 and sorted(found) == sorted(want)
    assert [len(found[r]) for r in sorted(want)] == [1, 1]
    assert sum(len(t.spans) for ts in found.values() for t in ts) == len(first) + len(second)
