"""`pdctl blocks` and the SDK's `blocks()` against the in-process fake Admin
(tests/support/sdk.py): counts per worker, holdings with their block ids, orphans
with the router's reason, the filters sent as asked."""

from __future__ import annotations

import asyncio
import json

from pdserve_client import AsyncClient
from pdserve_ops.cli import main


def test_sdk_blocks_decodes_the_view(fake, addr):
    async def run():
        async with AsyncClient(addr, timeout_s=5) as c:
            return await c.blocks(request_id="gone", worker_id="decode-0", orphans_only=True)

    view = asyncio.run(run())
    ((worker_id, h),) = view.orphans
    assert (worker_id, h.request_id, h.state, h.generation, h.orphan) == ("decode-0", "gone", "reserved", 2, True)
    assert h.block_ids == [8, 9, 10, 11, 20]
    d0 = view.workers[0]
    # The wire's 50 free and 7 cached are 57 free, 7 of them cached: status's definition.
    assert (d0.free_blocks, d0.cached_prefix_blocks) == (57, 7)
    assert d0.free_blocks + d0.held_blocks == d0.total_blocks
    (req,) = fake.blocks_requests
    assert (req.request_id, req.worker_id, req.orphans_only) == ("gone", "decode-0", True)


def test_cli_blocks_table_and_json(fake, addr, capsys):
    assert main(["--router", addr, "blocks"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[3:] == ["FREE", "(CACHED)", "RESERVED", "ACTIVE", "TOTAL", "ORPHANED"]
    assert lines[1].split() == ["decode-0", "decode", "1", "57", "7", "5", "2", "64", "5"]
    assert "prefill-0: no answer: UNAVAILABLE: down" in out
    (gone,) = [line for line in lines if " gone " in line]
    assert "reserved" in gone and "8-11,20" in gone and "ORPHAN: request not in flight" in gone
    (live,) = [line for line in lines if " r1 " in line]
    assert "decoding" in live and "2/3" in live and "ORPHAN" not in live
    assert "2 holding(s), 1 orphan(s)" in out

    assert main(["--router", addr, "blocks", "--orphans-only", "--json", "--request", "gone"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [h["request_id"] for w in doc["workers"] for h in w["holdings"]] == ["gone"]
    assert fake.blocks_requests[-1].orphans_only and fake.blocks_requests[-1].request_id == "gone"
