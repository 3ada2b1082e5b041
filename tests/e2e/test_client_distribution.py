"""The client distribution on its own: `pip install ./client` into a fresh virtualenv
brings grpcio and protobuf and nothing of the server (no torch, no UCX), and the examples
in client/README.md run with it against a real local cluster, from a directory outside
the cluster's clone with only $PD_CLUSTER naming it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve_client import contract
from tests.support.cluster import assert_cluster_clean, start_cluster

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "client" / "README.md"


def alone(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) without PYTHONPATH: a developer's pointing at the
    checkout would put the server's packages in the client's virtualenv."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("client-venv")
    source = tmp_path_factory.mktemp("client-src") / "client"  # a build writes beside its sources
    shutil.copytree(ROOT / "client", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    done = subprocess.run([str(py), "-m", "pip", "install", "-q", str(source)],
                          capture_output=True, text=True, timeout=600, env=alone())
    assert done.returncode == 0, done.stdout + done.stderr
    return py


def test_the_client_installs_alone_without_the_servers_dependencies(client_venv):
    listed = subprocess.run([str(client_venv), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True, env=alone()).stdout.lower()
    names = {line.split("==")[0] for line in listed.split()}
    assert {"pdserve-client", "grpcio", "protobuf"} <= names
    assert not names & {"torch", "ucxx-cu12", "numpy", "redis", "cython", "pdserve"}, names
    probe = ("import importlib.util, pdserve_client, pdserve_client.rpc.pd.v1.router_pb2; "
             "print(importlib.util.find_spec('torch'), importlib.util.find_spec('runtime'))")
    out = subprocess.run([str(client_venv), "-c", probe], capture_output=True, text=True, cwd="/",
                         check=True, env=alone()).stdout
    assert out.split() == ["None", "None"]
    typed = subprocess.run([str(client_venv), "-c", "import pdserve_client, pathlib; "
                            "print((pathlib.Path(pdserve_client.__file__).parent / 'py.typed').exists())"],
                           capture_output=True, text=True, cwd="/", check=True, env=alone()).stdout
    assert typed.strip() == "True"


def test_the_readme_examples_run_against_a_local_cluster(client_venv, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 2
    cluster = start_cluster(tmp_path / "clone", prefill=1, decode=1, transport="tcp")
    elsewhere = tmp_path / "elsewhere"  # outside the clone: no .pdserve here
    elsewhere.mkdir()
    try:
        # One variable, the cluster's state folder, as the README says; nothing else.
        env = {k: v for k, v in alone().items() if not k.startswith(("PD_ROUTER", "PD_TLS_", "PD_INSECURE"))}
        env[contract.CLUSTER_ENV] = str(cluster.state)
        outputs = []
        for code in blocks:
            done = subprocess.run([str(client_venv), "-c", code], capture_output=True, text=True, env=env,
                                  cwd=elsewhere, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            outputs.append(done.stdout)
        sync, aio = outputs
        # The streamed tokens with their text (the tiny preset's tokenizer), as repr() writes it.
        assert len(re.findall(r"^\d+ \d+ ('.*'|\".*\")$", sync, re.M)) == 8, sync
        assert re.search(r"^\[(\d+, ){7}\d+\] (disaggregated|colocated) TTFT [\d.]+ ms, TPOT [\d.]+ ms$",
                         sync, re.M)
        assert "cancelled after token 0" in sync
        assert "resumed exactly: True" in sync
        assert re.search(r"^(DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED) (True|False) .+", sync, re.M)
        assert re.search(r"^INVALID_ARGUMENT .*1000000000", sync, re.M)
        assert len(re.findall(r"^\d+ \d+$", aio, re.M)) == 8
        assert re.search(r"^(disaggregated|colocated) [\d.]+$", aio, re.M)
        assert_cluster_clean(cluster, timeout_s=30)
    finally:
        cluster.down()
