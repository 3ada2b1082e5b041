"""Transfer keys: what binds every data-plane message, and every byte of K/V, to the
sender the router chose for the transfer (docs/design.md, Security).

The router mints one random secret per attempt (`new_key`) and hands it to both ends over
their mutual-TLS calls: to the destination with Decode.Reserve, to the source with the
Prefill's grant. It never travels on the data plane, so a process that holds no
certificate cannot learn it, however much of the data plane it can reach. From it:

    key.mac(direction, *parts)   a control message's authenticator: BLAKE2b-128 keyed with
                                 the secret, personalised per direction (a receiver's reply
                                 can never pass for a sender's message, nor the reverse)
    key.checksum(chunk, views)   a chunk's checksum: GMAC (AES-256-GCM over no plaintext, the
                                 chunk's bytes as associated data) under a key derived from
                                 the secret, its nonce the chunk key, cut to 64 bits (16 hex
                                 digits, the width of the xxh3_64 it replaces): integrity and
                                 authenticity in one pass over the bytes, at ~20-30 GB/s here
    key.tag_bits                 28 bits naming the transfer in UCX data and body tags

Safety invariant: a GMAC nonce authenticates one message. A chunk key (the nonce) is sent
once per transfer and a transfer's secret is used for one attempt only (a retry is a new
generation: a new transfer id and a new secret), so each (key, nonce) covers exactly one
byte string, the chunk's, however often it is hashed. A receiver never reports the value
it computed over bytes that failed the check (the only other string under that nonce).
With 64 bits of tag, a forged chunk of L 16-byte blocks passes with probability about
L / 2^64 (2^-47 for a 2 MiB chunk) per try, and every try fails the attempt it aimed at.

With security off (PD_INSECURE) a transfer may come with no secret: `TransferKey.public`
derives one from the transfer id alone. It keeps the messages' integrity checks, not their
authenticity: anybody can compute it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Sequence

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
MAC_BYTES = 16
KEYED_CHECKSUM_ALGORITHM = "gmac-aes256-64"
"""HandoffManifest.checksum_algorithm of a keyed transfer (what `TransferKey.checksum` computes)."""
TO_RECEIVER, TO_SENDER = b"pd-to-receiver", b"pd-to-sender"
"""`TransferKey.mac` directions: a sender's messages, a receiver's replies."""
_CHUNK_KEY = struct.Struct("!III")  # a chunk key as a GMAC nonce: 96 bits
JOIN_MAX_BYTES = 256 << 10
"""A chunk in several pieces up to this size is joined and hashed in one call (the call's
fixed cost is most of a small chunk's); a larger one is fed piece by piece."""


def new_key() -> bytes:
    """A fresh transfer secret (the router's, one per attempt)."""
    return secrets.token_bytes(KEY_BYTES)


class TransferKey:
    """One transfer's secret and what it derives (see the module docstring)."""

    __slots__ = ("transfer_id", "public_only", "tag_bits", "_secret", "_gmac", "_aes")

    def __init__(self, transfer_id: str, secret: bytes):
        if len(secret) != KEY_BYTES:
            raise ValueError(f"a transfer key is {KEY_BYTES} bytes, not {len(secret)}")
        self.transfer_id, self._secret, self.public_only = transfer_id, bytes(secret), False
        bits = hashlib.blake2b(transfer_id.encode(), key=self._secret, digest_size=4, person=b"pd-tag").digest()
        self.tag_bits = (int.from_bytes(bits, "big") >> 4) or 1
        """28 nonzero bits for this transfer's UCX tags: without the secret they cannot be
        guessed, so nobody else's message can match a receive posted for the transfer."""
        gmac_key = hashlib.blake2b(key=self._secret, digest_size=32, person=b"pd-gmac").digest()
        self._gmac, self._aes = AESGCM(gmac_key), algorithms.AES(gmac_key)

    @classmethod
    def public(cls, transfer_id: str) -> TransferKey:
        """The key of a transfer that came without a secret (security off): derived from
        its id, so it checks integrity but proves nothing about the sender."""
        key = cls(transfer_id, hashlib.blake2b(transfer_id.encode(), digest_size=KEY_BYTES,
                                               person=b"pd-public-key").digest())
        key.public_only = True
        return key

    @classmethod
    def of(cls, transfer_id: str, secret: bytes) -> TransferKey:
        """The key for `secret`, or the public one when it is empty."""
        return cls(transfer_id, secret) if secret else cls.public(transfer_id)

    def mac(self, direction: bytes, *parts) -> bytes:
        """MAC_BYTES authenticating the concatenation of `parts` sent in `direction`."""
        h = hashlib.blake2b(key=self._secret, digest_size=MAC_BYTES, person=direction)
        for p in parts:
            h.update(p)
        return h.digest()

    def verify(self, mac: bytes, direction: bytes, *parts) -> bool:
        """Is `mac` this key's over `parts` in `direction`? (constant time)"""
        return hmac.compare_digest(mac, self.mac(direction, *parts))

    def checksum(self, chunk_key: Sequence[int], buffers: Sequence[memoryview]) -> str:
        """The keyed checksum of a chunk's bytes (the concatenation of `buffers`, however they
        are cut): 16 hex digits."""
        nonce = _CHUNK_KEY.pack(*chunk_key)
        if len(buffers) == 1:
            return self._gmac.encrypt(nonce, b"", buffers[0])[:8].hex()
        if sum(b.nbytes for b in buffers) <= JOIN_MAX_BYTES:
            return self._gmac.encrypt(nonce, b"", b"".join(buffers))[:8].hex()
        e = Cipher(self._aes, modes.GCM(nonce)).encryptor()
        for b in buffers:
            e.authenticate_additional_data(b)
        e.finalize()
        return e.tag[:8].hex()

    def __repr__(self) -> str:  # never the secret
        return f"TransferKey({self.transfer_id!r}{', public' if self.public_only else ''})"
