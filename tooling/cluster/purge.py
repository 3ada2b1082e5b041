"""`pdserve down --purge`: the local cluster's state dir removed once its processes are
stopped, so that the next `pdserve up` starts from clean state.

What a state dir keeps across `pdserve down`, and why it is kept otherwise:

    appendonly.aof (Redis 6), appendonlydir/ (7)   the directory's state: fences, transfer
                                    transactions and the release record, so a rolled-back
                                    release stays ROLLED_BACK across restarts (docs/design.md,
                                    The release)
    release.json                    the release as the last drill recorded it
    logs/, traces/                  each process's log, the spans
    tls/, redis.conf                the CA, the certificates, Redis's password (`up` makes
                                    them anew)

Only the state dir goes: the virtual environment, checkpoints and anything else outside it
stay, and a folder that holds the running Python's environment, the working directory or
the repository is refused rather than removed.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .launcher import REPO_ROOT

MARKERS = ("redis.conf", "cluster.json", "tls")
"""What `pdserve up` writes into a state dir before anything else can fail: a folder with
none of them is not one, and is never removed."""


class NotPurged(ValueError):
    """The folder named is not one `purge` may remove (the message says why)."""


def purge(state_dir: str | Path) -> bool:
    """Remove the state dir `state_dir` whole (its processes stopped first: `pdserve down`).
    False when there was none; NotPurged when the folder is not a local cluster's own."""
    state = Path(state_dir).resolve()
    if not state.exists():
        return False
    if not state.is_dir() or not any((state / name).exists() for name in MARKERS):
        raise NotPurged(f"{state} is not a pdserve state dir (it holds none of {', '.join(MARKERS)}): "
                        "nothing removed")
    for kept, what in ((Path(sys.prefix), "the Python environment"), (Path.cwd(), "the working directory"),
                       (REPO_ROOT, "the repository")):
        kept = kept.resolve()
        if kept == state or state in kept.parents:
            raise NotPurged(f"{state} holds {what} ({kept}): nothing removed")
    shutil.rmtree(state)
    return True
