"""`pdctl trace` end to end over a span file (no router, no processes): the default file
under the state dir, --json, --html, exit codes and messages."""

from __future__ import annotations

import json
import re

from pdserve_client import contract
from pdserve_client import spans as sv
from pdserve_ops import cli
from tests.support import traces


def _file(tmp_path, spans=None):
    return traces.write(tmp_path / "spans.jsonl", spans or traces.disaggregated() + traces.colocated())


def test_trace_prints_the_waterfall_from_the_state_dirs_span_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    traces.write(tmp_path / contract.LOCAL_STATE_DIR / sv.SPANS_FILE, traces.disaggregated())
    assert cli.main(["trace", "req-1"]) == 0
    out = capsys.readouterr().out
    assert "t_exposed_ms 2.875" in out and "attempt 2: generation 2" in out
    lines = out.splitlines()
    assert sum(sv.ROUTER_ATTEMPT in line for line in lines) == 2 and len(lines) == 6 + 2 + 20  # summary, header, rows


def test_trace_json_holds_the_summary_and_every_row(tmp_path, capsys):
    path = _file(tmp_path)
    assert cli.main(["trace", "req-1", "--spans", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (t,) = doc["traces"]
    assert doc["request_id"] == "req-1" and t["t_exposed_ms"] == 2.875 and t["route"] == "disaggregated"
    assert len(t["rows"]) == 20 and t["orphans"] == 1 and [a["generation"] for a in t["attempts"]] == [1, 2]
    assert {x["transfer_id"]: x["t_exposed_ms"] for x in t["transfers"]} == {"x1": None, "x2": 2.875}


def test_trace_html_writes_one_bar_per_span_with_every_text_escaped(tmp_path, capsys):
    spans = traces.disaggregated()
    spans[1]["attributes"]["pd.note"] = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    spans[2]["name"] = "router.attempt<b>"
    page = tmp_path / "trace.html"
    assert cli.main(["trace", "req-1", "--spans", str(_file(tmp_path, spans)), "--html", str(page)]) == 0
    assert f"wrote {page}" in capsys.readouterr().err
    text = page.read_text()
    assert len(re.findall(r"data-span-id=", text)) == 20
    assert "<img" not in text and "<b>" not in text and text.count("<script>") == 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img" in text
    assert "http://" not in text.replace("http-equiv", "") and "https://" not in text  # nothing fetched


def test_an_unknown_request_exits_1_with_a_message(tmp_path, capsys):
    assert cli.main(["trace", "nope", "--spans", str(_file(tmp_path)), "--wait-s", "0"]) == 1
    err = capsys.readouterr().err
    assert "request nope not found" in err and "pd.request_id='nope'" in err


def test_no_span_file_exits_1_and_says_why(tmp_path, capsys):
    assert cli.main(["trace", "r", "--state-dir", str(tmp_path / "none"), "--wait-s", "0"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert cli.main(["trace"]) == 2
    assert cli.main(["trace", "r", "--wait-s", "-1"]) == 2
    assert cli.main(["trace", "r", "--spans", "a", "--state-dir", "b"]) == 2


def test_a_request_in_two_traces_is_said_and_both_shown(tmp_path, capsys):
    path = _file(tmp_path, traces.disaggregated() + traces.colocated("req-1", trace="c" * 32))
    assert cli.main(["trace", "req-1", "--spans", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "ran as 2 traces" in captured.err and len(json.loads(captured.out)["traces"]) == 2


def test_malformed_lines_are_warned_about(tmp_path, capsys):
    path = _file(tmp_path)
    with path.open("a") as f:
        f.write("garbage\n{}\n")
    assert cli.main(["trace", "req-colo", "--spans", str(path)]) == 0
    assert "2 malformed line(s) skipped" in capsys.readouterr().err
