"""Compiled builds of the router's per-request modules, with the Python source as fallback.

A routing decision (router/pricing/decision.py over router/pricing/cost_table.py) is a few
hundred small float operations and tuple moves per request; the interpreter's
dispatch is most of its cost. The modules below are compiled with Cython into
extension modules: unchanged Python (no second implementation: the source
stays the definition and the fallback), except router/pricing/formula.py, whose
per-row loops are annotated with C types (`TYPED`) and run as plain Python
without a build. bench/router.py prints both ways.

Builds live in `router/_native/` (not in git), one file per module named by a
hash of its source and of the shared C declarations (`SHARED`):

    router/_native/router.pricing.cost_table.<sha256 of the source + SHARED, 16 hex>.<EXT_SUFFIX>

The compiled pricing modules call router/pricing/formula.py's terms as C functions
(cimported through formula.pxd), which needs formula's build, made from the same
declarations, to be the one loaded: so formula.py and formula.pxd are part of every
module's hash, and an edit to either sends every module back to its source together.

`install()` (called by router/__init__.py) puts a finder in front of the import
system that loads a module's build only when one exists for the module's
current source; an edited module falls back to its source until rebuilt, so a
stale build can never run. PD_ROUTER_NATIVE=0 turns the builds off (the pure
Python path, e.g. to compare). `python -m router.native_build` compiles what is
missing (`make` runs it before `run` and `test`; it needs Cython and a C
compiler, and without them the router runs its source);
`python -m router.native_build status` says which modules run compiled.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

from runtime.common.native import EXT_SUFFIX, tagged_path

MODULES = (
    "router.pricing.candidate",
    "router.pricing.corrections",
    "router.pricing.cost_model",
    "router.pricing.cost_table",
    "router.pricing.decision",
    "router.pricing.formula",
    "router.pricing.interference",
    "router.pricing.prefix_index",
    "router.pricing.routes",
    "router.pricing.scorers.base",
    "router.pricing.scorers.kv_headroom",
    "router.pricing.scorers.prefix_hit",
    "router.pricing.scorers.queue",
    "router.pricing.scorers.tpot_slack",
    "router.pricing.scorers.ttft_slack",
    "router.pricing.shapes",
    "router.pricing.worker_costs",
)
"""The per-request path: pricing, interference, scoring, choosing, prefix matching."""

TYPED = ("router.pricing.formula",)
"""Modules written for Cython's pure-Python mode: their annotations (cython.double,
typed memoryviews) are C types when compiled. The others are compiled with
annotations ignored, so they keep Python's semantics exactly."""

ROOT = Path(__file__).resolve().parent.parent
"""The directory holding the `router` package."""

SHARED = ("router/pricing/formula.py", "router/pricing/formula.pxd")
"""Files every build depends on (relative to ROOT): the terms other modules cimport."""


def build_dir(root: Path) -> Path:
    """Where the builds of the package under `root` live."""
    return root / "router" / "_native"


BUILD_DIR = build_dir(ROOT)

ENV = "PD_ROUTER_NATIVE"
_SUFFIX = EXT_SUFFIX


def source_of(module: str, root: Path = ROOT) -> Path:
    """The .py file of `module` (a name in MODULES) under `root`."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def build_path(module: str, root: Path | None = None) -> Path | None:
    """Where the build of `module`'s current source lives (it may not exist), or None
    when the source is missing. `root`: the directory holding the package (tests)."""
    root = ROOT if root is None else root
    try:
        data = source_of(module, root).read_bytes()
    except OSError:
        return None
    return tagged_path(build_dir(root), module, data + shared_bytes(root))


def shared_bytes(root: Path = ROOT) -> bytes:
    """The contents of the SHARED files under `root` (a missing one counts as empty)."""
    parts = []
    for name in SHARED:
        try:
            parts.append((root / name).read_bytes())
        except OSError:
            parts.append(b"")
    return b"\0".join(parts)


def enabled() -> bool:
    """False when PD_ROUTER_NATIVE=0 (or "false"/"no"/"off")."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class Finder(importlib.abc.MetaPathFinder):
    """Loads a module of `modules` from its build for the current source, when one exists;
    otherwise defers to the normal import (the source)."""

    def __init__(self, modules: tuple[str, ...] = MODULES, root: Path | None = None):
        self.modules = frozenset(modules)
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.modules:
            return None
        so = build_path(fullname, self.root)
        if so is None or not so.is_file():
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


def install() -> None:
    """Put the finder first in sys.meta_path (once), unless PD_ROUTER_NATIVE=0."""
    if enabled() and not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, Finder())


def compiled(module: str) -> bool:
    """Whether the imported `module` runs from a build."""
    mod = sys.modules.get(module)
    return mod is not None and str(getattr(mod, "__file__", "")).endswith(_SUFFIX)


def status() -> dict[str, bool]:
    """Module -> whether it runs compiled, importing each."""
    for m in MODULES:
        importlib.import_module(m)
    return {m: compiled(m) for m in MODULES}


def missing() -> list[str]:
    """The modules with no build for their current source."""
    return [m for m in MODULES if (p := build_path(m)) is not None and not p.is_file()]
