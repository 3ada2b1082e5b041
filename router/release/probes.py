"""What the release measures on the live cluster: a colocated request served end to end,
the blocks held for unpublished transfers, the transfers still open."""

from __future__ import annotations

import uuid

from pdserve_client.rpc.pd.v1 import admin_pb2
from router.blocks import blocks
from router.types import Completed, GenerateParams, Mode, RouterError

TENANT = "pdserve-release"
"""The tenant of every request the release itself sends (probes, smokes): never a canary sample."""


def probe_id(kind: str) -> str:
    """A fresh request id for one of the release's own requests."""
    return f"{kind}-{uuid.uuid4().hex[:12]}"


PROBE_PROMPT = (1, 2, 3, 4)
"""The colocated probe's prompt: a few token ids every vocabulary has."""


class RollbackBlocked(RuntimeError):
    """A step cannot complete now (what is missing, in words); the rollback stays at that
    step and resumes from it."""


async def colocated_probe(ctl) -> float:
    """Serve one small colocated request through this router; its TTFT in ms."""
    params = GenerateParams(request_id=probe_id("rollback-probe"), tenant=TENANT,
                            prompt_token_ids=PROBE_PROMPT, max_tokens=2, mode=Mode.COLOCATED, deadline_ms=30_000)
    try:
        run = await ctl.orch.submit(params)
        done = [e async for e in run.stream()][-1]
    except RouterError as exc:
        raise RollbackBlocked(f"the colocated probe failed: {exc.code.name}: {exc.message}") from None
    assert isinstance(done, Completed)
    return done.ttft_ms


async def reserved_blocks(ctl) -> int:
    """Blocks the live workers hold for unpublished transfers (reserved for, or sending, one)."""
    answer = await blocks(ctl.orch, admin_pb2.BlocksRequest())
    unreached = [w.worker_id for w in answer.workers if w.error]
    if unreached:
        raise RollbackBlocked(f"cannot read the blocks of {', '.join(unreached)}")
    return sum(w.reserved_blocks for w in answer.workers)


async def open_transfers(ctl) -> list:
    """Unpublished transfer transactions (the directory's list)."""
    return list(await ctl.orch.directory.list_open_transactions(ctl.config.directory_timeout_s))
