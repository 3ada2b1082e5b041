"""Workloads: the Azure trace format, rate scaling, interleaving, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.workload import Workload, interleave

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(text)
    return p


def test_azure_timestamps_and_columns(tmp_path):
    p = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
                        "2023-11-16 18:15:51.2224670,879,55\n")
    w = Workload.from_csv(p)
    assert [r.prompt_tokens for r in w.requests] == [374, 396, 879]
    assert [round(r.arrival_s, 6) for r in w.requests] == [0.0, 4.314579, 4.541877]
    assert w.rate_rps == pytest.approx(2 / 4.541877)
    s = w.scaled(10.0)
    assert s.rate_rps == pytest.approx(10.0) and [r.output_tokens for r in s.requests] == [44, 109, 55]


@pytest.mark.parametrize("text,match", [
    ("TIMESTAMP,Context,GeneratedTokens\n1,2,3\n", "missing column"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,two,3\n", "t.csv:2: ContextTokens 'two' is not an integer"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,5,0\n", "GeneratedTokens must be >= 1"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", "TIMESTAMP 'yesterday'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
])
def test_bad_traces_say_what_is_wrong(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        Workload.from_csv(write(tmp_path, text))


def test_interleave_keeps_order_and_kinds():
    a = Workload.synthetic(5.0, 50, seed=1, name="a")
    b = Workload.synthetic(7.0, 50, seed=2, name="b")
    m = interleave([a, b])
    assert len(m) == 100 and {r.kind for r in m.requests} == {"a", "b"}
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(m.requests, m.requests[1:]))


@pytest.mark.skipif(not TRACES.exists(), reason="the shared traces are not beside this checkout")
def test_the_shared_traces_load():
    conv = Workload.from_csv(TRACES / "azure-llm-2023-conv.csv")
    code = Workload.from_csv(TRACES / "azure-llm-2023-code.csv")
    assert len(conv) == 19366 and len(code) == 8819
    assert 4.0 < conv.rate_rps < 7.0


def test_spanning_repeats_the_sample_for_a_steady_state():
    w = Workload.synthetic(100.0, 50, seed=3)
    long = w.spanning(5.0)
    assert long.duration_s >= 5.0 and len(long) % len(w) == 0
    assert [r.prompt_tokens for r in long.requests[:50]] == [r.prompt_tokens for r in long.requests[50:100]]
    assert long.rate_rps == pytest.approx(w.rate_rps, rel=0.05)
    assert len(w.spanning(1e6, max_copies=4)) == 200 and w.spanning(0.1) is w
