"""`kubectl pdserve` (ops/pdserve_ops/kubectl.py): the pdctl command it runs for the
words kubectl hands it, the context and namespace it reads from the kubeconfig, its
console script, and its error when the kubernetes client is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from pdserve_ops import kubectl

REPO = Path(__file__).resolve().parents[3]


def here(context):
    return context or "prod", "serving" if context in (None, "prod") else "staging"


def no_router(*_):
    raise AssertionError("the ConfigMap is read only for release commands with --release and no --router")


@pytest.mark.parametrize(("argv", "pdctl"), [
    (["drill", "rollback", "--rate", "2"],
     ["drill", "rollback", "--rate", "2", "--cluster", "kube", "--namespace", "serving", "--context", "prod"]),
    (["-n", "other", "drill", "rollback", "--release", "pd", "--rate", "2", "--router", "127.0.0.1:50080"],
     ["drill", "rollback", "--rate", "2", "--cluster", "kube", "--namespace", "other", "--context", "prod",
      "--release", "pd", "--router", "127.0.0.1:50080"]),
    (["drill", "rollback", "--context", "lab"],
     ["drill", "rollback", "--cluster", "kube", "--namespace", "staging", "--context", "lab"]),
    (["release", "status", "--json"], ["release", "status", "--json"]),
    (["release", "promote", "canary", "--canary-fraction", "0.1", "--router", "127.0.0.1:50081"],
     ["release", "promote", "canary", "--canary-fraction", "0.1", "--router", "127.0.0.1:50081"]),
])
def test_the_pdctl_command_of_the_plugin_words(argv, pdctl):
    assert kubectl.to_pdctl(argv, resolve=here, router_of=no_router) == pdctl


def test_release_with_a_release_name_takes_the_router_from_its_configmap():
    seen = []

    def router_of(namespace, release, context):
        seen.append((namespace, release, context))
        return "pd-pdserve-router.serving.svc:50080"

    out = kubectl.to_pdctl(["release", "rollback", "--reason", "x", "--release", "pd"], resolve=here,
                           router_of=router_of)
    assert out == ["release", "rollback", "--reason", "x", "--router", "pd-pdserve-router.serving.svc:50080"]
    assert seen == [("serving", "pd", "prod")]


@pytest.mark.parametrize("argv", [["status"], ["generate", "--prompt", "hi"]])
def test_other_words_are_a_usage_error(argv, capsys):
    with pytest.raises(kubectl.UsageError, match="expected one of drill, release"):
        kubectl.to_pdctl(argv, resolve=here, router_of=no_router)
    assert kubectl.main(argv) == 2
    assert "kubectl pdserve drill rollback" in capsys.readouterr().err


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "prod",
              "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "prod", "context": {"cluster": "c", "user": "u", "namespace": "serving"}},
                           {"name": "lab", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path


def test_the_context_and_namespace_come_from_the_kubeconfig(kubeconfig):
    assert kubectl.current_context(None) == ("prod", "serving")
    assert kubectl.current_context("lab") == ("lab", "default")  # a context without one: kubectl's default
    with pytest.raises(kubectl.PluginError, match="context 'gone' is not in the kubeconfig .*prod, lab"):
        kubectl.current_context("gone")


def test_no_kubeconfig_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(kubectl.PluginError, match="no kubeconfig"):
        kubectl.current_context(None)


def test_main_runs_pdctl_with_the_mapped_words(kubeconfig, monkeypatch):
    ran = []
    monkeypatch.setattr("pdserve_ops.cli.main", lambda argv: ran.append(argv) or 0)
    assert kubectl.main(["drill", "rollback", "--rate", "2"]) == 0
    assert ran == [["drill", "rollback", "--rate", "2", "--cluster", "kube", "--namespace", "serving",
                    "--context", "prod"]]


def test_without_the_kubernetes_client_the_plugin_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # `import kubernetes` now fails
    monkeypatch.delitem(sys.modules, "pdserve_ops.drill.kube", raising=False)
    monkeypatch.setattr("pdserve_ops.cli.main", lambda argv: pytest.fail("pdctl ran"))
    assert kubectl.main(["drill", "rollback"]) == 1
    assert "pip install 'pdserve-ops[kube]'" in capsys.readouterr().err
    with pytest.raises(ImportError, match=r"pip install 'pdserve-ops\[kube\]'"):
        import pdserve_ops.drill.kube  # noqa: F401


def test_the_console_script_and_the_extras_are_declared():
    ops = tomllib.loads((REPO / "ops" / "pyproject.toml").read_text())["project"]
    assert ops["scripts"]["kubectl-pdserve"] == "pdserve_ops.kubectl:main"
    assert ops["scripts"]["pdctl"] == "pdserve_ops.cli:main"
    assert any(d.startswith("kubernetes") for d in ops["optional-dependencies"]["kube"])
    assert ops["dependencies"] == ["pdserve-client"]
    test = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert {d.split("==")[0] for d in test} >= {"kubernetes", "kmock", "pytest-asyncio"}
