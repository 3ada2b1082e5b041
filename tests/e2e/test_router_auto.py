"""End to end, real processes: the SLO-aware router's auto and shadow modes.

One prefill and one decode worker (tiny preset, TCP data plane) calibrate their
cost profiles at start and register them; the router runs in auto mode.

* A stream of short prompts runs colocated; a burst of long prompts while a
  long-running stream decodes at the decode worker is disaggregated.
* A request whose TPOT target no route can meet is rejected with
  RESOURCE_EXHAUSTED before any prefill: the prefill worker's computed-token
  counter and the directory show no work for it.
* Shadow mode executes colocated and records the disaggregated prediction.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pdserve_client import PdError
from pdserve_client.rpc.pd.v1 import admin_pb2, admin_pb2_grpc
from tests.support.cluster import aio_channel, assert_cluster_clean, client, directory, start_cluster

SHORT, LONG = 32, 2000
"""LONG: a prefill long enough that colocating it misses a 15 ms TPOT target by a wide margin
under any load (its attention term alone is ~120-200 ms on `tiny` here, >= 17 ms on each of
8 tokens' 7 gaps). At 1,000 tokens the verdict sat at the target: the calibrated profile
varies 2-5x between runs on a loaded 2-core machine, and colocation passed now and then."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # One saved profile for both workers (same model, same machine): the first worker
    # calibrates and writes it, the second loads it, so calibration noise on this shared
    # 2-core machine cannot make the two look different. One after the other: a
    # calibration beside a sibling's start-up (torch imports) prices every prompt high
    # enough to flip the short-prompt verdicts below.
    tmp = tmp_path_factory.mktemp("auto")
    c = start_cluster(tmp, prefill=1, decode=1, mode="auto", transport="tcp", num_blocks=1024,
                      workers_together=False,
                      env={"PD_PROFILE_BUDGET_S": "2", "PD_PROFILE_FILE": str(tmp / "profile.json")})
    yield c
    c.down()


def decisions(cluster, request_id: str = "") -> list:
    """The router's decision records (the client's: all this module's requests are its)."""
    async def go():
        async with aio_channel(cluster, "router", "client") as ch:
            resp = await admin_pb2_grpc.AdminStub(ch).Decisions(
                admin_pb2.DecisionsRequest(request_id=request_id, limit=1000))
            return list(resp.records)
    return asyncio.run(go())


def wait_for_decode_batch(cluster, timeout_s: float = 10.0) -> None:
    """Until some worker's latest heartbeat reports a nonempty decode batch."""
    async def go():
        async with aio_channel(cluster, "router", "client") as ch:
            stub = admin_pb2_grpc.AdminStub(ch)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                status = await stub.Status(admin_pb2.StatusRequest())
                if any(w.load.active_decode_batch for w in status.workers):
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"no heartbeat showed a decode batch within {timeout_s} s")
    asyncio.run(go())


def prompt(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


def test_workers_registered_calibrated_profiles(cluster):
    async def go():
        async with aio_channel(cluster, "router", "client") as ch:
            return await admin_pb2_grpc.AdminStub(ch).Status(admin_pb2.StatusRequest())
    status = asyncio.run(go())
    assert status.router_mode == "auto" and len(status.workers) == 2
    sources = sorted(w.profile.source.split(":")[0] for w in status.workers)
    assert sources == ["calibrated", "file"], sources  # one calibrated and saved, the other loaded it
    assert all(w.profile.prefill_ms_per_token > 0 and w.profile.kv_bytes_per_block > 0 for w in status.workers)


def test_short_stream_colocated_long_burst_disaggregated(cluster):
    rng = random.Random(5)
    sdk = client(cluster, timeout_s=120)
    shorts = [sdk.generate_full(prompt_ids=prompt(SHORT, rng), max_tokens=16, ignore_eos=True,
                                   request_id=f"short-{i}") for i in range(6)]
    why = {r.request_id: (r.outcome, r.reason, r.predicted_ttft_ms, r.shadow_predicted_ttft_ms)
           for r in decisions(cluster)}
    assert [r.route for r in shorts] == ["colocated"] * 6, why
    # A long-running stream keeps the decode worker busy while the burst arrives:
    # wait until it streams and a heartbeat shows it (else the burst's first prompt
    # can be priced against a load report that does not show the stream yet).
    # 2,000 tokens (to the model's 2,048 positions): it decodes for seconds, across several
    # 1 s heartbeats. 400 could end within ~1 s, before any heartbeat had sampled it.
    stream = sdk.generate(prompt_ids=prompt(SHORT, rng), max_tokens=2000, ignore_eos=True,
                             request_id="background")
    next(stream)
    wait_for_decode_batch(cluster)
    background = threading.Thread(target=stream.collect)
    background.start()
    try:
        # Each long request asks for TPOT <= 15 ms over 8 tokens: colocating its
        # 2,000-token prompt would spread (prefill time) over its own 7 gaps and the
        # running stream's, far over 15 ms on this model; a split route leaves the
        # decode worker's cadence at a few ms.
        with ThreadPoolExecutor(6) as pool:
            longs = list(pool.map(lambda i: sdk.generate_full(
                prompt_ids=prompt(LONG, random.Random(1000 + i)), max_tokens=8, ignore_eos=True,
                slo_tpot_ms=15.0, request_id=f"long-{i}"), range(6)))
    finally:
        background.join(timeout=120)
        stream.close()
    routes = [r.route for r in longs]
    why = [(r.request_id, r.outcome, r.reason) for r in decisions(cluster)
           if r.request_id.startswith("long-") and r.outcome != "disaggregated"]
    assert routes == ["disaggregated"] * 6, (routes, why)
    recs = {r.request_id: r for r in decisions(cluster)}
    for i in range(6):
        rec = recs[f"short-{i}"]
        assert rec.outcome == "colocated" and rec.finished and rec.observed_ttft_ms > 0
        assert rec.predicted_ttft_ms > 0 and rec.shadow_prefill_worker_id  # the split route was priced too
    split = [recs[f"long-{i}"] for i in range(6) if recs[f"long-{i}"].outcome == "disaggregated"]
    assert all(r.compute_tokens == LONG and r.transfer_tokens == LONG and r.observed_tpot_ms > 0 for r in split)
    sdk.close()
    assert_cluster_clean(cluster)


def test_unmeetable_slo_is_rejected_before_any_prefill(cluster):
    sdk = client(cluster, timeout_s=60)
    before = {r.request_id for r in decisions(cluster)}
    with pytest.raises(PdError) as err:
        sdk.generate_full(prompt_ids=prompt(LONG, random.Random(9)), max_tokens=16, slo_tpot_ms=0.001,
                             request_id="hopeless")
    assert err.value.code == "RESOURCE_EXHAUSTED", err.value
    assert "TPOT" in str(err.value) and "> SLO 0.001 ms" in str(err.value)
    (rec,) = decisions(cluster, "hopeless")
    assert rec.outcome == "rejected" and rec.prefill_worker_id == "" and rec.observed_ttft_ms == 0
    assert "hopeless" not in before
    # No prefill ran for it: no transaction was ever reserved, no worker holds its blocks.
    snap_txns = _txns(cluster)
    assert not [t for t in snap_txns if t.request_id == "hopeless"]
    sdk.close()
    assert_cluster_clean(cluster)


def _txns(cluster):
    async def go():
        async with directory(cluster) as d:
            return await d.list_open(), await d.lookup("hopeless", "hopeless/1")
    open_txns, latest = asyncio.run(go())
    return list(open_txns) + ([latest] if latest is not None else [])


def test_shadow_executes_colocated_and_records_split_predictions(cluster):
    # Shadow by request (the release's SHADOW state does the same for requests that name
    # no mode; moving the release there needs its gates: tests/e2e/test_release.py).
    sdk = client(cluster, timeout_s=120)
    results = [sdk.generate_full(prompt_ids=prompt(LONG, random.Random(100 + i)), max_tokens=8, mode="shadow",
                                    ignore_eos=True, request_id=f"shadow-{i}") for i in range(3)]
    sdk.close()
    assert [r.route for r in results] == ["colocated"] * 3
    for i in range(3):
        (rec,) = decisions(cluster, f"shadow-{i}")
        assert rec.mode == "shadow" and rec.outcome == "colocated" and rec.finished
        assert rec.shadow_prefill_worker_id and rec.shadow_decode_worker_id
        assert rec.shadow_predicted_ttft_ms > 0 and rec.shadow_predicted_tpot_ms > 0
        assert rec.observed_ttft_ms > 0
    assert_cluster_clean(cluster)
