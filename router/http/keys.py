"""Bearer API keys, each mapped to one tenant, stored only as their SHA-256.

The key file (PD_ROUTER_API_KEYS; a Secret in the chart) holds one key a line:

    # comment
    <tenant> sha256:<64 hex digits>

A key is 32 random bytes (`create`): with that much entropy one SHA-256 is what a
password hash's stretching buys for guessable secrets, at a microsecond a request. A
presented key is hashed and looked up; the file is read again when it changes (a
Secret's update, `pdserve api-key create`), checked at most once a second.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import secrets
import time
from pathlib import Path

from pdserve_client import contract
from runtime.common.private_files import private_open

log = logging.getLogger(__name__)

PREFIX = "pds-"
"""What every key starts with: a leaked one is recognizable (secret scanners match prefixes)."""
HASH_SCHEME = "sha256:"
RECHECK_S = 1.0
"""How often the file's identity (inode, size, mtime) is compared with the one read."""


class KeyFileError(ValueError):
    """The key file cannot be used; the message names the file and the line."""


def digest(key: str) -> str:
    """The stored form of `key`."""
    return HASH_SCHEME + hashlib.sha256(key.encode()).hexdigest()


def create(tenant: str) -> tuple[str, str]:
    """A new key for `tenant`: (the key, shown once; the line the key file keeps)."""
    check_tenant(tenant)
    key = PREFIX + secrets.token_urlsafe(32)
    return key, f"{tenant} {digest(key)}"


def check_tenant(tenant: str) -> None:
    """A tenant a key file line can hold: no whitespace, not empty, within the router's limit."""
    if not tenant or any(c.isspace() for c in tenant):
        raise KeyFileError(f"tenant {tenant!r} must be non-empty and without whitespace")
    if len(tenant.encode()) > contract.MAX_TENANT_BYTES:
        raise KeyFileError(f"tenant is {len(tenant.encode())} bytes; at most {contract.MAX_TENANT_BYTES}")


def parse(text: str, source: str) -> dict[str, str]:
    """Key file text -> {stored hash: tenant}; KeyFileError names the bad line."""
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        hexpart = parts[1][len(HASH_SCHEME):] if len(parts) == 2 and parts[1].startswith(HASH_SCHEME) else ""
        if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
            raise KeyFileError(f"{source}:{n}: expected '<tenant> {HASH_SCHEME}<64 lowercase hex digits>'")
        try:
            check_tenant(parts[0])
        except KeyFileError as exc:
            raise KeyFileError(f"{source}:{n}: {exc}") from None
        out[parts[1]] = parts[0]
    return out


def append(path: str | Path, line: str) -> None:
    """Add a key line to the file at `path`, created private (0600) when missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with private_open(path, "a") as f:
        f.write(line + "\n")


@dataclasses.dataclass
class ApiKeys:
    """The keys of one file, re-read when it changes. A file that became unreadable or
    malformed keeps the keys last read (logged): a bad edit does not lock every client out."""

    path: Path
    _keys: dict[str, str] = dataclasses.field(default_factory=dict)
    _identity: tuple[int, int, int] | None = None
    _checked_s: float = float("-inf")

    @classmethod
    def load(cls, path: str | Path) -> ApiKeys:
        """The keys in `path`; KeyFileError when it cannot be read or parsed now."""
        keys = cls(Path(path))
        try:
            keys._read(os.stat(keys.path))
        except OSError as exc:
            raise KeyFileError(f"API key file {path}: {exc.strerror}") from None
        return keys

    def __len__(self) -> int:
        return len(self._keys)

    def tenant_of(self, key: str) -> str | None:
        """The tenant `key` authenticates, or None."""
        self._refresh()
        return self._keys.get(digest(key))

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked_s < RECHECK_S:
            return
        self._checked_s = now
        try:
            st = os.stat(self.path)
            if (st.st_ino, st.st_size, st.st_mtime_ns) != self._identity:
                self._read(st)
        except (OSError, KeyFileError) as exc:
            log.error("API key file %s not re-read (keeping the %d keys read before): %s",
                      self.path, len(self._keys), exc)

    def _read(self, st: os.stat_result) -> None:
        self._keys = parse(self.path.read_text(), str(self.path))
        self._identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        log.info("API keys: %d key(s) for %d tenant(s) from %s", len(self._keys),
                 len(set(self._keys.values())), self.path)
