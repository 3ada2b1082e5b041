"""Transfer capabilities (runtime/security/capability.py): real Ed25519 keys on disk, no mocks.

Each refusal case changes one thing: grant fields are re-signed with the real key, so
the reason proves that exactly that check fired (checks run in `Reason`'s order,
and an earlier wrong field would report its own reason).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pdserve_client.rpc.pd.v1 import capability_pb2
from runtime.security.capability import (
    PULL,
    PUSH,
    CapabilityDenied,
    Grant,
    Reason,
    Signer,
    TransferAsk,
    Verifier,
    generate_signing_key,
    nonce_key,
    redact,
    retire_key,
)

ISSUER = "router/router-0"
NOW_MS = 1_700_000_000_000
ROUTE_EPOCH = 7
MAX_TTL_MS = 10_000
GRANT = Grant(tenant="tenant-a", source_worker_id="prefill-0", source_epoch=3, destination_worker_id="decode-0",
              destination_epoch=5, transfer_id="xfer-1", generation=2, route_epoch=ROUTE_EPOCH,
              cache_abi_digest="ab" * 32, direction=PUSH, regions=(3, 4, 5, 9), max_bytes=4096, ttl_ms=5_000)


@pytest.fixture
def keys(tmp_path):
    """(signer, verifier, public key set path) for one real key pair."""
    pub = tmp_path / "capability_keys.json"
    generate_signing_key(tmp_path / "router.pem", pub)
    return Signer.from_file(tmp_path / "router.pem", ISSUER), Verifier.from_file(pub, {ISSUER}, MAX_TTL_MS), pub


def ask_for(nonce: bytes, /, **changes) -> TransferAsk:
    """The ask GRANT permits: two of its blocks, under its byte bound, with ``nonce`` unless changed."""
    fields = {f: getattr(GRANT, f) for f in TransferAsk.__slots__ if hasattr(GRANT, f)}
    return TransferAsk(**{**fields, "regions": (4, 5), "num_bytes": 1024, "nonce": nonce, **changes})


def resigned(raw: bytes, key: Ed25519PrivateKey, **changes) -> bytes:
    """``raw`` with SignedCapability fields replaced (the signature is NOT recomputed unless passed)."""
    signed = capability_pb2.SignedCapability.FromString(raw)
    for name, value in changes.items():
        setattr(signed, name, value)
    return signed.SerializeToString()


def flip(data: bytes, i: int) -> bytes:
    """``data`` with byte ``i`` inverted."""
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]


def test_a_valid_capability_is_accepted(keys):
    signer, verifier, _ = keys
    minted = signer.mint(GRANT, now_ms=NOW_MS)
    cap = verifier.authorize(minted.raw, ask_for(minted.nonce), ROUTE_EPOCH, NOW_MS + 1)
    assert (cap.issuer, cap.tenant, cap.transfer_id, list(cap.regions)) == (ISSUER, "tenant-a", "xfer-1", [3, 4, 5, 9])
    assert cap.expires_unix_ms == minted.expires_unix_ms == NOW_MS + GRANT.ttl_ms
    assert len(minted.nonce) == 16 and cap.nonce == minted.nonce
    assert nonce_key(minted.nonce) == minted.nonce.hex() and len(nonce_key(minted.nonce)) == 32
    # The bounds are inclusive: every granted block, exactly max_bytes,
    # and the last millisecond before expiry.
    full = ask_for(minted.nonce, regions=GRANT.regions, num_bytes=GRANT.max_bytes)
    verifier.authorize(minted.raw, full, ROUTE_EPOCH, minted.expires_unix_ms - 1)


def test_every_mint_has_a_fresh_nonce(keys):
    signer, _, _ = keys
    nonces = {signer.mint(GRANT, now_ms=NOW_MS).nonce for _ in range(50)}
    assert len(nonces) == 50


# (case, grant changes re-signed with the real key, ask changes, route epoch, now offset from NOW_MS, reason)
GRANT_AND_ASK_CASES = [
    ("expired", {}, {}, ROUTE_EPOCH, GRANT.ttl_ms, Reason.EXPIRED),
    ("long expired", {}, {}, ROUTE_EPOCH, GRANT.ttl_ms + 60_000, Reason.EXPIRED),
    ("ttl too long", {"ttl_ms": MAX_TTL_MS + 1}, {}, ROUTE_EPOCH, 0, Reason.EXPIRED),
    ("tenant", {"tenant": "tenant-b"}, {}, ROUTE_EPOCH, 0, Reason.TENANT),
    ("source id", {"source_worker_id": "prefill-1"}, {}, ROUTE_EPOCH, 0, Reason.SOURCE),
    ("source epoch", {"source_epoch": 4}, {}, ROUTE_EPOCH, 0, Reason.SOURCE),
    ("destination id", {"destination_worker_id": "decode-1"}, {}, ROUTE_EPOCH, 0, Reason.DESTINATION),
    ("destination epoch", {"destination_epoch": 4}, {}, ROUTE_EPOCH, 0, Reason.DESTINATION),
    ("transfer id", {"transfer_id": "xfer-2"}, {}, ROUTE_EPOCH, 0, Reason.TRANSFER),
    ("generation", {"generation": 1}, {}, ROUTE_EPOCH, 0, Reason.GENERATION),
    ("old route epoch", {"route_epoch": ROUTE_EPOCH - 1}, {}, ROUTE_EPOCH, 0, Reason.ROUTE_EPOCH),
    ("advanced route epoch", {}, {}, ROUTE_EPOCH + 1, 0, Reason.ROUTE_EPOCH),
    ("cache abi", {"cache_abi_digest": "cd" * 32}, {}, ROUTE_EPOCH, 0, Reason.ABI),
    ("direction", {"direction": PULL}, {}, ROUTE_EPOCH, 0, Reason.DIRECTION),
    ("region outside the grant", {}, {"regions": (4, 6)}, ROUTE_EPOCH, 0, Reason.REGION),
    ("empty regions", {}, {"regions": ()}, ROUTE_EPOCH, 0, Reason.REGION),
    ("one byte over", {}, {"num_bytes": GRANT.max_bytes + 1}, ROUTE_EPOCH, 0, Reason.BYTES),
    ("zero bytes", {}, {"num_bytes": 0}, ROUTE_EPOCH, 0, Reason.BYTES),
    ("nonce mismatch", {}, {"nonce": secrets.token_bytes(16)}, ROUTE_EPOCH, 0, Reason.NONCE),
    ("empty nonce", {}, {"nonce": b""}, ROUTE_EPOCH, 0, Reason.NONCE),
]


def assert_denied(verifier, raw, ask, route_epoch, now_ms, reason, secrets_hex=()):
    """authorize refuses with ``reason``, and its message leaks none of ``secrets_hex``."""
    with pytest.raises(CapabilityDenied) as denied:
        verifier.authorize(raw, ask, route_epoch, now_ms)
    assert denied.value.reason is reason, str(denied.value)
    message = str(denied.value).lower()
    assert f": {reason.value}:" in message
    for secret in (*secrets_hex, raw.hex(), ask.nonce.hex() if len(ask.nonce) else None):
        if secret:
            assert secret.lower() not in message
            assert secret[:16].lower() not in message


def key_material(pub_path, raw: bytes) -> list[str]:
    """Hex of every public key in the set and of the capability's signature."""
    signed = capability_pb2.SignedCapability.FromString(raw)
    return [*json.loads(pub_path.read_text())["keys"].values(), signed.signature.hex()]


@pytest.mark.parametrize(("grant_changes", "ask_changes", "route_epoch", "now_offset_ms", "reason"),
                         [c[1:] for c in GRANT_AND_ASK_CASES], ids=[c[0] for c in GRANT_AND_ASK_CASES])
def test_one_wrong_field_is_refused_with_its_reason(keys, grant_changes, ask_changes, route_epoch, now_offset_ms,
                                                    reason):
    signer, verifier, pub = keys
    minted = signer.mint(dataclasses.replace(GRANT, **grant_changes), now_ms=NOW_MS)
    ask = ask_for(minted.nonce, **ask_changes)
    assert_denied(verifier, minted.raw, ask, route_epoch, NOW_MS + now_offset_ms, reason, key_material(pub, minted.raw))


def test_an_untrusted_issuer_is_refused_even_with_the_real_key(keys, tmp_path):
    _, verifier, pub = keys
    impostor = Signer.from_file(tmp_path / "router.pem", "router/rogue")
    minted = impostor.mint(GRANT, now_ms=NOW_MS)
    assert_denied(verifier, minted.raw, ask_for(minted.nonce), ROUTE_EPOCH, NOW_MS, Reason.ISSUER,
                  key_material(pub, minted.raw))


ORDER = ["ttl too long", "tenant", "source id", "destination id", "transfer id", "generation", "old route epoch",
         "cache abi", "direction", "region outside the grant", "one byte over", "nonce mismatch"]


@pytest.mark.parametrize("first", range(len(ORDER) + 1))
def test_the_first_failed_check_in_reason_order_is_the_reason(keys, tmp_path, first):
    """Every check from ``first`` on is wrong at once (0: the issuer too); the reason names the earliest."""
    _, verifier, _ = keys
    cases = {c[0]: c[1:] for c in GRANT_AND_ASK_CASES}
    grant_changes, ask_changes = {}, {}
    for name in ORDER[max(first - 1, 0):]:
        grant_changes |= cases[name][0]
        ask_changes |= cases[name][1]
    signer = Signer.from_file(tmp_path / "router.pem", ISSUER if first else "router/rogue")
    minted = signer.mint(dataclasses.replace(GRANT, **grant_changes), now_ms=NOW_MS)
    reason = cases[ORDER[first - 1]][4] if first else Reason.ISSUER
    assert_denied(verifier, minted.raw, ask_for(minted.nonce, **ask_changes), ROUTE_EPOCH, NOW_MS, reason)


def other_signer(tmp_path) -> tuple[Signer, Ed25519PrivateKey]:
    """A signer from another key pair, with the trusted issuer name."""
    generate_signing_key(tmp_path / "other" / "router.pem", tmp_path / "other" / "keys.json")
    signer = Signer.from_file(tmp_path / "other" / "router.pem", ISSUER)
    return signer, signer._key


@pytest.mark.parametrize("tamper", ["signature byte", "body byte", "unknown key id", "another key pair",
                                    "another key pair claiming the real key id", "garbage", "empty", "truncated"])
def test_a_forged_or_damaged_capability_is_a_signature_denial(keys, tmp_path, tamper):
    signer, verifier, pub = keys
    minted = signer.mint(GRANT, now_ms=NOW_MS)
    signed = capability_pb2.SignedCapability.FromString(minted.raw)
    other, other_key = other_signer(tmp_path)
    raw = {
        "signature byte": lambda: resigned(minted.raw, signer._key, signature=flip(signed.signature, 10)),
        "body byte": lambda: resigned(minted.raw, signer._key, body=flip(signed.body, len(signed.body) // 2)),
        "unknown key id": lambda: resigned(minted.raw, signer._key, key_id="0" * 16),
        "another key pair": lambda: other.mint(GRANT, now_ms=NOW_MS).raw,
        "another key pair claiming the real key id": lambda: resigned(
            other.mint(GRANT, now_ms=NOW_MS).raw, other_key, key_id=signer.key_id),
        "garbage": lambda: b"\xff\x00garbage" * 7,
        "empty": lambda: b"",
        "truncated": lambda: minted.raw[:-5],
    }[tamper]()
    nonce = minted.nonce
    if tamper.startswith("another key pair"):
        nonce = capability_pb2.TransferCapability.FromString(
            capability_pb2.SignedCapability.FromString(raw).body).nonce
    assert_denied(verifier, raw, ask_for(nonce), ROUTE_EPOCH, NOW_MS, Reason.SIGNATURE,
                  [*key_material(pub, minted.raw), other_key.public_key().public_bytes_raw().hex()])


def test_key_files_private_mode_0600_and_key_id_is_the_public_key_hash(tmp_path):
    pub = tmp_path / "keys.json"
    kid = generate_signing_key(tmp_path / "k.pem", pub)
    assert stat.S_IMODE((tmp_path / "k.pem").stat().st_mode) == 0o600
    assert (tmp_path / "k.pem").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    hex_key = json.loads(pub.read_text())["keys"][kid]
    assert kid == hashlib.sha256(bytes.fromhex(hex_key)).hexdigest()[:16]
    assert Signer.from_file(tmp_path / "k.pem", ISSUER).key_id == kid


def test_rotation_both_keys_verify_until_one_is_retired(tmp_path):
    pub = tmp_path / "keys.json"
    old_kid = generate_signing_key(tmp_path / "old.pem", pub)
    new_kid = generate_signing_key(tmp_path / "new.pem", pub)
    assert old_kid != new_kid and set(json.loads(pub.read_text())["keys"]) == {old_kid, new_kid}
    old = Signer.from_file(tmp_path / "old.pem", ISSUER).mint(GRANT, now_ms=NOW_MS)
    new = Signer.from_file(tmp_path / "new.pem", ISSUER).mint(GRANT, now_ms=NOW_MS)
    verifier = Verifier.from_file(pub, {ISSUER}, MAX_TTL_MS)
    for minted in (old, new):
        verifier.authorize(minted.raw, ask_for(minted.nonce), ROUTE_EPOCH, NOW_MS)

    retire_key(pub, old_kid)
    verifier = Verifier.from_file(pub, {ISSUER}, MAX_TTL_MS)
    assert_denied(verifier, old.raw, ask_for(old.nonce), ROUTE_EPOCH, NOW_MS, Reason.SIGNATURE)
    verifier.authorize(new.raw, ask_for(new.nonce), ROUTE_EPOCH, NOW_MS)


def test_a_public_key_set_whose_key_id_lies_is_rejected(tmp_path):
    pub = tmp_path / "keys.json"
    kid = generate_signing_key(tmp_path / "k.pem", pub)
    keys = json.loads(pub.read_text())["keys"]
    pub.write_text(json.dumps({"keys": {"f" * 16: keys[kid]}}))
    with pytest.raises(ValueError, match="does not match"):
        Verifier.from_file(pub, {ISSUER}, MAX_TTL_MS)


@pytest.mark.parametrize("changes", [{"direction": 0}, {"ttl_ms": 0}, {"max_bytes": 0}, {"regions": ()}])
def test_mint_refuses_an_unbounded_grant(keys, changes):
    signer, _, _ = keys
    with pytest.raises(ValueError):
        signer.mint(dataclasses.replace(GRANT, **changes), now_ms=NOW_MS)


def test_redact_is_a_short_hash():
    raw = secrets.token_bytes(64)
    assert redact(raw) == hashlib.sha256(raw).hexdigest()[:12] and raw.hex()[:12] not in redact(raw)
