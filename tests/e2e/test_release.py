"""End to end, real processes: the release record every router follows, and a rollback
under load in the article's order (issue 20) with nothing lost.

The cluster starts disaggregated, so its first router records the release ACTIVE with
the manifest frozen from the live workers. A steady load runs; mid-load an operator
rolls back; every request must succeed with the tokens colocated serving gives, every
step must be recorded in order, and nothing may stay reserved or open.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from pdserve_client import PdError
from pdserve_client.rpc.pd.v1 import common_pb2, decode_pb2, decode_pb2_grpc
from tests.support.cluster import assert_cluster_clean, channel, client, pdctl, start_cluster

STEPS = ["STOP_NEW_ROUTES", "ADVANCE_ROUTE_EPOCH", "DRAIN_OR_ABORT_TRANSFERS", "ENABLE_COLOCATED_FALLBACK",
         "DISABLE_CONNECTOR", "REVOKE_CAPABILITIES", "RECLAIM_UNPUBLISHED", "ROLLBACK_COMPLETE"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("release"), state_name=".pdserve", prefill=1, decode=1,
                      mode="disaggregated",
                      env={"PD_RELEASE_POLL_S": "0.2"})
    yield c
    c.down()


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(20, 90))] for _ in range(n)]


def test_the_first_router_records_the_release_with_its_manifest(cluster):
    with client(cluster) as sdk:
        view = sdk.release()
    assert (view.mode, view.router_mode, view.routes_stopped) == ("active", "disaggregated", False)
    m = view.manifest
    assert m["model"] == "tiny" and m["roles"] == ["decode=1", "prefill=1"] and m["transports"] == ["ucx"]
    assert len(m["cache_abi_digests"]) == 1 and len(m["model_identity"]) == 1 and len(m["digest"]) == 64
    assert m["fallback_mode"] == "colocated" and m["route_epoch"] > 0


def test_promotion_out_of_order_is_refused_with_the_reason(cluster):
    with client(cluster, "operator") as sdk:
        with pytest.raises(PdError) as err:
            sdk.promote("pinned", reason="skip the rollback")
    assert err.value.code == "FAILED_PRECONDITION" and "ACTIVE -> PINNED" in err.value.message


def test_rollback_under_load_fails_no_request_and_leaves_nothing(cluster):
    load, done, results, errors = prompts(60, 7), threading.Event(), {}, {}
    rolled = {}

    def one(i: int) -> None:
        try:
            with client(cluster, timeout_s=120) as sdk:
                results[i] = sdk.generate_full(prompt_ids=load[i], max_tokens=12, ignore_eos=True,
                                                  request_id=f"load-{i}")
        except PdError as exc:
            errors[i] = exc

    def roll_back() -> None:
        while len(results) < 15 and not done.is_set():  # disaggregated traffic first
            time.sleep(0.05)
        with client(cluster, "operator", timeout_s=120) as sdk:
            rolled["change"] = sdk.rollback(reason="drill: e2e")

    trigger = threading.Thread(target=roll_back)
    trigger.start()
    with ThreadPoolExecutor(4) as pool:
        for i in range(len(load)):
            pool.submit(one, i)
            time.sleep(0.05)
    done.set()
    trigger.join(timeout=180)
    assert not errors, errors
    assert len(results) == len(load)
    change = rolled["change"]
    rb = change.release.rollback
    assert (change.previous_mode, change.release.mode, rb.complete) == ("active", "rolled_back", True)
    assert [s.step for s in rb.steps] == STEPS and all(s.ended_unix_ms >= s.started_unix_ms for s in rb.steps)
    assert rb.steps[1].counts["route_epoch"] > rb.steps[1].counts["retired_epoch"] == rb.retired_epoch
    routes = [results[i].route for i in range(len(load))]
    assert routes.count("disaggregated") >= 10, routes
    # Every request's tokens are what colocated serving gives (the release now runs colocated).
    with client(cluster, timeout_s=120) as sdk:
        for i in range(len(load)):
            again = sdk.generate_full(prompt_ids=load[i], max_tokens=12, ignore_eos=True)
            assert again.route == "colocated"
            assert again.token_ids == results[i].token_ids, (i, results[i].route)
        view = sdk.release()
    assert view.routes_stopped and view.router_mode == "colocated"
    # Workers refuse transfer work now (DISABLE_CONNECTOR), even from the router.
    with channel(cluster, "decode-0", "router") as ch, pytest.raises(grpc.RpcError) as refused:
        decode_pb2_grpc.DecodeStub(ch).Reserve(decode_pb2.DecodeReserveRequest(
            request_id="after-rollback", tenant="default", generation=1, prompt_token_ids=[5, 6, 7],
            max_tokens=4, sampling=common_pb2.SamplingParams()), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "a rollback disabled the K/V connector" in refused.value.details()
    status = pdctl(cluster, "release", "status")
    assert status.returncode == 0, status.stderr
    assert "release: ROLLED_BACK" in status.stdout and "ROLLBACK_COMPLETE" in status.stdout
    assert_cluster_clean(cluster)


def test_a_router_killed_mid_rollback_is_finished_by_its_restart(tmp_path):
    c = start_cluster(tmp_path, prefill=1, decode=1, mode="disaggregated",
                      env={"PD_RELEASE_POLL_S": "0.2", "PD_ROLLBACK_STEP_PAUSE_S": "0.5"})
    try:
        with client(c) as sdk:
            sdk.generate_full(prompt_ids=list(range(5, 60)), max_tokens=4, ignore_eos=True)
        with client(c, "operator") as sdk:
            started = sdk.rollback(reason="drill: kill the router", wait=False).release.rollback
        c.signal("router")  # SIGKILL, mid-rollback (a step every 0.5 s)
        with client(c) as sdk:  # answered by the router's restart below
            c.restart("router")
            deadline = time.monotonic() + 60
            while not (view := sdk.release()).rollback.complete and time.monotonic() < deadline:
                time.sleep(0.2)
            after = sdk.generate_full(prompt_ids=list(range(5, 60)), max_tokens=4, ignore_eos=True)
        assert not started.complete and [s.step for s in started.steps] == STEPS[:1]
        rb = view.rollback
        assert rb.complete and [s.step for s in rb.steps] == STEPS
        assert rb.steps[0] == started.steps[0]  # what ended before the kill was not rewritten
        assert rb.started_unix_ms == started.started_unix_ms and view.mode == "rolled_back"
        assert after.route == "colocated"
        assert_cluster_clean(c)
    finally:
        c.down()
