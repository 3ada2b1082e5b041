"""The local CA works wherever its folder is."""

from __future__ import annotations

from pdserve_client.tls import TlsFiles
from runtime.security.pki import Identity, LocalCA
from runtime.security.tls import Security


def test_a_ca_in_a_deep_folder_issues_certificates(tmp_path):
    """X.509 caps a common name at 64 characters; the CA's names its folder, shortened."""
    deep = tmp_path / ("d" * 80) / "tls"
    ca = LocalCA(deep)
    ca.issue(Identity("client", "acme"), "client")
    assert Security.of(TlsFiles.in_dir(deep, "client")).identity == Identity("client", "acme")
    assert LocalCA(deep).cert == ca.cert  # reopened, not remade

