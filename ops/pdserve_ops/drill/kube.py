"""The drill against a Kubernetes cluster the Helm chart (helm/pdserve) deployed, through
the official `kubernetes` client (the `kube` extra: pip install 'pdserve-ops[kube]').

What it calls, and nothing else: the chart's Role `<fullname>-rollback-drill`
(templates/rbac.yaml) grants exactly this, and tests/unit/drill_kube checks every call
against the rendered Role.

    configmaps   get, patch  <fullname>-release  the release record; it names the router and
                                                 the decode Deployment
    deployments  get, patch  <fullname>-decode   revision, selector, template, roll-out status
    replicasets  list                            the decode Deployment's revision history
    pods         list                            the new decode workers (worker id = pod name)

`roll_back_decode` is `kubectl rollout undo` and `kubectl rollout status` with the API (the
client has no undo call):

  1. the decode workers the directory lists, with their epochs (Admin.Status; this also
     proves the router answers before anything is replaced);
  2. the Deployment and the ReplicaSets it controls (by owner uid: selectors can overlap);
     the one with the previous `deployment.kubernetes.io/revision` is the target;
  3. one JSON patch: the Deployment's resourceVersion is still the one read (else someone
     rolled it meanwhile and the history read is stale: stop), its pod template becomes the
     target's without `pod-template-hash`, its annotations the target's (as kubectl does);
  4. the Deployment, polled until its controller observed the patch and every replica is
     updated and available with no old one left (the chart's strategy replaces decode
     workers one at a time: maxSurge 1, maxUnavailable 0);
  5. the target ReplicaSet's pods that are not terminating: their names are the new worker
     ids, and `wait_registered` returns once the directory lists each with a live lease.

Safety invariant: the drill routes to the new decode workers only after step 5 saw them in
the directory with live leases at new epochs. A pod Ready, or a roll-out Kubernetes calls
complete, is not proof that the directory lists the worker the router will pick.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pdserve_client.client import Client
from pdserve_client.release import ReleaseView
from pdserve_client.tls import TlsConfigError
from pdserve_ops.drill.cluster import DrillCluster, DrillError, Registered

INSTALL_HINT = "the Kubernetes drill needs the kubernetes client: pip install 'pdserve-ops[kube]'"

try:
    import urllib3
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException
except ImportError as e:  # the `kube` extra is optional: say which one brings it
    raise ImportError(INSTALL_HINT, name=e.name) from e

CHART_NAME = "pdserve"  # Must match `name` in helm/pdserve/Chart.yaml
REVISION = "deployment.kubernetes.io/revision"
POD_TEMPLATE_HASH = "pod-template-hash"
# Deployment annotations kubectl's undo keeps from the Deployment instead of taking the
# ReplicaSet's (kubectl: annotationsToSkip): the controller owns them.
KEEP_ANNOTATIONS = frozenset({
    "kubectl.kubernetes.io/last-applied-configuration", REVISION, "deployment.kubernetes.io/revision-history",
    "deployment.kubernetes.io/desired-replicas", "deployment.kubernetes.io/max-replicas",
    "deprecated.deployment.rollback.to"})
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def fullname(release: str) -> str:
    """The chart's `pdserve.fullname` of Helm release `release` (no name overrides).
    Must match `pdserve.fullname` in helm/pdserve/templates/_helpers.tpl."""
    name = (release if CHART_NAME in release else f"{release}-{CHART_NAME}")[:40]
    return name[:-1] if name.endswith("-") else name  # Helm's trimSuffix drops one "-"


def kubeconfig_path() -> str:
    """$KUBECONFIG (read now, not at import as the client does), else ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def in_pod() -> bool:
    """Is this process in a Kubernetes pod (the variable every pod's environment gets)?"""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def api_client(context: str | None) -> k8s.ApiClient:
    """A client of the kubeconfig's `context` (its current one when None) or, like kubectl,
    of the pod's service account when there is no kubeconfig and this runs in a pod."""
    path = kubeconfig_path()
    first = os.path.expanduser(path.split(os.pathsep)[0])
    try:
        if context is None and not os.path.exists(first) and in_pod():
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)
            return k8s.ApiClient(configuration)
        return k8s_config.new_client_from_config(config_file=path, context=context)
    except k8s_config.ConfigException as e:
        where = f"{path}, context {context}" if context else path
        raise DrillError(f"no Kubernetes credentials ({where}): {e}") from None


def api_reason(e: ApiException) -> str:
    """An API error as `STATUS REASON: message` (the message from its JSON body, when any)."""
    try:
        message = json.loads(e.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return f"{e.status} {e.reason}" + (f": {message}" if message else "")


class ApiCallError(DrillError):
    """A Kubernetes API call that failed: `status` is its HTTP status (0: API not reached)."""

    def __init__(self, what: str, status: int, reason: str):
        super().__init__(f"{what}: {reason}")
        self.status, self.reason = status, reason


@contextlib.contextmanager
def _calling(what: str) -> Iterator[None]:
    """API failures as ApiCallErrors naming the call."""
    try:
        yield
    except ApiException as e:
        raise ApiCallError(what, e.status or 0, api_reason(e)) from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ApiCallError(what, 0, f"cannot reach the Kubernetes API: {e}") from None


@dataclass(frozen=True, slots=True)
class ReleaseObjects:
    """What the release ConfigMap names (its data: `router`, `decodeDeployment`)."""

    config_map: str
    router: str
    decode_deployment: str


def rollout_waiting(dep: k8s.V1Deployment) -> str:
    """What the roll-out still waits for ("" once done), by `kubectl rollout status`'s rules;
    DrillError once the Deployment's progress deadline passed."""
    status, want = dep.status or k8s.V1DeploymentStatus(), 1 if dep.spec.replicas is None else dep.spec.replicas
    if (status.observed_generation or 0) < (dep.metadata.generation or 0):
        return "the controller has not observed the new template yet"
    for c in status.conditions or []:
        if c.type == "Progressing" and c.reason == "ProgressDeadlineExceeded":
            raise DrillError(f"Deployment {dep.metadata.name} exceeded its progress deadline: {c.message}")
    updated, total, available = status.updated_replicas or 0, status.replicas or 0, status.available_replicas or 0
    if updated < want:
        return f"{updated} of {want} replicas updated"
    if total > updated:
        return f"{total - updated} old replicas pending termination"
    if available < updated:
        return f"{available} of {updated} updated replicas available"
    return ""


# ReplicaSets and pods are read as the API serves them (JSON, not the client's models): the
# template goes back verbatim, with any field newer than this client's models.
def _controlled_by(obj: dict, uid: str) -> bool:
    return any(o.get("controller") and o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])


def _revision(obj: dict) -> int:
    try:
        return int((obj["metadata"].get("annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


def _selector(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class KubernetesCluster(DrillCluster):
    """The chart's release `release` in `namespace`, reached through kubeconfig context
    `context` (the current one when None; in a pod without a kubeconfig, its service account)
    and, for the SDK, through `router` (e.g. a port-forward, 127.0.0.1:50080) or else the
    router Service the release ConfigMap names (reachable from pods of the cluster only).
    The SDK presents $PD_TLS_CERT/KEY/CA: the operator's certificate (it may also send load)."""

    poll_s: float = 1.0
    """Seconds between reads of the Deployment while it rolls out."""

    def __init__(self, namespace: str, release: str, context: str | None = None, router: str | None = None):
        self.namespace, self.release, self.context, self.router = namespace, release, context, router
        self.name = f"kubernetes ({context or 'current context'}/{namespace})"
        self._api = api_client(context)
        self._core, self._apps = k8s.CoreV1Api(self._api), k8s.AppsV1Api(self._api)
        self._objects: ReleaseObjects | None = None

    def objects(self) -> ReleaseObjects:
        """The release ConfigMap's names, read once: `<fullname>-release` of the Helm release,
        else `<release>-release` (`release` given as the full name, e.g. a fullnameOverride)."""
        if self._objects is not None:
            return self._objects
        tried = []
        for name in dict.fromkeys([f"{fullname(self.release)}-release", f"{self.release}-release"]):
            try:
                with _calling(f"get ConfigMap {name}"):
                    cm = self._core.read_namespaced_config_map(name, self.namespace)
            except ApiCallError as e:
                if e.status not in (403, 404):  # the Role names one ConfigMap: any other is 403, not 404
                    raise
                tried.append(f"{name} ({e.reason})")
                continue
            data = cm.data or {}
            missing = [k for k in ("router", "decodeDeployment") if not data.get(k)]
            if missing:
                raise DrillError(f"ConfigMap {name} lacks {', '.join(missing)} (not the pdserve chart's?)")
            self._objects = ReleaseObjects(name, data["router"], data["decodeDeployment"])
            return self._objects
        raise DrillError(f"no release ConfigMap of Helm release {self.release!r} in namespace {self.namespace}: "
                         f"tried {', '.join(tried)} (is the chart installed there, and does your account hold "
                         f"its rollback-drill Role?)")

    def router_address(self) -> str:
        """`router`, else the ConfigMap's router Service qualified with the namespace."""
        if self.router:
            return self.router
        address = self.objects().router
        if not in_pod():
            raise DrillError(f"the router {address} is a cluster address: from outside the cluster run "
                             f"`kubectl -n {self.namespace} port-forward svc/{address.rsplit(':', 1)[0]} 50080:"
                             f"{address.rsplit(':', 1)[-1]}` and give --router 127.0.0.1:50080")
        host, _, port = address.rpartition(":")
        return f"{host}.{self.namespace}.svc:{port}" if "." not in host else address

    def client(self, identity: str = "client", timeout_s: float = 60.0) -> Client:
        """An SDK client of the router (see the class docstring for the address and TLS)."""
        try:
            return Client(self.router_address(), timeout_s=timeout_s, identity=identity)
        except TlsConfigError as e:
            raise DrillError(f"{e}; against Kubernetes set $PD_TLS_CERT/$PD_TLS_KEY/$PD_TLS_CA to the operator's "
                             f"certificate (docs/deploy.md, Rollback drill)") from None

    def record_release(self, view: ReleaseView) -> None:
        """Merge the release into the ConfigMap's data (strings; a rollback's keys are
        removed when the release has none)."""
        rb = view.rollback
        data = {"mode": view.mode, "version": str(view.version), "manifestDigest": view.manifest.get("digest", ""),
                "rollbackComplete": None if rb is None else str(rb.complete).lower(),
                "rollbackDurationMs": None if rb is None else str(rb.duration_ms)}
        name = self.objects().config_map
        with _calling(f"patch ConfigMap {name}"):
            self._core.patch_namespaced_config_map(name, self.namespace, {"data": data}, _content_type=MERGE_PATCH)

    def roll_back_decode(self, timeout_s: float) -> list[Registered]:
        """Roll the decode Deployment back to its previous revision and return its new
        workers once the directory lists them (the module docstring's steps 1-5)."""
        deadline = time.monotonic() + timeout_s
        name = self.objects().decode_deployment
        before = {w.worker_id: w.epoch for w in self.registered()}
        dep = self._deployment(name)
        if dep.spec.paused:
            raise DrillError(f"Deployment {name} is paused: resume it (kubectl rollout resume) first")
        target = self._previous(dep)
        self._patch_template(dep, target)
        self._wait_rolled_out(name, deadline)
        workers = self._pods_of(target)
        if not workers and (dep.spec.replicas or 0) > 0:
            raise DrillError(f"Deployment {name} rolled out, but ReplicaSet {target['metadata']['name']} "
                             f"has no live pods")
        return self.wait_registered(before, workers, max(0.0, deadline - time.monotonic()))

    def _deployment(self, name: str) -> k8s.V1Deployment:
        try:
            with _calling(f"get Deployment {name}"):
                return self._apps.read_namespaced_deployment(name, self.namespace)
        except ApiCallError as e:
            if e.status != 404:
                raise
            raise DrillError(f"the decode Deployment {name} does not exist in namespace {self.namespace} "
                             f"(decode.enabled=false?)") from None

    def _list(self, what: str, call, selector: str) -> list[dict]:
        with _calling(f"list {what}"):
            return json.loads(call(self.namespace, label_selector=selector, _preload_content=False).data)["items"]

    def _previous(self, dep: k8s.V1Deployment) -> dict:
        """The ReplicaSet of the revision before the newest (kubectl's undo to revision 0)."""
        sets = self._list(f"the ReplicaSets of {dep.metadata.name}", self._apps.list_namespaced_replica_set,
                          _selector(dep.spec.selector.match_labels or {}))
        owned = sorted((rs for rs in sets if _controlled_by(rs, dep.metadata.uid)), key=_revision)
        revisions = sorted({_revision(rs) for rs in owned})
        if len(revisions) < 2:
            raise DrillError(f"Deployment {dep.metadata.name} has no previous revision to roll back to "
                             f"(revisions kept: {', '.join(map(str, revisions)) or 'none'}): deploy twice first")
        return next(rs for rs in owned if _revision(rs) == revisions[-2])

    def _patch_template(self, dep: k8s.V1Deployment, target: dict) -> None:
        template = copy.deepcopy(target["spec"]["template"])
        template.setdefault("metadata", {}).get("labels", {}).pop(POD_TEMPLATE_HASH, None)
        annotations = {k: v for k, v in (dep.metadata.annotations or {}).items() if k in KEEP_ANNOTATIONS}
        annotations.update({k: v for k, v in (target["metadata"].get("annotations") or {}).items()
                            if k not in KEEP_ANNOTATIONS})
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": dep.metadata.resource_version},
                 {"op": "replace", "path": "/spec/template", "value": template},
                 {"op": "add", "path": "/metadata/annotations", "value": annotations}]
        what = f"patch Deployment {dep.metadata.name} to revision {_revision(target)}"
        try:
            with _calling(what):
                self._apps.patch_namespaced_deployment(dep.metadata.name, self.namespace, patch,
                                                       _content_type=JSON_PATCH)
        except ApiCallError as e:
            if e.status not in (409, 422):  # 422: the resourceVersion test failed (409: as a conflict)
                raise
            raise DrillError(f"{e} (it changed since it was read: another roll-out? run the drill again)") from None

    def _wait_rolled_out(self, name: str, deadline: float) -> None:
        while True:
            waiting = rollout_waiting(self._deployment(name))
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise DrillError(f"Deployment {name} not rolled out in time: {waiting}")
            time.sleep(self.poll_s)

    def _pods_of(self, rs: dict) -> list[str]:
        """Names of the live (not terminating) pods ReplicaSet `rs` controls."""
        meta = rs["metadata"]
        pods = self._list(f"the pods of {meta['name']}", self._core.list_namespaced_pod,
                          _selector(rs["spec"]["selector"].get("matchLabels") or {}))
        return sorted(p["metadata"]["name"] for p in pods
                      if _controlled_by(p, meta["uid"]) and not p["metadata"].get("deletionTimestamp"))

    def close(self) -> None:
        """Close the API client's connections."""
        self._api.close()
