"""Settings of the KV directory: one pydantic-settings class (runtime/common/settings.py).

Where Redis is, two ways:

    plain     PD_REDIS_URL=redis://[:PASSWORD@]HOST:PORT/DB
    Sentinel  PD_REDIS_SENTINELS=h1:26379,h2:26379,h3:26379  PD_REDIS_SENTINEL_MASTER=NAME
              PD_REDIS_URL=redis://[:PASSWORD@]/DB  (optional: no host, Sentinel names it)

The master's password is in the URL or in PD_REDIS_PASSWORD (one of the two: a
Kubernetes Secret maps onto the variable without URL-quoting); the Sentinels'
own password, if they have one, is PD_REDIS_SENTINEL_PASSWORD.
"""

from __future__ import annotations

import urllib.parse

from pydantic import field_validator, model_validator

from pdserve_client import contract
from runtime.common.settings import ServiceSettings, env


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
    """Reconnect attempts per call. Safe because every script is idempotent: the
    transitions by transfer id and state, the registry by epoch, a reserve and a nonce
    check by the call's attempt token (run again after a lost reply, they answer
    APPLIED, not DUPLICATE: tests/integration/test_directory_lost_reply.py)."""

    store_inline_budget_s: float = env("PD_STORE_INLINE_BUDGET_S", 0.01, ge=0)
    """The hand-off's store calls (Reserve, nonce check, transitions) are made on the
    event loop while Redis answers them within this (a twin client that gives up past
    it); slower, or unreachable, they go back to the thread pool for the cool-off below
    (kv_directory/store_calls.py). 0: always on the pool."""

    store_inline_cool_off_s: float = env("PD_STORE_INLINE_COOL_OFF_S", 5.0, gt=0)
    """After an inline call that was slow or gave up, the pool takes every call this long."""

    redis_password: str = env("PD_REDIS_PASSWORD", "")
    """Password of the Redis master (and its replicas); '' = the URL's, if any."""

    redis_sentinels: str = env("PD_REDIS_SENTINELS", "")
    """Comma-separated host:port of Redis Sentinels; '' = plain Redis at PD_REDIS_URL.
    With Sentinels the directory asks them for the master and follows a failover."""

    redis_sentinel_master: str = env("PD_REDIS_SENTINEL_MASTER", "")
    """The master's name as the Sentinels know it (``sentinel monitor NAME ...``)."""

    redis_sentinel_password: str = env("PD_REDIS_SENTINEL_PASSWORD", "")
    """Password of the Sentinels themselves ('' = they take none)."""

    redis_min_replicas_ack: int | None = env("PD_REDIS_MIN_REPLICAS_ACK", None, ge=0)
    """Replicas that must hold a fence-critical write (register, route epoch advance,
    nonce consume, publish) before its answer goes out (Redis ``WAIT``); fewer within
    ``redis_replica_ack_timeout_s`` answers DirectoryUnavailable. None = 1 with
    Sentinels, 0 without. See docs/design.md, "Redis failover"."""

    redis_replica_ack_timeout_s: float = env("PD_REDIS_REPLICA_ACK_TIMEOUT_S", 0.5, gt=0)
    """How long such a write waits for its replica acknowledgements."""

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be redis://, rediss:// or unix://")
        return url

    @model_validator(mode="after")
    def _one_redis(self):
        parts = urllib.parse.urlsplit(self.redis_url)
        if self.redis_password and parts.password is not None:
            raise ValueError("PD_REDIS_PASSWORD and a password in PD_REDIS_URL: give one of them")
        if not self.redis_sentinels:
            if self.redis_sentinel_master or self.redis_sentinel_password:
                raise ValueError("PD_REDIS_SENTINEL_MASTER/_PASSWORD need PD_REDIS_SENTINELS")
            return self
        self.sentinel_addresses()  # raises on a malformed list
        if not self.redis_sentinel_master:
            raise ValueError("PD_REDIS_SENTINELS needs PD_REDIS_SENTINEL_MASTER (the monitored master's name)")
        if parts.scheme == "unix":
            raise ValueError("PD_REDIS_SENTINELS and a unix:// PD_REDIS_URL: Sentinel names a TCP master")
        if "redis_url" in self.model_fields_set and parts.hostname:
            raise ValueError("PD_REDIS_SENTINELS and a PD_REDIS_URL with a host: give one of them "
                             "(with Sentinels the URL may carry only the password and db: redis://:PASSWORD@/DB)")
        return self

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``redis_sentinels`` as (host, port) pairs; [] without Sentinels."""
        out = []
        for item in filter(None, (s.strip() for s in self.redis_sentinels.split(","))):
            host, sep, port = item.rpartition(":")
            if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"PD_REDIS_SENTINELS entry {item!r} is not host:port")
            out.append((host.strip("[]"), int(port)))
        if self.redis_sentinels and not out:
            raise ValueError("PD_REDIS_SENTINELS names no host:port")
        return out

    @property
    def replicas_to_ack(self) -> int:
        """``redis_min_replicas_ack`` with its default filled in."""
        if self.redis_min_replicas_ack is not None:
            return self.redis_min_replicas_ack
        return 1 if self.redis_sentinels else 0

    def describe_redis(self) -> str:
        """Where Redis is, without a password, for logs."""
        if self.redis_sentinels:
            return f"sentinel master {self.redis_sentinel_master!r} via {self.redis_sentinels}"
        return redact_url(self.redis_url)

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
