"""The chart checked by the real tools (`make chart-check`): `helm lint --strict`, every
rendered object of every value set under helm/pdserve/ci validated strictly against two
Kubernetes versions' schemas (kubernetes-validate) or, for Gateway API objects, against the
CRD's schema (gateway_api.py), `helm install --dry-run=client`, and the values refused with
their messages (values.schema.json, templates/validate.yaml)."""

from __future__ import annotations

import json
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support import REPO
from tests.support.helm import CHART, chart_command, helm, render, template
from tests.unit.chart import gateway_api

KUBERNETES = ("1.31.0", "1.35.0")
"""Two Kubernetes versions the installed kubernetes-validate ships schemas of."""
CUSTOM = {"cert-manager.io/v1", "monitoring.coreos.com/v1"}
"""API groups of CRDs kubernetes-validate has no schema for; checked by fields below."""
GATEWAY = {"gateway.networking.k8s.io/v1"}
"""Gateway API: validated strictly against the CRD's own schema (gateway_api.py)."""
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
        if obj["apiVersion"] in GATEWAY:
            gateway_api.validate(obj)
            continue
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


def test_the_gateway_validator_refuses_what_the_crd_would():
    """The Gateway API check can fail: a wrong type, a value outside an enum, a missing
    required field, an unknown field (strict, like the API server's field validation)."""
    route = next(o for o in render(files=(str(CHART / "ci" / "http-front-values.yaml"),)) if o["kind"] == "HTTPRoute")
    gateway_api.validate(route)
    breaks = [
        lambda r: r["spec"]["rules"][0]["backendRefs"][0].update(port="https"),  # a Service port number
        lambda r: r["spec"]["rules"][0]["matches"][0]["path"].update(type="Prefix"),  # PathPrefix
        lambda r: r["spec"]["parentRefs"][0].pop("name"),
        lambda r: r["spec"]["rules"][0].update(backends=r["spec"]["rules"][0].pop("backendRefs")),
        lambda r: r["metadata"].update(label={"a": "b"}),
        lambda r: r["spec"]["rules"][0]["timeouts"].update(request="5 minutes"),
    ]
    for i, breaking in enumerate(breaks):
        bad = yaml.safe_load(yaml.safe_dump(route))
        breaking(bad)
        with pytest.raises(jsonschema.ValidationError):
            gateway_api.validate(bad)
            pytest.fail(f"break {i} accepted")
    with pytest.raises(KeyError):
        gateway_api.validate({**route, "apiVersion": "gateway.networking.k8s.io/v1beta1"})


def test_install_dry_run_client():
    out = chart_command("install pd", "--dry-run=client", "--namespace", "serving")
    assert "STATUS: pending-install" in out.stdout
    assert "helm test pd -n serving --logs" in out.stdout  # NOTES: how to run the smoke test
    # No API key yet: the front refuses everything, and NOTES says how to make one.
    assert "no API key is configured: the front refuses every /v1 request with 401" in out.stdout
    assert "pdserve api-key create TENANT --hash-only" in out.stdout


def test_notes_name_the_key_secret_and_what_an_exposed_front_needs():
    out = chart_command("install pd", "--dry-run=client", "--namespace", "serving", "-f",
                        str(CHART / "ci" / "http-front-values.yaml")).stdout
    assert "401" not in out and "key file in Secret pd-pdserve-api-keys" in out
    assert "BackendTLSPolicy" in out and "networkPolicy.httpFrom" in out


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
    ({"router": {"http": {"port": "8000"}}}, "at '/router/http/port'"),
    ({"router": {"http": {"apiKeys": {"keys": [{"tenant": "gold team", "sha256": "0" * 64}]}}}},
     "at '/router/http/apiKeys/keys/0/tenant'"),
    ({"router": {"http": {"apiKeys": {"keys": [{"tenant": "#gold", "sha256": "0" * 64}]}}}},  # a comment line
     "at '/router/http/apiKeys/keys/0/tenant'"),
    ({"router": {"http": {"apiKeys": {"keys": [{"tenant": "gold", "sha256": "pds-the-key-itself"}]}}}},
     "at '/router/http/apiKeys/keys/0/sha256'"),
    ({"router": {"http": {"apiKeys": {"keys": [{"tenant": "gold", "hash": "0" * 64}]}}}},
     "at '/router/http/apiKeys/keys/0'"),
    ({"router": {"http": {"ingress": {"hosts": [{"host": "a.example.com", "paths": ["/"]}]}}}},
     "at '/router/http/ingress/hosts/0/paths/0'"),
    ({"router": {"http": {"httpRoute": {"timeouts": {"request": "5 minutes"}}}}},
     "at '/router/http/httpRoute/timeouts/request'"),
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
    ({"router": {"http": {"apiKeys": {"existingSecret": "k", "keys": [{"tenant": "a", "sha256": "0" * 64}]}}}},
     "set one of router.http.apiKeys.existingSecret and router.http.apiKeys.keys"),
    ({"router": {"http": {"port": 9464}}}, "router.http.port=9464 is already the router's gRPC or metrics port"),
    ({"router": {"http": {"enabled": False, "ingress": {"enabled": True, "hosts": [{"host": "a"}]}}}},
     "router.http.ingress.enabled needs router.http.enabled"),
    ({"security": {"enabled": False},
      "router": {"http": {"httpRoute": {"enabled": True, "parentRefs": [{"name": "g"}]}}}},
     "router.http.httpRoute.enabled with security.enabled=false would expose a plaintext front"),
    ({"router": {"http": {"ingress": {"enabled": True}}}},
     "router.http.ingress.enabled needs router.http.ingress.hosts"),
    ({"router": {"http": {"httpRoute": {"enabled": True}}}},
     "router.http.httpRoute.enabled needs router.http.httpRoute.parentRefs"),
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
