"""bench/handoff.py's legs: from the last traced step of one process to the first of the
next, per trace, medians; the Publish's way back from the last Publish span (one asked
again); a trace without both steps is left out of that leg."""

from __future__ import annotations

from types import SimpleNamespace

from bench._handoff_traces import EXTRA_LEGS, HANDOFF, HELD_LEG, after_compute, legs, rpc_counts, span_counts

MS = 1_000_000


def span(service, name, start_ms, end_ms, events=()):
    return SimpleNamespace(service=f"pdserve-{service}", name=name, start_ns=int(start_ms * MS),
                           end_ns=int(end_ms * MS), events=[{"name": n, "t_ns": int(t * MS)} for n, t in events])


def trace(shift: float, publishes=((18.0, 19.0),)):
    return SimpleNamespace(spans=[
        span("decode", "/pd.v1.Decode/Reserve", 2.0, 2.5),
        span("prefill", "/pd.v1.Prefill/Prefill", 1.0, 20.0, [("granted", 5.5 + shift)]),
        span("prefill", "transfer.send", 12.0, 12.1, [("layer.sent", 12.05)]),
        span("decode", "transfer.receive", 2.6, 15.0, [("layer.visible", 14.05 + shift)]),
        span("decode", "decode.publish", 17.0, 20.0),
        *(span("directory", "/pd.v1.Directory/Publish", a, b) for a, b in publishes),
    ])


def test_each_leg_is_the_median_gap_between_its_two_steps():
    got = legs([trace(0.0), trace(1.0), trace(2.0)], EXTRA_LEGS)
    assert {k: round(v[0], 6) for k, v in got.items()} == {
        "decode Reserve -> router -> prefill's grant (2 one-way hops)": 4.0,
        "prefill layer sent -> decode layer visible (data plane)": 3.0,
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


def test_the_held_leg_counts_only_the_traces_where_token_0_waited_for_the_prefill():
    def attempt(events):
        return SimpleNamespace(spans=[span("router", "router.attempt", 1.0, 30.0, events)])
    held = [attempt([("token.held", 20.0), ("prefill.done", 20.0 + gap)]) for gap in (0.5, 1.0, 3.0)]
    first = attempt([("prefill.done", 19.0)])  # the prefill's reply came before token 0: no wait
    assert legs([*held, first], HELD_LEG) == {next(iter(HELD_LEG)): (1.0, 3)}


def test_calls_are_counted_per_trace_by_service_and_method_asked_again_ones_included():
    one = SimpleNamespace(spans=[span("directory", "/pd.v1.Directory/ConsumeNonce", 1, 2),
                                 span("directory", "/pd.v1.Directory/ConsumeNonce", 3, 4),
                                 span("decode", "/pd.v1.Decode/Reserve", 1, 2), span("decode", "decode.publish", 5, 6)])
    two = SimpleNamespace(spans=[span("decode", "/pd.v1.Decode/Reserve", 1, 2)])
    assert rpc_counts([one, two]) == {"decode/Reserve": 1.0, "directory/ConsumeNonce": 1.0}
    assert rpc_counts([]) == {}


def test_spans_and_their_events_are_counted_per_trace_by_service():
    one, two = trace(0.0), trace(1.0, publishes=((18.0, 18.5), (18.6, 19.0)))
    per_service, events = span_counts([one, two])
    assert per_service == {"decode": 3.0, "directory": 1.5, "prefill": 2.0} and events == 3.0
    assert span_counts([]) == ({}, 0.0)


def _computed(shift):
    return SimpleNamespace(spans=[  # a prompt computed in two chunks: the paths start at the last's end
        span("prefill", "prefill.compute", 1.0, 3.0),
        span("prefill", "prefill.compute", 3.0, 8.0),
        span("prefill", "/pd.v1.Prefill/Prefill", 0.8, 30.0, [("granted", 4.0), ("first_token", 8.2 + shift)]),
        span("prefill", "transfer.send", 8.4, 8.5, [("layer.sent", 8.5 + shift)]),
        span("decode", "transfer.receive", 2.0, 10.0,
             [("layer.visible", 9.0 + shift), ("layer.visible", 9.5 + shift)]),
        span("decode", "decode.validate", 10.0 + shift, 10.4 + shift),
        span("decode", "decode.publish", 10.5 + shift, 12.5 + 2 * shift),
        span("decode", "decode.generate", 14.0 + 2 * shift, 16.0 + 2 * shift),
        span("router", "router.request", 0.5, 20.0, [("first_token", 9.0 + 2 * shift)]),
    ])


def test_token_0s_path_after_the_compute_goes_from_the_prefill_to_the_router():
    segments, whole = after_compute([_computed(0.0), _computed(1.0), _computed(2.0)])
    assert {k: round(ms, 6) for k, (ms, _) in segments.items()} == {
        "compute ended -> token 0 left the prefill": 1.2,
        "token 0 left the prefill -> token 0 left the router": 1.8,
    }
    assert whole == (3.0, 3)
    assert after_compute([SimpleNamespace(spans=_computed(0.0).spans[2:])])[1] is None  # no compute: no path


def test_the_hand_off_is_cut_at_each_step_and_its_whole_is_its_own_median():
    segments, whole = after_compute([_computed(0.0), _computed(1.0), _computed(2.0)], HANDOFF)
    assert {k: round(ms, 6) for k, (ms, _) in segments.items()} == {
        "compute ended -> first layer sent": 1.5,
        "first layer sent -> last layer visible": 1.0,  # to the last layer, not the first
        "last layer visible -> validation began": 0.5,
        "validation began -> Publish left": 0.5,
        "Publish left -> published": 3.0,
        "published -> decoding": 1.5,
    }
    assert whole == (8.0, 3)
