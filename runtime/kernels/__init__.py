"""The engine's compiled exact kernels (exact.cpp): build, load, choose.

    python -m runtime.kernels [build] [--strict]   compile them if their source has no build
    python -m runtime.kernels status               which kernels this process would run

`make` builds them (target `native`) before `run`, `test` and the benchmarks. The
build lives in runtime/kernels/_native/ (not in git), named by a hash of the
source and flags (runtime/common/native.py), so an edited kernel never runs a
stale build. This package imports nothing heavy: the engine (runtime/engine/ops.py)
loads the kernels, the build needs only setuptools and a C++ compiler.

Which kernel the engine runs (PD_ENGINE_KERNEL):
  auto    (default) the compiled kernel when its build exists, else torch's;
  pdkernels  the compiled kernel, or an error at start when it is missing;
  torch   torch's BLAS (MKL / oneDNN / OpenBLAS). Not row-invariant by construction:
          the worker's start-up self-check decides whether it may hand off K/V.
PD_KERNEL_ISA picks the compiled kernel's code path: auto (AVX2+FMA where the CPU
has it), avx2, or portable (std::fma, what aarch64 runs). Every path gives the
same bits; the switch exists so tests can show that on one machine.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from types import ModuleType

from runtime.common.native import (
    EXT_SUFFIX,
    install_file,
    load_extension,
    prepare_build_dir,
    run_build_ext,
    tagged_path,
)

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "exact.cpp"
BUILD_DIR = HERE / "_native"
NAME = "_pdkernels"

CFLAGS = ("-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off", "-fno-fast-math")
"""No contraction or reassociation beyond the kernel's own explicit FMAs (exact.cpp)."""
LDFLAGS = ("-fopenmp",)
"""OpenMP from libgomp.so.1: torch is imported first, so the kernel shares torch's copy
(same soname) and its thread pool rather than starting a second runtime."""

FAMILY = "pdkernels-3"
"""Names the engine's numerics in the cache ABI. Must change whenever exact.cpp, the
element-wise ops beside it (runtime/engine/ops.py) or the sampler's draw could change a
result bit (chain order, initial value, a new code path that differs). 2: RMSNorm's
square root correctly rounded on every CPU (torch's ran MKL's vector sqrt on some AVX-512
hosts). 3: the sampler's own inverse-CDF draw instead of torch.multinomial's."""

ENV_KERNEL = "PD_ENGINE_KERNEL"
ENV_ISA = "PD_KERNEL_ISA"
ISAS = {"auto": 0, "portable": 1, "avx2": 2}
"""Must match enum Isa in exact.cpp."""


def build_path() -> Path:
    """Where the build of the current source and flags lives (it may not exist)."""
    data = SOURCE.read_bytes() + " ".join(CFLAGS + LDFLAGS).encode()
    return tagged_path(BUILD_DIR, NAME, data)


def build() -> Path | None:
    """Compile the kernel if its current source has no build; returns the new build or
    None when it was already there. Raises when the compiler fails."""
    dest = build_path()
    prepare_build_dir(BUILD_DIR, {dest})
    if dest.is_file():
        return None
    from setuptools import Extension

    ext = Extension(NAME, [str(SOURCE)], language="c++", extra_compile_args=list(CFLAGS),
                    extra_link_args=list(LDFLAGS))
    with tempfile.TemporaryDirectory(prefix="pd-kernel-") as tmp:
        run_build_ext([ext], Path(tmp) / "lib", Path(tmp) / "tmp")
        install_file(Path(tmp, "lib", NAME + EXT_SUFFIX), dest)
    return dest


def choice() -> str:
    """PD_ENGINE_KERNEL, checked: auto, pdkernels or torch."""
    value = os.environ.get(ENV_KERNEL, "auto").strip().lower() or "auto"
    if value not in ("auto", "pdkernels", "torch"):
        raise ValueError(f"{ENV_KERNEL}={value!r}: expected auto, pdkernels or torch")
    return value


def isa() -> int:
    """PD_KERNEL_ISA as the kernel's enum value."""
    value = os.environ.get(ENV_ISA, "auto").strip().lower() or "auto"
    if value not in ISAS:
        raise ValueError(f"{ENV_ISA}={value!r}: expected one of {sorted(ISAS)}")
    return ISAS[value]


def load() -> ModuleType | None:
    """The compiled kernel module, or None when the engine runs torch's kernels."""
    import torch  # noqa: F401 - first, so the kernel's libgomp.so.1 resolves to torch's

    wanted = choice()
    if wanted == "torch":
        return None
    path = build_path()
    if not path.is_file():
        if wanted == "pdkernels":
            raise RuntimeError(f"{ENV_KERNEL}=pdkernels but {SOURCE.name} has no build "
                               f"(run `make native` or `python -m runtime.kernels`)")
        log.warning("no build of %s for its current source; the engine runs torch's kernels, "
                    "which are not row-invariant by construction (`make native` builds it)",
                    SOURCE.name)
        return None
    return load_extension(NAME, path)
