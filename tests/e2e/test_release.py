"""End to end, real processes: the release (docs/design.md, The release) on one local cluster, in order.

The cluster starts disaggregated with two decode workers, so its first router records
the release ACTIVE with the manifest frozen from the live workers. Then, as an operator
runs them with pdctl:

1. an out-of-order promotion is refused with the reason;
2. `pdctl drill rollback --cluster local` sends load, rolls the release back mid-load
   (every step recorded, in order), replaces both decode workers one at a
   time (real processes: drained, started again, registered at a new epoch) while the
   load goes on, and checks the result; the test reads the drill's JSON and checks it
   against the cluster itself (workers refuse transfer work after, nothing reserved or
   open, every answer equal to colocated serving's);
3. `pdctl drill promote` takes the rolled-back release to ACTIVE under load, one state at
   a time, through every gate the router measures (the failure-injection smoke against
   these workers, the canary's record of what the router served);
4. the router is SIGKILLed in the middle of a rollback; its restart finishes it.
"""

from __future__ import annotations

import json
import time

import grpc
import pytest

from pdserve_client import PdError
from pdserve_client.rpc.pd.v1 import common_pb2, decode_pb2, decode_pb2_grpc
from pdserve_ops.drill.checks import EXPECTED_STEPS
from tests.support.cluster import assert_cluster_clean, channel, client, pdctl, start_cluster
from tooling.cluster.launcher import LocalCluster

DRILL_S = 300
CANARY_SAMPLES = 6
STEPS = list(EXPECTED_STEPS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("release"), state_name=".pdserve", prefill=1, decode=2,
                      mode="disaggregated",
                      env={"PD_RELEASE_POLL_S": "0.2", "PD_CANARY_MIN_SAMPLES": str(CANARY_SAMPLES),
                           # Paces each rollback step, so test 4 kills the router between two.
                           "PD_ROLLBACK_STEP_PAUSE_S": "0.3"})
    yield c
    # The drill restarted the decode workers from its own process: the state dir, not
    # this object, knows their pids.
    try:
        LocalCluster.load(str(c.state)).down()
    except FileNotFoundError:
        pass
    c.down()


def decode_epochs(cluster) -> dict[str, int]:
    with client(cluster) as sdk:
        return {w.worker_id: w.epoch for w in sdk.status().workers if w.role == "decode"}


def test_the_first_router_records_the_release_with_its_manifest(cluster):
    with client(cluster) as sdk:
        view = sdk.release()
    assert (view.mode, view.router_mode, view.routes_stopped) == ("active", "disaggregated", False)
    m = view.manifest
    assert m["model"] == "tiny" and m["roles"] == ["decode=2", "prefill=1"] and m["transports"] == ["ucx"]
    assert len(m["cache_abi_digests"]) == 1 and len(m["model_identity"]) == 1 and len(m["digest"]) == 64
    assert m["fallback_mode"] == "colocated" and m["route_epoch"] > 0


def test_promotion_out_of_order_is_refused_with_the_reason(cluster):
    with client(cluster, "operator") as sdk:
        with pytest.raises(PdError) as err:
            sdk.promote("pinned", reason="skip the rollback")
    assert err.value.code == "FAILED_PRECONDITION" and "ACTIVE -> PINNED" in err.value.message


def test_rollback_drill_under_load(cluster):
    before = decode_epochs(cluster)
    run = pdctl(cluster, "drill", "rollback", "--cluster", "local", "--state-dir", str(cluster.state), "--json",
                "--rate", "5", "--duration", "8", "--trigger-after", "2", "--max-tokens", "8", "--seed", "11",
                timeout_s=DRILL_S)
    assert run.returncode in (0, 1) and run.stdout, run.stderr
    doc = json.loads(run.stdout)
    print(json.dumps(doc, indent=1))  # shown when an assertion fails
    checks = {c["name"]: c for c in doc["checks"]}

    assert doc["sent"] >= 50 and doc["failed"] == 0, (doc["sent"], doc["errors"])
    assert doc["succeeded"] == doc["sent"] and checks["requests_failed"]["passed"]
    assert doc["disaggregated_before"] >= 5 and doc["routes"]["colocated"] > 0, doc["routes"]
    assert doc["compared"] == doc["sent"] and doc["mismatch_count"] == 0, doc["mismatches"]
    assert (doc["reserved_blocks_after"], doc["open_transactions_after"]) == (0, 0)
    assert [s["step"] for s in doc["steps"]] == STEPS
    assert all(s["ended_unix_ms"] >= s["started_unix_ms"] > 0 for s in doc["steps"])
    advanced = doc["steps"][1]["counts"]
    assert advanced["route_epoch"] > advanced["retired_epoch"] > 0
    assert (doc["release_before"], doc["release_after"]) == ("active", "rolled_back")
    assert checks["rollback_complete"]["passed"], checks["rollback_complete"]["detail"]
    assert doc["publications_under_old_epoch"] == 0, checks["publications_under_old_epoch"]["detail"]

    # Both decode workers were replaced: new processes, registered at new epochs, one at a time.
    replaced = {p["worker_id"]: p for p in doc["decode"]["replacements"]}
    assert sorted(replaced) == sorted(before) == ["decode-0", "decode-1"] and not doc["decode"]["error"]
    after = decode_epochs(cluster)
    for w, epoch in before.items():
        assert replaced[w]["epoch_before"] == epoch < replaced[w]["epoch_after"] == after[w]
    state = LocalCluster.load(str(cluster.state))
    assert all(state.procs[w].pid != cluster.procs[w].pid for w in before), "the decode processes are new"
    assert json.loads((cluster.state / "release.json").read_text())["mode"] == "rolled_back"
    assert checks["decode_replaced"]["passed"]
    assert doc["passed"] and run.returncode == 0, [c for c in doc["checks"] if not c["passed"]]

    # Workers refuse transfer work now (DISABLE_CONNECTOR), even from the router.
    with channel(state, "decode-0", "router") as ch, pytest.raises(grpc.RpcError) as refused:
        decode_pb2_grpc.DecodeStub(ch).Reserve(decode_pb2.DecodeReserveRequest(
            request_id="after-rollback", tenant="default", generation=1, prompt_token_ids=[5, 6, 7],
            max_tokens=4, sampling=common_pb2.SamplingParams()), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "a rollback disabled the K/V connector" in refused.value.details()
    status = pdctl(cluster, "release", "status")
    assert status.returncode == 0, status.stderr
    assert "release: ROLLED_BACK" in status.stdout and "ROLLBACK_COMPLETE" in status.stdout
    assert_cluster_clean(cluster)


def test_promote_drill_reaches_active_through_every_gate(cluster):
    """Runs after the rollback drill: the release is ROLLED_BACK, complete."""
    run = pdctl(cluster, "drill", "promote", "--state-dir", str(cluster.state), "--json", "--rate", "6",
                "--duration", "4", "--trigger-after", "1", "--max-tokens", "6", "--canary-fraction", "0.5",
                "--canary-samples", str(CANARY_SAMPLES), "--slo-ttft-ms", "20000", "--slo-tpot-ms", "5000",
                timeout_s=DRILL_S)
    assert run.returncode in (0, 1) and run.stdout, run.stderr
    doc = json.loads(run.stdout)
    print(json.dumps(doc, indent=1))
    assert doc["sent"] > 0 and doc["failed"] == 0, doc["errors"]
    assert doc["compared"] == doc["sent"] and doc["mismatch_count"] == 0, doc["mismatches"]
    assert [(p["from_mode"], p["to_mode"], p["passed"]) for p in doc["promotions"]] == [
        ("rolled_back", "pinned", True), ("pinned", "shadow", True), ("shadow", "canary", True),
        ("canary", "active", True)], [p.get("refusal") for p in doc["promotions"]]
    gates = {g["name"]: g for g in doc["promotions"][-1]["gates"]}
    assert all(g["passed"] for g in gates.values())
    smoke = gates["failure_injection_smoke"]["detail"]
    assert "CAPABILITY_DENIED signature" in smoke and "CAPABILITY_DENIED transfer" in smoke, smoke
    assert "stale_completion ok" in smoke and "mid_transfer ok: cut while" in smoke, smoke
    samples = gates["canary_samples"]["detail"]  # "n disaggregated and m colocated requests completed ..."
    assert int(samples.split()[0]) >= CANARY_SAMPLES and int(samples.split()[3]) >= CANARY_SAMPLES, samples
    for name in ("ttft_attainment", "tpot_attainment", "stale_publications", "unauthorized_accepted_transfers",
                 "transfer_failure_rate"):
        assert name in gates, sorted(gates)
    with client(cluster) as sdk:
        assert sdk.release().mode == "active" == doc["release_after"]
    assert doc["passed"] and run.returncode == 0, [c for c in doc["checks"] if not c["passed"]]
    assert json.loads((cluster.state / "release.json").read_text())["mode"] == "active"
    assert_cluster_clean(cluster)


def test_a_router_killed_mid_rollback_is_finished_by_its_restart(cluster):
    """Runs after the promotion drill: the release is ACTIVE again."""
    live = LocalCluster.load(str(cluster.state))  # the drill replaced the decode processes
    with client(live) as sdk:
        sdk.generate_full(prompt_ids=list(range(5, 60)), max_tokens=4, ignore_eos=True)
    with client(live, "operator") as sdk:
        started = sdk.rollback(reason="drill: kill the router", wait=False).release.rollback
    live.signal("router")  # SIGKILL, mid-rollback (a step every 0.3 s)
    with client(live) as sdk:  # answered by the router's restart below
        live.restart("router")
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
    assert_cluster_clean(live)
