"""The router's output log (router/requests/output.py) times a hand-off's tokens two ways:
for the client from the prefill's token 0, for the cost model from the decode's (the
prefill's token 0 goes out before the hand-off ends; the decode's comes after it)."""

from __future__ import annotations

import pytest

from router.requests.output import OutputLog
from router.types import FinishReason, Route, RouterError


def test_a_prefills_token_0_goes_out_and_the_decodes_times_the_stream():
    now = [100.010]
    log = OutputLog(100.0, clock=lambda: now[0])
    first = log.offer(0, 7, 1, decoding=False)
    assert first is not None and not first.decoding and first.time_since_start_ms == pytest.approx(10.0)
    now[0] = 100.022  # the hand-off ended: the decode's token 0, the same token
    assert log.offer(0, 7, 1) is None
    now[0] = 100.024
    second = log.offer(1, 9, 1)
    assert second is not None and second.decoding
    now[0] = 100.026
    assert log.offer(2, 4, 1) is not None
    done = log.completed(FinishReason.LENGTH, Route.DISAGGREGATED, 1)
    assert done.ttft_ms == pytest.approx(10.0) and done.tpot_ms == pytest.approx(8.0)  # the client's: (26 - 10) / 2
    assert done.decoding_ttft_ms == pytest.approx(22.0) and done.decoding_tpot_ms == pytest.approx(2.0)


def test_a_colocated_stream_is_timed_once():
    now = [100.0]
    log = OutputLog(100.0, clock=lambda: now[0])
    for i, t in enumerate((100.010, 100.012, 100.014)):
        now[0] = t
        assert log.offer(i, i + 3, 1) is not None
    done = log.completed(FinishReason.LENGTH, Route.COLOCATED, 1)
    assert done.decode_ttft_ms is None and done.decode_tpot_ms is None
    assert (done.decoding_ttft_ms, done.decoding_tpot_ms) == (pytest.approx(10.0), pytest.approx(2.0))


def test_a_decode_token_0_other_than_the_prefills_is_a_divergence():
    log = OutputLog(100.0, clock=lambda: 100.0)
    log.offer(0, 7, 1, decoding=False)
    with pytest.raises(RouterError, match="divergence at index 0"):
        log.offer(0, 8, 1)
