"""Sealed declarations (runtime/security/seal.py): a seal opens only with the key that
made it, over exactly the declaration it was made for; the COMMIT carries it intact."""

from __future__ import annotations

import pytest

from runtime.security.seal import SEAL_BYTES, Sealer, declaration, opens, public_key
from runtime.transfer import Chunk, ChunkKey, TransferCommit
from runtime.transfer.tcp.wire import commit_for, decode_commit, encode_commit

DECL = ("req/3", 3, "prefill-0", 1_796_000_000_000, "ab" * 16 + "+" + "cd" * 32)


def test_a_seal_opens_with_its_key_over_its_declaration():
    s = Sealer()
    sealed = s.seal(*DECL)
    assert len(sealed) == SEAL_BYTES and len(s.public) == 32
    assert opens(public_key(s.public), sealed, *DECL)


@pytest.mark.parametrize("field", range(len(DECL)))
def test_a_seal_does_not_open_over_any_other_declaration(field):
    s = Sealer()
    sealed = s.seal(*DECL)
    other = list(DECL)
    other[field] = other[field] + 1 if isinstance(other[field], int) else other[field] + "0"
    assert not opens(public_key(s.public), sealed, *other)


def test_a_seal_does_not_open_with_another_key_or_damaged():
    s, t = Sealer(), Sealer()
    sealed = s.seal(*DECL)
    assert not opens(public_key(t.public), sealed, *DECL)
    assert not opens(public_key(s.public), bytes([sealed[0] ^ 1]) + sealed[1:], *DECL)
    assert not opens(public_key(s.public), sealed[:-1], *DECL)
    assert not opens(public_key(s.public), b"", *DECL)


def test_fields_cannot_slide_into_each_other():
    """Length prefixes: moving a character from one field to the next changes the bytes."""
    assert declaration("a/1", 1, "p", 2, "e") != declaration("a/", 11, "p", 2, "e")
    assert declaration("a", 1, "p0", 2, "e") != declaration("a", 1, "p", 2, "0e")


def test_a_registered_key_must_be_32_bytes():
    with pytest.raises(ValueError, match="32 raw bytes"):
        public_key(b"\0" * 31)


def _commit(seal: bytes) -> TransferCommit:
    return TransferCommit("r/1", "r", 1, "abi", (Chunk(ChunkKey(0, 0, 2), 4096, "00ff"),), "kv", 7, "p0", 5,
                          (), seal)


def test_the_commit_carries_the_seal_intact():
    sealed = Sealer().seal(*DECL)
    assert decode_commit(encode_commit(_commit(sealed))).seal == sealed
    assert decode_commit(encode_commit(_commit(b""))).seal == b""


@pytest.mark.parametrize("bad", ["zz" * 64, "00" * 65, 7])
def test_a_malformed_seal_makes_a_malformed_commit(bad):
    body = encode_commit(_commit(b""))
    body["seal"] = bad
    commit, why = commit_for(body, "r/1")
    assert commit is None and "seal" in why
