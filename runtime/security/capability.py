"""Transfer capabilities (docs/design.md, Security): remote-memory access is a signed, bounded grant.

Knowing a peer's address or memory keys authorizes nothing: a transfer may touch
destination blocks only under a ``pd.v1.TransferCapability`` that binds tenant, both
workers and epochs, transfer id, generation, route epoch, cache ABI, direction,
permitted regions, a byte bound, expiry and nonce, signed by a trusted control plane.

- Issuer: the router alone holds the Ed25519 private key (``Signer``); it mints one
  capability per transfer attempt, with a fresh 16-byte nonce.
- Verifiers: workers hold public keys only (``Verifier``). Decode calls ``authorize``
  before it exposes destination blocks, prefill before it reads K/V to send; both
  deny before any registration or remote operation exists, never repair after.
- Replay: ``authorize`` binds the nonce to the ask but remembers nothing. Safety
  invariant: right after ``authorize`` succeeds and before exposing blocks, the
  destination consumes the nonce once in the directory (``consume_nonce(nonce_key(
  cap.nonce), cap.expires_unix_ms, cap.transfer_id)``); False is a replay: deny NONCE.
- Rotation: a key in the public set verifies until ``retire_key`` removes it.
- Logs: a denial names its ``Reason`` and the mismatching identities, never the key,
  the signature, the raw bytes or the nonce (``redact`` gives a short hash).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import DecodeError

from pdserve_client.rpc.pd.v1 import capability_pb2
from runtime.common.private_files import private_open

PUSH = capability_pb2.TRANSFER_DIRECTION_PUSH
PULL = capability_pb2.TRANSFER_DIRECTION_PULL
NONCE_BYTES = 16


class Reason(str, enum.Enum):
    """Why a capability was refused, one per check in ``authorize`` order (str mixin: no StrEnum in 3.10)."""

    SIGNATURE = "signature"
    ISSUER = "issuer"
    EXPIRED = "expired"
    TENANT = "tenant"
    SOURCE = "source"
    DESTINATION = "destination"
    TRANSFER = "transfer"
    GENERATION = "generation"
    ROUTE_EPOCH = "route_epoch"
    ABI = "abi"
    DIRECTION = "direction"
    REGION = "region"
    BYTES = "bytes"
    NONCE = "nonce"


class CapabilityDenied(Exception):
    """A capability failed a check; ``reason`` is the first failed one. Safe to log."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"capability denied: {reason.value}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Grant:
    """What the router permits for one transfer attempt; ``Signer.mint`` adds nonce and expiry."""

    tenant: str
    source_worker_id: str
    source_epoch: int
    destination_worker_id: str
    destination_epoch: int
    transfer_id: str
    generation: int
    route_epoch: int
    cache_abi_digest: str
    direction: int
    """``PUSH`` or ``PULL``."""
    regions: tuple[int, ...]
    """Destination physical block ids the transfer may touch."""
    max_bytes: int
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class TransferAsk:
    """What the party presenting or checking a capability knows about the transfer."""

    tenant: str
    source_worker_id: str
    source_epoch: int
    destination_worker_id: str
    destination_epoch: int
    transfer_id: str
    generation: int
    cache_abi_digest: str
    direction: int
    regions: tuple[int, ...]
    """Exact destination blocks this operation touches."""
    num_bytes: int
    nonce: bytes
    """The nonce the capability was delivered with (from the router, beside it)."""


@dataclass(frozen=True, slots=True)
class Minted:
    """A freshly signed capability: ``raw`` travels; nonce and expiry are for the ask and the directory."""

    raw: bytes
    nonce: bytes
    expires_unix_ms: int


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 hex chars of sha256 of the raw public key bytes."""
    return hashlib.sha256(_raw_public(public_key)).hexdigest()[:16]


def nonce_key(nonce: bytes) -> str:
    """The nonce as the directory's ConsumeNonce takes it (hex)."""
    return nonce.hex()


def redact(raw: bytes) -> str:
    """Short sha256 prefix of secret or capability bytes, for logs."""
    return hashlib.sha256(raw).hexdigest()[:12]


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of an Ed25519 public key."""
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_public_keys(path_public_set: Path) -> dict[str, Ed25519PublicKey]:
    """Read a public key set ``{"keys": {kid: hex raw key}}``; a kid must match its key."""
    keys = {}
    for kid, hex_key in json.loads(Path(path_public_set).read_text())["keys"].items():
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(hex_key))
        if key_id(key) != kid:
            raise ValueError(f"{path_public_set}: key id {kid} does not match its key")
        keys[kid] = key
    return keys


def _read_hex_keys(path_public_set: Path) -> dict[str, str]:
    return json.loads(path_public_set.read_text())["keys"] if path_public_set.exists() else {}


def _write_hex_keys(path_public_set: Path, hex_keys: Mapping[str, str]) -> None:
    tmp = path_public_set.with_name(path_public_set.name + ".tmp")
    tmp.write_text(json.dumps({"keys": dict(sorted(hex_keys.items()))}, indent=2) + "\n")
    tmp.replace(path_public_set)


def generate_signing_key(path_private: Path, path_public_set: Path) -> str:
    """Write a new private key (PKCS8 PEM, mode 0600), add its public key to the set, return its id.

    Older keys in the set stay (rotation): they keep verifying until ``retire_key``."""
    path_private, path_public_set = Path(path_private), Path(path_public_set)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    path_private.parent.mkdir(parents=True, exist_ok=True)
    with private_open(path_private, "wb") as f:
        f.write(pem)
    public, kid = private.public_key(), key_id(private.public_key())
    path_public_set.parent.mkdir(parents=True, exist_ok=True)
    _write_hex_keys(path_public_set, {**_read_hex_keys(path_public_set), kid: _raw_public(public).hex()})
    return kid


def retire_key(path_public_set: Path, kid: str) -> None:
    """Remove a key from the public set: every capability it signed stops verifying."""
    hex_keys = _read_hex_keys(Path(path_public_set))
    del hex_keys[kid]
    _write_hex_keys(Path(path_public_set), hex_keys)


class Signer:
    """The router's side: mints capabilities with its private key."""

    def __init__(self, private_key: Ed25519PrivateKey, issuer: str) -> None:
        self._key = private_key
        self.issuer = issuer
        self.key_id = key_id(private_key.public_key())

    @classmethod
    def from_file(cls, path: Path, issuer: str) -> Signer:
        """Load a PKCS8 PEM Ed25519 private key written by ``generate_signing_key``."""
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path}: not an Ed25519 private key")
        return cls(key, issuer)

    def mint(self, grant: Grant, now_ms: int | None = None) -> Minted:
        """Sign ``grant`` with a fresh random nonce, expiring ``grant.ttl_ms`` from now."""
        if grant.direction not in (PUSH, PULL) or grant.ttl_ms <= 0 or grant.max_bytes <= 0 or not grant.regions:
            raise ValueError(f"a grant needs PUSH or PULL, ttl_ms > 0, max_bytes > 0 and a region: {grant}")
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        nonce = secrets.token_bytes(NONCE_BYTES)
        fields = {f: getattr(grant, f) for f in Grant.__slots__ if f != "ttl_ms"}
        body = capability_pb2.TransferCapability(
            issuer=self.issuer, issued_unix_ms=now_ms, expires_unix_ms=now_ms + grant.ttl_ms, nonce=nonce,
            **fields).SerializeToString()
        signed = capability_pb2.SignedCapability(key_id=self.key_id, body=body, signature=self._key.sign(body))
        return Minted(signed.SerializeToString(), nonce, now_ms + grant.ttl_ms)


class Verifier:
    """A worker's side: checks capabilities against public keys only."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey], trusted_issuers: Iterable[str], max_ttl_ms: int) -> None:
        assert max_ttl_ms > 0
        self.keys = dict(keys)
        self.trusted_issuers = frozenset(trusted_issuers)
        self.max_ttl_ms = max_ttl_ms

    @classmethod
    def from_file(cls, path_public_set: Path, trusted_issuers: Iterable[str], max_ttl_ms: int) -> Verifier:
        """Load the public key set written by ``generate_signing_key``."""
        return cls(load_public_keys(path_public_set), trusted_issuers, max_ttl_ms)

    def verified_body(self, raw: bytes) -> capability_pb2.TransferCapability:
        """The signed capability inside ``raw``, or CapabilityDenied(SIGNATURE)."""
        return self.opened(self.signed(raw), raw)

    @staticmethod
    def signed(raw: bytes) -> capability_pb2.SignedCapability:
        """``raw`` parsed, its signature not checked yet (`opened` does), or CapabilityDenied(SIGNATURE)."""
        signed = capability_pb2.SignedCapability()
        try:
            signed.ParseFromString(raw)
        except DecodeError:
            raise CapabilityDenied(Reason.SIGNATURE, f"unparseable capability {redact(raw)}") from None
        return signed

    def opened(self, signed: capability_pb2.SignedCapability, raw: bytes) -> capability_pb2.TransferCapability:
        """The body of `signed` (parsed from ``raw``) once its key id is one of ours and the
        signature holds, or CapabilityDenied(SIGNATURE)."""
        key = self.keys.get(signed.key_id)
        if key is None:
            raise CapabilityDenied(Reason.SIGNATURE, f"unknown key id {signed.key_id[:16]!r}")
        try:
            key.verify(signed.signature, signed.body)
            return capability_pb2.TransferCapability.FromString(signed.body)
        except (InvalidSignature, DecodeError):
            raise CapabilityDenied(Reason.SIGNATURE, f"bad signature on capability {redact(raw)}") from None

    def authorize(self, raw: bytes, ask: TransferAsk, route_epoch: int | None,
                  now_ms: int) -> capability_pb2.TransferCapability:
        """Return the capability if it permits exactly ``ask`` now; else raise CapabilityDenied.

        Checks run in the order of `Reason` and the first failure is the reason. The
        caller must consume ``cap.nonce`` once in the directory next (module docstring).
        ``route_epoch`` None: the caller has the directory compare the route epoch in the
        same atomic step that consumes the nonce (ConsumeNonce's route_epoch).
        """
        return self.check(self.verified_body(raw), ask, route_epoch, now_ms)

    def current(self, cap: capability_pb2.TransferCapability, now_ms: int, transfer_id: str) -> None:
        """The issuer and expiry checks of a capability `verified_body` returned, in that
        order (CapabilityDenied ISSUER or EXPIRED): all that a party asking nothing else of
        it checks (the directory, which takes the destination it names for a nonce check)."""
        left_ms = cap.expires_unix_ms - now_ms
        if cap.issuer not in self.trusted_issuers:
            raise CapabilityDenied(Reason.ISSUER, f"untrusted issuer {cap.issuer!r} (transfer {transfer_id!r})")
        if not 0 < left_ms <= self.max_ttl_ms:
            raise CapabilityDenied(Reason.EXPIRED, f"expires in {left_ms} ms, not in (0, {self.max_ttl_ms}] "
                                                   f"(transfer {transfer_id!r})")

    def check(self, cap: capability_pb2.TransferCapability, ask: TransferAsk, route_epoch: int | None,
              now_ms: int) -> capability_pb2.TransferCapability:
        """`authorize` after the signature: the checks from the issuer on, on a capability
        `verified_body` returned (a caller that needed its fields first verifies once)."""
        self.current(cap, now_ms, ask.transfer_id)
        source, asked_source = (cap.source_worker_id, cap.source_epoch), (ask.source_worker_id, ask.source_epoch)
        dest = (cap.destination_worker_id, cap.destination_epoch)
        asked_dest = (ask.destination_worker_id, ask.destination_epoch)
        outside = sorted(set(ask.regions) - set(cap.regions))
        checks = (  # (reason, passed, what was wrong: formatted only on denial), in `Reason`'s order
            (Reason.TENANT, cap.tenant == ask.tenant, lambda: f"tenant {cap.tenant!r} != {ask.tenant!r}"),
            (Reason.SOURCE, source == asked_source, lambda: f"source {source} != {asked_source}"),
            (Reason.DESTINATION, dest == asked_dest, lambda: f"destination {dest} != {asked_dest}"),
            (Reason.TRANSFER, cap.transfer_id == ask.transfer_id,
             lambda: f"minted for transfer {cap.transfer_id!r}"),
            (Reason.GENERATION, cap.generation == ask.generation,
             lambda: f"generation {cap.generation} != {ask.generation}"),
            (Reason.ROUTE_EPOCH, route_epoch is None or cap.route_epoch == route_epoch,
             lambda: f"route epoch {cap.route_epoch} != {route_epoch}"),
            (Reason.ABI, cap.cache_abi_digest == ask.cache_abi_digest,
             lambda: f"cache ABI {cap.cache_abi_digest[:16]} != {ask.cache_abi_digest[:16]}"),
            (Reason.DIRECTION, cap.direction == ask.direction and cap.direction in (PUSH, PULL),
             lambda: f"direction {cap.direction} != {ask.direction}"),
            (Reason.REGION, bool(ask.regions) and not outside,
             lambda: f"blocks {outside[:8]} not granted" if outside else "ask names no region"),
            (Reason.BYTES, 0 < ask.num_bytes <= cap.max_bytes,
             lambda: f"{ask.num_bytes} bytes, not in (0, {cap.max_bytes}]"),
            (Reason.NONCE, len(cap.nonce) == NONCE_BYTES and hmac.compare_digest(cap.nonce, ask.nonce),
             lambda: f"nonce {redact(ask.nonce)} not bound to this capability"),
        )
        for reason, passed, detail in checks:
            if not passed:
                raise CapabilityDenied(reason, f"{detail()} (transfer {ask.transfer_id!r})")
        return cap
