"""KubernetesCluster (ops/pdserve_ops/drill/kube.py) with the real `kubernetes` client
against kmock's Kubernetes emulator holding the chart's objects: the API calls it makes, in
order and with their bodies, each one within the chart's rollback-drill Role; and the safety
invariant (roll_back_decode returns only once the directory lists the new decode workers)."""

from __future__ import annotations

import copy

import pytest
import yaml

from pdserve_client.release import ReleaseView, RollbackStepView, RollbackView
from pdserve_ops.drill.cluster import DrillError, Registered
from pdserve_ops.drill.kube import KubernetesCluster, fullname, rollout_waiting
from tests.support.helm import template as helm_template
from tests.unit.drill_kube.emulator import (
    CONFIG_MAP,
    CONFIGMAPS,
    DECODE,
    DEPLOYMENTS,
    HASH,
    NEW_IMAGE,
    NS,
    OLD_IMAGE,
    RELEASE,
    REPLICASETS,
    REVISION,
    Emulator,
    FakeDirectory,
    Running,
    chart,
    template,
)


class Drill(KubernetesCluster):
    """The cluster with the directory stood in for (Admin.Status is not Kubernetes)."""

    poll_s = 0.02

    def __init__(self, directory: FakeDirectory, **kw):
        super().__init__(NS, RELEASE, context="emulator", **kw)
        self.directory = directory

    def registered(self) -> list[Registered]:
        return self.directory.list()


def _emulate(directory: FakeDirectory, tmp_path, monkeypatch, **setup):
    emulator = Emulator()
    emulator.setup(directory, **setup)
    running = Running(emulator).__enter__()
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "other",
                  "clusters": [{"name": "kmock", "cluster": {"server": running.url}}],
                  "users": [{"name": "operator", "user": {"token": "not-checked"}}],
                  "contexts": [{"name": "emulator", "context": {"cluster": "kmock", "user": "operator",
                                                                "namespace": NS}},
                               {"name": "other", "context": {"cluster": "kmock", "user": "operator"}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return emulator, running


@pytest.fixture
def directory() -> FakeDirectory:
    return FakeDirectory(lag=2)


@pytest.fixture
def emulator(directory, tmp_path, monkeypatch):
    emulator, running = _emulate(directory, tmp_path, monkeypatch)
    yield emulator
    running.__exit__(None, None, None)


def verb(request) -> str:
    if request.method == "GET":
        return "watch" if request.params.get("watch") == "true" else "get" if request.name else "list"
    return {"PATCH": "patch", "PUT": "update", "POST": "create"}.get(request.method, "delete")


def calls(emulator) -> list[tuple[str, str, str | None]]:
    """(verb, group/resource, name) of every request the emulator served, in order."""
    out = []
    for r in emulator:
        assert r.resource is not None, f"not a Kubernetes API call: {r.method} {r.url}"
        out.append((verb(r), f"{r.resource.group}/{r.resource.plural}", r.name))
    return out


def permitted(role: dict, verb: str, group: str, resource: str, name: str | None) -> bool:
    """Does the Role allow this call? (RBAC: resourceNames never allow list, watch or create)."""
    for rule in role["rules"]:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            names = rule.get("resourceNames")
            if not names or (name in names and verb not in ("list", "watch", "create")):
                return True
    return False


def assert_within_the_role(emulator) -> None:
    role = chart()[("Role", "pd-pdserve-rollback-drill")]
    for r in emulator:
        assert r.namespace == NS, f"{r.method} {r.url}: outside the release's namespace"
        assert permitted(role, verb(r), r.resource.group, r.resource.plural, r.name), \
            f"{verb(r)} {r.resource.plural} {r.name}: not granted by the chart's Role"


def rolled_back_view(complete: bool = True) -> ReleaseView:
    steps = (RollbackStepView("STOP_NEW_ROUTES", 1_000, 1_200, {"routes": 3}, ""),
             RollbackStepView("ROLLBACK_COMPLETE", 1_200, 1_750 if complete else 0, {}, ""))
    return ReleaseView("rolled_back", 7, {"digest": "d1g35t", "model": "tiny"},
                       rollback=RollbackView("canary", 1_000, "drill", "operator/alice", steps, 3, "", 0))


def test_record_release_merges_the_release_into_the_configmap_data(emulator, directory):
    drill = Drill(directory)
    drill.record_release(rolled_back_view())
    assert calls(emulator) == [("get", "/configmaps", CONFIG_MAP), ("patch", "/configmaps", CONFIG_MAP)]
    patch = list(emulator)[1]
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert patch.data == {"data": {"mode": "rolled_back", "version": "7", "manifestDigest": "d1g35t",
                                   "rollbackComplete": "true", "rollbackDurationMs": "750"}}
    stored = emulator.objects[CONFIGMAPS, NS, CONFIG_MAP]["data"]
    assert stored["decodeDeployment"] == DECODE and stored["router"] == "pd-pdserve-router:50080"
    assert stored["mode"] == "rolled_back" and stored["rollbackComplete"] == "true"

    drill.record_release(ReleaseView("pinned", 8, {"digest": "d1g35t"}))  # no rollback: its keys go
    assert calls(emulator)[2:] == [("patch", "/configmaps", CONFIG_MAP)]  # the ConfigMap's names were read once
    stored = emulator.objects[CONFIGMAPS, NS, CONFIG_MAP]["data"]
    assert "rollbackComplete" not in stored and "rollbackDurationMs" not in stored and stored["version"] == "8"
    drill.record_release(rolled_back_view(complete=False))
    assert emulator.objects[CONFIGMAPS, NS, CONFIG_MAP]["data"]["rollbackComplete"] == "false"
    assert_within_the_role(emulator)
    drill.close()


def test_roll_back_decode_is_rollout_undo_then_waits_for_the_directory(emulator, directory):
    before = copy.deepcopy(emulator.objects[DEPLOYMENTS, NS, DECODE].raw)
    assert before["spec"]["template"] == template(NEW_IMAGE)
    # A field newer than the client's models: revision 1's template must go back verbatim.
    emulator.objects[REPLICASETS, NS, f"{DECODE}-h1"].patch({"spec": {"template": {"spec": {"futureField": "kept"}}}})
    revision_1 = template(OLD_IMAGE)
    revision_1["spec"]["futureField"] = "kept"
    drill = Drill(directory)
    workers = drill.roll_back_decode(timeout_s=30)

    seen = calls(emulator)
    assert seen[:4] == [("get", "/configmaps", CONFIG_MAP), ("get", "apps/deployments", DECODE),
                        ("list", "apps/replicasets", None), ("patch", "apps/deployments", DECODE)]
    polls = seen[4:-1]
    assert set(polls) == {("get", "apps/deployments", DECODE)} and len(polls) >= 3  # waited the roll-out out
    assert seen[-1] == ("list", "/pods", None)
    assert_within_the_role(emulator)

    patch = [r for r in emulator if r.method == "PATCH"][0]
    assert patch.headers["Content-Type"] == "application/json-patch+json"
    test_op, template_op, annotations_op = patch.data
    assert test_op == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}  # as read
    assert before["metadata"]["resourceVersion"] == "41"
    assert template_op["op"] == "replace" and template_op["path"] == "/spec/template"
    assert template_op["value"] == revision_1  # without pod-template-hash
    assert HASH not in template_op["value"]["metadata"]["labels"]
    assert annotations_op == {"op": "add", "path": "/metadata/annotations", "value": {
        REVISION: "2", "meta.helm.sh/release-name": RELEASE, "kubernetes.io/change-cause": "revision 1"}}
    assert emulator.objects[DEPLOYMENTS, NS, DECODE].raw["spec"]["template"] == revision_1
    assert HASH in emulator.objects[REPLICASETS, NS, f"{DECODE}-h1"].raw["spec"]["template"]["metadata"]["labels"]

    # The safety invariant: the replacements, each listed by the directory when it returned,
    # and not the terminating pod of the same ReplicaSet.
    assert [w.worker_id for w in workers] == [f"{DECODE}-h1-n1", f"{DECODE}-h1-n2"]
    assert all(w.epoch > 0 and directory.listed.get(w.worker_id) == w for w in workers)
    assert f"{DECODE}-h1-gone" not in {w.worker_id for w in workers}
    drill.close()


def test_a_new_worker_the_directory_never_lists_fails_the_drill_by_name(tmp_path, monkeypatch):
    directory = FakeDirectory(lag=1, never=frozenset({f"{DECODE}-h1-n2"}))
    emulator, running = _emulate(directory, tmp_path, monkeypatch)
    try:
        with pytest.raises(DrillError, match=f"{DECODE}-h1-n2 not registered with a new lease"):
            Drill(directory).roll_back_decode(timeout_s=3)
        assert emulator.objects[DEPLOYMENTS, NS, DECODE]["spec"]["template"] == template(OLD_IMAGE)
    finally:
        running.__exit__(None, None, None)


def test_without_a_previous_revision_nothing_is_patched(tmp_path, monkeypatch):
    directory = FakeDirectory()
    emulator, running = _emulate(directory, tmp_path, monkeypatch, rs_owned_revisions=(2,))
    try:
        with pytest.raises(DrillError, match="no previous revision.*revisions kept: 2"):
            Drill(directory).roll_back_decode(timeout_s=3)
        assert "patch" not in {c[0] for c in calls(emulator)}
    finally:
        running.__exit__(None, None, None)


def test_a_deployment_changed_after_it_was_read_is_not_rolled_back(emulator, directory, monkeypatch):
    previous = KubernetesCluster._previous

    def racing(self, dep):  # another roll-out lands between the read and the patch
        target = previous(self, dep)
        emulator.objects[DEPLOYMENTS, NS, DECODE].patch({"metadata": {"resourceVersion": "99"}})
        return target

    monkeypatch.setattr(KubernetesCluster, "_previous", racing)
    with pytest.raises(DrillError, match=f"patch Deployment {DECODE} to revision 1: 422 .*changed since it was read"):
        Drill(directory).roll_back_decode(timeout_s=3)
    assert emulator.objects[DEPLOYMENTS, NS, DECODE]["spec"]["template"] == template(NEW_IMAGE)


def test_missing_objects_are_named(emulator, directory):
    del emulator.objects[DEPLOYMENTS, NS, DECODE]
    with pytest.raises(DrillError, match=f"decode Deployment {DECODE} does not exist in namespace {NS}"):
        Drill(directory).roll_back_decode(timeout_s=3)
    del emulator.objects[CONFIGMAPS, NS, CONFIG_MAP]
    with pytest.raises(DrillError, match="no release ConfigMap of Helm release 'pd' in namespace serving: tried "
                                         "pd-pdserve-release \\(404.*pd-release \\(404"):
        Drill(directory).record_release(rolled_back_view())


def test_the_sdk_goes_to_the_given_router_or_the_release_service_from_a_pod(emulator, directory, monkeypatch,
                                                                            tmp_path):
    monkeypatch.setenv("PD_INSECURE", "1")
    with Drill(directory, router="127.0.0.1:50080").client("operator") as sdk:
        assert sdk.address == "127.0.0.1:50080"
    with pytest.raises(DrillError, match="cluster address: .*port-forward svc/pd-pdserve-router 50080:50080"):
        Drill(directory).client()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with Drill(directory).client() as sdk:
        assert sdk.address == "pd-pdserve-router.serving.svc:50080"
    monkeypatch.delenv("PD_INSECURE")
    for name in ("PD_TLS_CERT", "PD_TLS_KEY", "PD_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DrillError, match="operator's certificate"):
        Drill(directory, router="127.0.0.1:50080").client("operator")
    assert_within_the_role(emulator)


def test_an_unknown_context_or_an_unreachable_api_is_a_clear_error(emulator, directory, tmp_path, monkeypatch):
    with pytest.raises(DrillError, match="no Kubernetes credentials .*context nowhere"):
        KubernetesCluster(NS, RELEASE, context="nowhere")
    config = yaml.safe_load((tmp_path / "kubeconfig").read_text())
    config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # nothing listens (discard)
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    with pytest.raises(DrillError, match="get ConfigMap pd-pdserve-release: cannot reach the Kubernetes API"):
        Drill(directory).record_release(rolled_back_view())


@pytest.mark.parametrize("release", ["pd", "pdserve", "team-pdserve-prod", "a-release-name-long-enough-to-be-cut-x"])
def test_fullname_is_the_charts(release):
    rendered = [d for d in yaml.safe_load_all(helm_template(release=release).stdout) if d]
    (cm,) = [o["metadata"]["name"] for o in rendered if o["kind"] == "ConfigMap"
             and o["metadata"]["labels"].get("app.kubernetes.io/component") == "release"]
    assert cm == f"{fullname(release)}-release"


def test_rollout_waiting_follows_kubectl_rollout_status():
    from kubernetes import client as k8s

    def dep(generation=2, observed=2, updated=2, total=2, available=2, conditions=()):
        return k8s.V1Deployment(metadata=k8s.V1ObjectMeta(name=DECODE, generation=generation),
                                spec=k8s.V1DeploymentSpec(replicas=2, selector=k8s.V1LabelSelector(),
                                                          template=k8s.V1PodTemplateSpec()),
                                status=k8s.V1DeploymentStatus(observed_generation=observed, updated_replicas=updated,
                                                              replicas=total, available_replicas=available,
                                                              conditions=list(conditions)))

    assert rollout_waiting(dep()) == ""
    assert "not observed" in rollout_waiting(dep(generation=3))
    assert rollout_waiting(dep(updated=1, total=3)) == "1 of 2 replicas updated"
    assert rollout_waiting(dep(total=3)) == "1 old replicas pending termination"
    assert rollout_waiting(dep(available=1)) == "1 of 2 updated replicas available"
    stuck = k8s.V1DeploymentCondition(type="Progressing", status="False", reason="ProgressDeadlineExceeded",
                                      message="ReplicaSet has timed out progressing.")
    with pytest.raises(DrillError, match="progress deadline"):
        rollout_waiting(dep(updated=1, conditions=[stuck]))
