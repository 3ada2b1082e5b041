"""bench/handoff.py's legs: from the last traced step of one process to the first of the
next, per trace, medians; the Publish's way back from the last Publish span (one asked
again); a trace without both steps is left out of that leg."""

from __future__ import annotations

from types import SimpleNamespace

from bench.handoff import EXTRA_LEGS, legs

MS = 1_000_000


def span(service, name, start_ms, end_ms, events=()):
    return SimpleNamespace(service=f"pdserve-{service}", name=name, start_ns=int(start_ms * MS),
                           end_ns=int(end_ms * MS), events=[{"name": n, "t_ns": int(t * MS)} for n, t in events])


def trace(shift: float, publishes=((18.0, 19.0),)):
    return SimpleNamespace(spans=[
        span("decode", "/pd.v1.Decode/Reserve", 2.0, 2.5),
        span("prefill", "/pd.v1.Prefill/Prefill", 1.0, 20.0, [("granted", 5.5 + shift)]),
        span("prefill", "transfer.layer", 12.0, 12.1, [("chunk.sent", 12.05)]),
        span("decode", "transfer.receive", 2.6, 15.0, [("chunk.visible", 14.05 + shift)]),
        span("decode", "decode.publish", 17.0, 20.0),
        *(span("directory", "/pd.v1.Directory/Publish", a, b) for a, b in publishes),
    ])


def test_each_leg_is_the_median_gap_between_its_two_steps():
    got = legs([trace(0.0), trace(1.0), trace(2.0)], EXTRA_LEGS)
    assert {k: round(v[0], 6) for k, v in got.items()} == {
        "decode Reserve -> router -> prefill's grant (2 one-way hops)": 4.0,
        "prefill chunk sent -> decode chunk visible (data plane)": 3.0,
        "decode -> directory Publish": 1.0,
        "directory Publish -> decode": 1.0,
    }
    assert {n for _, n in got.values()} == {3}


def test_the_way_back_leaves_from_the_last_publish_and_a_missing_step_drops_the_trace():
    asked_again = trace(0.0, publishes=((17.5, 17.7), (18.5, 19.5)))
    bare = SimpleNamespace(spans=[s for s in trace(0.0).spans if s.name != "/pd.v1.Prefill/Prefill"])
    got = legs([asked_again, bare], EXTRA_LEGS)
    assert got["directory Publish -> decode"] == (0.75, 2)  # 0.5 and 1.0 (from the first one: 2.3)
    assert got["decode -> directory Publish"] == (0.75, 2)  # to the first one: 0.5 and 1.0
    assert got["decode Reserve -> router -> prefill's grant (2 one-way hops)"] == (3.0, 1)  # bare: left out
