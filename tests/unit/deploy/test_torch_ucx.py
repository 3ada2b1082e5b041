"""deploy/torch-ucx.sh, the install's choice of torch index and UCX extra, run under dash and
bash with stand-ins for what it looks at: an `nvidia-smi` on a PATH holding nothing else of
this machine's, a local HTTP server as PyTorch's CPU index (or a port nobody listens on), and
a `torch` package on PYTHONPATH that names a CUDA version. No network; the resolutions of the
pairings it picks are tests/integration/test_install_resolution.py."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tomllib

from tests.support import REPO

SCRIPT = REPO / "deploy" / "torch-ucx.sh"
SHELLS = ["/bin/dash", "/bin/bash"]
GPU = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"


@pytest.fixture(params=SHELLS)
def shell(request) -> str:
    if not os.access(request.param, os.X_OK):
        pytest.skip(f"{request.param} is not installed here")
    return request.param


@pytest.fixture(scope="module")
def cpu_index(tmp_path_factory) -> str:
    """A local stand-in for PyTorch's CPU index: it serves a `torch/` page."""
    root = tmp_path_factory.mktemp("index")
    (root / "torch").mkdir()
    (root / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl</a>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def dead_index() -> str:
    """An index URL on a loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/whl/cpu"


def machine(root: Path, nvidia_smi: str | None) -> str:
    """A PATH holding grep and, unless None, an `nvidia-smi` that runs `nvidia_smi` (sh)."""
    root.mkdir()
    (root / "grep").symlink_to(shutil.which("grep"))
    if nvidia_smi is not None:
        (root / "nvidia-smi").write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        (root / "nvidia-smi").chmod(0o755)
    return str(root)


def run(shell: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([shell, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)


def torch_index(shell: str, path: str, index: str, **env: str) -> str:
    proc = run(shell, "torch-index", sys.executable, PATH=path, TORCH_CPU_INDEX_URL=index, **env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_no_gpu_takes_the_cpu_index_when_it_answers(tmp_path, shell, cpu_index):
    assert torch_index(shell, machine(tmp_path / "bin", None), cpu_index) == cpu_index


def test_no_gpu_and_no_cpu_index_leaves_torch_to_pip(tmp_path, shell, dead_index):
    """The fallback: nothing printed, so pip's own indexes (PyPI, a pre-staged wheel) decide."""
    assert torch_index(shell, machine(tmp_path / "bin", None), dead_index) == ""


def test_a_page_the_index_does_not_serve_is_no_answer(tmp_path, shell, cpu_index):
    assert torch_index(shell, machine(tmp_path / "bin", None), f"{cpu_index}/missing") == ""


def test_an_nvidia_smi_that_finds_no_gpu_is_no_gpu(tmp_path, shell, cpu_index):
    """A host with the tool but no driver: nvidia-smi fails, and the CPU build is right."""
    path = machine(tmp_path / "bin", "echo 'NVIDIA-SMI has failed because it could not communicate"
                   " with the NVIDIA driver.'; exit 9")
    assert torch_index(shell, path, cpu_index) == cpu_index


def test_a_gpu_leaves_torch_to_pip_even_where_the_cpu_index_answers(tmp_path, shell, cpu_index):
    path = machine(tmp_path / "bin", f"printf '{GPU}'")
    assert torch_index(shell, path, cpu_index) == ""


@pytest.mark.parametrize("gpu", [False, True])
def test_torch_index_url_wins(tmp_path, shell, cpu_index, gpu):
    path = machine(tmp_path / "bin", f"printf '{GPU}'" if gpu else None)
    chosen = "https://download.pytorch.org/whl/cu128"
    assert torch_index(shell, path, cpu_index, TORCH_INDEX_URL=chosen) == chosen


def fake_torch(root: Path, cuda: str | None) -> str:
    """A `torch` package whose torch.version.cuda is `cuda` (None: a CPU build)."""
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("from . import version\n")
    (root / "torch" / "version.py").write_text(f"cuda = {cuda!r}\n")
    return str(root)


@pytest.mark.parametrize("cuda, extra", [(None, "ucx-cu12"), ("12.8", "ucx-cu12"), ("13.0", "ucx-cu13")])
def test_ucx_extra_follows_torchs_cuda_major(tmp_path, shell, cuda, extra):
    proc = run(shell, "ucx-extra", sys.executable, PATH=os.defpath, PYTHONPATH=fake_torch(tmp_path, cuda))
    assert (proc.returncode, proc.stdout) == (0, f"{extra}\n"), proc.stderr


def test_ucx_extra_refuses_a_cuda_major_without_ucx_wheels(tmp_path, shell):
    proc = run(shell, "ucx-extra", sys.executable, PATH=os.defpath, PYTHONPATH=fake_torch(tmp_path, "11.8"))
    assert proc.returncode == 1 and proc.stdout == ""
    assert "CUDA 11.8" in proc.stderr


def test_ucx_extra_fails_without_torch(tmp_path, shell):
    """No torch importable (PYTHONPATH shadows it with an empty package): fail, never guess an extra."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    proc = run(shell, "ucx-extra", sys.executable, PATH=os.defpath, PYTHONPATH=str(tmp_path))
    assert proc.returncode != 0 and proc.stdout == ""


@pytest.mark.parametrize("args", [(), ("torch-index",), ("ucx-extra",), ("other", sys.executable)])
def test_usage(shell, args):
    proc = run(shell, *args, PATH=os.defpath)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_the_extras_it_names_exist_and_carry_ucx_of_their_major():
    """pyproject's dependencies name no UCX wheel (one would pin a CUDA major for every torch);
    each extra the script prints names the ucxx of its own major."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("ucxx")]
    for major in ("12", "13"):
        (req,) = project["optional-dependencies"][f"ucx-cu{major}"]
        assert req.startswith(f"ucxx-cu{major}>="), req
