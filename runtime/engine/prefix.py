"""Prefix identity: a hash chain over full blocks.

    h_0 = H(cache_identity || salt)
    h_j = H(h_{j-1} || tokens of block j)

Block j's key names the whole prefix up to and including it, under one model
and cache layout (cache_identity = the cache ABI digest) and one isolation
scope (salt, e.g. the tenant), so equal keys mean interchangeable K/V bytes.
"""

from __future__ import annotations

import hashlib
import struct


def hash_blocks(token_ids: list[int], block_size: int, cache_identity: str,
                salt: bytes = b"") -> list[bytes]:
    """Keys of every full block of `token_ids` (a trailing partial block has none)."""
    prev = hashlib.blake2b(cache_identity.encode() + b"|" + salt, digest_size=16).digest()
    keys = []
    for j in range(len(token_ids) // block_size):
        block = token_ids[j * block_size:(j + 1) * block_size]
        prev = hashlib.blake2b(prev + struct.pack(f"<{block_size}I", *block),
                               digest_size=16).digest()
        keys.append(prev)
    return keys
