"""Mutual TLS for clients: which certificate to present and how a channel checks the server.

Every pdserve port speaks TLS and asks for the caller's certificate. A certificate
names its holder as ``<role>/<name>`` (contract.ROLES); a server certificate also
carries the DNS name of each service it answers as (``router.pdserve.internal``...),
and a channel checks that name, so a worker's certificate cannot pose as the router.

A client finds its files, first found:
  1. the `TlsFiles` it was given;
  2. $PD_TLS_CERT, $PD_TLS_KEY and $PD_TLS_CA;
  3. a local cluster's `tls/<identity>.crt`, `.key` and `ca.crt` (identity "client" for
     the SDK, "operator" for pdctl's state-changing commands), in the state folder
     $PD_CLUSTER names, else in `./.pdserve`.
$PD_INSECURE=1 makes plaintext channels instead (debugging a cluster started the same way).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from pdserve_client import contract


class TlsConfigError(RuntimeError):
    """No usable certificate: the message says which files were looked for."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM bytes of a certificate, its private key and the CA that signs every peer."""

    cert: bytes
    key: bytes
    ca: bytes

    @classmethod
    def read(cls, cert: str | Path, key: str | Path, ca: str | Path) -> TlsFiles:
        """Load the three files; TlsConfigError names the one that cannot be read."""
        out = []
        for what, path in (("certificate", cert), ("private key", key), ("CA certificate", ca)):
            try:
                out.append(Path(path).read_bytes())
            except OSError as e:
                raise TlsConfigError(f"cannot read the TLS {what} {path}: {e.strerror or e}") from None
        return cls(*out)

    @classmethod
    def in_dir(cls, tls_dir: str | Path, name: str) -> TlsFiles:
        """`<tls_dir>/<name>.crt`, `<name>.key` and `ca.crt` (the local launcher's layout)."""
        d = Path(tls_dir)
        return cls.read(d / f"{name}.crt", d / f"{name}.key", d / contract.TLS_CA_FILE)


def insecure(environ: Mapping[str, str] | None = None) -> bool:
    """Is $PD_INSECURE set to a true value?"""
    value = (os.environ if environ is None else environ).get(contract.INSECURE_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def resolve(explicit: TlsFiles | None = None, identity: str = "client", cwd: Path | None = None,
            environ: Mapping[str, str] | None = None) -> TlsFiles | None:
    """The files a client presents (see the module docstring); None when $PD_INSECURE=1."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        return explicit
    if insecure(env):
        return None
    paths = [env.get(n, "").strip() for n in (contract.TLS_CERT_ENV, contract.TLS_KEY_ENV, contract.TLS_CA_ENV)]
    if any(paths):
        if not all(paths):
            raise TlsConfigError(f"set all of {contract.TLS_CERT_ENV}, {contract.TLS_KEY_ENV} and "
                                 f"{contract.TLS_CA_ENV}, or none")
        return TlsFiles.read(*paths)
    cluster = env.get(contract.CLUSTER_ENV, "").strip()
    tls_dir = Path(cluster).expanduser() / Path(contract.TLS_DIR).name if cluster else \
        (cwd or Path.cwd()) / contract.TLS_DIR
    if not (tls_dir / f"{identity}.crt").exists():
        raise TlsConfigError(
            f"no client certificate: {tls_dir / (identity + '.crt')} does not exist (start a local cluster "
            f"with `pdserve up` from this directory, or set {contract.CLUSTER_ENV} to its state folder, or "
            f"{contract.TLS_CERT_ENV}/{contract.TLS_KEY_ENV}/{contract.TLS_CA_ENV}; {contract.INSECURE_ENV}=1 "
            "only for a cluster started insecure)")
    return TlsFiles.in_dir(tls_dir, identity)


def credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Channel credentials that present `files.cert` and trust only `files.ca`."""
    return grpc.ssl_channel_credentials(root_certificates=files.ca, private_key=files.key,
                                        certificate_chain=files.cert)


def channel_options(service: str) -> list[tuple[str, str]]:
    """The server must hold a certificate for `service` (router, directory, prefill, decode)."""
    return [("grpc.ssl_target_name_override", contract.server_name(service))]


def channel(address: str, files: TlsFiles | None, service: str,
            options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """A blocking channel to `service` at `address`: mutual TLS, or plaintext when files is None."""
    if files is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, credentials(files), options=[*options, *channel_options(service)])


def aio_channel(address: str, files: TlsFiles | None, service: str,
                options: Sequence[tuple[str, object]] = (), interceptors: Sequence = ()) -> grpc.aio.Channel:
    """The asyncio twin of `channel` (`interceptors`: e.g. the tracing ones)."""
    if files is None:
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=list(interceptors) or None)
    return grpc.aio.secure_channel(address, credentials(files), options=[*options, *channel_options(service)],
                                   interceptors=list(interceptors) or None)
