"""The chart's pod certificates (runtime/security/podcert.py) and exec health probe
(runtime/common/healthcheck.py): a certificate issued from a read-only CA folder names
the pod, carries the service DNS name, and a probe with it sees SERVING / NOT_SERVING."""

from __future__ import annotations

import shutil
from concurrent import futures

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve_client import contract
from pdserve_client.tls import TlsFiles
from runtime.common import healthcheck
from runtime.security import podcert
from runtime.security.pki import Identity, LocalCA


@pytest.fixture
def ca_dir(tmp_path):
    """A CA laid out as a kubernetes.io/tls Secret mounted read-only: tls.crt, tls.key."""
    LocalCA(tmp_path / "make")
    d = tmp_path / "ca"
    d.mkdir()
    shutil.copyfile(tmp_path / "make" / contract.TLS_CA_FILE, d / "tls.crt")
    shutil.copyfile(tmp_path / "make" / "ca.key", d / "tls.key")
    d.chmod(0o555)
    yield d
    d.chmod(0o755)


def test_issues_the_pods_identity_with_service_names(ca_dir, tmp_path):
    out = tmp_path / "tls"
    assert podcert.main(["--ca-dir", str(ca_dir), "--out", str(out), "--role", "decode",
                         "--name", "pdserve-decode-7c9f-x2", "--host", "10.1.2.3"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert (out / "tls.key").stat().st_mode & 0o077 == 0
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    assert Identity.parse(cn) == Identity("decode", "pdserve-decode-7c9f-x2")
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "decode.pdserve.internal" in sans.get_values_for_type(x509.DNSName)
    assert "pdserve://decode/pdserve-decode-7c9f-x2" in sans.get_values_for_type(x509.UniformResourceIdentifier)
    assert (out / "ca.crt").read_bytes() == (ca_dir / "tls.crt").read_bytes()
    assert sorted(p.name for p in ca_dir.iterdir()) == ["tls.crt", "tls.key"]  # nothing written beside the CA


def test_refuses_a_bad_identity_and_a_missing_ca(ca_dir, tmp_path, capsys):
    assert podcert.main(["--ca-dir", str(ca_dir), "--out", str(tmp_path / "o"), "--role", "decode",
                         "--name", "a/b"]) == 1
    assert "must be non-empty and contain no '/'" in capsys.readouterr().err
    assert podcert.main(["--ca-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--role", "router",
                         "--name", "router"]) == 1


def _server(files: TlsFiles):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    creds = grpc.ssl_server_credentials([(files.key, files.cert)], root_certificates=files.ca,
                                        require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, servicer, f"127.0.0.1:{port}"


def test_the_probe_presents_the_pods_certificate_and_reads_the_status(ca_dir, tmp_path):
    for role, name in (("router", "router"), ("decode", "decode-pod")):
        podcert.issue(ca_dir, tmp_path / name, Identity(role, name))
    router = TlsFiles.read(*(tmp_path / "router" / f for f in ("tls.crt", "tls.key", "ca.crt")))
    pod = TlsFiles.read(*(tmp_path / "decode-pod" / f for f in ("tls.crt", "tls.key", "ca.crt")))
    server, servicer, address = _server(router)
    try:
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert healthcheck.check(address, "router", 3.0, pod) == (False, "NOT_SERVING")
        assert healthcheck.check(address, "router", 3.0, pod, alive=True) == (True, "NOT_SERVING")
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert healthcheck.check(address, "router", 3.0, pod) == (True, "SERVING")
        ok, why = healthcheck.check(address, "decode", 3.0, pod)  # the router's certificate is not decode's
        assert not ok and why.startswith("UNAVAILABLE")
        assert not healthcheck.check(address, "decode", 3.0, pod, alive=True)[0]  # no answer is not alive
    finally:
        server.stop(None)


def test_the_probe_exits_2_without_certificates(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    for var in (contract.TLS_CERT_ENV, contract.TLS_KEY_ENV, contract.TLS_CA_ENV, contract.INSECURE_ENV):
        monkeypatch.delenv(var, raising=False)
    assert healthcheck.main(["--address", "127.0.0.1:1", "--service", "router"]) == 2
    assert "no client certificate" in capsys.readouterr().err
