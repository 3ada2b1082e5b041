"""Settings of the KV directory: one pydantic-settings class (services/common/settings.py)."""

from __future__ import annotations

import urllib.parse

from pydantic import field_validator

from pdserve_client import contract
from services.common.settings import ServiceSettings, env


class DirectoryConfig(ServiceSettings):
    """Everything the directory needs to run; build with ``from_env()``."""

    redis_url: str = env("PD_REDIS_URL", "redis://127.0.0.1:6379/0")
    """Where the directory's state lives. ``redis://``, ``rediss://`` or ``unix://``."""

    key_prefix: str = env("PD_DIRECTORY_KEY_PREFIX", "{pd}")
    """Prefix of every Redis key. The ``{...}`` hash tag keeps all keys in one
    cluster slot, which Lua scripts touching computed keys require."""

    listen_addr: str = env("PD_DIRECTORY_LISTEN", contract.DEFAULT_DIRECTORY_ADDRESS)
    """gRPC listen address of the directory service (used by ``server.py``)."""

    lease_ttl_s: float = env("PD_LEASE_TTL_S", 10.0, gt=0)
    """A worker that has not heartbeated for this long is dead: it leaves the
    snapshot, its epoch is fenced and its unpublished transactions abort."""

    txn_ttl_s: float = env("PD_TXN_TTL_S", 60.0, gt=0)
    """Longest a transaction may stay unpublished (RESERVED..VALIDATED) before the
    directory aborts it with reason ``txn_timeout`` — the bound on leaked blocks."""

    record_retention_s: float = env("PD_RECORD_RETENTION_S", 600.0, ge=0)
    """How long terminal (ABORTED/RELEASED) records are kept so late retries get
    DUPLICATE/STALE answers instead of NOT_FOUND."""


    redis_timeout_s: float = env("PD_REDIS_TIMEOUT_S", 2.0, gt=0)
    """Socket connect/read timeout; past it the call raises DirectoryUnavailable."""

    redis_retries: int = env("PD_REDIS_RETRIES", 2, ge=0)
    """Reconnect attempts per call. Safe because every script is idempotent by
    transfer id / epoch (a retried reserve answers DUPLICATE)."""

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be redis://, rediss:// or unix://")
        return url

    @field_validator("key_prefix")
    @classmethod
    def _one_word(cls, prefix: str) -> str:
        if not prefix or any(c.isspace() for c in prefix):
            raise ValueError("must be non-empty without spaces")
        return prefix


def redact_url(url: str) -> str:
    """``url`` without a password, for logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
