"""The directory's Lua scripts as Redis runs them (kv_directory/redis_store.py): each
operation's text is

    <header rendered from states.py / records.py>  +  lua/_lib.lua  +  lua/<op>.lua

so the state numbers, the legal-transition table and the abort-reason outcomes have
one source of truth (``states.py``) and cannot drift from the in-memory store."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from runtime.directory.records import CAPACITY_FIELDS, LOAD_FIELDS
from runtime.directory.states import ABORT_OUTCOMES, LEGAL_SOURCES, Outcome, TxnState

LUA_DIR = Path(__file__).with_name("lua")
OPERATIONS = (
    "register", "heartbeat", "deregister", "reap", "snapshot",
    "reserve", "forward", "abort", "release", "lookup", "list_open",
    "route_epoch", "nonce", "release_record", "seal_key",
)


def lua_header() -> str:
    """Lua constants rendered from the Python enums and tables."""

    def table(pairs: Sequence[tuple[str, str]]) -> str:
        return "{" + ", ".join(f"[{k}] = {v}" for k, v in pairs) + "}"

    legal = [
        (str(new.value), table([(str(old.value), "true") for old in sorted(olds)]))
        for new, olds in LEGAL_SOURCES.items()
    ]
    return "\n".join([
        "-- Rendered by kv_directory/lua_scripts.py:lua_header() from states.py; do not edit.",
        "local ST = " + table([(json.dumps(s.name), str(s.value)) for s in TxnState]),
        "local OC = " + table([(json.dumps(o.name), str(o.value)) for o in Outcome]),
        "local LEGAL = " + table(legal),
        "local ABORT_OUTCOME = " + table([(json.dumps(r), str(o.value)) for r, o in ABORT_OUTCOMES.items()]),
        "local LOAD_FIELDS = {" + ", ".join(json.dumps(f) for f in LOAD_FIELDS) + "}",
        "local CAPACITY_FIELDS = {" + ", ".join(json.dumps(f) for f in CAPACITY_FIELDS) + "}",
        "",
    ])


def script_source(operation: str) -> str:
    """The full text sent to Redis for ``operation``."""
    lib = (LUA_DIR / "_lib.lua").read_text()
    body = (LUA_DIR / f"{operation}.lua").read_text()
    return f"{lua_header()}\n{lib}\n-- ---- {operation}.lua ----\n{body}"
