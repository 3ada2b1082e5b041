"""bench/_transfer_exact.py: the exact floor packs the plan's chunks into messages exactly as
UcxSender.send_many does (else its figure would be the floor of another protocol)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bench._transfer_exact import messages
from runtime.transfer import Chunk
from runtime.transfer.chunks import plan_chunks
from runtime.transfer.ucx.sender import UcxSender


class RecordingSender(UcxSender):
    """send_many's grouping, without UCX: each message it would issue, as its chunk keys."""

    def __init__(self):
        super().__init__()
        self.issued: list[list] = []

    async def _peer(self, dest):
        return SimpleNamespace(credits=SimpleNamespace(capacity=self.window_bytes))

    def _out(self, peer, transfer_id):
        return SimpleNamespace(held=None, failed="", announced=None)

    async def _issue(self, out, items, hold=False):
        self.issued.append([c.key for c, _ in items])
        return []


@pytest.mark.parametrize("blocks,block_bytes,max_chunk_blocks", [
    (1, 32 << 10, 64),     # 1 MiB: 32 chunks of 32 KiB, one packed message
    (16, 32 << 10, 64),    # 16 MiB: 512 KiB chunks, each alone
    (3, 96 << 10, 2),      # mixed: 192 KiB and 96 KiB chunks, packed up to 2 MiB
    (70, 4 << 10, 64),     # small blocks, a short tail chunk per layer
    (2, 64 << 10, 1),      # 64 KiB chunks filling 2 MiB batches exactly
])
def test_exact_floor_messages_are_send_many_messages(blocks, block_bytes, max_chunk_blocks):
    layers = 32
    plan = plan_chunks(layers, 0, blocks, max_chunk_blocks)
    half = block_bytes // 2

    def views_of(key):
        return [memoryview(bytearray(key.block_count * half)), memoryview(bytearray(key.block_count * half))]

    sender = RecordingSender()
    items = [(Chunk(k, k.block_count * block_bytes, "0" * 16), views_of(k)) for k in plan]
    asyncio.run(sender.send_many("dest", "t", items))
    floor = [[k for k, _ in chunks] for _, chunks in messages(plan, views_of)]
    assert floor == sender.issued
    assert [k for keys in floor for k in keys] == list(plan)
