"""Every command docs/runbooks/ tells an operator to run (tests/support/runbooks.py reads
them from its code blocks and its text), run as written.

Local ones run in PLAN's order, one test each, on one cluster `pdserve up` starts from
a directory of its own (its state dir ./.pdserve), from a shell with the virtualenv's
pdserve and pdctl on PATH, the placeholders filled in as an operator would (VALUES): the
rollback drill, the promotion drill (its defaults included), `pdctl release promote`
naming no state, the restarts that keep the release, `pdserve down --purge`.

Kubernetes ones cannot run here (no cluster): each goes through the kubectl-pdserve
plugin to pdctl's argument parsing and the drill's options (what they would run), and the
object names they use are the chart's as helm renders it (KUBE).

A runbook command that is in neither fails `test_every_runbook_command_is_run_or_checked`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve_ops import cli, cli_drill, kubectl
from pdserve_ops.drill.kube import fullname
from tests.support.operator import operator_env, operator_home
from tests.support.runbooks import all_commands, local

STEP_S = 420
"""A step's limit: a drill with its load, decode roll-back and colocated re-runs."""
ROUTER = "127.0.0.1:50080"
PROMPT_IDS = ",".join(str(i) for i in range(5, 45))


def ok(marker: str):
    """A check: the step's output (stdout and stderr) contains `marker`."""
    return lambda home, run: marker in run.stdout + run.stderr


def passed(home, run) -> bool:
    return re.search(r"^drill \w+ on local .*: PASS$", run.stdout, re.M) is not None


def release_is(mode: str):
    def check(home, run) -> bool:
        return pdctl_json(home, "release", "status")["mode"] == mode
    return check


def drill_json_passed(home, run) -> bool:
    doc = json.loads((home / "drill.json").read_text())
    return doc["passed"] and (doc["release_before"], doc["release_after"]) == ("active", "rolled_back")


def purged(home, run) -> bool:
    return not (home / ".pdserve").exists() and Path(sys.prefix, "bin", "pdctl").exists()


PLAN = [
    ("pdserve up --decode 2 --prefill 1 --mode disaggregated", release_is("active")),
    ("pdserve up", ok("127.0.0.1:")),  # already running: its address again
    ("pdctl release status", ok("release: ACTIVE")),
    ("pdctl release status --json", ok('"canary_min_samples": 20')),
    ("pdctl status", ok("decode-1")),
    ("pdctl drill rollback --rate 5 --duration 10 --trigger-after 3", passed),
    ("pdctl release rollback --reason R", ok("ROLLBACK_COMPLETE")),  # a complete one: nothing to resume
    ("pdctl drill promote --rate 4 --duration 10 --trigger-after 2", passed),
    ("pdctl drill rollback --state-dir /path/to/.pdserve --json > drill.json", drill_json_passed),
    ("pdctl drill promote --rate 6 --duration 6 --trigger-after 1 --max-tokens 8 --canary-fraction 0.5", passed),
    ("pdctl generate --prompt-ids IDS --max-tokens N --ids --mode disaggregated", ok("route=disaggregated")),
    ("pdctl generate --prompt-ids IDS --max-tokens N --ids --mode colocated", ok("route=colocated")),
    ("pdctl trace REQUEST_ID", ok("router.request")),
    ("pdctl blocks --orphans-only", None),
    ("pdctl transactions --state reserved", ok("0 transaction(s)")),
    ("pdctl transactions --json", None),
    ("pdctl release rollback --reason R", release_is("rolled_back")),
    ("pdserve down", None),
    # The state dir kept the release: up says so, and what moves it.
    ("pdserve up --decode 2", ok("release ROLLED_BACK since")),
    ("pdctl release promote --reason R", ok("release: ROLLED_BACK -> PINNED")),
    ("pdctl drill promote", passed),
    ("pdserve down && pdserve up", release_is("active")),
    ("pdserve down --purge", purged),
]
"""The runbook's local commands (as written there) in an order one cluster can run them,
each with what shows it did what the runbook says (None: its exit status only)."""

KUBE_PLUGIN = ["kubectl pdserve drill rollback --namespace pdserve --release pd --rate 5 --duration 60",
               "kubectl pdserve drill rollback --namespace pdserve --release pd --context prod-eu --json",
               "kubectl pdserve drill promote --namespace pdserve --release pd"]
KUBE_PDCTL = ["pdctl drill rollback --cluster kube --namespace pdserve --release pd"]
KUBE_KUBECTL = ["kubectl -n NS rollout status deploy/RELEASE-pdserve-decode", "kubectl -n NS get pods"]
KUBE = KUBE_PLUGIN + KUBE_PDCTL + KUBE_KUBECTL
"""The runbook's Kubernetes commands: checked here as far as a machine without a cluster can."""


def test_every_runbook_command_is_run_or_checked():
    found = [c for commands in all_commands().values() for c in commands]
    assert found, "no runbook commands found"
    covered = {c for c, _ in PLAN} | set(KUBE)
    assert [c for c in found if c not in covered] == [], "a runbook command no test runs"
    assert [c for c in covered if c not in found] == [], "a command the runbooks no longer have"


@pytest.mark.parametrize("command", KUBE_PLUGIN + KUBE_PDCTL)
def test_kubernetes_drill_commands_parse_into_the_drill_they_would_run(command):
    words = command.split()
    if words[0] == "kubectl":  # the plugin's translation, with the kubeconfig it would read stood in for
        words = kubectl.to_pdctl(words[2:], resolve=lambda ctx: (ctx or "current", "default"),
                                 router_of=lambda *_: ROUTER)
    args = cli.build_parser().parse_args(words[1:] if words[0] == "pdctl" else words)
    options = cli_drill.options_of(args)
    assert (args.cluster, args.namespace, args.release) == ("kube", "pdserve", "pd")
    assert args.drill in ("rollback", "promote") and options.rate_rps > 0


@pytest.mark.parametrize("command", KUBE_KUBECTL)
def test_kubectl_commands_name_the_charts_objects(command):
    from tests.support.helm import render

    filled = local(command, {r"\bNS\b": "serving", r"\bRELEASE\b": "pd"})
    names = {(o["kind"], o["metadata"]["name"]) for o in render()}
    assert ("ConfigMap", f"{fullname('pd')}-release") in names  # what the drill reads (drill/kube.py)
    deployments = re.findall(r"deploy/(\S+)", filled)
    assert all(("Deployment", d) in names for d in deployments), (deployments, sorted(names))
    assert filled.split()[:3] == ["kubectl", "-n", "serving"]

@pytest.fixture(scope="module")
def home(tmp_path_factory):
    with operator_home(tmp_path_factory, "runbook") as home:
        yield home


@pytest.fixture(scope="module")
def seen() -> dict[str, str]:
    """What earlier steps printed that later ones name (a request id)."""
    return {}


def shell_env() -> dict[str, str]:
    """An operator's shell: the virtualenv's scripts first on PATH, no certificate or router
    settings of the test's own (pdctl finds ./.pdserve's), this checkout importable."""
    return operator_env()


def values(home: Path, seen: dict[str, str]) -> dict[str, str]:
    return {r"--reason R\b": "--reason 'runbook test'", r"/path/to/\.pdserve": str(home / ".pdserve"),
            r"\bIDS\b": PROMPT_IDS, r"--max-tokens N\b": "--max-tokens 8",
            r"\bREQUEST_ID\b": seen.get("request_id", "no-request-seen")}


def pdctl_json(home: Path, *args: str) -> dict:
    run = subprocess.run(["pdctl", *args, "--json"], cwd=home, env=shell_env(), capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize(("command", "check"), PLAN, ids=[c for c, _ in PLAN])
def test_runbook_command_on_a_local_cluster(home, seen, command, check):
    run = subprocess.run(["bash", "-c", local(command, values(home, seen))], cwd=home, env=shell_env(),
                         capture_output=True, text=True, timeout=STEP_S)
    shown = f"$ {command}\n{run.stdout[-6000:]}\n{run.stderr[-6000:]}"
    assert run.returncode == 0, shown
    seen.update(re.findall(r"(request_id)=(\S+)", run.stdout))
    assert check is None or check(home, run), shown
