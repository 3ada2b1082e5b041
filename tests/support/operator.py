"""An operator's shell around a local cluster: the folder it works from and the environment it works with.

`pdserve up` there writes ./.pdserve; `pdctl` run there finds it, as long as the shell carries no
certificate, router or cluster settings of the test's own that would send it elsewhere.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tooling.cluster.launcher import REPO_ROOT, LocalCluster

OPERATOR_SETTINGS = ("PD_TLS_", "PD_INSECURE", "PD_ROUTER", "PD_CLUSTER")
"""Environment a test's own shell may hold that would send pdctl elsewhere than ./.pdserve."""


def operator_env() -> dict[str, str]:
    """The virtualenv's scripts first on PATH, none of OPERATOR_SETTINGS, this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OPERATOR_SETTINGS)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'client'}"
    return env


@contextmanager
def operator_home(tmp_path_factory, name: str) -> Iterator[Path]:
    """A fresh folder to run a local cluster from; whatever cluster it holds at the end is taken down."""
    home = tmp_path_factory.mktemp(name)
    try:
        yield home
    finally:
        try:
            LocalCluster.load(str(home / ".pdserve")).down()
        except FileNotFoundError:
            pass
