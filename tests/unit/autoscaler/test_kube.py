"""KubeScaler (autoscaler/kube.py) with the real `kubernetes` client against kmock's
emulator holding the chart's pool Deployments and status ConfigMap (rendered by the real
helm with the autoscaler on): the calls in order with their bodies, a missing Deployment's
error, and every call within the chart's autoscaler Role, whose verbs are exactly those used.

kmock stores objects and serves them back; it has no scale subresource, so `Emulator`
plays the API server's part there (GET: a Scale of the Deployment's replicas; PATCH: the
merge patch applied to the Deployment, its Scale answered), as the drill's emulator plays
the Deployment controller (tests/unit/drill_kube/emulator.py).
"""

from __future__ import annotations

import copy
import functools
import json

import aiohttp.web
import kmock
import pytest

from autoscaler.kube import STATUS_KEY, KubeScaler
from autoscaler.policy import Sizes
from autoscaler.scaler import ScalerError
from tests.support.helm import render
from tests.unit.drill_kube.emulator import Running
from tests.unit.drill_kube.test_kube_cluster import permitted

NS = "serving"
FULL = "pd-pdserve"
DEPLOYMENTS, CONFIGMAPS = "apps/v1/deployments", "v1/configmaps"
POOLS = {"prefill": f"{FULL}-prefill", "decode": f"{FULL}-decode", "mixed": f"{FULL}-mixed"}
STATUS_CM = f"{FULL}-autoscaler"
VALUES = {"autoscaler": {"enabled": True, "targets": {"profile": "p"}}, "mixed": {"enabled": True}}


@functools.cache
def _chart() -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render(VALUES)}


def chart() -> dict[tuple[str, str], dict]:
    return copy.deepcopy(_chart())


def _status_404(name: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                      "code": 404, "message": f'deployments.apps "{name}" not found'}, status=404)


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the Deployments' scale subresource (see the module docstring)."""

    def setup(self, replicas: dict[str, int]) -> None:
        self.resources[DEPLOYMENTS], self.resources[CONFIGMAPS] = {}, {}
        rendered = chart()
        for pool, n in replicas.items():
            dep = rendered[("Deployment", POOLS[pool])]
            assert "replicas" not in dep["spec"]  # with the autoscaler on, the chart leaves the size to it
            dep["metadata"]["namespace"] = NS
            dep["spec"]["replicas"] = n
            self.objects[DEPLOYMENTS, NS, POOLS[pool]] = dep
        cm = rendered[("ConfigMap", STATUS_CM)]
        cm["metadata"]["namespace"] = NS
        self.objects[CONFIGMAPS, NS, STATUS_CM] = cm

    async def _handle(self, request):
        if request.subresource != "scale":
            return await super()._handle(request)
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return _status_404(request.name)
        dep = self.objects[key]
        if request.method == "PATCH":
            assert request.headers["Content-Type"] == "application/merge-patch+json"
            dep.patch({"spec": {"replicas": request.data["spec"]["replicas"]}})
        n = dep["spec"]["replicas"]
        return aiohttp.web.json_response({
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": request.name, "namespace": request.namespace},
            "spec": {"replicas": n}, "status": {"replicas": n, "selector": "app.kubernetes.io/component=x"}})


def verb(request) -> str:
    if request.method == "GET":
        return "get" if request.name else "list"
    return {"PATCH": "patch", "PUT": "update", "POST": "create"}.get(request.method, "delete")


def calls(emulator) -> list[tuple[str, str, str | None]]:
    """(verb, resource[/subresource], name) of every request served, in order."""
    return [(verb(r), r.resource.plural + (f"/{r.subresource}" if r.subresource else ""), r.name)
            for r in emulator]


@pytest.fixture
def emulator():
    emulator = Emulator()
    emulator.setup({"prefill": 1, "decode": 2, "mixed": 0})
    with Running(emulator) as running:
        emulator.api_url = running.url
        yield emulator


def scaler(emulator, pools=POOLS) -> KubeScaler:
    from kubernetes import client as k8s

    return KubeScaler(k8s.ApiClient(k8s.Configuration(host=emulator.api_url)), NS, pools, STATUS_CM)


def test_sizes_resize_and_status_are_these_calls_with_these_bodies(emulator):
    s = scaler(emulator)
    assert s.sizes() == Sizes(1, 2, 0)
    s.resize("decode", 3)
    s.publish({"format": "x", "decisions": [{"reason": "decode 2 -> 3"}]})
    assert s.sizes() == Sizes(1, 3, 0)
    assert calls(emulator) == [
        ("get", "deployments/scale", POOLS["prefill"]), ("get", "deployments/scale", POOLS["decode"]),
        ("get", "deployments/scale", POOLS["mixed"]),
        ("patch", "deployments/scale", POOLS["decode"]),
        ("patch", "configmaps", STATUS_CM),
        ("get", "deployments/scale", POOLS["prefill"]), ("get", "deployments/scale", POOLS["decode"]),
        ("get", "deployments/scale", POOLS["mixed"])]
    requests = list(emulator)
    assert requests[3].data == {"spec": {"replicas": 3}}
    assert requests[4].headers["Content-Type"] == "application/merge-patch+json"
    body = json.loads(requests[4].data["data"][STATUS_KEY])
    assert body == {"format": "x", "decisions": [{"reason": "decode 2 -> 3"}]}
    stored = emulator.objects[CONFIGMAPS, NS, STATUS_CM]
    assert json.loads(stored["data"][STATUS_KEY])["decisions"][0]["reason"] == "decode 2 -> 3"
    assert emulator.objects[DEPLOYMENTS, NS, POOLS["decode"]]["spec"]["replicas"] == 3
    assert all(r.namespace == NS for r in emulator)


def test_a_missing_deployment_is_a_clear_error(emulator):
    s = scaler(emulator, {"decode": POOLS["decode"], "prefill": f"{FULL}-nope"})
    with pytest.raises(ScalerError, match=rf"Deployment {NS}/{FULL}-nope \(the prefill pool\) not found: is the pool "
                                          r"enabled in the chart \(prefill.enabled\)"):
        s.sizes()
    with pytest.raises(ScalerError, match="not found"):
        s.resize("prefill", 2)
    with pytest.raises(ScalerError, match="no Deployment for the mixed pool"):
        s.resize("mixed", 1)


def test_the_charts_role_grants_exactly_the_verbs_the_scaler_uses(emulator):
    s = scaler(emulator)
    s.sizes()
    s.resize("prefill", 2)
    s.resize("mixed", 1)
    s.publish({"format": "x"})
    role = chart()[("Role", f"{FULL}-autoscaler")]
    used = set()
    for r in emulator:
        resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        assert permitted(role, verb(r), r.resource.group, resource, r.name), f"{verb(r)} {resource} {r.name}"
        used.add((r.resource.group, resource, verb(r)))
    granted = {(g, res, v) for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"]
               for v in rule["verbs"]}
    assert granted == used
    names = {n for rule in role["rules"] for n in rule["resourceNames"]}
    assert names == {*POOLS.values(), STATUS_CM}
    binding = chart()[("RoleBinding", f"{FULL}-autoscaler")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{FULL}-autoscaler", "namespace": NS}]


def test_without_the_mixed_pool_the_role_names_only_the_pools_there_are():
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render({"autoscaler": VALUES["autoscaler"]})}
    rules = objs[("Role", f"{FULL}-autoscaler")]["rules"]
    (scale_rule,) = [r for r in rules if r["resources"] == ["deployments/scale"]]
    assert scale_rule["resourceNames"] == [POOLS["prefill"], POOLS["decode"]]
