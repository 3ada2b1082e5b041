"""bench/_handoff_floor.py, the design floor bench/handoff.py reports: real processes
(grpc.aio over mutual TLS, UCX through pdserve's runtime, a real redis-server) that do
the hand-off's transaction, not a no-op: every disaggregated request's record reserved,
published and released in Redis, its nonce consumed once, each request's first token
timed in both modes."""

from __future__ import annotations

import pytest

from bench._handoff_floor import measure

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("merged", "one", "watch"),
                         [(False, False, False), (True, False, False), (False, True, False), (False, False, True)],
                         ids=["router-reserves", "decode-reserves", "reserve-and-stream-one-call",
                              "router-watches-the-publication"])
def test_every_handoff_reserved_published_released_once(merged, one, watch):
    r = measure(requests=3, warmup=1, compute_ms=1.0, step_ms=0.1, kv_bytes=8192, tls=True, nonce=True,
                merged=merged, one=one, watch=watch)
    assert len(r["colocated"]) == len(r["disaggregated"]) == 3
    assert all(ms > 0 for ms in r["colocated"] + r["disaggregated"])
    # 7 disaggregated requests (the warm-up's and the CPU count's included): each one
    # record, released after its last token (never left reserved or published), one nonce each.
    assert r["records"] == {"X": 7, "nonces": 7}
    # Variant o: each hand-off on one Handoff call (its reserve and stream steps counted
    # too); the others on a Reserve and a DecodeStream.
    assert r["decode_calls"] == ({"Handoff": 7, "Reserve": 7, "DecodeStream": 7} if one
                                 else {"Reserve": 7, "DecodeStream": 7})
    # Variant w: each record made on a call held open for its publication.
    assert r["directory_calls"] == ({"ReserveWatch": 7} if watch else {})
    assert r["cpu"]["disaggregated"]["directory"] > 0 and r["cpu"]["colocated"]["decode"] > 0
    assert r["cpu"]["disaggregated"]["prefill"] > r["cpu"]["colocated"]["prefill"]  # it computes there only
    assert r["iterations"]["prompt"] > 0


def test_directory_on_a_pool_with_reads_does_the_same():
    r = measure(requests=2, warmup=0, compute_ms=0.0, step_ms=0.0, kv_bytes=64, tls=False, pool=True,
                read=True)
    assert r["records"] == {"X": 4, "nonces": 0}
    assert r["iterations"] == {"prompt": 0, "step": 0}


def test_engine_variant_computes_with_pdserves_engine():
    """Variant e: each prompt's compute is the tiny preset's real prefill (the GIL held
    between kernels, as in a worker), in the prefill when disaggregated, the decode when not."""
    r = measure(requests=2, warmup=1, compute_ms=1.0, step_ms=0.1, kv_bytes=8192, tls=False, engine="tiny")
    assert r["engine"].startswith("tiny@")
    assert r["iterations"]["prompt"] == 0  # no burst calibrated or run: the engine computes
    assert r["records"] == {"X": 5, "nonces": 0}
    assert r["cpu"]["disaggregated"]["prefill"] > 10 * r["cpu"]["colocated"]["prefill"]
