"""bench/_transfer_exact.py's commit variant (`ucxx-python-commit`): the receiver acks only a
COMMIT whose manifest lists every chunk of the plan, each with the checksum that landed."""

from __future__ import annotations

import orjson

from bench._transfer_exact import _manifest_matches
from runtime.transfer import Chunk, ChunkKey, TransferCommit
from runtime.transfer.tcp.wire import encode_commit


def _buffer(chunks: tuple[Chunk, ...]) -> bytearray:
    body = orjson.dumps(encode_commit(TransferCommit("exact-1", "bench", 1, "bench-abi", chunks, "-", 0)))
    buf = bytearray(64 << 10)
    buf[:4 + len(body)] = len(body).to_bytes(4, "big") + body
    return buf


KEYS = [ChunkKey(layer, 0, 1) for layer in range(3)]
LANDED = {k: f"{i:016x}" for i, k in enumerate(KEYS)}


def test_a_manifest_equal_to_what_landed_is_acked():
    assert _manifest_matches(_buffer(tuple(Chunk(k, 32, LANDED[k]) for k in KEYS)), LANDED, 3)


def test_a_checksum_that_differs_from_what_landed_is_not():
    chunks = tuple(Chunk(k, 32, "ffffffffffffffff" if k == KEYS[1] else LANDED[k]) for k in KEYS)
    assert not _manifest_matches(_buffer(chunks), LANDED, 3)


def test_a_manifest_short_of_the_plan_is_not():
    assert not _manifest_matches(_buffer(tuple(Chunk(k, 32, LANDED[k]) for k in KEYS[:2])), LANDED, 3)
