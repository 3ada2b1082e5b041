"""Where the capability keys are, and the checks' limits (runtime/security/capability.py).

The router signs with PD_CAPABILITY_SIGNING_KEY; workers verify with the public key set
PD_CAPABILITY_PUBLIC_KEYS and trust the issuers PD_CAPABILITY_ISSUERS. With TLS on
(runtime/security/tls.py) both are required: a router cannot mint, a worker cannot
accept K/V, without them. Under PD_INSECURE with no keys, hand-offs carry no capability.
"""

from __future__ import annotations

from pathlib import Path

from runtime.common.settings import Settings, SettingsError, env

from .capability import Signer, Verifier
from .tls import Security


class CapabilitySettings(Settings):
    """Capability keys and limits."""

    signing_key: str = env("PD_CAPABILITY_SIGNING_KEY", "")
    """PKCS8 PEM Ed25519 private key (the router's; workers have none)."""
    public_keys: str = env("PD_CAPABILITY_PUBLIC_KEYS", "")
    """JSON public key set {"keys": {key id: hex}} (the workers'); a key removed from it
    revokes every capability it signed."""
    issuers: str = env("PD_CAPABILITY_ISSUERS", "router/router")
    """Comma-separated certificate identities (<role>/<name>) whose capabilities are trusted."""
    ttl_ms: int = env("PD_CAPABILITY_TTL_MS", 60_000, gt=0, le=3_600_000)
    """Lifetime of a minted capability: long enough for a queued prefill and its transfer."""
    max_ttl_ms: int = env("PD_CAPABILITY_MAX_TTL_MS", 300_000, gt=0, le=3_600_000)
    """A capability living longer than this (from now) is refused (EXPIRED)."""


def signer(settings: CapabilitySettings, security: Security) -> Signer | None:
    """The router's signer, issuing as its certificate's identity; None when insecure without a key."""
    if not settings.signing_key:
        if security.secure:
            raise SettingsError("router: PD_CAPABILITY_SIGNING_KEY is required with TLS on "
                                "(`pdserve up` writes one under .pdserve/tls)")
        return None
    issuer = str(security.identity) if security.identity is not None else "router/router"
    try:
        return Signer.from_file(Path(settings.signing_key), issuer)
    except (OSError, ValueError) as e:
        raise SettingsError(f"PD_CAPABILITY_SIGNING_KEY={settings.signing_key}: {e}") from None


def verifier(settings: CapabilitySettings, security: Security) -> Verifier | None:
    """A worker's verifier; None when insecure without a key set."""
    if not settings.public_keys:
        if security.secure:
            raise SettingsError("PD_CAPABILITY_PUBLIC_KEYS is required with TLS on "
                                "(`pdserve up` writes one under .pdserve/tls)")
        return None
    issuers = [i.strip() for i in settings.issuers.split(",") if i.strip()]
    try:
        return Verifier.from_file(Path(settings.public_keys), issuers, settings.max_ttl_ms)
    except (OSError, ValueError) as e:
        raise SettingsError(f"PD_CAPABILITY_PUBLIC_KEYS={settings.public_keys}: {e}") from None
