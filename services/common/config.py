"""`PD_*` environment overrides for the services' frozen config dataclasses.

Each config class keeps its own table (variable -> field); this module parses
the variables present into typed keyword arguments, with an error that names
the variable when a value does not parse.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any


def _bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


# Field annotations are strings (postponed evaluation); these are the ones configs use.
_PARSERS = {"str": str, "int": int, "float": float, "bool": _bool}


def env_overrides(cls: type, table: Mapping[str, str], env: Mapping[str, str] | None = None,
                  skip_empty: bool = False) -> dict[str, Any]:
    """Keyword arguments for `cls` from the variables of `table` set in `env` (default
    os.environ); with `skip_empty`, a variable set to '' counts as unset."""
    env = os.environ if env is None else env
    types = {f.name: f.type if isinstance(f.type, str) else f.type.__name__
             for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for var, field in table.items():
        raw = env.get(var)
        if raw is None or (skip_empty and raw == ""):
            continue
        kind = types[field]
        try:
            kwargs[field] = _PARSERS[kind](raw)
        except ValueError as exc:
            raise ValueError(f"{var}={raw!r}: expected {kind}") from exc
    return kwargs
