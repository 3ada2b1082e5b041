"""Certificates for tests that run pdserve's servers in-process: one throwaway CA per
test process (runtime/security/pki.py), a certificate per (role, name) on demand."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from pdserve_client import contract
from pdserve_client.tls import TlsFiles
from runtime.security.capability import generate_signing_key
from runtime.security.config import CapabilitySettings
from runtime.security.pki import Identity, LocalCA
from runtime.security.tls import Security


@functools.cache
def ca() -> LocalCA:
    d = Path(tempfile.mkdtemp(prefix="pd-test-ca-"))
    atexit.register(shutil.rmtree, d, True)
    return LocalCA(d)


def paths(role: str, name: str) -> tuple[Path, Path, Path]:
    """(cert, key, CA) files of `role/name`, issued on first use."""
    stem = f"{role}-{name}"
    crt = ca().dir / f"{stem}.crt"
    if not crt.exists():
        ca().issue(Identity(role, name), stem)
    return crt, ca().dir / f"{stem}.key", ca().dir / contract.TLS_CA_FILE


def files(role: str, name: str) -> TlsFiles:
    return TlsFiles.read(*paths(role, name))


def security(role: str, name: str) -> Security:
    return Security.of(files(role, name))


def env(role: str, name: str) -> dict[str, str]:
    """PD_TLS_* naming `role/name`'s files."""
    cert, key, ca_file = paths(role, name)
    return {contract.TLS_CERT_ENV: str(cert), contract.TLS_KEY_ENV: str(key), contract.TLS_CA_ENV: str(ca_file)}


@functools.cache
def capability_keys() -> tuple[Path, Path]:
    """(signing key, public key set) of this test process's capability issuer."""
    d = ca().dir
    generate_signing_key(d / "capability-signing.pem", d / "capability-keys.json")
    return d / "capability-signing.pem", d / "capability-keys.json"


def capability_settings() -> CapabilitySettings:
    signing, public = capability_keys()
    return CapabilitySettings(signing_key=str(signing), public_keys=str(public))
