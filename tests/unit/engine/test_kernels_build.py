"""The exact kernels' build and choice (runtime/kernels): present after `make`,
loaded only for the source they were built from, chosen by PD_ENGINE_KERNEL."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runtime import kernels
from runtime.engine import ops


def test_the_engine_runs_the_built_kernels():
    assert kernels.build_path().is_file(), "no build of exact.cpp for its source (`make native`)"
    assert ops.KERNEL is not None and ops.kernel_family() == kernels.FAMILY


def test_a_build_is_named_by_its_source_and_flags(monkeypatch, tmp_path):
    src = tmp_path / "exact.cpp"
    src.write_bytes(kernels.SOURCE.read_bytes())
    monkeypatch.setattr(kernels, "SOURCE", src)
    monkeypatch.setattr(kernels, "BUILD_DIR", tmp_path / "_native")
    first = kernels.build_path()
    assert first.parent == tmp_path / "_native" and first.name.startswith("_pdkernels.")
    monkeypatch.setattr(kernels, "CFLAGS", kernels.CFLAGS + ("-DEXTRA",))
    assert kernels.build_path() != first
    monkeypatch.setattr(kernels, "CFLAGS", kernels.CFLAGS[:-1])
    src.write_text(src.read_text() + "\n// edited\n")
    assert kernels.build_path() != first


def test_choice_when_the_build_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "BUILD_DIR", tmp_path / "empty")
    monkeypatch.setenv(kernels.ENV_KERNEL, "auto")
    assert kernels.load() is None  # torch's kernels, with a warning
    monkeypatch.setenv(kernels.ENV_KERNEL, "pdkernels")
    with pytest.raises(RuntimeError, match="has no build"):
        kernels.load()
    monkeypatch.setenv(kernels.ENV_KERNEL, "torch")
    assert kernels.load() is None


@pytest.mark.parametrize("var,value", [("PD_ENGINE_KERNEL", "mkl"), ("PD_KERNEL_ISA", "avx512")])
def test_bad_settings_name_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var):
        kernels.choice() if var == "PD_ENGINE_KERNEL" else kernels.isa()


def test_status_command():
    out = subprocess.run([sys.executable, "-m", "runtime.kernels", "status"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("kernel: pdkernels "), out.stdout + out.stderr
