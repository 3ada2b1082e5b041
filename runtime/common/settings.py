"""Declarative service settings: one pydantic-settings class per service, `PD_*` names on the fields.

Every setting is a field declared with `env(name, default, ...)`: its variable, its
default, its bounds (pydantic constraints) and a docstring, in one place. Building:

    Cls(**fields)                 defaults + arguments (no environment: a test's or a
                                  bench's config never depends on the shell it ran in)
    Cls.from_env(env, **flags)    defaults, then the variables of `env` (default
                                  os.environ), then the flags that are not None

`from_env` reads the variables through pydantic-settings' own env source, fed the
given mapping. A bad value raises `SettingsError` (a ValueError) with one line that
names the variable or field and the problem; cross-field checks are model
validators and report the same way.

One variable, one owner: a variable is declared by exactly one class; a service
that needs it inherits that class (`ServiceSettings`: the log level;
`MemberSettings`: the directory address and the model, which the router and the
workers share). tests/unit/common/test_settings.py walks every class and pins it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from pdserve_client import contract

_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("pd_settings_environ", default=None)
"""The mapping `from_env` reads while it builds; None (plain construction) reads nothing."""


def env(name: str, default: Any, **constraints: Any) -> Any:
    """A settings field read from variable `name` (exactly as spelled), with pydantic
    constraints (gt, ge, le, ...) checked whatever the value came from."""
    assert name.startswith("PD_"), name
    return Field(default, validation_alias=name, **constraints)


class SettingsError(ValueError):
    """A setting that does not parse or validate; the message is one line."""


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' env source over a given mapping instead of os.environ (the
    override point its dotenv source uses too)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


class Settings(BaseSettings):
    """Base of every settings class: frozen, unknown fields refused, variables matched
    exactly (case-sensitive), field docstrings kept as descriptions."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", case_sensitive=True, validate_by_name=True,
                                      validate_by_alias=True, use_attribute_docstrings=True, env_ignore_empty=False)

    def __init__(self, **values: Any):
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(render_errors(type(self), exc)) from None

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        """Arguments first, then the environment `from_env` was given; no dotenv, no secrets dir."""
        environ = _ENVIRON.get()
        if environ is None:
            return (init_settings,)
        return init_settings, _MappingEnvSource(settings_cls, environ)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any):
        """Defaults, then the class's variables in `env` (default os.environ), then the
        `overrides` that are not None (command-line flags left unset are None)."""
        token = _ENVIRON.set(os.environ if env is None else env)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        finally:
            _ENVIRON.reset(token)

    def replace(self, **changes: Any):
        """A copy with `changes`, validated again (the frozen dataclasses' dataclasses.replace)."""
        return type(self)(**{**self.model_dump(), **changes})

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Variable -> field, for every field of this class (inherited ones included)."""
        return {f.validation_alias: name for name, f in cls.model_fields.items()}


def render_errors(cls: type[Settings], exc: ValidationError) -> str:
    """A ValidationError as one line: each problem with the variable (and field) it is about."""
    fields = {f.validation_alias: name for name, f in cls.model_fields.items()}
    variables = {name: var for var, name in fields.items()}
    parts = []
    for err in exc.errors(include_url=False):
        loc = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        if loc in fields:  # read from the environment
            parts.append(f"{loc}={err['input']!r} ({fields[loc]}): {msg}")
        elif loc in variables:  # an argument (a flag, or code)
            parts.append(f"{loc}={err['input']!r} ({variables[loc]}): {msg}")
        else:  # a cross-field check, or an unknown argument
            parts.append(f"{loc + ': ' if loc else ''}{msg}")
    return f"{cls.__name__}: " + "; ".join(parts)


class ServiceSettings(Settings):
    """What every service process has: its log level."""

    log_level: str = env("PD_LOG_LEVEL", "INFO")
    """Python logging level name."""

    metrics_listen: str = env("PD_METRICS_LISTEN", "")
    """host:port of this process's /metrics (HTTPS with client certificates; port 0
    picks one); empty = no metrics endpoint. `pdserve up` gives every process one."""


class MemberSettings(ServiceSettings):
    """What the processes that join the cluster through the directory share (the router
    and the workers): where the directory is, and which model the cluster serves."""

    directory_addr: str = env(contract.DIRECTORY_ADDRESS_ENV, contract.DEFAULT_DIRECTORY_ADDRESS)
    """host:port of the directory service."""

    model: str = env("PD_MODEL", "tiny")
    """Preset name (tiny, small, name@seed) or checkpoint directory. The router uses only
    its tokenizer: a directory with ``tokenizer.json`` enables text prompts and token
    text; presets have none."""

    @model_validator(mode="after")
    def _member_names(self):
        if not self.directory_addr:
            raise ValueError("directory_addr must be non-empty")
        return self
