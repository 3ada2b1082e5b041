"""`pdctl drill` over the fake cluster (the factory patched): the report as text or
JSON, exit 0 only when every check passed; bad arguments and missing clusters refused."""

from __future__ import annotations

import json
import re

import pytest

from pdserve_ops import cli_drill
from pdserve_ops.cli import main
from pdserve_ops.drill.fake import FakeCluster, FakeKnobs

FAST = ["--rate", "200", "--duration", "0.4", "--trigger-after", "0.1", "--max-tokens", "4"]


@pytest.fixture
def fake(monkeypatch):
    made = {}

    def make(args, knobs=None):
        made["args"] = args
        made["cluster"] = FakeCluster(made.get("knobs"))
        return made["cluster"]

    monkeypatch.setattr(cli_drill, "make_cluster", make)
    monkeypatch.setattr(cli_drill, "DrillOptions", _quick(cli_drill.DrillOptions))
    return made


def _quick(options):
    def build(**kw):
        return options(**kw, settle_s=0, step_dwell_s=0, min_disaggregated=2)
    return build


def test_json_report_and_exit_0_when_every_check_passed(fake, capsys):
    assert main(["drill", "rollback", "--json", "--seed", "3", *FAST]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is True and doc["kind"] == "rollback" and doc["options"]["seed"] == 3
    assert {c["name"]: c["passed"] for c in doc["checks"]}["publications_under_old_epoch"] is True
    assert [s["step"] for s in doc["steps"]][-1] == "ROLLBACK_COMPLETE"
    assert fake["args"].cluster == "local" and fake["args"].state_dir == ".pdserve"


def test_text_report_and_exit_1_when_a_check_failed(fake, capsys):
    fake["knobs"] = FakeKnobs(publications_under_retired_epoch=None, reserved_blocks_after=2)
    assert main(["drill", "rollback", *FAST]) == 1
    out = capsys.readouterr().out
    assert out.startswith("drill rollback on fake: FAIL")
    verdicts = {line.split()[1]: line.split()[0] for line in out.splitlines() if line.startswith("  PASS")
                or line.startswith("  FAIL")}
    assert verdicts == {"requests_failed": "PASS", "disaggregated_before_rollback": "PASS",
                        "tokens_equal_colocated": "PASS", "publications_under_old_epoch": "FAIL",
                        "reserved_blocks_after": "FAIL", "open_transactions_after": "PASS",
                        "rollback_complete": "PASS", "decode_replaced": "PASS"}
    assert re.search(r"FAIL  publications_under_old_epoch +NOT MEASURED: the rollback record's", out)
    assert "decode-0 (decode): epoch 1 -> 2" in out


@pytest.mark.parametrize("argv, message", [
    (["--rate", "0"], "expected a number > 0"),
    (["--max-tokens", "x"], "expected a number"),
    (["--duration", "2", "--trigger-after", "5"], "must not exceed duration_s"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    assert main(["drill", "rollback", *argv]) == 2
    assert message in capsys.readouterr().err


def test_kube_needs_its_namespace_and_release(capsys):
    assert main(["drill", "rollback", "--cluster", "kube", *FAST]) == 1
    assert "--cluster kube needs --namespace and --release" in capsys.readouterr().err


def test_a_state_dir_without_a_cluster_is_reported(tmp_path, capsys):
    assert main(["drill", "promote", "--state-dir", str(tmp_path / "none"), *FAST]) == 1
    err = capsys.readouterr().err
    assert "no local cluster in" in err and "pdserve up" in err
