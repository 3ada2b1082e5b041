"""`pdctl trace --html` in a real headless Chromium (tests/support/browser.py): the page
loads from a file URL with no console error, shows one bar per span, opens a span's
details on click, and renders hostile span text as text. Without Chromium the test
fails and says how to install it (`make install` does)."""

from __future__ import annotations

import json

import pytest

from pdserve_client import spans as sv
from pdserve_ops import cli
from tests.support import traces
from tests.support.browser import BrowserUnavailable, Chromium

HOSTILE = '</td><script>window.__pwned = 1</script>"><img src=x onerror="window.__pwned = 2">'


@pytest.fixture(scope="module")
def browser():
    try:
        chromium = Chromium.open()
    except BrowserUnavailable as e:
        pytest.fail(f"the trace page test needs a headless Chromium: {e}", pytrace=False)
    with chromium:
        yield chromium


def _page(tmp_path, spans: list[dict], request_id: str):
    path = traces.write(tmp_path / "spans.jsonl", spans)
    page = tmp_path / "trace.html"
    assert cli.main(["trace", request_id, "--spans", str(path), "--html", str(page), "--wait-s", "0"]) == 0
    return page


def test_the_page_shows_every_span_and_the_summary_without_console_errors(browser, tmp_path):
    spans = traces.disaggregated()
    page = browser.load(_page(tmp_path, spans + traces.colocated(), "req-1"))
    assert page.evaluate("document.title") == "pdserve trace of request req-1"
    assert page.evaluate("document.querySelectorAll('[data-span-id]').length") == len(spans)
    shown = page.evaluate("Array.from(document.querySelectorAll('[data-span-id]'), e => e.dataset.spanId)")
    assert sorted(shown) == sorted(s["span_id"] for s in spans)
    summary = page.evaluate("document.querySelector('.summary').innerText")
    assert "T_exposed ms\t2.875" in summary and "disaggregated" in summary and "TRANSFER_FAILED" in summary
    widths = page.evaluate("Array.from(document.querySelectorAll('.bar'), e => e.getBoundingClientRect().width)")
    assert all(w >= 1 for w in widths)  # every bar is visible, however short its span
    assert page.errors == []


def test_a_click_opens_a_spans_attributes_and_events(browser, tmp_path):
    page = browser.load(_page(tmp_path, traces.disaggregated(), "req-1"))
    row = "Array.from(document.querySelectorAll('.row')).find(r => r.querySelector('.bar.error'))"
    assert page.evaluate(f"{row}.querySelector('.details').hidden") is True
    page.evaluate(f"{row}.click()")
    details = page.evaluate(f"{row}.querySelector('.details').innerText")
    assert "pd.transfer_id\tx1" in details and "TRANSFER_FAILED: source prefill-0 lost" in details
    page.evaluate("document.getElementById('toggle-all').click()")
    assert page.evaluate("Array.from(document.querySelectorAll('.details')).every(d => !d.hidden)")
    assert page.errors == []


def test_hostile_span_text_stays_text(browser, tmp_path):
    spans = traces.colocated()
    spans[2]["attributes"]["pd.note"] = HOSTILE
    spans[3]["name"] = HOSTILE
    spans[4]["events"] = [traces.event(HOSTILE, 1.0, **{sv.REASON: HOSTILE})]
    page = browser.load(_page(tmp_path, spans, "req-colo"))
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("document.querySelectorAll('script').length") == 1  # the page's own
    assert page.evaluate("document.querySelectorAll('[data-span-id]').length") == len(spans)
    page.evaluate("document.getElementById('toggle-all').click()")
    assert page.evaluate(f"document.body.innerText.split({json.dumps(HOSTILE)}).length - 1") >= 4
    assert page.errors == []


def test_a_request_in_two_traces_gets_two_sections(browser, tmp_path):
    spans = traces.disaggregated() + traces.colocated("req-1", trace="c" * 32)
    page = browser.load(_page(tmp_path, spans, "req-1"))
    assert page.evaluate("document.querySelectorAll('section.trace').length") == 2
    assert page.evaluate("document.querySelectorAll('[data-span-id]').length") == len(spans)
    assert page.errors == []
