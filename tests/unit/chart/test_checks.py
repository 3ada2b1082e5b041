"""The chart checked by the real tools (`make chart-check`): `helm lint --strict`, every
rendered object of every value set under helm/pdserve/ci validated strictly against two
Kubernetes versions' schemas (kubernetes-validate), `helm install --dry-run=client`, and
the values refused with their messages (values.schema.json, templates/validate.yaml)."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml

from tests.support import REPO
from tests.support.helm import CHART, chart_command, helm, render, template

KUBERNETES = ("1.31.0", "1.35.0")
"""Two Kubernetes versions the installed kubernetes-validate ships schemas of."""
CUSTOM = {"cert-manager.io/v1", "monitoring.coreos.com/v1"}
"""API groups of CRDs kubernetes-validate has no schema for; checked by fields below."""
CI = sorted((CHART / "ci").glob("*-values.yaml"))
APIS = ("cert-manager.io/v1", "monitoring.coreos.com/v1")


def test_lint_strict():
    for values in (None, *CI):
        args = ("-f", str(values)) if values else ()
        out = chart_command("lint --strict", *args)
        assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("values", CI, ids=lambda p: p.stem)
@pytest.mark.parametrize("apis", [(), APIS], ids=["bare", "with-crd-apis"])
def test_every_object_is_valid_kubernetes(values, apis):
    objs = render(files=(str(values),), api_versions=apis)
    assert objs
    for obj in objs:
        if obj["apiVersion"] in CUSTOM:
            assert obj["kind"] in ("Certificate", "Issuer", "PodMonitor") and obj["spec"], obj["kind"]
            continue
        for version in KUBERNETES:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_refuses_what_kubernetes_would():
    """The check above can fail: an unknown field and a wrong type are errors."""
    dep = next(o for o in render() if o["kind"] == "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["probes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES[0], strict=True)
    bad = yaml.safe_load(yaml.safe_dump(dep))
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES[1], strict=True)


def test_install_dry_run_client():
    out = chart_command("install pd", "--dry-run=client", "--namespace", "serving")
    assert "STATUS: pending-install" in out.stdout
    assert "helm test pd -n serving --logs" in out.stdout  # NOTES: how to run the smoke test


def _refused(values: dict, api_versions: tuple[str, ...] = ()) -> str:
    proc = template(values, api_versions=api_versions, check=False)
    assert proc.returncode != 0, f"accepted: {values}"
    return proc.stderr


@pytest.mark.parametrize("values, message", [
    ({"prefill": {"replicas": "two"}}, "at '/prefill/replicas': got string, want integer"),
    ({"redis": {"appendfsync": "no"}}, "at '/redis/appendfsync'"),
    ({"image": {"tag": "latest"}}, "at '/image/tag'"),
    ({"transfer": {"transport": "nccl"}}, "at '/transfer/transport'"),
    ({"router": {"mode": "fast"}}, "at '/router/mode'"),
    ({"redis": {"ha": {"enabled": True}, "external": {"url": "redis://r:6379/0"}}}, "at '/redis/external/url'"),
    ({"security": {"enabled": False}, "networkPolicy": {"enabled": False},
      "router": {"service": {"type": "LoadBalancer"}}}, "at '/router/service/type'"),
])
def test_the_schema_refuses_wrong_types_and_combinations(values, message):
    assert message in _refused(values)


@pytest.mark.parametrize("values, message", [
    ({"workers": {"replicas": 2}}, "workers is no longer read: split into prefill:, decode: and mixed:"),
    ({"redis": {"url": "redis://x"}}, "redis.url is no longer read: use redis.external.url"),
    ({"decode": {"maxSurge": 1}}, "decode.maxSurge is no longer read: use decode.strategy.rollingUpdate.maxSurge"),
    ({"decode": {"enabled": False}}, "no decode-capable worker"),
    ({"prefill": {"replicas": 0}}, "router.mode=disaggregated needs a prefill-capable worker"),
    ({"decode": {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}}},
     "decode.strategy.rollingUpdate: maxSurge and maxUnavailable cannot both be 0"),
    ({"model": {"source": "pvc"}}, "model.source=pvc needs model.pvc.claimName"),
    ({"security": {"capability": {"existingSecret": ""}}}, "security.capability.existingSecret"),
    ({"redis": {"external": {"url": "redis://a", "existingSecret": "s"}}}, "not both"),
    ({"redis": {"ha": {"enabled": True, "sentinel": {"quorum": 4}}}}, "quorum cannot exceed"),
    ({"observability": {"serviceMonitor": {"enabled": True}}}, "serves no monitoring.coreos.com/v1"),
    ({"security": {"certManager": {"enabled": True}}}, "serves no cert-manager.io/v1"),
])
def test_validate_refuses_removed_keys_and_impossible_combinations_with_a_message(values, message):
    assert message in _refused(values)


def test_a_removed_key_meets_its_migration_message_not_a_schema_error():
    err = _refused({"serviceMonitor": {"enabled": True}})
    assert "serviceMonitor is no longer read: use observability.serviceMonitor" in err
    assert "schema" not in err


def test_the_monitor_certificate_with_an_existing_ca_must_be_named():
    err = _refused({"security": {"ca": {"existingSecret": "my-ca"}}}, api_versions=("monitoring.coreos.com/v1",))
    assert "no cert-manager the chart cannot sign" in err and "set observability.serviceMonitor.tlsSecret" in err
    objs = render({"security": {"ca": {"existingSecret": "my-ca"}},
                   "observability": {"serviceMonitor": {"tlsSecret": "mon"}}},
                  api_versions=("monitoring.coreos.com/v1",))
    assert {o["kind"] for o in objs} >= {"PodMonitor"} and not [o for o in objs if o["kind"] == "Secret"
                                                                and o["metadata"]["name"].endswith("-ca")]


def test_the_dashboard_uses_only_documented_metrics():
    documented = set(re.findall(r"`(pd_[a-z_]+)`", (REPO / "docs" / "observability.md").read_text()))
    dash = json.loads((CHART / "dashboards" / "pdserve.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"\bpd_[a-z_]+", e)}
    assert used and used <= documented, used - documented
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("attainment", "ttft", "tpot", "route mix", "exposed transfer", "publication rejects",
                  "capability denials", "blocks"):
        assert topic in titles, topic
    cm = next(o for o in render() if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboards"))
    assert json.loads(cm["data"]["pdserve.json"]) == dash


def test_the_pinned_helm_is_v4():
    assert helm("version", "--short").stdout.startswith("v4.")


def test_an_existing_ca_with_cert_manager_signs_the_monitor_certificate_through_an_issuer():
    objs = render({"security": {"ca": {"existingSecret": "my-ca"}}}, api_versions=APIS)
    issuers = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "Issuer"}
    assert issuers == {"pd-pdserve-ca": {"ca": {"secretName": "my-ca"}}}
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Certificate"] == ["pd-pdserve-monitor"]
