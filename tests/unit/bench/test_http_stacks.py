"""bench/http_stacks.py's pure helpers: where the first SSE event ends in a body (also in
the raw bytes of a chunked HTTP/1.1 response), and what a front adds over its baseline."""

from __future__ import annotations

import pytest

from bench.http_stacks import DONE, TARGET_ADDED_MS, compare, first_event_end, sse


def test_the_first_event_ends_after_its_blank_line():
    body = sse(b'{"a": 1}') + sse(b'{"a": 2}') + DONE
    assert body[:first_event_end(body)] == b'data: {"a": 1}\n\n'


def test_an_unfinished_event_is_not_an_event():
    assert first_event_end(b'data: {"a": 1}\n') == -1
    assert first_event_end(b"") == -1


def test_headers_and_chunk_framing_are_never_taken_for_an_event_end():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    event = sse(b"{}")
    raw = head + f"{len(event):x}\r\n".encode() + event + b"\r\n"
    assert first_event_end(head) == -1
    assert raw[:first_event_end(raw)].endswith(b"data: {}\n\n")


def test_compare_gives_the_added_median_the_paired_median_and_the_ratio():
    out = compare([2.0, 3.0, 4.0], [1.0, 1.5, 2.0])
    assert out["added_ms"] == pytest.approx(1.5)
    assert out["added_paired_ms"] == pytest.approx(1.5)
    assert out["ratio"] == pytest.approx(2.0)
    assert out["met"] is (1.5 <= TARGET_ADDED_MS)


def test_compare_meets_the_target_at_exactly_the_target():
    assert compare([1.0 + TARGET_ADDED_MS] * 3, [1.0] * 3)["met"]
    assert not compare([1.01 + TARGET_ADDED_MS] * 3, [1.0] * 3)["met"]


def test_compare_wants_the_same_rounds_on_both_sides():
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0])
