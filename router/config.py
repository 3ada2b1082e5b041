"""Configuration of the router: one frozen dataclass, env overrides in one table."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.common.config import env_overrides

MODES = ("disaggregated", "colocated")


@dataclasses.dataclass(frozen=True, slots=True)
class RouterConfig:
    """Everything the router needs to run; build with ``from_env()``."""

    listen_addr: str = "127.0.0.1:50080"
    """gRPC listen address of the Router and Admin services."""

    directory_addr: str = "127.0.0.1:50070"
    """host:port of the directory service."""

    default_mode: str = "disaggregated"
    """Route for requests with mode UNSPECIFIED: ``disaggregated`` or ``colocated``.
    Admin.SetMode changes it at run time (PINNED -> colocated, ACTIVE -> disaggregated)."""

    model: str = ""
    """Checkpoint directory or preset name. Only the tokenizer is used here: a
    directory with ``tokenizer.json`` enables text prompts and token text;
    presets have no tokenizer."""

    router_id: str = "router"
    """Name the router gives as worker_id in directory calls it makes (Abort);
    the directory fences only a transaction's own ends by epoch."""

    default_tenant: str = "default"
    """Tenant of requests that name none (the directory requires one)."""

    max_tokens_limit: int = 4096
    """Largest max_tokens a request may ask for."""

    max_attempts: int = 3
    """Generations one request may use in total (disaggregated plus colocated)."""

    max_disaggregated_attempts: int = 2
    """Of those, how many may be disaggregated (each on a distinct (P, D) pair);
    the rest are colocated recomputes on decode-capable workers."""

    default_deadline_ms: int = 120_000
    """Request time budget when GenerateRequest.deadline_ms is 0; 0 = none."""

    reserve_timeout_s: float = 5.0
    """Deadline of Decode.Reserve."""

    directory_timeout_s: float = 2.0
    """Deadline of each directory call (snapshot, reserve, abort, list)."""

    prefill_timeout_s: float = 60.0
    """Deadline of Prefill.Prefill (compute plus hand-off)."""

    first_token_timeout_s: float = 60.0
    """Longest wait for token 0 of an attempt (DecodeStream or Generate)."""

    token_timeout_s: float = 30.0
    """Longest gap between two tokens of one attempt before it counts as failed."""

    cancel_timeout_s: float = 1.0
    """Deadline of each Cancel / Abort sent while tearing an attempt down."""

    snapshot_max_age_ms: int = 100
    """A cluster snapshot younger than this is reused instead of asking the directory."""

    snapshot_stale_limit_ms: int = 5_000
    """When the directory is unreachable, a cached snapshot up to this old still
    places requests (colocated routes need no directory)."""

    overlay_ttl_ms: int = 5_000
    """Longest the router counts its own dispatch against a worker's load before
    trusting the worker's heartbeat to show it (backstop if heartbeats are not
    detected)."""

    failure_cooldown_ms: int = 3_000
    """After a worker's own call fails (unreachable or hung), new requests avoid
    it for this long unless nothing else can serve them (its lease may not have
    expired in the directory yet)."""

    log_level: str = "INFO"
    """Python logging level name."""

    def __post_init__(self) -> None:
        if self.default_mode not in MODES:
            raise ValueError(f"default_mode must be one of {MODES}, got {self.default_mode!r}")
        for name in ("default_tenant", "router_id", "directory_addr"):
            if not getattr(self, name):
                raise ValueError(f"{name} must be non-empty")
        for name in ("max_tokens_limit", "max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.max_disaggregated_attempts <= self.max_attempts:
            raise ValueError("max_disaggregated_attempts must be in [0, max_attempts]")
        for name in ("reserve_timeout_s", "directory_timeout_s", "prefill_timeout_s",
                     "first_token_timeout_s", "token_timeout_s", "cancel_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("default_deadline_ms", "snapshot_max_age_ms", "snapshot_stale_limit_ms",
                     "overlay_ttl_ms", "failure_cooldown_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "RouterConfig":
        """Defaults, then ``PD_*`` variables from ``env`` (default os.environ), then ``overrides``."""
        kwargs = env_overrides(cls, ENV_OVERRIDES, env)
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kwargs)


# The one table of environment overrides: variable -> field.
ENV_OVERRIDES: dict[str, str] = {
    "PD_ROUTER_LISTEN": "listen_addr",
    "PD_DIRECTORY_ADDR": "directory_addr",
    "PD_ROUTER_MODE": "default_mode",
    "PD_MODEL": "model",
    "PD_ROUTER_ID": "router_id",
    "PD_ROUTER_DEFAULT_TENANT": "default_tenant",
    "PD_ROUTER_MAX_TOKENS": "max_tokens_limit",
    "PD_ROUTER_MAX_ATTEMPTS": "max_attempts",
    "PD_ROUTER_MAX_DISAGGREGATED_ATTEMPTS": "max_disaggregated_attempts",
    "PD_ROUTER_DEADLINE_MS": "default_deadline_ms",
    "PD_ROUTER_RESERVE_TIMEOUT_S": "reserve_timeout_s",
    "PD_ROUTER_DIRECTORY_TIMEOUT_S": "directory_timeout_s",
    "PD_ROUTER_PREFILL_TIMEOUT_S": "prefill_timeout_s",
    "PD_ROUTER_FIRST_TOKEN_TIMEOUT_S": "first_token_timeout_s",
    "PD_ROUTER_TOKEN_TIMEOUT_S": "token_timeout_s",
    "PD_ROUTER_CANCEL_TIMEOUT_S": "cancel_timeout_s",
    "PD_ROUTER_SNAPSHOT_MAX_AGE_MS": "snapshot_max_age_ms",
    "PD_ROUTER_SNAPSHOT_STALE_LIMIT_MS": "snapshot_stale_limit_ms",
    "PD_ROUTER_OVERLAY_TTL_MS": "overlay_ttl_ms",
    "PD_ROUTER_FAILURE_COOLDOWN_MS": "failure_cooldown_ms",
    "PD_LOG_LEVEL": "log_level",
}

