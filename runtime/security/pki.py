"""The local cluster's throwaway certificate authority (`pdserve up`), with `cryptography`.

One CA per state dir (`.pdserve/tls/ca.crt`, its key beside it, mode 0600), and one
certificate per process: subject CN ``<role>/<name>``, a URI SAN
``pdserve://<role>/<name>``, and for a server the DNS names of the services it answers
as (contract.SERVER_ROLES) plus ``localhost`` and 127.0.0.1. Keys are ECDSA P-256
(milliseconds to make, so tests make their own CAs too). A production cluster brings
its own CA and certificates as files (Kubernetes Secrets); nothing here is needed there.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pdserve_client import contract

CA_KEY_FILE = "ca.key"
VALIDITY = datetime.timedelta(days=30)
"""Lifetime of a throwaway certificate (the local cluster is re-made by `pdserve up`)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a certificate names: a role (contract.ROLES) and a name (worker id, tenant...)."""

    role: str
    name: str

    def __post_init__(self):
        if self.role not in contract.ROLES:
            raise ValueError(f"unknown role {self.role!r}; one of {', '.join(contract.ROLES)}")
        if not self.name or "/" in self.name:
            raise ValueError(f"identity name {self.name!r} must be non-empty and contain no '/'")

    def __str__(self) -> str:
        return f"{self.role}/{self.name}"

    @classmethod
    def parse(cls, common_name: str) -> Identity:
        """Inverse of str(): 'decode/decode-0' -> Identity('decode', 'decode-0'); ValueError if not."""
        role, sep, name = common_name.partition("/")
        if not sep:
            raise ValueError(f"certificate common name {common_name!r} is not <role>/<name>")
        return cls(role, name)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _ca_common_name(tls_dir: Path) -> str:
    """`pdserve local CA <folder>`, the folder's tail when the whole would pass X.509's
    64-character limit on a common name (a deep state dir: pytest's tmp paths)."""
    name = f"pdserve local CA {tls_dir.resolve()}"
    return name if len(name) <= 64 else f"pdserve local CA ...{name[-44:]}"


class LocalCA:
    """A CA kept in a folder; `issue` writes <name>.crt/.key signed by it."""

    def __init__(self, tls_dir: str | Path):
        self.dir = Path(tls_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        ca_crt, ca_key = self.dir / contract.TLS_CA_FILE, self.dir / CA_KEY_FILE
        if ca_crt.exists() and ca_key.exists():
            self.cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
            self.key = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
            return
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pdserve"),
                          x509.NameAttribute(NameOID.COMMON_NAME, _ca_common_name(self.dir))])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        _write(ca_key, _key_pem(self.key), private=True)
        _write(ca_crt, self.cert.public_bytes(serialization.Encoding.PEM))

    @classmethod
    def from_files(cls, cert: str | Path, key: str | Path) -> LocalCA:
        """A CA whose certificate and key are elsewhere (a Kubernetes Secret's tls.crt and
        tls.key, mounted read-only): it issues only with `issue(..., out_dir=...)`."""
        ca = cls.__new__(cls)
        ca.dir = Path(cert).parent
        ca.cert = x509.load_pem_x509_certificate(Path(cert).read_bytes())
        ca.key = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
        return ca

    def issue(self, identity: Identity, file_name: str | None = None, hosts: tuple[str, ...] = (),
              out_dir: str | Path | None = None, validity: datetime.timedelta = VALIDITY) -> Path:
        """Write `<file_name or identity.name>.crt/.key` for `identity` (into `out_dir`, default
        the CA's folder); returns the .crt path. Server roles get their services' DNS names,
        localhost, 127.0.0.1 and `hosts`."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(f"pdserve://{identity}")]
        services = contract.SERVER_ROLES.get(identity.role, ())
        if services:
            sans += [x509.DNSName(contract.server_name(s)) for s in services]
            sans += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if services else [])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pdserve"),
                                         x509.NameAttribute(NameOID.COMMON_NAME, str(identity))]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + validity)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .sign(self.key, hashes.SHA256()))
        stem, out = file_name or identity.name, Path(out_dir) if out_dir is not None else self.dir
        _write(out / f"{stem}.key", _key_pem(key), private=True)
        crt = out / f"{stem}.crt"
        _write(crt, cert.public_bytes(serialization.Encoding.PEM))
        return crt
