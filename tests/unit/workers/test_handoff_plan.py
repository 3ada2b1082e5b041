"""A fault hook never changes what a hand-off does (prefill_worker/handoff.py HandOffPlan),
between the real PrefillWorker and DecodeWorker (tests/support/inproc_cluster.py): a request
that pauses at any step takes the plan a plain request takes, streamed or whole; a test that
wants another plan asks for it by name (runtime/worker/events.py PLAN_OPTIONS)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import pytest

from prefill_worker.handoff import HandOffPlan
from runtime.worker.events import PAUSE_STEPS
from tests.support.inproc_cluster import InprocCluster

PROMPT = [random.Random(8).randrange(3, 500) for _ in range(300)]
STREAMED = dict(stream_min_bytes=0, chunk_tokens=128, max_chunk_blocks=4)
WHOLE = dict(stream_min_bytes=1 << 40, max_chunk_blocks=4)
FIELDS = [f.name for f in dataclasses.fields(HandOffPlan)]


def plans(tmp_path, cfg: dict, request_ids: list[str]) -> dict[str, dict]:
    """Each request handed off in turn (pauses of 50 ms): its plan, as the prefill logged it."""
    tmp_path.mkdir(exist_ok=True)
    log = tmp_path / "events.jsonl"

    async def go():
        async with InprocCluster(fault_pause_s=0.05, event_log=str(log), **cfg) as c:
            for rid in request_ids:
                res = await c.reserve(rid, PROMPT, 3)
                stream = c.router_stream(res)
                await c.send(rid, res, PROMPT)
                assert len(await stream) == 3
            await c.assert_all_returned()

    asyncio.run(asyncio.wait_for(go(), 60))
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return {e["request"]: {k: e[k] for k in FIELDS} for e in events if e["event"] == "plan"}


@pytest.mark.parametrize("cfg", [STREAMED, WHOLE], ids=["streamed", "whole"])
def test_a_request_that_pauses_at_any_step_takes_a_plain_requests_plan(tmp_path, cfg):
    paused = [f"p{i}@{step}" for i, step in enumerate(PAUSE_STEPS)]
    got = plans(tmp_path, cfg, ["plain", *paused])
    assert set(got) == {"plain", *paused}
    assert {rid: plan for rid, plan in got.items() if plan != got["plain"]} == {}
    assert got["plain"]["stream"] is (cfg is STREAMED) and got["plain"]["token_commit_early"] is (cfg is STREAMED)


def test_a_test_asks_the_plan_for_another_by_name(tmp_path):
    whole = plans(tmp_path / "w", WHOLE, ["plain", "a@chunk@one_by_one"])
    assert (whole["plain"]["one_by_one"], whole["a@chunk@one_by_one"]["one_by_one"]) == (False, True)
    streamed = plans(tmp_path / "s", STREAMED, ["plain", "b@sampled@token_late"])
    assert (streamed["plain"]["token_commit_early"], streamed["b@sampled@token_late"]["token_commit_early"]) \
        == (True, False)
