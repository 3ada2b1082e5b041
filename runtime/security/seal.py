"""Sealed declarations: the source's word on a hand-off, carried by the destination.

The directory publishes a transfer only when the destination's K/V digest and chunk
list with checksums are the ones the *source* declared (docs/design.md "The directory
judges the bytes"). The source used to declare with a Begin of its own, one more gRPC
call that the destination's Publish then waited for. Now the source seals the
declaration into its COMMIT and the destination relays the seal with its Publish:

- Each worker process makes a fresh Ed25519 key (``Sealer``) and registers its public
  half with the directory under mutual TLS (``RegisterWorkerRequest.seal_key``); a
  restarted worker has a new epoch and a new key, so a key never outlives its epoch.
- The seal signs ``transfer id, generation, source worker, source epoch, evidence``
  (``declaration``), the evidence being the directory's own string: the K/V digest
  and the chunk list with checksums (``runtime.directory.records.evidence``).
- The directory rebuilds the declaration from the destination's *own* digest and
  chunks and checks the seal with the key the source registered at the manifest's
  source epoch (``opens``). The destination cannot forge it (it has no key), cannot
  move it to another transfer or attempt (both are signed), and cannot publish other
  bytes under it (its digest is the signed one, or the seal does not verify).

A seal proves who declared, not that anyone is allowed to publish: the Publish is
still the destination's alone, by certificate, at its epoch, a compare-and-set on the
generation. Logs never show a seal or a key.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["KEY_BYTES", "SEAL_BYTES", "Sealer", "declaration", "opens", "public_key"]

KEY_BYTES = 32
"""A raw Ed25519 public key."""
SEAL_BYTES = 64
"""A raw Ed25519 signature."""
_DOMAIN = b"pdserve/v1/kv-declaration\0"
"""Separates these signatures from any other use of the key."""


def declaration(transfer_id: str, generation: int, source_worker_id: str, source_epoch: int,
                evidence: str) -> bytes:
    """The signed bytes: every field length-prefixed, so no two declarations share them."""
    out = bytearray(_DOMAIN)
    for part in (transfer_id.encode(), str(int(generation)).encode(), source_worker_id.encode(),
                 str(int(source_epoch)).encode(), evidence.encode()):
        out += len(part).to_bytes(4, "big") + part
    return bytes(out)


class Sealer:
    """This process's sealing key: made at start, never written anywhere."""

    def __init__(self, private_key: Ed25519PrivateKey | None = None) -> None:
        self._key = private_key or Ed25519PrivateKey.generate()
        self.public = self._key.public_key().public_bytes(serialization.Encoding.Raw,
                                                           serialization.PublicFormat.Raw)
        """The raw 32-byte public key, registered with the directory."""

    def seal(self, transfer_id: str, generation: int, source_worker_id: str, source_epoch: int,
             evidence: str) -> bytes:
        """The 64-byte seal of this declaration."""
        return self._key.sign(declaration(transfer_id, generation, source_worker_id, source_epoch, evidence))


def public_key(raw: bytes) -> Ed25519PublicKey:
    """A registered key; ValueError when it is not 32 bytes of an Ed25519 public key."""
    if len(raw) != KEY_BYTES:
        raise ValueError(f"a seal key is {KEY_BYTES} raw bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def opens(key: Ed25519PublicKey, seal: bytes, transfer_id: str, generation: int, source_worker_id: str,
          source_epoch: int, evidence: str) -> bool:
    """Whether `seal` is `key`'s over exactly this declaration."""
    if len(seal) != SEAL_BYTES:
        return False
    try:
        key.verify(seal, declaration(transfer_id, generation, source_worker_id, source_epoch, evidence))
    except InvalidSignature:
        return False
    return True

