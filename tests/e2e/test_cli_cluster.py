"""`pdserve up/demo/down` and `pdctl` as a user runs them: real processes, real CLIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from services.cluster.processes import pid_alive

REPO = Path(__file__).resolve().parents[2]


def run(args: list[str], timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def pdctl(state: str, *args: str) -> subprocess.CompletedProcess:
    """pdctl presenting the cluster's client certificate (its state dir is not ./.pdserve)."""
    tls = Path(state) / "tls"
    return run(["pdserve_client.cli", *args], env={
        **os.environ, "PD_TLS_CERT": str(tls / "client.crt"), "PD_TLS_KEY": str(tls / "client.key"),
        "PD_TLS_CA": str(tls / "ca.crt")})


def test_up_pdctl_demo_down(tmp_path):
    state = str(tmp_path / "state")
    up = run(["services.cli", "up", "--state-dir", state])
    try:
        assert up.returncode == 0, up.stderr
        router = up.stdout.strip().splitlines()[-1]
        assert router.startswith("127.0.0.1:")
        procs = json.loads((Path(state) / "cluster.json").read_text())["procs"]
        pids = [p["pid"] for p in procs.values()]
        assert len(pids) == 6  # redis, the trace collector, directory, decode, prefill, router
        for name, p in procs.items():  # each pdserve service's /metrics, recorded and printed
            assert (p["metrics_url"] == "") == (name in ("redis", "collector")), (name, p)
            assert name in ("redis", "collector") or f"{name:<10} metrics {p['metrics_url']}" in up.stderr
        assert f"traces -> {procs['collector']['address']}" in up.stderr

        gen = pdctl(state, "--router", router, "generate", "--prompt-ids", "5,6,7,8,9", "--max-tokens", "4",
                    "--ignore-eos", "--json")
        assert gen.returncode == 0, gen.stderr
        result = json.loads(gen.stdout)
        assert len(result["token_ids"]) == 4 and result["route"] == "disaggregated"
        assert result["ttft_ms"] > 0
        shown = pdctl(state, "trace", result["request_id"], "--state-dir", state, "--json")
        assert shown.returncode == 0, shown.stderr
        (view,) = json.loads(shown.stdout)["traces"]
        assert view["route"] == "disaggregated" and view["orphans"] == 0 and view["processes"] == 4
        assert view["t_exposed_ms"] is not None and view["t_exposed_ms"] >= 0

        status = pdctl(state, "--router", router, "status", "--json")
        assert status.returncode == 0, status.stderr
        workers = json.loads(status.stdout)["workers"]
        assert sorted(w["worker_id"] for w in workers) == ["decode-0", "prefill-0"]

        bad = pdctl(state, "--router", router, "generate", "--prompt-ids", "1,512",
                    "--max-tokens", "4")  # 512 is outside the tiny model's vocabulary
        assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "512" in bad.stderr

        demo = run(["services.cli", "demo", "--state-dir", state, "--max-tokens", "4"])
        assert demo.returncode == 0, demo.stderr
        assert "TTFT" in demo.stdout and "TPOT" in demo.stdout
        # Every disaggregated request is shown split, or served colocated with the reason.
        fell_back = demo.stdout.count("asked for disaggregated, served colocated: attempt 1 (disaggregated")
        assert demo.stdout.count("[disaggregated") + fell_back == 3, demo.stdout
        assert demo.stdout.count("[colocated") == 1 + fell_back
        # The colocated request repeats the second prompt: the demo shows the tokens equal.
        assert "the same prompt, disaggregated earlier: the same tokens" in demo.stdout or fell_back, demo.stdout
        assert "OTHER TOKENS" not in demo.stdout, demo.stdout
    finally:
        down = run(["services.cli", "down", "--state-dir", state])
    assert down.returncode == 0, down.stderr
    for pid in pids:
        assert not pid_alive(pid), f"pid {pid} still running after pdserve down"
