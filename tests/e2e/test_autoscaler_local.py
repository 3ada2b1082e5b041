"""The autoscaler's loop on the real local cluster (tooling/cluster/autoscale.py, autoscaler/loop.py): the
routers' /metrics read with the monitor certificate, the decode pool resized 1 -> 2 -> 1
through the launcher while requests stream (the planner stood in for by a fixed list of
targets: the planner is sim/'s to test). Every request completes, the added worker serves
some of them, the drained one leaves no block held and no transaction open, and `pdctl
autoscale status` reads what the loop decided."""

from __future__ import annotations

import json
import threading
import time

import pytest

from autoscaler.loop import Autoscaler
from autoscaler.observe import Observer
from autoscaler.policy import Policy, Rules, Sizes, Target
from pdserve_client.types import PdError
from pdserve_ops.cli import main as pdctl
from tests.support.cluster import _directory, assert_cluster_clean, client, start_cluster, tls_env
from tooling.cluster.autoscale import STATUS_FILE, LocalScaler


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("autoscale")
    c = start_cluster(tmp, prefill=1, decode=1, transport="tcp",
                      env={"PD_PROFILE_BUDGET_S": "1", "PD_PROFILE_FILE": str(tmp / "profile.json")})
    yield c
    c.down()


class Load:
    """Requests streamed back to back by `threads` threads until stopped; every result kept."""

    def __init__(self, cluster, threads: int = 3):
        self.results, self.errors, self.stop = [], [], threading.Event()
        self._sdk = client(cluster, timeout_s=60)
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self, seed: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            prompt = [3 + (seed * 131 + n * 17 + j) % 500 for j in range(40 + n % 60)]
            try:
                self.results.append(self._sdk.generate_full(prompt_ids=prompt, max_tokens=24, ignore_eos=True))
            except PdError as e:  # reported by the test
                self.errors.append(e)

    def until(self, done, timeout_s: float = 60.0) -> None:
        """Wait for `done()` while the load runs (an error or the deadline fails the test)."""
        deadline = time.monotonic() + timeout_s
        while not done():
            assert not self.errors, self.errors[:3]
            assert time.monotonic() < deadline and all(t.is_alive() for t in self._threads), "the load stalled"
            time.sleep(0.2)

    def finish(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(90)
        self._sdk.close()


def test_decode_scales_up_and_drains_down_under_load_and_nothing_leaks(cluster):
    targets = [Target(1, 2, 0, "stand-in planner: 2 decode"), Target(1, 1, 0, "stand-in planner: 1 decode")]
    routers = lambda: [cluster.procs["router"].metrics_url]  # noqa: E731
    auto = Autoscaler(Observer(routers, cluster.identity("monitor").client_ssl(), 60),
                      lambda load: targets.pop(0), Policy(Rules(up_stable_s=0, down_stable_s=0, cooldown_s=0)),
                      LocalScaler(cluster, drain_timeout_s=40), "local")
    load = Load(cluster)
    try:
        first = auto.step()  # the first reading only starts the window
        assert first.action == "hold" and "first reading" in first.reason
        load.until(lambda: len(load.results) >= 6)
        up = auto.step()
        assert up.new == Sizes(1, 2) and up.reason.startswith("decode 1 -> 2"), up.reason
        assert auto.load.requests > 0 and auto.load.rate_rps > 0  # the real router's histograms
        assert cluster.workers("decode") == ["decode-0", "decode-1"]
        served = len(load.results)
        load.until(lambda: any(r.decode_worker == "decode-1" for r in load.results[served:]))
        down = auto.step()  # SIGTERM to decode-1 while requests stream: it drains
        assert down.new == Sizes(1, 1) and down.reason.startswith("decode 2 -> 1"), down.reason
        after = len(load.results)
        load.until(lambda: len(load.results) >= after + 6)
    finally:
        load.finish()
    assert not load.errors, load.errors[:3]
    assert all(r.finish_reason == "length" and r.num_tokens == 24 for r in load.results)
    assert cluster.workers("decode") == ["decode-0"] and "decode-1" not in cluster.procs
    snap, _ = _directory(cluster)
    assert sorted(w.worker_id for w in snap.workers) == ["decode-0", "prefill-0"]
    assert_cluster_clean(cluster)
    record = json.loads((cluster.state / STATUS_FILE).read_text())
    assert [d["action"] for d in record["decisions"]] == ["scale", "scale", "hold"]
    assert pdctl(["autoscale", "status", "--state-dir", str(cluster.state)]) == 0


def test_the_clusters_profile_plans_and_drives_the_autoscaler(cluster, tmp_path, monkeypatch):
    """End to end with the real planner: `pdctl profile save` keeps what the live workers
    registered, `pdctl plan` plans with that file, and the autoscaler asks the planner about
    the load the real router observed."""
    from autoscaler.config import AutoscalerSettings
    from autoscaler.recommend import recommender
    from sim.profile import SimProfile

    for k, v in tls_env(cluster, "operator").items():
        if k.startswith("PD_TLS_"):
            monkeypatch.setenv(k, v)
    saved = tmp_path / "local.json"
    assert pdctl(["--router", cluster.procs["router"].address, "profile", "save", str(saved), "--layers", "2"]) == 0
    prof = SimProfile.load(saved)
    with client(cluster, identity="operator") as ops:
        registered = [w.profile for w in ops.status().workers]
    assert all(r["source"] for r in registered) and len(registered) == 2
    assert min(r["prefill_ms_per_token"] for r in registered) <= prof.engine.cost.prefill_ms_per_token \
        <= max(r["prefill_ms_per_token"] for r in registered)
    assert prof.engine.block_size == 16 and prof.engine.layers == 2

    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"{i * 0.05:.3f},{60 + i % 50},{8 + i % 9}\n" for i in range(80)))
    assert pdctl(["plan", "--trace", str(trace), "--slo-ttft-ms", "200", "--slo-tpot-ms", "20", "--gpus", "2",
                  "--profile", str(saved), "--quiet", "--json", "--tolerance", "0.1"]) == 0

    settings = AutoscalerSettings(profile=str(saved), slo_ttft_ms=200, slo_tpot_ms=20, max_gpus=4,
                                  max_decode=3, max_prefill=1)
    routers = lambda: [cluster.procs["router"].metrics_url]  # noqa: E731
    auto = Autoscaler(Observer(routers, cluster.identity("monitor").client_ssl(), 60), recommender(settings),
                      Policy(Rules(up_stable_s=3600, down_stable_s=3600, cooldown_s=0)),
                      LocalScaler(cluster, drain_timeout_s=40), "local")
    load = Load(cluster, threads=2)
    try:
        auto.step()
        load.until(lambda: len(load.results) >= 8)
        d = auto.step()
    finally:
        load.finish()
    assert d.action == "hold" and ("meets TTFT 200 ms, TPOT 20 ms" in d.reason or "no configuration" in d.reason), \
        d.reason  # the real planner answered for the observed load (and the stable window holds the change)
    assert_cluster_clean(cluster)
