"""Mutual TLS for pdserve's servers and the channels between them, and who may call what.

`Security` is one process's side of it: its certificate and key, the CA it trusts,
and the identity its certificate names (``<role>/<name>``, runtime/security/pki.py).
Every server asks for and verifies the caller's certificate; every channel presents
this process's and checks that the server holds a certificate for the service it
calls (client/pdserve_client/tls.py). `Access` then lets a method through only for
the roles its table names, and a servicer asks `caller(context)` for finer checks
(a worker registers only under its own id, a client sees only its own tenant).

    PD_TLS_CERT, PD_TLS_KEY, PD_TLS_CA   PEM files (the local launcher writes them)
    PD_INSECURE=1                        plaintext, nobody identified, every call
                                         allowed; a warning on every start

Without certificates and without PD_INSECURE a service refuses to start.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio
from cryptography import x509

from pdserve_client import contract
from pdserve_client import tls as client_tls
from pdserve_client.tls import TlsFiles
from runtime.common.settings import Settings, SettingsError, env
from runtime.telemetry import tracing

from .pki import Identity

log = logging.getLogger(__name__)

ANY_ROLE = frozenset(contract.ROLES)
WORKERS = frozenset({"prefill", "decode", "mixed"})
INSECURE_WARNING = ("%s: PD_INSECURE=1: plaintext gRPC and data plane, no caller is identified and every "
                    "call is allowed. For debugging only; never on a shared network.")


class TlsSettings(Settings):
    """Where this process's certificate, key and trusted CA are."""

    cert: str = env(contract.TLS_CERT_ENV, "")
    """PEM certificate naming this process (CN <role>/<name>)."""
    key: str = env(contract.TLS_KEY_ENV, "")
    """PEM private key of the certificate."""
    ca: str = env(contract.TLS_CA_ENV, "")
    """PEM CA certificate every peer's certificate must chain to."""
    insecure: bool = env(contract.INSECURE_ENV, False)
    """Plaintext and no authorization (debugging only)."""


@dataclass(frozen=True)
class Security:
    """This process's TLS files and identity; `files` None means insecure."""

    files: TlsFiles | None
    identity: Identity | None

    @classmethod
    def insecure(cls) -> Security:
        return cls(None, None)

    @classmethod
    def of(cls, files: TlsFiles) -> Security:
        cert = x509.load_pem_x509_certificate(files.cert)
        cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        return cls(files, Identity.parse(str(cn[0].value)) if cn else None)

    @classmethod
    def from_env(cls, service: str, environ: Mapping[str, str] | None = None) -> Security:
        """From PD_TLS_* (or PD_INSECURE=1, with its warning); SettingsError if neither."""
        s = TlsSettings.from_env(environ)
        if s.insecure:
            log.warning(INSECURE_WARNING, service)
            return cls.insecure()
        if not (s.cert and s.key and s.ca):
            raise SettingsError(
                f"{service}: no TLS certificate: set {contract.TLS_CERT_ENV}, {contract.TLS_KEY_ENV} and "
                f"{contract.TLS_CA_ENV} (`pdserve up` writes them under .pdserve/tls), or "
                f"{contract.INSECURE_ENV}=1 to debug without security")
        try:
            return cls.of(TlsFiles.read(s.cert, s.key, s.ca))
        except (client_tls.TlsConfigError, ValueError) as e:
            raise SettingsError(f"{service}: {e}") from None

    @property
    def secure(self) -> bool:
        return self.files is not None

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """Require and verify a client certificate from the CA (None when insecure)."""
        if self.files is None:
            return None
        return grpc.ssl_server_credentials([(self.files.key, self.files.cert)], root_certificates=self.files.ca,
                                           require_client_auth=True)

    def aio_channel(self, address: str, service: str, options: Sequence[tuple[str, object]] = ()
                    ) -> grpc.aio.Channel:
        """An asyncio channel to `service` at `address` (mutual TLS unless insecure); its
        calls carry the trace context when tracing is on."""
        return tracing.carrying_context(client_tls.aio_channel(address, self.files, service, options))

    def channel(self, address: str, service: str, options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
        """A blocking channel to `service` at `address`."""
        return client_tls.channel(address, self.files, service, options)

    # ---- raw sockets (the TCP data plane) --------------------------------------
    def server_ssl(self) -> ssl.SSLContext | None:
        """A server context that requires a client certificate from the CA (None: plaintext)."""
        return self._server_context(ssl.TLSVersion.TLSv1_3, ssl.CERT_REQUIRED)

    def https_ssl(self) -> ssl.SSLContext | None:
        """A server context for HTTPS (the router's OpenAI-compatible front): this
        certificate, no client certificate asked for (browsers and SDKs carry none; API keys
        say who calls), TLS 1.2 or newer (None: plaintext)."""
        ctx = self._server_context(ssl.TLSVersion.TLSv1_2, ssl.CERT_NONE)
        if ctx is not None:
            ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def _server_context(self, minimum: ssl.TLSVersion, verify: ssl.VerifyMode) -> ssl.SSLContext | None:
        if self.files is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = minimum
        _load(ctx, self.files)
        ctx.verify_mode = verify
        return ctx

    def client_ssl(self) -> ssl.SSLContext | None:
        """A client context presenting this certificate, trusting only the CA."""
        if self.files is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        _load(ctx, self.files)
        return ctx


def _load(ctx: ssl.SSLContext, files: TlsFiles) -> None:
    ctx.load_verify_locations(cadata=files.ca.decode())
    # ssl loads a key pair only from files: a private temporary copy, gone at once.
    fd, path = tempfile.mkstemp(prefix="pd-tls-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(files.cert + b"\n" + files.key)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)


def peer_of_ssl(obj) -> Identity | None:
    """The identity in an ssl object's verified peer certificate (the TCP data plane)."""
    cert = obj.getpeercert() if obj is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return Identity.parse(value)
    return None


def worker_of_ssl(obj, roles: frozenset[str], peer: str) -> str | None:
    """The name in a TLS peer's certificate if its role is one of `roles`; else None (logged)."""
    who = peer_of_ssl(obj)
    if who is None or who.role not in roles:
        log.warning("%s presented %s, not a certificate of role %s; refused", peer, who, "/".join(sorted(roles)))
        return None
    return who.name


_URI_PREFIX = b"pdserve://"


def caller(context) -> Identity | None:
    """Who made this call (from the verified client certificate); None when insecure."""
    ids = context.peer_identities()
    for raw in ids or ():
        if raw.startswith(_URI_PREFIX):
            try:
                return Identity.parse(raw[len(_URI_PREFIX):].decode())
            except ValueError:
                return None
    return None


def caller_name(context) -> str:
    """Who made the call, for the audit log ("anonymous (insecure)" without TLS)."""
    who = caller(context)
    return str(who) if who is not None else "anonymous (insecure)"


class Access(grpc.aio.ServerInterceptor):
    """Lets a call through only if its caller's role is one its method allows.

    `table` maps a full method name (/pd.v1.Directory/Begin) to the roles allowed;
    health and reflection are open to every identified caller; a method in no table
    is refused. Denials are PERMISSION_DENIED naming the method and the caller.
    """

    OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")

    def __init__(self, table: Mapping[str, frozenset[str]]):
        self.table = dict(table)

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        roles = ANY_ROLE if method.startswith(self.OPEN) else self.table.get(method, frozenset())
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return _guarded(handler, method, roles)


def _deny_message(method: str, who: Identity | None, roles: frozenset[str]) -> str:
    if who is None:
        return f"{method}: the caller presented no pdserve certificate"
    allowed = ", ".join(sorted(roles)) or "nobody"
    return f"{method}: role {who.role} ({who}) may not call this method (allowed: {allowed})"


def _guarded(handler, method: str, roles: frozenset[str]):
    """`handler` with its behaviour run only for a caller whose role is in `roles`."""
    async def check(context) -> None:
        who = caller(context)
        if who is None or who.role not in roles:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _deny_message(method, who, roles))

    def unary_response(inner):  # the first argument is a request or a request iterator alike
        async def behaviour(request, context):
            await check(context)
            return await inner(request, context)
        return behaviour

    def stream_response(inner):
        async def behaviour(request, context):
            await check(context)
            async for item in inner(request, context):
                yield item
        return behaviour

    for kind, wrap in (("unary_unary", unary_response), ("stream_unary", unary_response),
                       ("unary_stream", stream_response), ("stream_stream", stream_response)):
        inner = getattr(handler, kind)
        if inner is not None:
            return handler._replace(**{kind: wrap(inner)})
    return handler


def access_table(service_full_name: str, methods: Mapping[str, frozenset[str] | set[str]]) -> dict[str, frozenset[str]]:
    """{method: roles} of one service -> {/service/method: roles}."""
    return {f"/{service_full_name}/{m}": frozenset(r) for m, r in methods.items()}
