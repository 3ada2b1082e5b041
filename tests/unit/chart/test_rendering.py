"""The Helm chart's rendered objects, helm-unittest style (helm/pdserve): every claim
docs/deploy.md and the chart README make about the manifests, read back from what the
real helm renders (tests/support/helm.py)."""

from __future__ import annotations

import base64

import pytest

from tests.support.helm import CHART, render

CI = sorted((CHART / "ci").glob("*-values.yaml"))


@pytest.fixture(scope="module")
def defaults() -> list[dict]:
    return render()


@pytest.fixture(scope="module", params=CI, ids=lambda p: p.stem)
def each(request) -> list[dict]:
    return render(files=(str(request.param),))


def kinds(objs: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def pod_specs(objs: list[dict]) -> dict[str, dict]:
    """Name -> pod spec of every workload (Deployment, StatefulSet, the test Pod)."""
    out = {}
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet"):
            out[o["metadata"]["name"]] = o["spec"]["template"]["spec"]
        elif o["kind"] == "Pod":
            out[o["metadata"]["name"]] = o["spec"]
    return out


def env_of(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_every_long_running_container_has_probes_resources_and_a_pinned_image(each):
    for name, spec in pod_specs(each).items():
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["resources"].get("requests") and c["resources"].get("limits"), (name, c["name"])
            image = c["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), (name, image)
        if spec.get("restartPolicy") == "Never":  # the helm test pod runs once
            continue
        for c in spec["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in c, (name, c["name"], probe)


def test_pdserve_probes_are_mtls_exec_probes_and_readiness_means_serving(defaults):
    for name, spec in pod_specs(defaults).items():
        if "redis" in name or spec.get("restartPolicy") == "Never":
            continue
        c = spec["containers"][0]
        if name == "pd-pdserve-router":  # readiness on its HTTP front's /ready (below)
            assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "https", "scheme": "HTTPS"}
            assert "--alive" in c["livenessProbe"]["exec"]["command"]
            continue
        ready = c["readinessProbe"]["exec"]["command"]
        assert ready[:3] == ["python", "-m", "runtime.common.healthcheck"] and "--alive" not in ready, name
        assert "--alive" in c["livenessProbe"]["exec"]["command"], name  # a NOT_SERVING worker is not killed
        assert "grpc" not in c["readinessProbe"]  # the native probe cannot present a certificate


def test_worker_startup_probes_allow_a_long_model_load(defaults):
    for role in ("prefill", "decode"):
        probe = pod_specs(defaults)[f"pd-pdserve-{role}"]["containers"][0]["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 15 * 60


def test_worker_pools_request_gpus_and_rdma_when_asked(each):
    for name, dep in kinds(each, "Deployment").items():
        comp = dep["metadata"]["labels"]["app.kubernetes.io/component"]
        if comp not in ("prefill", "decode", "mixed"):
            continue
        res = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
        caps = dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
        if "rdma/rdma_shared_device_a" in res["limits"]:
            assert caps == {"drop": ["ALL"], "add": ["IPC_LOCK"]}, name
        else:
            assert caps == {"drop": ["ALL"]}, name


def test_gpu_requests_on_default_worker_pools(defaults):
    for role in ("prefill", "decode"):
        res = pod_specs(defaults)[f"pd-pdserve-{role}"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == 1 and res["requests"]["nvidia.com/gpu"] == 1


def test_rdma_values_add_devices_ipc_lock_and_ucx_settings():
    objs = render(files=(str(CHART / "ci" / "gpu-rdma-values.yaml"),))
    spec = pod_specs(objs)["pd-pdserve-decode"]
    c = spec["containers"][0]
    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    env = env_of(c)
    assert env["UCX_TLS"] == "rc,cuda_copy,tcp" and env["UCX_NET_DEVICES"] == "mlx5_0:1"
    shm = {v["name"]: v for v in spec["volumes"]}["dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    comps = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in kinds(objs, "Deployment").values()}
    assert "mixed" in comps


def test_workers_are_named_by_their_pod_and_advertise_the_pod_ip(defaults):
    spec = pod_specs(defaults)["pd-pdserve-decode"]
    env = env_of(spec["containers"][0])
    assert env["PD_WORKER_ID"] == "$(POD_NAME)"
    assert env["PD_ADVERTISE"] == "$(POD_IP):50090" and env["PD_DATA_PLANE_ADVERTISE"] == "$(POD_IP)"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    cert = spec["initContainers"][0]
    assert cert["name"] == "pd-cert" and "$(POD_NAME)" in cert["command"] and "decode" in cert["command"]
    # The CA (with its key) is mounted into the init container only.
    assert {m["name"] for m in cert["volumeMounts"]} >= {"ca", "tls"}
    assert "ca" not in {m["name"] for m in spec["containers"][0]["volumeMounts"]}


def test_workers_see_only_the_public_keys_and_the_router_only_the_signing_key(defaults):
    specs = pod_specs(defaults)
    for verifier in ("pd-pdserve-decode", "pd-pdserve-directory"):  # the directory checks nonce callers
        vols = {v["name"]: v for v in specs[verifier]["volumes"]}
        assert [i["path"] for i in vols["capability"]["secret"]["items"]] == ["public-keys.json"]
        assert env_of(specs[verifier]["containers"][0])["PD_CAPABILITY_PUBLIC_KEYS"] == \
            "/pd/capability/public-keys.json"
    vols = {v["name"]: v for v in specs["pd-pdserve-router"]["volumes"]}
    assert [i["path"] for i in vols["capability"]["secret"]["items"]] == ["signing-key.pem"]


def test_redis_has_aof_on_and_a_volume(defaults):
    conf = kinds(defaults, "ConfigMap")["pd-pdserve-redis"]["data"]["redis.conf"].splitlines()
    assert "appendonly yes" in conf and "appendfsync everysec" in conf
    sts = kinds(defaults, "StatefulSet")["pd-pdserve-redis"]
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    # The password reaches Redis through the environment, never a command line or a manifest.
    assert "requirepass" not in str(sts) and "$REDIS_PASSWORD" in kinds(defaults, "ConfigMap")["pd-pdserve-redis"][
        "data"]["start.sh"]


def test_pdbs_for_every_pool_by_default(defaults):
    pdbs = {p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
            for p in kinds(defaults, "PodDisruptionBudget").values()}
    assert pdbs == {"router", "directory", "prefill", "decode"}


def test_rollout_strategy_per_pool(defaults):
    deps = kinds(defaults, "Deployment")
    assert deps["pd-pdserve-prefill"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert deps["pd-pdserve-decode"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    for name in ("pd-pdserve-prefill", "pd-pdserve-decode"):
        spec = deps[name]["spec"]["template"]["spec"]
        assert spec["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": 10}}
        assert spec["terminationGracePeriodSeconds"] >= 120


def test_everything_runs_as_non_root_without_capabilities(each):
    for name, spec in pod_specs(each).items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["automountServiceAccountToken"] is False, name
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"] and set(sc["capabilities"].get("add", [])) <= {"IPC_LOCK"}


def test_network_policies_by_default_and_off_when_asked(defaults):
    pols = kinds(defaults, "NetworkPolicy")
    assert set(pols) == {f"pd-pdserve-{n}" for n in ("router", "directory", "workers", "redis", "test")}
    directory = pols["pd-pdserve-directory"]["spec"]
    froms = [p["podSelector"]["matchLabels"] for rule in directory["ingress"] for p in rule["from"]
             if "podSelector" in p]
    assert {"app.kubernetes.io/component": "router", "app.kubernetes.io/instance": "pd",
            "app.kubernetes.io/name": "pdserve"} in froms
    assert not any("pdserve.io/client" in f for f in froms)  # clients never reach the directory
    assert not kinds(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_every_pod_gets_the_otlp_endpoint_and_a_metrics_port():
    objs = render({"observability": {"otlp": {"endpoint": "http://tempo:4317"}}})
    for name, spec in pod_specs(objs).items():
        if "redis" in name or spec.get("restartPolicy") == "Never":
            continue
        env = env_of(spec["containers"][0])
        assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://tempo:4317", name
        assert env["PD_METRICS_LISTEN"] == "0.0.0.0:9464", name


def test_pod_monitors_only_with_the_prometheus_operator_api(defaults):
    assert not kinds(defaults, "PodMonitor")
    objs = render(api_versions=("monitoring.coreos.com/v1",))
    mons = kinds(objs, "PodMonitor")
    assert set(mons) == {f"pd-pdserve-{c}" for c in ("router", "directory", "prefill", "decode")}
    tls = mons["pd-pdserve-decode"]["spec"]["podMetricsEndpoints"][0]["tlsConfig"]
    assert tls["serverName"] == "decode.pdserve.internal" and tls["cert"]["secret"]["name"] == "pd-pdserve-monitor-tls"
    assert "pd-pdserve-monitor-tls" in kinds(objs, "Secret")


def test_cert_manager_certificates_only_with_its_api(defaults):
    assert not [o for o in defaults if o["apiVersion"].startswith("cert-manager.io")]
    assert "pd-pdserve-ca" in kinds(defaults, "Secret")  # the chart's own CA instead
    objs = render(api_versions=("cert-manager.io/v1", "monitoring.coreos.com/v1"))
    certs = kinds(objs, "Certificate")
    assert certs["pd-pdserve-ca"]["spec"]["isCA"] is True
    assert certs["pd-pdserve-monitor"]["spec"]["commonName"] == "monitor/prometheus"
    assert "pd-pdserve-ca" not in kinds(objs, "Secret")


def test_ha_redis_has_sentinels_and_the_directory_follows_them():
    objs = render(files=(str(CHART / "ci" / "redis-ha-values.yaml"),))
    sts = kinds(objs, "StatefulSet")
    assert sts["pd-pdserve-redis"]["spec"]["replicas"] == 3 and sts["pd-pdserve-sentinel"]["spec"]["replicas"] == 3
    env = env_of(pod_specs(objs)["pd-pdserve-directory"]["containers"][0])
    assert env["PD_REDIS_SENTINELS"] == ",".join(
        f"pd-pdserve-sentinel-{i}.pd-pdserve-sentinel-headless:26379" for i in range(3))
    assert env["PD_REDIS_SENTINEL_MASTER"] == "pdserve"
    conf = kinds(objs, "ConfigMap")["pd-pdserve-sentinel"]["data"]["start.sh"]
    assert "sentinel monitor pdserve $master 6379 2" in conf


def test_external_redis_renders_no_redis():
    objs = render(files=(str(CHART / "ci" / "external-redis-values.yaml"),))
    assert not kinds(objs, "StatefulSet")
    env = env_of(pod_specs(objs)["pd-pdserve-directory"]["containers"][0])
    assert env["PD_REDIS_URL"] == {"secretKeyRef": {"name": "pdserve-redis-url", "key": "url"}}


def test_insecure_dev_values_turn_security_off_everywhere():
    objs = render(files=(str(CHART / "ci" / "dev-insecure-values.yaml"),))
    for name, spec in pod_specs(objs).items():
        if "redis" in name:
            continue
        assert env_of(spec["containers"][0])["PD_INSECURE"] == "1", name
        assert not spec.get("initContainers") or spec["initContainers"][0]["name"] == "model-fetch"


def test_rbac_is_the_least_the_rollback_drill_needs(defaults):
    rules = kinds(defaults, "Role")["pd-pdserve-rollback-drill"]["rules"]
    by = {(r["apiGroups"][0], r["resources"][0], tuple(r.get("resourceNames", []))): set(r["verbs"]) for r in rules}
    assert by == {("", "configmaps", ("pd-pdserve-release",)): {"get", "patch"},
                  ("apps", "deployments", ("pd-pdserve-decode",)): {"get", "patch"},
                  ("apps", "replicasets", ()): {"list"},
                  ("", "pods", ()): {"list"}}


def test_the_helm_test_pod_generates_and_checks_the_route(defaults):
    pod = kinds(defaults, "Pod")["pd-pdserve-test-generate"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["command"][-1]
    assert "pdctl" in script and "--json" in script and 'r["route"] == want' in script
    assert script.rstrip().endswith('"disaggregated"') and "--mode disaggregated" in script


@pytest.mark.parametrize("values", CI, ids=lambda p: p.stem)
def test_the_directory_accepts_the_redis_settings_the_chart_gives_it(values, monkeypatch):
    """The chart and kv_directory/config.py agree: the directory's rendered environment
    (Secret values stood in for, $(VAR) expanded as the kubelet does) is a valid config."""
    import re

    from kv_directory.config import DirectoryConfig

    env = env_of(pod_specs(render(files=(str(values),)))["pd-pdserve-directory"]["containers"][0])
    plain = {k: ("redis://:pw@redis.example:6379/0" if k == "PD_REDIS_URL" else "pw") if isinstance(v, dict) else v
             for k, v in env.items()}
    for key in [k for k in list(__import__("os").environ) if k.startswith("PD_REDIS")]:
        monkeypatch.delenv(key)
    for key, value in plain.items():
        if key.startswith("PD_REDIS") or key == "REDIS_PASSWORD":
            monkeypatch.setenv(key, re.sub(r"\$\((\w+)\)", lambda m: plain.get(m.group(1), ""), str(value)))
    config = DirectoryConfig.from_env()
    assert config.redis_url or config.redis_sentinels


def test_vllm_workers_get_the_engine_its_arguments_and_the_vllm_image():
    objs = render(files=(str(CHART / "ci" / "vllm-values.yaml"),))
    for name, spec in pod_specs(objs).items():
        if not name.endswith(("-prefill", "-decode")):
            continue
        (worker,) = [c for c in spec["containers"] if c["name"] == "worker"]
        env = env_of(worker)
        assert env["PD_ENGINE"] == "vllm" and env["PD_VLLM_HOST_STAGING"] == "auto", name
        assert env["PD_VLLM_ARGS"] == \
            '{"enable_chunked_prefill":true,"gpu_memory_utilization":0.85,"tensor_parallel_size":1}', name
        assert env["PD_MODEL"] == "/models/llama-3.1-8b-instruct"
        assert worker["image"].endswith(":0.1.0-cuda-vllm"), worker["image"]


def test_the_default_engine_is_pdserves_and_its_image_has_no_vllm(defaults):
    for spec in pod_specs(defaults).values():
        for c in spec["containers"]:
            assert not c["image"].endswith("-vllm")
            if c["name"] == "worker":
                assert env_of(c)["PD_ENGINE"] == "pdserve" and "PD_VLLM_ARGS" not in env_of(c)


def test_a_vllm_workers_tensor_parallelism_is_its_pods_gpus():
    from tests.support.helm import template

    four = {"requests": {"cpu": "8", "nvidia.com/gpu": 4}, "limits": {"memory": "64Gi", "nvidia.com/gpu": 4}}
    objs = render({"engine": {"name": "vllm"}, "decode": {"resources": four}})
    args = {name: env_of(next(c for c in spec["containers"] if c["name"] == "worker"))["PD_VLLM_ARGS"]
            for name, spec in pod_specs(objs).items() if name.endswith(("-prefill", "-decode"))}
    assert args == {"pd-pdserve-prefill": '{"tensor_parallel_size":1}',
                    "pd-pdserve-decode": '{"tensor_parallel_size":4}'}, args
    out = template({"engine": {"name": "vllm", "vllm": {"args": {"tensor_parallel_size": 2}}}}, (), (), check=False)
    assert out.returncode != 0
    assert "tensor_parallel_size=2, but each prefill worker gets 1 GPUs" in out.stderr, out.stderr


# ---- the router's OpenAI-compatible front (router/http) --------------------------------

FRONT = CHART / "ci" / "http-front-values.yaml"
GOLD = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
"""sha256 of "foo": the key file holds hashes only."""


def router_of(objs: list[dict]) -> dict:
    (c,) = [c for c in pod_specs(objs)["pd-pdserve-router"]["containers"] if c["name"] == "router"]
    return c


def test_the_front_is_on_by_default_on_a_named_https_port_of_the_pod_and_the_service(defaults):
    c = router_of(defaults)
    assert {"name": "https", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
    env = env_of(c)
    assert env["PD_ROUTER_HTTP_LISTEN"] == "0.0.0.0:8000"
    assert env["PD_TLS_CERT"] == "/pd/tls/tls.crt"  # the router's own certificate serves HTTPS too
    assert "PD_ROUTER_SERVED_MODEL_NAME" not in env  # empty: the model's own name
    assert "PD_ROUTER_HTTP_CORS_ORIGINS" not in env  # none: browsers refuse cross-origin calls
    ports = {p["name"]: p for p in kinds(defaults, "Service")["pd-pdserve-router"]["spec"]["ports"]}
    assert ports["https"] == {"name": "https", "port": 8000, "targetPort": "https", "protocol": "TCP",
                              "appProtocol": "https"}
    assert ports["grpc"]["port"] == 50080


def test_the_routers_certificate_names_its_service_for_the_fronts_clients(defaults):
    cert = pod_specs(defaults)["pd-pdserve-router"]["initContainers"][0]["command"]
    hosts = [cert[i + 1] for i, a in enumerate(cert) if a == "--host"]
    assert hosts == ["$(POD_IP)", "pd-pdserve-router", "pd-pdserve-router.serving", "pd-pdserve-router.serving.svc",
                     "pd-pdserve-router.serving.svc.cluster.local"]


def test_readiness_is_an_https_get_of_ready_and_liveness_stays_on_grpc(defaults):
    c = router_of(defaults)
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "https", "scheme": "HTTPS"}
    assert "exec" not in c["readinessProbe"]
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["exec"]["command"][:3] == ["python", "-m", "runtime.common.healthcheck"], probe
        assert "--alive" in c[probe]["exec"]["command"], probe


def test_without_keys_no_key_file_is_mounted(defaults):
    c = router_of(defaults)
    assert "PD_ROUTER_API_KEYS" not in env_of(c)
    assert "api-keys" not in {m["name"] for m in c["volumeMounts"]}
    assert not [o for o in defaults if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-api-keys")]


def test_listed_keys_become_a_secret_mounted_read_only_and_named_by_the_env():
    objs = render(files=(str(FRONT),))
    secret = kinds(objs, "Secret")["pd-pdserve-api-keys"]
    text = base64.b64decode(secret["data"]["api-keys"]).decode()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[0] == f"gold sha256:{GOLD}" and lines[1].startswith("silver sha256:")  # `sha256:` is optional
    c = router_of(objs)
    env = env_of(c)
    assert env["PD_ROUTER_API_KEYS"] == "/pd/api-keys/api-keys"
    assert env["PD_ROUTER_SERVED_MODEL_NAME"] == "llama-3.1-8b-instruct"
    assert env["PD_ROUTER_HTTP_LISTEN"] == "0.0.0.0:8443"
    assert {"name": "api-keys", "mountPath": "/pd/api-keys", "readOnly": True} in c["volumeMounts"]
    vol = {v["name"]: v for v in pod_specs(objs)["pd-pdserve-router"]["volumes"]}["api-keys"]
    assert vol["secret"] == {"secretName": "pd-pdserve-api-keys", "defaultMode": 0o400,
                             "items": [{"key": "api-keys", "path": "api-keys"}]}


def test_the_router_reads_the_key_file_and_settings_the_chart_renders():
    """The chart and the router agree: router/http/keys.py parses the rendered key file,
    and RouterConfig takes the rendered environment."""
    from router.config import RouterConfig
    from router.http.keys import parse

    objs = render(files=(str(FRONT),))
    text = base64.b64decode(kinds(objs, "Secret")["pd-pdserve-api-keys"]["data"]["api-keys"]).decode()
    assert parse(text, "api-keys")[f"sha256:{GOLD}"] == "gold"
    env = {k: v for k, v in env_of(router_of(objs)).items() if k.startswith("PD_") and isinstance(v, str)}
    config = RouterConfig.from_env(env)
    assert config.http_listen == "0.0.0.0:8443" and config.api_keys_file == "/pd/api-keys/api-keys"
    assert config.served_name() == "llama-3.1-8b-instruct"


def test_an_existing_key_secret_is_mounted_and_none_is_rendered():
    objs = render({"router": {"http": {"apiKeys": {"existingSecret": "tenant-keys"}}}})
    vol = {v["name"]: v for v in pod_specs(objs)["pd-pdserve-router"]["volumes"]}["api-keys"]
    assert vol["secret"]["secretName"] == "tenant-keys" and vol["secret"]["items"] == [
        {"key": "api-keys", "path": "api-keys"}]
    assert env_of(router_of(objs))["PD_ROUTER_API_KEYS"] == "/pd/api-keys/api-keys"
    assert "pd-pdserve-api-keys" not in kinds(objs, "Secret")


def test_the_front_off_changes_no_port_probe_or_certificate():
    objs = render({"router": {"http": {"enabled": False, "apiKeys": {"existingSecret": "tenant-keys"}}}})
    c = router_of(objs)
    assert [p["name"] for p in c["ports"]] == ["grpc", "metrics"]
    assert c["readinessProbe"]["exec"]["command"] == ["python", "-m", "runtime.common.healthcheck", "--address",
                                                      "127.0.0.1:50080", "--service", "router"]
    assert env_of(c)["PD_ROUTER_HTTP_LISTEN"] == ""  # off, whatever the router's default
    assert "PD_ROUTER_API_KEYS" not in env_of(c) and "api-keys" not in {m["name"] for m in c["volumeMounts"]}
    assert [p["name"] for p in kinds(objs, "Service")["pd-pdserve-router"]["spec"]["ports"]] == ["grpc"]
    cert = pod_specs(objs)["pd-pdserve-router"]["initContainers"][0]["command"]
    assert cert.count("--host") == 1
    router_policy = kinds(objs, "NetworkPolicy")["pd-pdserve-router"]["spec"]
    assert 8000 not in {p["port"] for rule in router_policy["ingress"] for p in rule["ports"]}


def test_without_security_the_front_is_plain_http_on_a_port_named_http():
    objs = render(files=(str(CHART / "ci" / "dev-insecure-values.yaml"),))
    c = router_of(objs)
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http", "scheme": "HTTP"}
    ports = {p["name"]: p for p in kinds(objs, "Service")["pd-pdserve-router"]["spec"]["ports"]}
    assert ports["http"]["appProtocol"] == "http" and "https" not in ports


def test_ingress_and_httproute_only_when_enabled(defaults):
    assert not kinds(defaults, "Ingress") and not kinds(defaults, "HTTPRoute")
    objs = render(files=(str(FRONT),))
    ing = kinds(objs, "Ingress")["pd-pdserve-router"]
    assert ing["metadata"]["annotations"] == {"nginx.ingress.kubernetes.io/backend-protocol": "HTTPS",
                                              "nginx.ingress.kubernetes.io/proxy-read-timeout": "300"}
    assert ing["spec"]["ingressClassName"] == "nginx"
    paths = {(r["host"], p["path"]): p["backend"]["service"] for r in ing["spec"]["rules"] for p in r["http"]["paths"]}
    assert paths == {("llm.example.com", "/"): {"name": "pd-pdserve-router", "port": {"name": "https"}},
                     ("api.example.com", "/v1"): {"name": "pd-pdserve-router", "port": {"name": "https"}}}
    assert ing["spec"]["tls"] == [{"secretName": "llm-example-tls", "hosts": ["llm.example.com", "api.example.com"]}]
    route = kinds(objs, "HTTPRoute")["pd-pdserve-router"]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateways", "sectionName": "https"}]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": "pd-pdserve-router", "port": 8443}]  # the Service's port number
    assert rule["timeouts"] == {"request": "300s"}


def test_an_ingress_annotation_wins_over_the_nginx_default():
    objs = render({"router": {"http": {"ingress": {
        "enabled": True, "className": "nginx", "hosts": [{"host": "a.example.com"}],
        "annotations": {"nginx.ingress.kubernetes.io/backend-protocol": "GRPCS"}}}}})
    ann = kinds(objs, "Ingress")["pd-pdserve-router"]["metadata"]["annotations"]
    assert ann == {"nginx.ingress.kubernetes.io/backend-protocol": "GRPCS"}
    other = render({"router": {"http": {"ingress": {"enabled": True, "className": "traefik",
                                                    "hosts": [{"host": "a.example.com"}]}}}})
    assert "annotations" not in kinds(other, "Ingress")["pd-pdserve-router"]["metadata"]


def test_the_network_policy_lets_http_front_clients_in_on_its_port_only(defaults):
    rules = kinds(defaults, "NetworkPolicy")["pd-pdserve-router"]["spec"]["ingress"]
    front = [r for r in rules if r["ports"] == [{"port": 8000, "protocol": "TCP"}]]
    clients = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pdserve.io/client": "true"}}}
    assert front == [{"from": [clients], "ports": [{"port": 8000, "protocol": "TCP"}]}]
    objs = render(files=(str(FRONT),))
    rules = kinds(objs, "NetworkPolicy")["pd-pdserve-router"]["spec"]["ingress"]
    (front,) = [r for r in rules if r["ports"] == [{"port": 8443, "protocol": "TCP"}]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}} in front["from"]
    grpc = [r for r in rules if r["ports"] == [{"port": 50080, "protocol": "TCP"}]]
    assert all("ingress-nginx" not in str(r) for r in grpc)  # the Ingress controller reaches the front only


def test_cors_origins_reach_the_router_as_one_list():
    env = env_of(router_of(render({"router": {"http": {"corsOrigins": ["https://a.example", "https://b.example"]}}})))
    assert env["PD_ROUTER_HTTP_CORS_ORIGINS"] == "https://a.example,https://b.example"
