"""`make image` finds its builder (buildah, then podman, then docker) under every POSIX shell.

The Makefile's `$(shell ...)` runs in make's SHELL, /bin/sh: dash on Debian and Ubuntu, whose
`command -v` given several names answers for none once the first is missing. Each case runs
`make -n image` with SHELL set to the shell under test and a PATH holding only stand-in tools,
and reads which builder the build line starts with (deploy/README.md, Building).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO

SHELLS = ["/bin/dash", "/bin/bash"]


def builder_line(shell: str, path: str) -> str:
    """The `... build -f deploy/Containerfile` line `make -n image` prints, with only `path` on PATH
    (make itself is named by its absolute path; nothing else of the caller's environment goes in)."""
    if not os.access(shell, os.X_OK):
        pytest.skip(f"{shell} is not installed here")
    make = shutil.which("make")
    assert make, "make not found"
    proc = subprocess.run([make, "-n", "-C", str(REPO), "image", f"SHELL={shell}"], env={"PATH": path},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if " -f deploy/Containerfile " in ln]
    return line


def tools(root: Path, *names: str) -> str:
    """A folder holding an executable stand-in for each of `names` (never run by `make -n`)."""
    root.mkdir()
    for name in names:
        (root / name).write_text("#!/bin/sh\nexit 0\n")
        (root / name).chmod(0o755)
    return str(root)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("only", ["docker", "podman", "buildah"])
def test_the_one_builder_present_is_picked(tmp_path, shell, only):
    path = tools(tmp_path / "bin", only)
    assert builder_line(shell, path).split()[0] == f"{path}/{only}"


@pytest.mark.parametrize("shell", SHELLS)
def test_buildah_then_podman_then_docker(tmp_path, shell):
    """Across PATH folders, the order of preference holds, not the order on PATH."""
    late = tools(tmp_path / "late", "buildah")
    early = tools(tmp_path / "early", "docker", "podman")
    assert builder_line(shell, f"{early}:{late}").split()[0] == f"{late}/buildah"
    assert builder_line(shell, early).split()[0] == f"{early}/podman"


@pytest.mark.parametrize("shell", SHELLS)
def test_no_builder_is_reported(tmp_path, shell):
    """With none on PATH, the guard sees an empty BUILDER (it fails with its message when run)."""
    path = tools(tmp_path / "bin")
    assert builder_line(shell, path).split()[0] == "build"
    proc = subprocess.run([shutil.which("make"), "-s", "-C", str(REPO), "image", f"SHELL={shell}"],
                          env={"PATH": path}, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "needs buildah, podman or docker" in proc.stdout + proc.stderr
