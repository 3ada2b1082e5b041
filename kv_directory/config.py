"""Configuration of the KV directory: one frozen dataclass, env overrides in one table."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pdserve_client import contract
from services.common.config import env_overrides


@dataclasses.dataclass(frozen=True, slots=True)
class DirectoryConfig:
    """Everything the directory needs to run; build with ``from_env()``."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Where the directory's state lives. ``redis://``, ``rediss://`` or ``unix://``."""

    key_prefix: str = "{pd}"
    """Prefix of every Redis key. The ``{...}`` hash tag keeps all keys in one
    cluster slot, which Lua scripts touching computed keys require."""

    listen_addr: str = contract.DEFAULT_DIRECTORY_ADDRESS
    """gRPC listen address of the directory service (used by ``server.py``)."""

    lease_ttl_s: float = 10.0
    """A worker that has not heartbeated for this long is dead: it leaves the
    snapshot, its epoch is fenced and its unpublished transactions abort."""

    txn_ttl_s: float = 60.0
    """Longest a transaction may stay unpublished (RESERVED..VALIDATED) before the
    directory aborts it with reason ``txn_timeout`` — the bound on leaked blocks."""

    record_retention_s: float = 600.0
    """How long terminal (ABORTED/RELEASED) records are kept so late retries get
    DUPLICATE/STALE answers instead of NOT_FOUND."""



    redis_timeout_s: float = 2.0
    """Socket connect/read timeout; past it the call raises DirectoryUnavailable."""

    redis_retries: int = 2
    """Reconnect attempts per call. Safe because every script is idempotent by
    transfer id / epoch (a retried reserve answers DUPLICATE)."""

    def __post_init__(self) -> None:
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must be redis://, rediss:// or unix://: {self.redis_url!r}")
        if not self.key_prefix or any(c.isspace() for c in self.key_prefix):
            raise ValueError(f"key_prefix must be non-empty without spaces: {self.key_prefix!r}")
        for name in ("lease_ttl_s", "txn_ttl_s", "redis_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.record_retention_s < 0:
            raise ValueError("record_retention_s must be >= 0")
        if self.redis_retries < 0:
            raise ValueError("redis_retries must be >= 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> DirectoryConfig:
        """Defaults, then ``PD_*`` variables from ``env`` (default os.environ), then ``overrides``."""
        kwargs = env_overrides(cls, ENV_OVERRIDES, env)
        kwargs.update(overrides)
        return cls(**kwargs)


# The one table of environment overrides: variable -> field.
ENV_OVERRIDES: dict[str, str] = {
    "PD_REDIS_URL": "redis_url",
    "PD_DIRECTORY_KEY_PREFIX": "key_prefix",
    "PD_DIRECTORY_LISTEN": "listen_addr",
    "PD_LEASE_TTL_S": "lease_ttl_s",
    "PD_TXN_TTL_S": "txn_ttl_s",
    "PD_RECORD_RETENTION_S": "record_retention_s",
    "PD_REDIS_TIMEOUT_S": "redis_timeout_s",
    "PD_REDIS_RETRIES": "redis_retries",
}

