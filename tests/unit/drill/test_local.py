"""LocalDrillCluster over a state dir, no processes: which workers it would replace, where
it records the release, and clear errors for a state dir without a cluster."""

from __future__ import annotations

import json

import pytest

from pdserve_ops.drill.cluster import DrillError
from pdserve_ops.drill.fake import FakeCluster
from tooling.cluster.drill import LocalDrillCluster
from tooling.cluster.launcher import ClusterSpec, LocalCluster, Proc


def recorded_cluster(state_dir) -> None:
    c = LocalCluster(ClusterSpec(state_dir=str(state_dir), insecure=True))
    c.state.mkdir(parents=True)
    c.router_address = "127.0.0.1:1"
    for name, role in (("directory", "directory"), ("decode-0", "decode"), ("decode-1", "decode"),
                       ("mixed-0", "mixed"), ("prefill-0", "prefill"), ("router", "router")):
        c.roles[name] = role
        c.procs[name] = Proc(name, 0, "127.0.0.1:2", str(state_dir / f"{name}.log"))
    c._save()


def test_decode_workers_and_the_recorded_release(tmp_path, monkeypatch):
    recorded_cluster(tmp_path / ".pdserve")
    local = LocalDrillCluster(str(tmp_path / ".pdserve"))
    monkeypatch.delenv("PD_INSECURE", raising=False)
    with pytest.raises(DrillError, match="runs without TLS .* set PD_INSECURE=1"):
        local.client()
    monkeypatch.setenv("PD_INSECURE", "1")
    assert local.decode_workers() == ["decode-0", "decode-1", "mixed-0"]
    assert local.name == f"local ({tmp_path / '.pdserve'})"
    with local.client("operator") as sdk:
        assert sdk.address == "127.0.0.1:1"
    with LocalDrillCluster(str(tmp_path / ".pdserve"), router="127.0.0.1:9").client() as sdk:
        assert sdk.address == "127.0.0.1:9"
    view = FakeCluster().client().release()
    local.record_release(view)
    assert json.loads((tmp_path / ".pdserve" / "release.json").read_text()) == json.loads(json.dumps(view.to_dict()))


def test_a_state_dir_without_a_cluster_is_a_clear_error(tmp_path):
    with pytest.raises(DrillError, match="no local cluster in .*pdserve up"):
        LocalDrillCluster(str(tmp_path))
    (tmp_path / "cluster.json").write_text(json.dumps({"spec": {}}))
    with pytest.raises(DrillError, match="is not a cluster the launcher wrote"):
        LocalDrillCluster(str(tmp_path))
