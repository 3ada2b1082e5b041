"""The metrics of docs/observability.md against a real cluster with mutual TLS on: every
process serves /metrics (its URL in cluster.json), only operator and monitor certificates
may read it, and after known traffic the counters have exactly the expected values (each measured
as the change over a scrape taken before, parsed with prometheus_client's parser)."""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.error
import uuid

import grpc
import pytest

from pdserve_client.rpc.pd.v1 import manifest_pb2, prefill_pb2, prefill_pb2_grpc
from runtime.directory.states import Outcome
from tests.e2e.test_capabilities import attempt
from tests.support import ucx_loop
from tests.support.cluster import assert_cluster_clean, channel, client, directory, start_cluster
from tests.support.metrics import Scrape, scrape, scrape_process, tls_context
from tests.support.router_role import PROMPT, credential, hold, mint, release
from tooling.cluster.launcher import LocalCluster

SERVICES = ("directory", "decode-0", "prefill-0", "router")
KV_DIGEST = "cd" * 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("metrics"), prefill=1, decode=1, lease_ttl_s=2.0)
    yield c
    c.down()


def settled(read, expected, timeout_s: float = 5.0):
    """read() once it equals `expected` (a router counts a request when its task ends,
    just after the client saw the end), else its last value."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_every_process_records_and_serves_its_metrics_url(cluster):
    recorded = LocalCluster.load(str(cluster.state)).procs
    assert recorded["redis"].metrics_url == ""
    for name in SERVICES:
        url = recorded[name].metrics_url
        assert url.startswith("https://127.0.0.1:") and url.endswith("/metrics"), (name, url)
        assert url != cluster.procs[name].address
        for reader in ("operator", "monitor"):
            assert "process_resident_memory_bytes" in Scrape(scrape(url, cluster.identity(reader))).families


@pytest.mark.parametrize("identity", ["client", "decode-0", "router"])
def test_other_certificates_get_403(cluster, identity):
    for name in SERVICES:
        with pytest.raises(urllib.error.HTTPError) as err:
            scrape(cluster.procs[name].metrics_url, cluster.identity(identity))
        assert err.value.code == 403, name


def test_no_certificate_fails_the_handshake(cluster):
    ca_only = tls_context(None, trust=cluster.identity("operator"))
    for name in SERVICES:
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            scrape(cluster.procs[name].metrics_url, context=ca_only)


def test_routes_latencies_and_bytes_after_known_traffic(cluster):
    n, m = 3, 2
    before = {name: scrape_process(cluster, name) for name in ("router", "prefill-0", "decode-0")}
    with client(cluster) as sdk:
        for i in range(n):
            r = sdk.generate_full(prompt_ids=[7 + (i * 13 + j) % 400 for j in range(100)], max_tokens=3,
                                  ignore_eos=True, mode="disaggregated")
            assert r.route == "disaggregated"
        for i in range(m):
            r = sdk.generate_full(prompt_ids=[9 + (i * 17 + j) % 400 for j in range(40)], max_tokens=3,
                                  ignore_eos=True, mode="colocated")
            assert r.route == "colocated"

    def delta(name, sample, **labels):
        return scrape_process(cluster, name).value(sample, **labels) - before[name].value(sample, **labels)

    ok = {"result": "ok"}
    assert settled(lambda: delta("router", "pd_route_total", policy="disaggregated", topology="disaggregated",
                                 **ok), n) == n
    assert settled(lambda: delta("router", "pd_route_total", policy="colocated", topology="colocated", **ok), m) == m
    assert delta("router", "pd_route_total") == n + m
    assert delta("router", "pd_ttft_seconds_count") == n + m
    assert delta("router", "pd_ttft_seconds_count", tenant="default", prompt_bucket="le128") == n + m
    assert delta("router", "pd_tpot_seconds_count") == n + m
    assert delta("router", "pd_kv_transfer_attempts_total") == n
    assert delta("router", "pd_kv_transfer_completions_total") == n
    assert delta("router", "pd_kv_transfer_failures_total") == 0
    assert delta("router", "pd_fallbacks_total") == 0
    sent = delta("prefill-0", "pd_kv_transfer_bytes_total", direction="sent")
    received = delta("decode-0", "pd_kv_transfer_bytes_total", direction="received")
    assert sent > 0 and sent == received
    assert delta("prefill-0", "pd_kv_exposed_transfer_seconds_count") == n
    assert delta("router", "pd_prompt_tokens_total", tenant="default") == n * 100 + m * 40
    assert delta("router", "pd_generation_tokens_total", tenant="default") == (n + m) * 3
    after = scrape_process(cluster, "router")
    assert after.value("pd_drain_depth") == 0 and not after.samples("pd_rollback_duration_seconds_count")
    assert after.value("pd_requests_in_flight") == 0
    assert_cluster_clean(cluster)


def test_no_process_exports_created_series(cluster):
    """After traffic every counter and histogram has children; none has a _created twin."""
    with client(cluster) as sdk:
        sdk.generate_full(prompt_ids=[11, 12, 13, 14], max_tokens=2, ignore_eos=True, mode="disaggregated")
    for name in SERVICES:
        for openmetrics in (False, True):
            m = scrape_process(cluster, name, openmetrics=openmetrics)
            samples = {sample for sample, _ in m.as_dict()}
            assert any(s.startswith("pd_") for s in samples), name
            assert not [s for s in samples if s.endswith("_created")], (name, openmetrics)


def test_kv_cache_usage_rises_while_a_request_holds_blocks_and_falls_after(cluster):
    def usage() -> tuple[float, float]:
        m = scrape_process(cluster, "decode-0")
        return m.value("pd_kv_cache_usage_ratio"), 1 - m.value("pd_free_blocks") / m.value("pd_total_blocks")

    assert usage() == (0.0, 0.0)  # at rest: cached prefix blocks count as free
    with client(cluster) as sdk:
        stream = sdk.generate(prompt_ids=[5 + (7 * i) % 300 for i in range(70)], max_tokens=1900, ignore_eos=True,
                              mode="disaggregated")
        with stream:
            tokens = iter(stream)
            next(tokens), next(tokens)  # the decode is decoding from its own blocks
            held, from_blocks = usage()
            stream.cancel("seen")
    assert 0 < held < 1 and held == pytest.approx(from_blocks, abs=0.01)
    assert settled(lambda: usage()[0], 0.0) == 0.0
    assert_cluster_clean(cluster)


def test_a_stale_publication_is_counted_once_by_the_directory(cluster):
    """Generation 1 validated, generation 2 reserved over it, then the late publish of 1."""
    before = scrape_process(cluster, "directory")

    async def scenario():
        async with directory(cluster, "router") as router, directory(cluster, "prefill-0") as p, \
                directory(cluster, "decode-0") as d:
            workers = {w.worker_id: w for w in (await router.snapshot()).workers}
            src, dst = workers["prefill-0"], workers["decode-0"]
            rid = f"stale-{uuid.uuid4().hex[:8]}"
            chunks = [manifest_pb2.ChunkSpec(layer=i, block_count=3, num_bytes=1024, checksum=f"c{i}")
                      for i in range(3)]

            def manifest(gen: int) -> manifest_pb2.HandoffManifest:
                return manifest_pb2.HandoffManifest(
                    request_id=rid, tenant="default", generation=gen, transfer_id=f"{rid}/{gen}", block_size=16,
                    token_interval=manifest_pb2.TokenInterval(start=0, end=48), reservation_id=f"{rid}/{gen}",
                    expected_chunks=chunks, source_worker_id=src.worker_id, source_epoch=src.epoch,
                    destination_worker_id=dst.worker_id, destination_epoch=dst.epoch,
                    checksum_algorithm="xxh3_64", cache_abi_digest=dst.cache_abi_digest)
            assert (await router.reserve(manifest(1))).outcome == Outcome.APPLIED
            assert (await p.begin(rid, f"{rid}/1", 1, src.worker_id, src.epoch, KV_DIGEST, chunks)).ok
            assert (await d.validated(rid, f"{rid}/1", 1, dst.worker_id, dst.epoch, KV_DIGEST, chunks)).ok
            assert (await router.reserve(manifest(2))).outcome == Outcome.APPLIED  # supersedes generation 1
            late = await d.publish(rid, f"{rid}/1", 1, dst.worker_id, dst.epoch, KV_DIGEST)
            assert late.outcome == Outcome.STALE_GENERATION
            await router.abort(rid, f"{rid}/2", 2, "router", 0, "test over")
    asyncio.run(scenario())
    after = scrape_process(cluster, "directory")
    assert after.value("pd_publication_rejects_total", reason="stale") - \
        before.value("pd_publication_rejects_total", reason="stale") == 1
    assert after.value("pd_publication_rejects_total") - before.value("pd_publication_rejects_total") == 1
    assert_cluster_clean(cluster)


def test_capability_denials_are_counted_by_reason_where_refused(cluster):
    """A capability for another tenant, presented to decode on the data plane (TENANT),
    and a garbage one handed to prefill with the manifest (SIGNATURE)."""
    before = {w: scrape_process(cluster, w) for w in ("decode-0", "prefill-0")}
    held = hold(cluster, ucx_loop.run)
    try:
        why = ucx_loop.run(attempt(cluster, held, credential(mint(cluster, held, tenant="other"), held)))
        assert "capability denied: tenant:" in why, why
        stub = prefill_pb2_grpc.PrefillStub(channel(cluster, "prefill-0", "router"))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Prefill(iter([prefill_pb2.PrefillRequest(
                manifest=held.manifest, prompt_token_ids=PROMPT, capability=b"garbage",
                destination_data_plane_address=held.reservation.data_plane_address)]), timeout=30))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "signature" in err.value.details()
    finally:
        release(cluster, held)

    def delta(w, **labels):
        return scrape_process(cluster, w).value("pd_capability_denials_total", **labels) - \
            before[w].value("pd_capability_denials_total", **labels)
    assert delta("decode-0", reason="tenant") == 1 and delta("decode-0") == 1
    assert delta("prefill-0", reason="signature") == 1 and delta("prefill-0") == 1
    assert_cluster_clean(cluster)


def test_end_to_end_latency_and_queue_time_once_per_completed_request(cluster):
    n = 3
    before = scrape_process(cluster, "router")
    with client(cluster) as sdk:
        for i in range(n):
            sdk.generate_full(prompt_ids=[3 + (i * 11 + j) % 400 for j in range(30)], max_tokens=4, ignore_eos=True,
                              mode="disaggregated")

    def delta(sample, **labels):
        return scrape_process(cluster, "router").value(sample, **labels) - before.value(sample, **labels)

    cell = {"tenant": "default", "prompt_bucket": "le128"}
    assert settled(lambda: delta("pd_e2e_request_latency_seconds_count", **cell), n) == n
    assert delta("pd_request_queue_time_seconds_count", **cell) == n
    # Admission to the end holds the first token and the dispatch before it.
    assert delta("pd_e2e_request_latency_seconds_sum") > delta("pd_ttft_seconds_sum") > 0
    assert 0 <= delta("pd_request_queue_time_seconds_sum") < delta("pd_ttft_seconds_sum")
