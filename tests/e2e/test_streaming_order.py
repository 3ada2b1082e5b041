"""Layer streaming on the real cluster (ucx): the producer gate and the consumer gate
(docs/design.md, Contracts: the streaming gate).

Workers append hand-off events to one JSON-lines file (PD_EVENT_LOG, times from
CLOCK_MONOTONIC, one clock for every process here). A 1,000-token prompt on
`tiny` is 4 prefill chunks of 256 tokens; the transfer is 4 layers x 4 chunks of
16 blocks. The test asserts, per request:

  producer gate  every chunk_sent follows a layer_written of its layer that
                 covers its last token
  overlap        some chunk left before prefill wrote its last layer
  consumer gate  `published` follows every chunk_visible, and all 16 were visible
and the tokens equal a colocated run.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from tests.support.cluster import assert_cluster_clean, client, start_cluster
from tests.support.metrics import scrape_process

PROMPT_TOKENS = 1000
CHUNKS = 4 * 4  # tiny: 4 layers; 63 blocks in chunks of 16 blocks (one prefill chunk)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("streaming")
    events = tmp / "events.jsonl"
    c = start_cluster(tmp, prefill=1, decode=1, transport="ucx",
                      env={"PD_EVENT_LOG": str(events), "PD_STREAM_MIN_BYTES": "0"})
    c.events = events
    c.metrics = lambda worker: scrape_process(c, worker).as_dict()
    yield c
    c.down()


def events_of(cluster, request_id: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in cluster.events.read_text().splitlines():
        e = json.loads(line)
        if e.get("request") == request_id:
            out.setdefault(e["event"], []).append(e)
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_chunks_leave_after_their_layer_and_publish_waits_for_all(cluster, seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(3, 500) for _ in range(PROMPT_TOKENS)]
    with client(cluster) as sdk:
        split = sdk.generate_full(prompt_ids=prompt, max_tokens=6, ignore_eos=True,
                                     mode="disaggregated", request_id=f"stream-{seed}")
        coloc = sdk.generate_full(prompt_ids=prompt, max_tokens=6, ignore_eos=True,
                                     mode="colocated")
    assert split.route == "disaggregated" and split.token_ids == coloc.token_ids
    ev = events_of(cluster, f"stream-{seed}")
    written, sent, visible = ev["layer_written"], ev["chunk_sent"], ev["chunk_visible"]
    assert len(sent) == CHUNKS and len(visible) == CHUNKS, {k: len(v) for k, v in ev.items()}
    for c in sent:  # producer gate
        opened = [w["t"] for w in written
                  if w["layer"] == c["layer"] and w["token_end"] >= c["needs_token"]]
        assert opened and min(opened) <= c["t"], f"chunk sent before its layer: {c}"
    assert min(c["t"] for c in sent) < max(w["t"] for w in written), "no overlap with compute"
    published = ev["published"]
    assert len(published) == 1 and published[0]["chunks"] == CHUNKS
    assert published[0]["t"] >= max(v["t"] for v in visible)  # consumer gate
    keys = {(v["layer"], v["block_start"]) for v in visible}
    assert keys == {(layer, b) for layer in range(4) for b in (0, 16, 32, 48)}
    assert_cluster_clean(cluster)


def test_metrics_report_the_data_path_and_the_bytes(cluster):
    """The path UCX took (shared memory here) and the bytes moved are on the workers' /metrics."""
    with client(cluster) as sdk:
        sdk.generate_full(prompt_ids=[3 + i % 500 for i in range(600)], max_tokens=2,
                             ignore_eos=True, mode="disaggregated")
    deadline = time.monotonic() + 5
    while True:
        sent, got = cluster.metrics("prefill-0"), cluster.metrics("decode-0")
        paths = [dict(labels)["path"] for (name, labels) in sent if name == "pd_transfer_path_info"]
        sent_bytes = sum(v for (n, _), v in sent.items() if n == "pd_transfer_sent_bytes_total")
        got_bytes = sum(v for (n, _), v in got.items() if n == "pd_transfer_received_bytes_total")
        if (paths and sent_bytes and got_bytes == sent_bytes) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert paths and all(p.startswith("shm(") and "cma" in p for p in paths), paths
    assert sent_bytes > 0 and got_bytes == sent_bytes
    in_flight = [v for (n, _), v in sent.items() if n == "pd_transfer_credit_in_flight_bytes"]
    assert in_flight and all(v == 0 for v in in_flight)
