"""`pdctl autoscale status` (ops/pdserve_ops/cli_autoscale.py) on the record the loop
publishes: from the local state dir, and from the chart's status ConfigMap through the real
`kubernetes` client against kmock (one `get`, which the chart's status Role grants); a
missing record and a foreign one exit 1 saying why; every option has its help."""

from __future__ import annotations

import argparse
import json

import pytest

from autoscaler.loop import STATUS_FORMAT, Autoscaler
from autoscaler.policy import Policy, Rules, Sizes, Target
from autoscaler.scaler import MemoryScaler
from pdserve_ops import cli_autoscale
from pdserve_ops.cli import build_parser, main
from tests.unit.autoscaler.test_kube import CONFIGMAPS, NS, STATUS_CM, Emulator, chart, verb
from tests.unit.autoscaler.test_loop import Clock, FakeObserver
from tests.unit.drill_kube.emulator import Running
from tests.unit.drill_kube.test_kube_cluster import permitted
from tooling.cluster.autoscale import STATUS_FILE


def published() -> dict:
    """The record after two decisions of the real loop (a scale, then a hold)."""
    s = MemoryScaler(Sizes(1, 1))
    a = Autoscaler(FakeObserver(), lambda load: Target(1, 2, 0, "3 rps"),
                   Policy(Rules(up_stable_s=0, cooldown_s=60)), s, "local", clock=Clock())
    a.step()
    a.step()
    return s.status


def test_the_shared_names_match():
    from autoscaler.kube import STATUS_KEY
    assert (cli_autoscale.STATUS_FILE, cli_autoscale.STATUS_KEY, cli_autoscale.STATUS_FORMAT) == \
        (STATUS_FILE, STATUS_KEY, STATUS_FORMAT)


def test_local_status_prints_sizes_the_last_decision_and_why(tmp_path, capsys):
    (tmp_path / STATUS_FILE).write_text(json.dumps(published()))
    assert main(["autoscale", "status", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "autoscaler (local), updated 2023-11-14 22:13:20 UTC" in out
    assert "pools:  prefill 1, decode 2, mixed 0" in out and "target: prefill 1, decode 2, mixed 0" in out
    assert "load:   12.30 rps over 60 s" in out
    assert "last:   hold: cool-down 60 s left; planner: 3 rps" in out
    rows = [line for line in out.splitlines() if line.startswith("2023-")]
    assert len(rows) == 2 and "decode 1 -> 2: up after 0 s stable" in rows[1] and " scale " in rows[1]
    assert main(["autoscale", "status", "--state-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == STATUS_FORMAT


def test_no_record_or_a_foreign_one_exits_1_saying_why(tmp_path, capsys):
    assert main(["autoscale", "status", "--state-dir", str(tmp_path)]) == 1
    assert "no autoscaler status at" in capsys.readouterr().err
    (tmp_path / STATUS_FILE).write_text(json.dumps({"format": "other/9"}))
    assert main(["autoscale", "status", "--state-dir", str(tmp_path)]) == 1
    assert "status format 'other/9', this pdctl reads" in capsys.readouterr().err
    assert main(["autoscale", "status", "--kube"]) == 2


@pytest.fixture
def kube(tmp_path, monkeypatch):
    import yaml

    emulator = Emulator()
    emulator.setup({"decode": 1})
    emulator.objects[CONFIGMAPS, NS, STATUS_CM].patch({"data": {"status.json": json.dumps(published())}})
    with Running(emulator) as running:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "e",
                  "clusters": [{"name": "k", "cluster": {"server": running.url}}],
                  "users": [{"name": "u", "user": {"token": "t"}}],
                  "contexts": [{"name": "e", "context": {"cluster": "k", "user": "u"}}]}
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
        yield emulator


def test_kube_status_reads_the_configmap_with_one_get_the_role_grants(kube, capsys):
    assert main(["autoscale", "status", "--kube", "--namespace", NS, "--release", "pd"]) == 0
    assert "last:   hold: cool-down 60 s left" in capsys.readouterr().out
    (request,) = list(kube)
    assert (verb(request), request.resource.plural, request.name) == ("get", "configmaps", STATUS_CM)
    role = chart()[("Role", f"{STATUS_CM}-status")]
    assert permitted(role, "get", "", "configmaps", STATUS_CM)
    assert main(["autoscale", "status", "--kube", "--namespace", NS, "--release", "other"]) == 1
    assert "ConfigMap serving/other-pdserve-autoscaler: 404" in capsys.readouterr().err


def test_every_option_has_help():
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    (actions,) = [a for a in commands.choices["autoscale"]._actions if isinstance(a, argparse._SubParsersAction)]
    status = actions.choices["status"]
    missing = [a.option_strings for a in status._actions if not (a.help or "").strip()]
    assert not missing and status.description
