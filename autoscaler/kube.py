"""The chart's worker pools on Kubernetes, resized through each Deployment's scale
subresource with the official `kubernetes` client.

What it calls, and nothing else (the chart's Role `<fullname>-autoscaler`,
templates/autoscaler.yaml, grants exactly this; tests/unit/autoscaler/test_kube.py
checks every call against the rendered Role):

    deployments/scale  get    <fullname>-prefill, -decode, -mixed   each pool's replicas
    deployments/scale  patch  the same                              a merge patch of
                                                                    spec.replicas
    configmaps         patch  <fullname>-autoscaler                 the status record
                                                                    (key status.json)

The status ConfigMap is the chart's (rendered without data, so `helm upgrade` leaves the
record alone and `helm uninstall` removes it); the autoscaler only merges its key in, and
`pdctl autoscale status --kube` reads it with `get`. A pod the scale-up asks for may take
minutes to serve (model load); the scale subresource's replicas count it at once, so the
policy never asks twice for the same worker.
"""

from __future__ import annotations

import json

from .policy import Sizes
from .scaler import Scaler, ScalerError

try:
    import urllib3
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from pdserve_ops.drill import kube as drill_kube
    from pdserve_ops.drill.cluster import DrillError
    from pdserve_ops.drill.kube import api_reason
except ImportError as e:  # the image installs it (the `kube` extra); a local run may not have it
    raise ImportError("the Kubernetes autoscaler needs the kubernetes client: pip install 'pdserve[kube]' (and ./ops)",
                      name=e.name) from e

MERGE_PATCH = "application/merge-patch+json"
STATUS_KEY = "status.json"  # Must match STATUS_KEY in ops/pdserve_ops/cli_autoscale.py


def api_client(context: str | None = None) -> k8s.ApiClient:
    """The pod's service account in a pod without a kubeconfig; else the kubeconfig's
    `context` ($KUBECONFIG, ~/.kube/config), as kubectl does (the drill's loader)."""
    try:
        return drill_kube.api_client(context)
    except DrillError as e:
        raise ScalerError(str(e)) from None


class KubeScaler(Scaler):
    """The pools named in `deployments` ({pool: Deployment name}) in `namespace`; the
    status goes to ConfigMap `status_configmap`."""

    def __init__(self, api: k8s.ApiClient, namespace: str, deployments: dict[str, str], status_configmap: str):
        assert namespace and deployments and status_configmap, (namespace, deployments, status_configmap)
        self.namespace, self.deployments, self.status_configmap = namespace, dict(deployments), status_configmap
        self.pools = tuple(deployments)
        self._apps, self._core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)

    def sizes(self) -> Sizes:
        sizes = Sizes()
        for pool, name in self.deployments.items():
            try:
                scale = self._apps.read_namespaced_deployment_scale(name, self.namespace)
            except ApiException as e:
                raise self._error(e, "read", pool, name) from None
            except urllib3.exceptions.HTTPError as e:
                raise ScalerError(f"the Kubernetes API did not answer: {e}") from None
            sizes = sizes.with_size(pool, scale.spec.replicas or 0)
        return sizes

    def resize(self, pool: str, n: int) -> None:
        name = self.deployments.get(pool)
        if name is None:
            raise ScalerError(f"no Deployment for the {pool} pool (PD_AUTOSCALER_DEPLOYMENTS)")
        try:
            self._apps.patch_namespaced_deployment_scale(name, self.namespace, {"spec": {"replicas": n}},
                                                         _content_type=MERGE_PATCH)
        except ApiException as e:
            raise self._error(e, "scale", pool, name) from None
        except urllib3.exceptions.HTTPError as e:
            raise ScalerError(f"the Kubernetes API did not answer: {e}") from None

    def publish(self, status: dict) -> None:
        body = {"data": {STATUS_KEY: json.dumps(status)}}
        try:
            self._core.patch_namespaced_config_map(self.status_configmap, self.namespace, body,
                                                   _content_type=MERGE_PATCH)
        except ApiException as e:
            what = f"ConfigMap {self.namespace}/{self.status_configmap}"
            hint = " (the chart renders it with autoscaler.enabled)" if e.status == 404 else ""
            raise ScalerError(f"status to {what}: {api_reason(e)}{hint}") from None
        except urllib3.exceptions.HTTPError as e:
            raise ScalerError(f"the Kubernetes API did not answer: {e}") from None

    def _error(self, e: ApiException, verb: str, pool: str, name: str) -> ScalerError:
        where = f"Deployment {self.namespace}/{name} (the {pool} pool)"
        if e.status == 404:
            return ScalerError(f"{where} not found: is the pool enabled in the chart "
                               f"({pool}.enabled) and PD_AUTOSCALER_DEPLOYMENTS right?")
        if e.status == 403:
            return ScalerError(f"{verb} {where}: forbidden: the autoscaler's Role must grant deployments/scale "
                               f"get and patch on it: {api_reason(e)}")
        return ScalerError(f"{verb} {where}: {api_reason(e)}")
