"""Every process killed at every step of the hand-off, and a cancel and a deadline at
every await (docs/design.md, Failures): tooling/cluster/faults.py stops one request at one step,
acts there, restarts the victim and waits for the cluster to settle.

Expected: a worker, the directory or Redis killed (or a worker stopped), the request
still completes with
the fault-free run's tokens (a retry on the other pair, or the colocated recompute);
the router killed, its client's request fails; a cancel or a deadline ends the
request with CANCELLED or DEADLINE_EXCEEDED (a cancel once the prefill's token 0 went
out ends it as a completion cancelled after that token). In every case the cluster settles
clean: no held block on any worker, no open transaction, none of the request's
transactions left PUBLISHED.
"""

from __future__ import annotations

import random

import pytest

from tests.support.cluster import start_cluster
from tooling.cluster.faults import STEPS, FaultRunner, fault_env, kill_cases

PAUSE_S = 2.0
PROMPT = [random.Random(15).randrange(3, 500) for _ in range(150)]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    state = tmp_path_factory.mktemp("faults")
    events = state / "events.jsonl"
    cluster = start_cluster(state, prefill=2, decode=2, lease_ttl_s=2.0, env=fault_env(events, PAUSE_S))
    try:
        yield FaultRunner(cluster, events, PROMPT, max_tokens=8, pause_s=PAUSE_S)
    finally:
        cluster.down()


@pytest.mark.parametrize("victim,step", kill_cases())
def test_kill_at_each_step(runner, victim, step):
    r = runner.run("kill", victim, step)
    assert r.reached, f"the request never reached {step}: {r.outcome} {r.detail}"
    if victim == "router":
        assert r.outcome.startswith("failed"), r  # its client's stream went with it
    else:
        assert (r.outcome, r.tokens_match) == ("ok", True), r
    assert r.clean(), r


@pytest.mark.parametrize("victim,step", [("prefill", "chunk"), ("decode", "chunk"), ("decode", "published")])
def test_a_hung_worker_is_routed_around(runner, victim, step):
    """SIGSTOP: the worker stops answering without closing anything; its lease lapses
    and the request completes elsewhere; continued, it finds its lease lost, drops
    what it held and registers again."""
    r = runner.run("stop", victim, step)
    assert r.reached, f"the request never reached {step}: {r.outcome} {r.detail}"
    assert (r.outcome, r.tokens_match) == ("ok", True), r
    assert r.clean(), r


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("action,code", [("cancel", "CANCELLED"), ("deadline", "DEADLINE_EXCEEDED")])
def test_cancel_and_deadline_at_each_await(runner, action, code, step):
    r = runner.run(action, "", step)
    assert r.reached, f"the request never reached {step}: {r.outcome} {r.detail}"
    if r.outcome == "cancelled":  # token 0 left from the prefill before the cancel (at "reserved" too:
        # it does not wait for the decode's Reserve): the request ends there, a completion
        assert action == "cancel" and r.tokens_match, r
    else:
        assert r.outcome == f"failed: {code}", r
    assert r.clean(), r
