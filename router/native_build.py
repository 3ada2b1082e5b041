"""Compile the router's per-request modules (router/native.py) with Cython.

    python -m router.native_build [build] [--strict]   compile the modules whose
                                                      current source has no build
    python -m router.native_build status              which modules run compiled

`build` exits 0 when the compiler is missing or fails (the router then runs its
Python source, and says so on stderr) unless --strict; `status` exits 1 when a
module runs from source while builds are enabled.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from router.native import _SUFFIX, BUILD_DIR, MODULES, ROOT, TYPED, build_path, enabled, missing, source_of, status
from runtime.common.native import build_command, install_file, prepare_build_dir, run_build_ext

DIRECTIVES = {"language_level": 3, "annotation_typing": False}
"""Plain modules: annotations ignored (Python semantics). TYPED modules are built with
annotation_typing on (and their `# cython:` header line: no bounds checks)."""

CFLAGS = ["-ffp-contract=off"]
"""No fused multiply-add: every double operation rounds as Python's float does."""


def build(modules: list[str] | None = None, jobs: int = 2) -> list[Path]:
    """Compile `modules` (default: those missing) into BUILD_DIR and remove builds of
    sources that no longer exist. Raises when Cython or the compiler fails."""
    todo = missing() if modules is None else modules
    prepare_build_dir(BUILD_DIR, {build_path(m) for m in MODULES})
    if not todo:
        return []
    from Cython.Build import cythonize  # only the build needs Cython
    from setuptools import Extension

    with tempfile.TemporaryDirectory(prefix="pd-native-") as tmp:
        cwd = os.getcwd()
        os.chdir(ROOT)  # Cython names each module by its path under the package root
        try:
            exts = []
            for typed in (False, True):
                group = [Extension(m, [str(source_of(m).relative_to(ROOT))], extra_compile_args=CFLAGS)
                         for m in todo if (m in TYPED) == typed]
                if group:
                    exts += cythonize(group, build_dir=str(Path(tmp) / "c"), quiet=True, nthreads=jobs,
                                      compiler_directives={**DIRECTIVES, "annotation_typing": typed})
            run_build_ext(exts, Path(tmp) / "lib", Path(tmp) / "tmp", jobs)
        finally:
            os.chdir(cwd)
        out = []
        for m in todo:
            dest = build_path(m)
            install_file(Path(tmp, "lib", *m.split(".")).with_suffix(_SUFFIX), dest)
            out.append(dest)
        return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cmd = next((a for a in args if not a.startswith("-")), "build")
    if cmd == "build":
        return build_command(
            "router.native_build", build, "the router runs its Python source",
            lambda done: f"{len(done)} module(s) compiled; {len(MODULES) - len(missing())}/{len(MODULES)} "
                         f"have a build for their current source", "--strict" in args)
    if cmd == "status":
        st = status()
        for m, c in st.items():
            print(f"{m}: {'compiled' if c else 'python'}")
        if not enabled():
            print("(builds turned off by PD_ROUTER_NATIVE)")
        return 0 if all(st.values()) or not enabled() else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
