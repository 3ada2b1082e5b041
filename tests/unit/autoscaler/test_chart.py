"""The chart's autoscaler (helm/pdserve/templates/autoscaler.yaml) and the code agree: the
rendered environment is a valid AutoscalerSettings naming the pools' Deployments and the
routers' metrics Service; the pod presents a monitor certificate and gets an API token in
its container only; the NetworkPolicy lets it reach the routers' /metrics; values that
cannot work are refused; and the probes' command reads the heartbeat the loop writes."""

from __future__ import annotations

import os
import time

import pytest

from autoscaler import health
from autoscaler.config import AutoscalerSettings
from tests.support.helm import render, template
from tests.unit.chart.test_rendering import env_of, kinds, pod_specs

ON = {"autoscaler": {"enabled": True, "targets": {"profile": "h100", "sloTtftMs": 400},
                     "pools": {"decode": {"min": 2, "max": 6}}}}


@pytest.fixture(scope="module")
def objs():
    return render(ON)


def test_nothing_is_rendered_by_default():
    objs = render()
    assert not [o for o in objs if "autoscaler" in o["metadata"]["name"]]
    assert kinds(objs, "Deployment")["pd-pdserve-decode"]["spec"]["replicas"] == 1


def test_the_rendered_environment_is_the_settings_the_code_reads(objs):
    (c,) = pod_specs(objs)["pd-pdserve-autoscaler"]["containers"]
    assert c["command"] == ["python", "-m", "autoscaler", "--kube"]
    env = {k: v for k, v in env_of(c).items() if k.startswith("PD_AUTOSCALER_") and isinstance(v, str)}
    s = AutoscalerSettings.from_env(env)
    assert s.deployment_names() == {"prefill": "pd-pdserve-prefill", "decode": "pd-pdserve-decode"}
    assert (s.namespace, s.status_configmap) == ("serving", "pd-pdserve-autoscaler")
    assert s.metrics_service == "pd-pdserve-router-metrics.serving.svc:9464"
    assert (s.profile, s.slo_ttft_ms, s.bounds("decode"), s.down_stable_s) == ("h100", 400, (2, 6), 300)
    svc = kinds(objs, "Service")["pd-pdserve-router-metrics"]["spec"]
    assert svc["clusterIP"] == "None" and svc["selector"]["app.kubernetes.io/component"] == "router"
    assert svc["ports"] == [{"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"}]
    assert "replicas" not in kinds(objs, "Deployment")["pd-pdserve-decode"]["spec"]  # the autoscaler owns it


def test_it_scrapes_as_monitor_and_holds_the_api_token_alone(objs):
    spec = pod_specs(objs)["pd-pdserve-autoscaler"]
    (cert,) = spec["initContainers"]
    assert cert["command"][cert["command"].index("--role") + 1] == "monitor"
    assert cert["command"][cert["command"].index("--name") + 1] == "autoscaler"
    assert spec["serviceAccountName"] == "pd-pdserve-autoscaler" and spec["automountServiceAccountToken"] is False
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]} >= {token, "/pd/tls"}
    assert token not in {m["mountPath"] for m in cert["volumeMounts"]}
    env = env_of(spec["containers"][0])
    assert env["PD_TLS_CERT"] == "/pd/tls/tls.crt" and "PD_INSECURE" not in env
    assert kinds(objs, "Deployment")["pd-pdserve-autoscaler"]["spec"]["strategy"] == {"type": "Recreate"}


def test_the_network_policy_lets_only_the_autoscaler_in_to_the_routers_metrics(objs):
    pols = kinds(objs, "NetworkPolicy")
    router_in = pols["pd-pdserve-router"]["spec"]["ingress"]
    mine = [r for r in router_in if any(p.get("podSelector", {}).get("matchLabels", {}).get(
        "app.kubernetes.io/component") == "autoscaler" for p in r["from"])]
    assert [r["ports"] for r in mine] == [[{"port": 9464, "protocol": "TCP"}]]
    own = pols["pd-pdserve-autoscaler"]["spec"]
    assert own["ingress"] == []
    assert own["egress"][0]["ports"] == [{"port": 9464, "protocol": "TCP"}]


def test_the_status_role_reads_only_the_record_and_binds_the_operators():
    objs = render({**ON, "rbac": {"subjects": [{"kind": "Group", "name": "ops",
                                                "apiGroup": "rbac.authorization.k8s.io"}]}})
    role = kinds(objs, "Role")["pd-pdserve-autoscaler-status"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["pd-pdserve-autoscaler"], "verbs": ["get"]}]
    assert kinds(objs, "RoleBinding")["pd-pdserve-autoscaler-status"]["subjects"][0]["name"] == "ops"


@pytest.mark.parametrize("values,says", [
    ({"autoscaler": {"enabled": True}}, "autoscaler.enabled needs autoscaler.targets.profile"),
    ({"autoscaler": {"enabled": True, "targets": {"profile": "p"}, "pools": {"decode": {"min": 5, "max": 2}}}},
     "autoscaler.pools.decode.min (5) is above its max (2)"),
])
def test_values_that_cannot_work_are_refused(values, says):
    out = template(values, check=False)
    assert out.returncode != 0 and says in out.stderr, out.stderr


def test_the_probe_reads_the_heartbeat(tmp_path, capsys):
    beat = tmp_path / "heartbeat"
    assert health.main(["--file", str(beat), "--max-age-s", "60"]) == 1
    assert "no decision made yet" in capsys.readouterr().err
    beat.touch()
    assert health.main(["--file", str(beat), "--max-age-s", "60"]) == 0
    os.utime(beat, (time.time() - 120, time.time() - 120))
    assert health.main(["--file", str(beat), "--max-age-s", "60"]) == 1
