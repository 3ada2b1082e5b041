"""What Kubernetes needs of a worker's lifecycle (docs/design.md, Processes and what each
owns: readiness and drain), on real processes.

Drain: SIGTERM to a decode worker while a request is in flight on it. The request
finishes there with every token (equal to a colocated run), new requests meanwhile
go to the other decode worker and succeed, the worker exits 0 well within
PD_DRAIN_TIMEOUT_S, and the directory stops listing it at once (deregistered, long
before its lease would lapse). With the budget spent first, what is unpublished is
aborted and the request completes elsewhere.

Readiness: a worker is NOT_SERVING until registered (directory unreachable at start)
and when its lease lapses (directory away for longer than a lease), SERVING again
once the directory is back; the router stays SERVING (it reached the directory once).

Every test ends with the leak check.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve_client import contract
from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2
from tests.support.cluster import assert_cluster_clean, client, directory, router_events, start_cluster

MAX_TOKENS = 24
PAUSE_S = 3.0
"""The request waits this long on the decode worker after publication (PD_FAULT_PAUSE_S):
the window in which the worker gets SIGTERM with the request in flight."""
LEASE_TTL_S = 10.0


def prompt(seed: int, n: int = 120) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def generate(cluster, request_id: str, ids: list[int], mode=router_pb2.MODE_DISAGGREGATED):
    """One request through the router: (its `started` events, tokens, complete)."""
    request = router_pb2.GenerateRequest(
        request_id=request_id, prompt_token_ids=common_pb2.TokenIds(ids=ids), max_tokens=MAX_TOKENS, mode=mode,
        sampling=common_pb2.SamplingParams(ignore_eos=True), deadline_ms=60_000)
    started, tokens, _, complete = router_events(cluster, request)
    return started, tokens, complete


def colocated(cluster, ids: list[int]) -> list[int]:
    with client(cluster) as sdk:
        return sdk.generate_full(prompt_ids=ids, max_tokens=MAX_TOKENS, mode="colocated", ignore_eos=True).token_ids


def wait_event(log_path, event: str, request_id: str, timeout_s: float = 30.0) -> dict:
    """The first `event` record of `request_id` in the shared event log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log_path.exists():
            for line in log_path.read_text().splitlines():
                rec = json.loads(line)
                if rec["event"] == event and rec.get("request") == request_id:
                    return rec
        time.sleep(0.02)
    raise AssertionError(f"no {event} of {request_id} in {log_path}")


def listed(cluster) -> set[str]:
    """The workers the directory lists now."""
    async def go():
        async with directory(cluster) as d:
            return {w.worker_id for w in (await d.snapshot()).workers}
    return asyncio.run(go())


def health(cluster, name: str) -> str:
    service = contract.SERVER_ROLES[cluster.roles[name]][0]
    with cluster.identity("operator").channel(cluster.procs[name].address, service) as ch:
        try:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError as e:
            return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_health(cluster, name: str, want: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := health(cluster, name)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got == want, f"{name} is {got}, not {want}"


ADVERTISED = {"PD_DATA_PLANE_ADVERTISE": "127.0.0.1", "PD_DATA_HOST": "0.0.0.0"}
"""The data plane binds every interface (as in a pod) and registers the advertised host."""


@pytest.fixture(scope="module")
def drain_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drain")
    events = tmp / "events.jsonl"
    c = start_cluster(tmp, prefill=1, decode=2, lease_ttl_s=LEASE_TTL_S, transport="ucx",
                      env={"PD_FAULT_PAUSE_S": str(PAUSE_S), "PD_EVENT_LOG": str(events),
                           "PD_DRAIN_TIMEOUT_S": "20", **ADVERTISED})
    c.events = events
    yield c
    c.down()


@pytest.fixture(scope="module")
def lease_cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("lease"), prefill=1, decode=1, lease_ttl_s=2.0, transport="tcp",
                      env=ADVERTISED)
    yield c
    c.down()


def assert_advertised(cluster, transport: str) -> None:
    async def snapshot():
        async with directory(cluster) as d:
            return await d.snapshot()
    decode = next(w for w in asyncio.run(snapshot()).workers if w.worker_id == "decode-0")
    want = "@127.0.0.1:" if transport == "ucx" else "tcp://127.0.0.1:"
    assert want in decode.data_plane_address, decode.data_plane_address
    started, tokens, complete = generate(cluster, f"advertised-{transport}", prompt(4))
    assert complete is not None and started[-1].route == router_pb2.ROUTE_DISAGGREGATED
    assert tokens == colocated(cluster, prompt(4))
    assert_cluster_clean(cluster)


def test_the_ucx_data_plane_registers_the_advertised_host(drain_cluster):
    assert_advertised(drain_cluster, "ucx")


def test_the_tcp_data_plane_registers_the_advertised_host(lease_cluster):
    assert_advertised(lease_cluster, "tcp")


def test_sigterm_drains_a_decode_worker_finishes_in_flight_and_deregisters(drain_cluster):
    cluster = drain_cluster
    ids = prompt(1)
    rid = "drain@published"
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(zip(("started", "tokens", "complete"),
                                                          generate(cluster, rid, ids))))
    t.start()
    name = wait_event(cluster.events, "published", rid)["worker"]  # paused there before token 0
    survivor = next(n for n in ("decode-0", "decode-1") if n != name)
    popen = cluster._popen[name]
    sigterm_at = time.monotonic()
    cluster.signal(name, signal.SIGTERM)
    wait_health(cluster, name, "NOT_SERVING", timeout_s=2)

    # New requests during the drain: refused there (UNAVAILABLE), served by the survivor.
    during: list = []
    newcomers = threading.Thread(target=lambda: during.extend(
        generate(cluster, f"during-{i}", prompt(10 + i)) for i in range(3)))
    newcomers.start()
    assert popen.wait(timeout=30) == 0
    exited_at = time.monotonic()
    assert exited_at - sigterm_at < 20  # within PD_DRAIN_TIMEOUT_S
    assert exited_at - sigterm_at > PAUSE_S - 0.5  # it waited for its in-flight request
    assert name not in listed(cluster)  # deregistered: its lease (10 s) would still stand
    assert time.monotonic() - exited_at < 2
    newcomers.join(120)
    t.join(60)
    assert len(during) == 3
    for started, tokens, complete in during:
        assert complete is not None and len(tokens) == MAX_TOKENS
        assert started[-1].decode_worker_id == survivor
    # The drained request finished where it was, with every token of a colocated run.
    assert result["complete"] is not None and result["complete"].attempts == 1
    assert [s.decode_worker_id for s in result["started"]] == [name]
    assert result["tokens"] == colocated(cluster, ids)
    assert "deregister " + name in open(cluster.procs["directory"].log).read()
    assert_cluster_clean(cluster)


def test_a_drain_whose_budget_is_spent_aborts_the_unpublished_and_the_request_completes_elsewhere(tmp_path):
    events = tmp_path / "events.jsonl"
    cluster = start_cluster(tmp_path, prefill=1, decode=2, lease_ttl_s=LEASE_TTL_S,
                            env={"PD_FAULT_PAUSE_S": "30", "PD_EVENT_LOG": str(events), "PD_DRAIN_TIMEOUT_S": "1"})
    try:
        ids, rid, result = prompt(2), "budget@reserved", {}
        t = threading.Thread(target=lambda: result.update(zip(("started", "tokens", "complete"),
                                                              generate(cluster, rid, ids))))
        t.start()
        # Blocks reserved; the Reserve call has not returned (nor has the router said `started`).
        name = wait_event(events, "reserved", rid)["worker"]
        cluster.signal(name, signal.SIGTERM)
        assert cluster._popen[name].wait(timeout=15) == 0
        assert name not in listed(cluster)
        t.join(60)
        assert result["complete"] is not None and len(result["tokens"]) == MAX_TOKENS
        assert result["started"][-1].decode_worker_id != name
        assert result["tokens"] == colocated(cluster, ids)
        aborted = [json.loads(line) for line in events.read_text().splitlines()]
        assert any(r["event"] == "aborted" and r.get("request") == rid and r["worker"] == name for r in aborted)
        assert_cluster_clean(cluster)
    finally:
        cluster.down()


def test_a_worker_is_ready_only_with_a_live_lease(lease_cluster):
    cluster = lease_cluster
    assert health(cluster, "decode-0") == "SERVING"
    cluster.stop("directory")
    # Lease lapsed as far as the worker can tell (no renewal for a whole lease).
    wait_health(cluster, "decode-0", "NOT_SERVING", timeout_s=10)
    assert health(cluster, "router") == "SERVING"  # it reached the directory before
    # A worker started while the directory is away is NOT_SERVING until it registers.
    starting = threading.Thread(target=cluster.start_worker, args=("decode", 1, 120.0))
    starting.start()
    deadline = time.monotonic() + 60
    while "directory not ready" not in _log(cluster, "decode-1") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert health(cluster, "decode-1") == "NOT_SERVING"
    assert starting.is_alive()  # the launcher still waits for SERVING
    cluster.restart("directory")
    starting.join(60)
    assert not starting.is_alive()
    wait_health(cluster, "decode-1", "SERVING")
    wait_health(cluster, "decode-0", "SERVING")  # lost, registered again
    deadline = time.monotonic() + 10
    while listed(cluster) != {"prefill-0", "decode-0", "decode-1"} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert listed(cluster) == {"prefill-0", "decode-0", "decode-1"}
    _, tokens, complete = generate(cluster, "after", prompt(3))
    assert complete is not None and tokens == colocated(cluster, prompt(3))
    assert_cluster_clean(cluster)


def _log(cluster, name: str) -> str:
    try:
        return open(cluster.procs[name].log).read()
    except (KeyError, FileNotFoundError):
        return ""
