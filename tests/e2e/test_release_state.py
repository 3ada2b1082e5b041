"""The release outlives `pdserve down` (docs/design.md, The release: the directory keeps
it, locally in the state dir's Redis files), and is never silent about it: real
processes, the real CLIs, one state dir used by cluster after cluster, in order.

1. A rolled-back release stays ROLLED_BACK across a restart, and says so: `pdserve up`
   prints its state and the command that moves it; a request that asks for
   disaggregated and runs colocated is told why by pdctl and by the demo.
2. A cluster started with another model on that state dir is not reported under the old
   manifest: `pdserve up` and `pdctl release status` name every identity that differs,
   frozen -> live; a promotion (no state named) freezes the live one.
3. `pdserve down --purge` starts the next cluster from clean state and keeps the virtualenv.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.operator import operator_env, operator_home

UP_S = 240

@pytest.fixture(scope="module")
def home(tmp_path_factory):
    with operator_home(tmp_path_factory, "release-state") as home:
        yield home


def run(home: Path, *argv: str) -> subprocess.CompletedProcess:
    """`pdserve ...` or `pdctl ...` as an operator runs it from `home` (./.pdserve there)."""
    env = operator_env()
    module = {"pdserve": "tooling.cli", "pdctl": "pdserve_ops.cli"}[argv[0]]
    done = subprocess.run([sys.executable, "-m", module, *argv[1:]], cwd=home, env=env, capture_output=True,
                          text=True, timeout=UP_S)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
    return done


def release(home: Path) -> dict:
    return json.loads(run(home, "pdctl", "release", "status", "--json").stdout)


def test_a_rolled_back_release_is_said_across_a_restart(home):
    first = run(home, "pdserve", "up")
    assert "release " not in first.stderr, first.stderr  # ACTIVE under its own manifest: nothing to say
    run(home, "pdctl", "release", "rollback", "--reason", "test: rolled back")
    run(home, "pdserve", "down")

    again = run(home, "pdserve", "up")
    assert release(home)["mode"] == "rolled_back"  # kept: a rollback is not undone by a restart
    assert "release ROLLED_BACK since " in again.stderr and "test: rolled back" in again.stderr, again.stderr
    assert "`pdctl release promote --reason R` moves it to PINNED" in again.stderr
    assert "down --purge` stops the cluster and starts the next from clean state" in again.stderr

    asked = run(home, "pdctl", "generate", "--prompt-ids", "5,6,7,8", "--max-tokens", "4", "--mode", "disaggregated")
    assert "route=colocated" in asked.stdout
    assert "asked for disaggregated, served colocated: the release is ROLLED_BACK" in asked.stderr, asked.stderr
    assert "`pdctl release promote --reason R`" in asked.stderr

    demo = run(home, "pdserve", "demo", "--max-tokens", "4")
    assert "no such route" not in demo.stdout, demo.stdout
    assert demo.stdout.count("asked for disaggregated, served colocated: the release is ROLLED_BACK") == 3


def test_another_model_is_not_reported_under_the_old_manifest(home):
    """Runs after the first: the state dir holds a ROLLED_BACK release frozen for `tiny`."""
    run(home, "pdserve", "down")
    model = str(home / "seed-7")
    run(home, "pdserve", "export-checkpoint", "--preset", "tiny", "--seed", "7", "--out", model)
    up = run(home, "pdserve", "up", "--model", model)

    before = release(home)
    assert before["manifest"]["model"] == "tiny"  # the record is what it was ...
    drift = before["manifest_drift"]  # ... and says where the live cluster is not it
    assert f"model tiny -> {model}" in drift and "cache_abi_digests " in drift and "model_identity " in drift
    assert f"is NOT the live cluster's: model tiny -> {model}" in up.stderr, up.stderr
    status = run(home, "pdctl", "release", "status").stdout
    assert f"NOT the live cluster's: model tiny -> {model}" in status, status

    promoted = run(home, "pdctl", "release", "promote", "--reason", "test: the new model")  # no TARGET: the next
    assert "release: ROLLED_BACK -> PINNED" in promoted.stdout, promoted.stdout
    after = release(home)
    assert after["manifest"]["model"] == model and after["manifest_drift"] == ""
    assert "NOT the live cluster's" not in run(home, "pdctl", "release", "status").stdout


def test_down_purge_starts_from_clean_state_and_keeps_the_venv(home):
    """Runs after the second: the release is PINNED, its history long."""
    state = home / ".pdserve"
    gone = run(home, "pdserve", "down", "--purge")
    assert not state.exists() and "the next `pdserve up` starts from clean state" in gone.stderr
    assert Path(sys.prefix, "bin", "pdctl").exists()  # the virtualenv is elsewhere, and stays

    fresh = run(home, "pdserve", "up")
    view = release(home)
    assert (view["mode"], view["version"], view["manifest"]["model"]) == ("active", 1, "tiny")
    assert len(view["history"]) == 0 and view["rollback"] is None
    assert "release " not in fresh.stderr, fresh.stderr
    run(home, "pdserve", "down")
