"""Compiled extension modules named by their source, shared by the router and the engine.

A build is only ever loaded for the exact source (and build flags) it was made
from: its file name carries a hash of them,

    <build dir>/<stem>.<sha256 of source + flags + EXT_SUFFIX, 16 hex><EXT_SUFFIX>

so an edited source never runs a stale build; it falls back (router: its Python
source; engine: torch's kernels) until `make native` rebuilds it. Builds go
through setuptools' `build_ext` (it knows the platform's compiler and Python's
headers) into a temporary folder, then move into place with an atomic rename,
so processes that build at the same time never load half a file.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

EXT_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
"""The platform's extension-module suffix, e.g. `.cpython-311-x86_64-linux-gnu.so`."""


def tagged_path(build_dir: Path, stem: str, data: bytes) -> Path:
    """Where the build of `data` (source bytes, plus anything else that changes the
    binary) named `stem` lives; it may not exist."""
    tag = hashlib.sha256(data + EXT_SUFFIX.encode()).hexdigest()[:16]
    return build_dir / f"{stem}.{tag}{EXT_SUFFIX}"


def prepare_build_dir(build_dir: Path, keep: set[Path]) -> None:
    """Create `build_dir` (git-ignored) and remove the builds not in `keep`."""
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / ".gitignore").write_text("*\n")
    for old in build_dir.glob(f"*{EXT_SUFFIX}"):
        if old not in keep:
            old.unlink(missing_ok=True)


def run_build_ext(extensions: Sequence, lib_dir: Path, temp_dir: Path, jobs: int = 1) -> None:
    """Compile setuptools `Extension`s into lib_dir (raises when the compiler fails)."""
    from setuptools import Distribution  # only a build needs setuptools
    from setuptools.command.build_ext import build_ext

    cmd = build_ext(Distribution({"name": "pdserve-native", "ext_modules": list(extensions)}))
    cmd.build_lib, cmd.build_temp, cmd.parallel = str(lib_dir), str(temp_dir), jobs
    cmd.ensure_finalized()
    cmd.run()


def install_file(built: Path, dest: Path) -> None:
    """Move a finished build to `dest` atomically (a reader sees all of it or nothing)."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".partial-")
    os.close(fd)
    shutil.copyfile(built, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)


def load_extension(name: str, path: Path) -> ModuleType:
    """Import the extension module `name` from the file `path`."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def build_command(prog: str, build: Callable[[], object], fallback: str,
                  summary: Callable[[object], str], strict: bool) -> int:
    """`python -m <prog> build`: run `build()` and print `summary(result)`; when the
    compiler or Cython fails, say why and what runs instead (`fallback`). Exit code 0,
    or 1 for a failed build with --strict (`strict`)."""
    try:
        done = build()
    except Exception as e:  # noqa: BLE001 - the service still runs without the build: say so
        print(f"{prog}: build failed ({type(e).__name__}: {e}); {fallback}", file=sys.stderr)
        return 1 if strict else 0
    print(f"{prog}: {summary(done)}")
    return 0
