"""One request, one trace, across every process it touched (docs/observability.md), on a real local
cluster whose processes export to the project's collector over mutual TLS.

A disaggregated request, a colocated one, one rejected by auto mode and one that retries
after its prefill worker was SIGKILLed each give exactly one trace (W3C context over
gRPC, and inside the hand-off's commit on the data plane), spans from every process it
touched, no orphan span, every span carrying pd.request_id, and the phases in causal
order. `pdctl trace --html` of the disaggregated one loads in headless Chromium with
every span shown and no console error. A caller's own span is the request's parent;
the router's TTFT histogram carries the request's trace id as an exemplar; a dead
collector costs its spans and nothing else, and tracing resumes when it is back.
"""

from __future__ import annotations

import random

import pytest

from pdserve_client import spans as S
from pdserve_client.types import PdError
from pdserve_ops import cli, trace_view
from runtime.engine.presets import PRESETS
from tests.support.browser import BrowserUnavailable, Chromium
from tests.support.cluster import assert_cluster_clean, client, start_cluster
from tests.support.metrics import scrape_process

MAX_TOKENS = 6
LAYERS = PRESETS["tiny"].num_hidden_layers


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("traces"), prefill=1, decode=1, lease_ttl_s=3.0)
    yield c
    c.down()


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def _trace(cluster, request_id: str, *expect: str) -> trace_view.Trace:
    """The request's one trace, once it holds the router's request span and each of
    `expect` (a process's batch may come after the router's settled)."""
    traces, malformed = trace_view.wait_for(cluster.state / S.SPANS_FILE, request_id, wait_s=20, expect=expect)
    assert malformed == 0
    assert len(traces) == 1, f"{request_id}: {len(traces)} traces"
    return traces[0]


def _named(trace, name: str) -> list:
    return sorted((s for s in trace.spans if s.name == name), key=lambda s: s.start_ns)


def _one(trace, name: str):
    (span,) = _named(trace, name)
    return span


SNAPSHOT_READ = frozenset({"pdserve-directory"})
"""A request without a transaction reaches the directory only if the router's snapshot is
older than PD_ROUTER_SNAPSHOT_MAX_AGE_MS when it arrives (a background read may have just
renewed it): its trace may or may not have the directory's span."""


def _check_whole(trace, request_id: str, services: set[str], maybe: frozenset[str] = frozenset()) -> None:
    """No orphan: one root (the router's Generate span) and every other span's parent is
    in the trace; every span names the request; the processes are the expected ones
    (`services`, and any of `maybe`)."""
    ids = {s.span_id for s in trace.spans}
    roots = [s for s in trace.spans if not s.parent_id]
    assert [r.name for r in roots] == ["/pd.v1.Router/Generate"], roots
    assert [s.name for s in trace.spans if s.parent_id and s.parent_id not in ids] == []
    assert {s.request_id for s in trace.spans} == {request_id}
    assert services <= {s.service for s in trace.spans} <= services | maybe
    for s in trace.spans:
        assert s.start_ns <= s.end_ns, s.name
        parent = next((p for p in trace.spans if p.span_id == s.parent_id), None)
        # A child starts after its parent (a span for work already done may end after it).
        assert parent is None or parent.start_ns <= s.start_ns, (parent.name, s.name)


def _before(a, b) -> None:
    assert a.end_ns <= b.start_ns, f"{a.name} ends after {b.name} starts"


def test_a_disaggregated_request_is_one_trace_in_causal_order(cluster, tmp_path):
    with client(cluster) as sdk:
        r = sdk.generate_full(prompt_ids=_prompt(100, 1), max_tokens=MAX_TOKENS, mode="disaggregated",
                              ignore_eos=True)
    assert r.route == "disaggregated"
    trace = _trace(cluster, r.request_id, S.DECODE_GENERATE, S.TRANSFER_SEND, S.TRANSFER_RECEIVE,
                   S.DECODE_PUBLISH, "/pd.v1.Prefill/Prefill", "/pd.v1.Directory/ConsumeNonce")
    _check_whole(trace, r.request_id, {"pdserve-router", "pdserve-directory", "pdserve-prefill", "pdserve-decode"})
    decide, attempt = _one(trace, S.ROUTER_DECIDE), _one(trace, S.ROUTER_ATTEMPT)
    assert decide.attributes[S.ROUTE] == "disaggregated" and attempt.attributes[S.GENERATION] == "1"
    assert attempt.attributes[S.TRANSFER_ID] == f"{r.request_id}/1"
    reserve, receive = _one(trace, S.DECODE_RESERVE), _one(trace, S.TRANSFER_RECEIVE)
    computes, send = _named(trace, S.PREFILL_COMPUTE), _one(trace, S.TRANSFER_SEND)
    commit, validate = _one(trace, S.TRANSFER_COMMIT), _one(trace, S.DECODE_VALIDATE)
    publish, admit = _one(trace, S.DECODE_PUBLISH), _one(trace, S.DECODE_ADMIT)
    generate = _one(trace, S.DECODE_GENERATE)
    for a, b in [(decide, attempt), (reserve, receive), (computes[-1], send), (send, commit),
                 (validate, publish), (publish, admit), (admit, generate)]:
        _before(a, b)
    assert commit.start_ns <= validate.start_ns and validate.parent_id == commit.span_id  # joined over the data plane
    assert receive.end_ns <= validate.start_ns
    # The Prefill's job left beside the decode's Reserve; its grant once the Reserve answered,
    # landed before the first chunk left.
    at = {e["name"]: e["t_ns"] for e in attempt.events}
    landed = [e["t_ns"] for e in _one(trace, "/pd.v1.Prefill/Prefill").events if e["name"] == S.EVENT_GRANTED]
    assert reserve.end_ns <= at[S.EVENT_RESERVED] <= at[S.EVENT_GRANTED] <= landed[0] <= send.start_ns
    # One-way: the directory recorded the transaction before anything that needs the record
    # reached it. The DecodeStream leaves once it answered, and the decode publishes after
    # its stream came (the nonce check of a signed capability needs no record).
    (recorded,) = [s for s in _named(trace, "/pd.v1.Directory/Reserve") if s.service == "pdserve-directory"]
    (stream,) = [s for s in _named(trace, "/pd.v1.Decode/DecodeStream") if s.service == "pdserve-decode"]
    assert at[S.EVENT_RESERVED] <= recorded.start_ns and recorded.end_ns <= at[S.EVENT_RECORDED] <= stream.start_ns
    publishes = [s for s in _named(trace, "/pd.v1.Directory/Publish") if s.service == "pdserve-directory"]
    assert publishes and all(recorded.end_ns <= s.start_ns for s in publishes)
    # The Prefill's reply (its K/V digest) came after the publication. Token 0 did not wait
    # for it: it brought the prefill's seal, which the router opened over the decode's digest.
    published = max(s.end_ns for s in _named(trace, "/pd.v1.Directory/Publish"))
    assert published <= at[S.EVENT_PREFILL_DONE] <= attempt.end_ns
    assert S.EVENT_TOKEN_HELD not in at
    # One event per layer on each side, whatever the chunks: the model's every layer, each
    # layer's chunks and bytes the same at both ends, summed on the send span.
    sent = {e["attributes"][S.LAYER]: e["attributes"] for e in send.events if e["name"] == S.EVENT_LAYER_SENT}
    visible = {e["attributes"][S.LAYER]: e["attributes"] for e in receive.events if e["name"] == S.EVENT_LAYER_VISIBLE}
    assert sorted(sent) == list(range(LAYERS)) and sent == visible
    assert send.attributes[S.LAYERS] == LAYERS and send.attributes[S.CHUNKS] == sum(
        a[S.CHUNKS] for a in sent.values()) >= LAYERS
    assert send.attributes[S.BYTES] == sum(a[S.BYTES] for a in sent.values()) > 0
    directory = {s.name for s in trace.spans if s.service == "pdserve-directory"}
    # The nonce check belongs to the request too, whether the sender's AUTH or the router's
    # copy of the capability (the DecodeStream) made it.
    assert "/pd.v1.Directory/ConsumeNonce" in directory
    # The destination validates and publishes in one call (no separate Validated), and the
    # source's declaration is the seal its COMMIT carried (not streamed: no Begin at all).
    assert {f"/pd.v1.Directory/{m}" for m in ("Reserve", "Publish")} <= directory
    assert not {f"/pd.v1.Directory/{m}" for m in ("Validated", "Begin")} & directory
    view = trace_view.waterfall(trace)
    assert view.summary.route == "disaggregated" and view.summary.orphans == 0
    ready = max(reserve.end_ns, computes[-1].end_ns)
    (exposure,) = view.summary.transfers
    assert exposure.t_exposed_ms == pytest.approx(max(0, publish.end_ns - ready) / 1e6, abs=1e-3)

    page = tmp_path / "trace.html"
    assert cli.main(["trace", r.request_id, "--state-dir", str(cluster.state), "--html", str(page)]) == 0
    try:
        browser = Chromium.open()
    except BrowserUnavailable as e:
        pytest.fail(f"the trace page test needs a headless Chromium: {e}", pytrace=False)
    with browser:
        loaded = browser.load(page)
        shown = loaded.evaluate("Array.from(document.querySelectorAll('[data-span-id]'), e => e.dataset.spanId)")
        assert sorted(shown) == sorted(s.span_id for s in trace.spans)
        assert loaded.errors == []


def test_a_colocated_request_is_one_trace(cluster):
    with client(cluster) as sdk:
        r = sdk.generate_full(prompt_ids=_prompt(40, 2), max_tokens=MAX_TOKENS, mode="colocated", ignore_eos=True)
    trace = _trace(cluster, r.request_id, "pdserve-decode:/pd.v1.Decode/Generate")
    _check_whole(trace, r.request_id, {"pdserve-router", "pdserve-decode"}, SNAPSHOT_READ)
    attempt = _one(trace, S.ROUTER_ATTEMPT)
    assert attempt.attributes[S.ROUTE] == "colocated" and S.TRANSFER_ID not in attempt.attributes
    (served,) = [s for s in _named(trace, "/pd.v1.Decode/Generate") if s.service == "pdserve-decode"]
    _before(_one(trace, S.ROUTER_DECIDE), served)
    assert trace_view.waterfall(trace).summary.t_exposed_ms is None


def test_a_request_rejected_by_auto_is_one_trace_that_says_why(cluster):
    with client(cluster) as sdk, pytest.raises(PdError) as err:
        sdk.generate_full(prompt_ids=_prompt(300, 3), max_tokens=16, mode="auto", slo_tpot_ms=0.001,
                          request_id="hopeless")
    assert err.value.code == "RESOURCE_EXHAUSTED"
    trace = _trace(cluster, "hopeless")
    _check_whole(trace, "hopeless", {"pdserve-router"}, SNAPSHOT_READ)
    request, decide = _one(trace, S.ROUTER_REQUEST), _one(trace, S.ROUTER_DECIDE)
    assert request.status == decide.status == 2
    assert [e["name"] for e in request.events] == ["error", S.EVENT_REJECTED]
    assert _named(trace, S.ROUTER_ATTEMPT) == []  # rejected before any work


def test_the_callers_own_span_is_the_requests_parent(cluster):
    from opentelemetry.sdk.trace import TracerProvider

    caller = TracerProvider().get_tracer("caller")  # the caller's own tracing (not exported here)
    with caller.start_as_current_span("caller.work") as span, client(cluster) as sdk:
        r = sdk.generate_full(prompt_ids=_prompt(30, 5), max_tokens=2, mode="colocated")
    ctx = span.get_span_context()
    trace = _trace(cluster, r.request_id)
    assert trace.trace_id == format(ctx.trace_id, "032x")  # the SDK sent traceparent; the router took it
    assert _one(trace, "/pd.v1.Router/Generate").parent_id == format(ctx.span_id, "016x")
    assert trace_view.waterfall(trace).summary.orphans == 0  # a child of the caller's span is no orphan


def test_ttft_exemplars_name_the_requests_trace(cluster):
    with client(cluster) as sdk:
        r = sdk.generate_full(prompt_ids=_prompt(50, 6), max_tokens=MAX_TOKENS, mode="disaggregated",
                              ignore_eos=True)
    trace = _trace(cluster, r.request_id)
    scraped = scrape_process(cluster, "router", openmetrics=True)
    exemplars = {s.exemplar.labels["trace_id"] for s in scraped.samples("pd_ttft_seconds_bucket") if s.exemplar}
    assert trace.trace_id in exemplars  # the histogram points at the trace that explains it


def test_a_retry_after_a_killed_prefill_worker_is_one_trace(cluster):
    cluster.signal("prefill-0")  # SIGKILL: its lease still looks live for a moment
    with client(cluster) as sdk:
        r = sdk.generate_full(prompt_ids=_prompt(120, 4), max_tokens=MAX_TOKENS, mode="disaggregated",
                              ignore_eos=True)
    assert r.attempts >= 2 and r.route == "colocated"
    trace = _trace(cluster, r.request_id, "pdserve-decode:/pd.v1.Decode/Generate")
    _check_whole(trace, r.request_id, {"pdserve-router", "pdserve-directory", "pdserve-decode"})
    attempts = _named(trace, S.ROUTER_ATTEMPT)
    assert len(attempts) == r.attempts and attempts[0].status == 2 and attempts[-1].status != 2
    assert [a.attributes[S.GENERATION] for a in attempts] == [str(i + 1) for i in range(len(attempts))]
    _before(attempts[0], attempts[1])
    request = _one(trace, S.ROUTER_REQUEST)
    events = [e["name"] for e in request.events]
    assert S.EVENT_RETRY in events and S.EVENT_FALLBACK in events and S.EVENT_FIRST_TOKEN in events
    assert_cluster_clean(cluster, timeout_s=20)


def test_a_dead_collector_costs_its_spans_and_nothing_else(cluster):
    if not cluster.alive()["prefill-0"]:  # killed by the test before (when it ran in this process)
        cluster.restart("prefill-0")
    cluster.signal("collector")  # SIGKILL: every process's exporter now fails
    with client(cluster) as sdk:
        results = [sdk.generate_full(prompt_ids=_prompt(64, 10 + i), max_tokens=MAX_TOKENS, mode="disaggregated",
                                     ignore_eos=True) for i in range(3)]
    assert [(r.route, r.attempts, len(r.token_ids)) for r in results] == [("disaggregated", 1, MAX_TOKENS)] * 3
    assert_cluster_clean(cluster, timeout_s=20)
    cluster.restart("collector")  # the exporters reconnect: the next request is traced whole again
    with client(cluster) as sdk:
        r = sdk.generate_full(prompt_ids=_prompt(64, 20), max_tokens=MAX_TOKENS, mode="disaggregated",
                              ignore_eos=True)
    trace = _trace(cluster, r.request_id, S.DECODE_GENERATE, "pdserve-prefill:/pd.v1.Prefill/Prefill")
    _check_whole(trace, r.request_id, {"pdserve-router", "pdserve-directory", "pdserve-prefill", "pdserve-decode"})
