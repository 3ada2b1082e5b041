"""The pd.v1 contract: stubs import, round-trip, follow the proto rules, and are current.

Rules checked (STYLE.md habit 5): a leading `//` comment on every message, enum,
enum value, service, rpc, oneof and field; `request_id = 1` as the first field
wherever it appears; enums start at *_UNSPECIFIED = 0; stream events are oneofs;
the checked-in stubs equal a fresh `make proto`; numbers are never renumbered.
"""

from __future__ import annotations

import filecmp
import importlib
import re
from pathlib import Path

import pytest

from tooling import gen_stubs as gen

PROTO_DIR = gen.PROTO_ROOT / gen.PACKAGE
PROTOS = sorted(PROTO_DIR.glob("*.proto"))
STEMS = [p.stem for p in PROTOS]
SERVICE_STEMS = [p.stem for p in PROTOS if re.search(r"^service ", p.read_text(), re.M)]

DECLARATION = re.compile(r"^(message|enum|service|oneof)\s+\w+\s*\{|^rpc\s+\w+\s*\(")
FIELD = re.compile(r"^(?:optional\s+|repeated\s+)?(?:map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*\d+\s*[;\[]")
ENUM_VALUE = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=\s*-?\d+\s*[;\[]")
NOT_DECLARATIONS = re.compile(r"^(?:(?:syntax|package|import|option|reserved)\b|//|\})")


def pb2(stem: str):
    """Import pdserve_client.rpc.pd.v1.<stem>_pb2."""
    return importlib.import_module(f"pdserve_client.rpc.pd.v1.{stem}_pb2")


def all_messages():
    """Yield (full name, descriptor) of every message, nested ones included."""

    def walk(desc):
        yield desc.full_name, desc
        for nested in desc.nested_types:
            yield from walk(nested)

    for stem in STEMS:
        for desc in pb2(stem).DESCRIPTOR.message_types_by_name.values():
            yield from walk(desc)


def all_enums():
    """Yield every enum descriptor, top-level and nested."""
    for stem in STEMS:
        yield from pb2(stem).DESCRIPTOR.enum_types_by_name.values()
    for _, desc in all_messages():
        yield from desc.enum_types


def declarations(path: Path) -> list[tuple[int, str, str | None, bool]]:
    """Parse a .proto: (line number, text, field name or None, has leading comment)."""
    found, previous = [], ""
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if not NOT_DECLARATIONS.match(line):
            field = FIELD.match(line)
            if field or ENUM_VALUE.match(line) or DECLARATION.match(line):
                found.append((number, line, field and field.group(1), previous.startswith("//")))
        previous = line
    return found


@pytest.mark.parametrize("stem", STEMS)
def test_every_module_imports(stem):
    module = pb2(stem)
    assert module.DESCRIPTOR.name == f"pd/v1/{stem}.proto"
    assert module.DESCRIPTOR.package == "pd.v1"
    for service in module.DESCRIPTOR.services_by_name:
        grpc_module = importlib.import_module(f"pdserve_client.rpc.pd.v1.{stem}_pb2_grpc")
        for suffix in ("Stub", "Servicer"):
            assert hasattr(grpc_module, service + suffix)
        assert hasattr(grpc_module, f"add_{service}Servicer_to_server")
    assert (stem in SERVICE_STEMS) == bool(module.DESCRIPTOR.services_by_name)


def test_handoff_manifest_round_trip():
    m = pb2("manifest")
    manifest = m.HandoffManifest(
        request_id="req-1",
        tenant="acme",
        generation=3,
        attempt=1,
        prompt_digest="ab" * 32,
        token_interval=m.TokenInterval(start=16, end=40),
        cache_abi_digest="ef" * 32,
        block_size=16,
        expected_chunks=[
            m.ChunkSpec(layer=layer, block_start=1, block_count=2, num_bytes=4096, checksum=f"{layer:016x}")
            for layer in range(4)
        ],
        source_worker_id="prefill-0",
        source_epoch=7,
        destination_worker_id="decode-1",
        destination_epoch=9,
        transfer_id="xfer-1",
        reservation_id="resv-1",
        route_epoch=2,
        checksum_algorithm="xxh3_64",
    )
    wire = manifest.SerializeToString(deterministic=True)
    decoded = m.HandoffManifest.FromString(wire)
    assert decoded == manifest
    assert decoded.SerializeToString(deterministic=True) == wire
    assert [c.layer for c in decoded.expected_chunks] == [0, 1, 2, 3]
    assert decoded.token_interval.end - decoded.token_interval.start == 24
    record = m.Transaction(request_id="req-1", transfer_id="xfer-1", state=m.TXN_STATE_RESERVED, manifest=manifest)
    assert m.Transaction.FromString(record.SerializeToString()).manifest == manifest


@pytest.mark.parametrize("path", PROTOS, ids=STEMS)
def test_every_declaration_has_a_leading_comment(path):
    found = declarations(path)
    missing = [f"{path.name}:{n}: {text}" for n, text, _, commented in found if not commented]
    assert not missing, "declarations without a leading // comment:\n" + "\n".join(missing)
    # Cross-check the parser against the compiled descriptor so no field escapes it.
    parsed_fields = sorted(name for _, _, name, _ in found if name)
    module = pb2(path.stem)
    compiled = sorted(f.name for full, d in all_messages() if d.file is module.DESCRIPTOR
                      and not d.GetOptions().map_entry for f in d.fields)  # a map's key/value are implied
    assert parsed_fields == compiled


def test_request_id_is_field_one_and_first():
    seen = []
    for name, desc in all_messages():
        if "request_id" in desc.fields_by_name:
            seen.append(name)
            assert desc.fields_by_name["request_id"].number == 1, name
            assert desc.fields[0].name == "request_id", name
    assert "pd.v1.HandoffManifest" in seen and "pd.v1.GenerateEvent" in seen


def test_enums_start_at_unspecified_zero():
    for enum in all_enums():
        zero = enum.values_by_number[0].name
        assert zero.endswith("UNSPECIFIED"), f"{enum.full_name}: value 0 is {zero}"


@pytest.mark.parametrize("stem, event", [("decode", "TokenEvent"), ("router", "GenerateEvent")])
def test_stream_events_are_oneofs(stem, event):
    desc = pb2(stem).DESCRIPTOR.message_types_by_name[event]
    members = {f.name for f in desc.oneofs_by_name["event"].fields}
    assert {"token", "complete", "error"} <= members


def test_regeneration_matches_checked_in_stubs(tmp_path):
    for _ in range(2):  # the second run over existing output must change nothing
        gen.main(["--out", str(tmp_path)])
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    checked_in = sorted(
        p.relative_to(gen.RPC_DIR)
        for p in [*(gen.RPC_DIR / "pd").rglob("*"), gen.RPC_DIR / gen.LOCK_NAME]
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert fresh == checked_in, "run `make proto` and commit client/pdserve_client/rpc"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, gen.RPC_DIR / p, shallow=False)]
    assert not stale, f"stale stubs {stale}: run `make proto` and commit client/pdserve_client/rpc"


def test_lock_rejects_renumbering_reuse_and_unreserved_removal():
    old = {"pd.v1.M.a": 1, "pd.v1.M.b": 2}
    with pytest.raises(SystemExit, match="renumbered"):
        gen.merge_lock(old, {"pd.v1.M.a": 3, "pd.v1.M.b": 2}, {"pd.v1.M": set()})
    with pytest.raises(SystemExit, match="reuses"):
        gen.merge_lock(old, {"pd.v1.M.a": 1, "pd.v1.M.c": 2}, {"pd.v1.M": set()})
    with pytest.raises(SystemExit, match="reserved 2"):
        gen.merge_lock(old, {"pd.v1.M.a": 1}, {"pd.v1.M": set()})
    merged = gen.merge_lock(old, {"pd.v1.M.a": 1, "pd.v1.M.d": 3}, {"pd.v1.M": {2}})
    assert merged == {"pd.v1.M.a": 1, "pd.v1.M.b": 2, "pd.v1.M.d": 3}
