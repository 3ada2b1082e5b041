"""The transports' samples become prometheus_client families (SampleCollector), the
exposition parsed back with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from runtime.telemetry.metrics import registry_of, render


class FakeSender:
    """A transport's metrics(): running totals and per-peer gauges, as ucx_sender returns them."""

    def __init__(self):
        self.stats = dict(chunks=0, bytes=0)

    def metrics(self):
        return [(f"pd_transfer_sent_{k}_total", {"backend": "ucx"}, v) for k, v in self.stats.items()] + [
            ("pd_transfer_credit_in_flight_bytes", {"backend": "ucx", "peer": "1@h"}, 0)]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict, family: str, name: str) -> float:
    return next(s.value for s in fams[family].samples if s.name == name)


def test_a_counter_moves_and_keeps_its_name_and_type():
    sender = FakeSender()
    registry = registry_of([sender.metrics])
    before = families(render(registry))
    sender.stats["bytes"] += 4096
    after = families(render(registry))
    assert before["pd_transfer_sent_bytes"].type == "counter"
    assert sample(before, "pd_transfer_sent_bytes", "pd_transfer_sent_bytes_total") == 0
    assert sample(after, "pd_transfer_sent_bytes", "pd_transfer_sent_bytes_total") == 4096
    assert after["pd_transfer_credit_in_flight_bytes"].type == "gauge"
    assert after["pd_transfer_sent_bytes"].documentation == "K/V bytes the sender delivered."
    [peer] = after["pd_transfer_credit_in_flight_bytes"].samples
    assert peer.labels == {"backend": "ucx", "peer": "1@h"}


def test_a_failing_source_does_not_hide_the_others():
    def broken():
        raise RuntimeError("gone")
    fams = families(render(registry_of([broken, FakeSender().metrics])))
    assert "pd_transfer_sent_chunks" in fams
