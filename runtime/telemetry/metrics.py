"""The transports' own figures as prometheus_client metric families.

Each process has one `CollectorRegistry` (runtime/telemetry/catalog.py builds it and
runtime/telemetry/endpoint.py serves it on /metrics). The data plane's running totals
and per-peer gauges stay with the transports, which return samples

    source() -> [(name, {label: value}, number), ...]

and `SampleCollector` turns those into metric families at each collection: a
name ending in ``_total`` is a counter (the transports' own running totals,
exported as they are), any other a gauge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

Sample = tuple[str, dict[str, str], float]
Source = Callable[[], Iterable[Sample]]

HELP = {
    "pd_transfer_sent_chunks": "K/V chunks the sender delivered.",
    "pd_transfer_sent_bytes": "K/V bytes the sender delivered.",
    "pd_transfer_sent_failed_transfers": "Transfers the sender gave up.",
    "pd_transfer_sent_announced_batches": "Batches whose header left before their chunks were hashed "
                                          "(ucx: announced, the checksums in the COMMIT).",
    "pd_transfer_received_chunks": "K/V chunks the receiver made visible.",
    "pd_transfer_received_bytes": "K/V bytes the receiver made visible.",
    "pd_transfer_received_failed_transfers": "Transfers the receiver failed.",
    "pd_transfer_received_drained": "Posted receives of ended transfers the receiver completed itself "
                                    "(a receive into staging at once, one into the cache after the fence timeout).",
    "pd_transfer_received_staged_pieces": "Chunk pieces the receiver staged before copying.",
    "pd_transfer_received_carried_commits": "COMMITs that arrived in the header of the sender's last batch.",
    "pd_transfer_pending": "Transfers the receiver expects and has not decided.",
    "pd_transfer_path_info": "The path UCX took to a peer (value 1).",
    "pd_transfer_credit_in_flight_bytes": "Byte credit in flight to a peer.",
    "pd_transfer_credit_peak_bytes": "Most byte credit ever in flight to a peer.",
    "pd_transfer_credit_window_bytes": "Byte credit window per peer.",
    "pd_dataplane_rejected": "Data-plane messages dropped unread or refused, by side and reason (ucx: a MAC "
                             "that does not hold, an unknown transfer, a replay, a message nobody receives...).",
    "pd_dataplane_endpoints": "UCX endpoints the process holds (to peers that proved a transfer key, and itself).",
    "pd_engine_loop_seconds": "The engine loop thread's time by phase (commands: imports, allocations and frees; "
                              "prefill: chunks; decode: steps; idle: waiting for work) and clock (wall; cpu: the "
                              "thread's own CPU time; wall above cpu in a phase is time the thread was runnable "
                              "and not running: other threads holding the GIL, or the cores busy elsewhere).",
    "pd_engine_loop_runs": "Engine loop phases run, by phase (decode: steps).",
    "pd_engine_loop_decoded_sequences": "Sequences summed over the decode steps (over the steps: the mean batch).",
}
"""HELP text by family name (a counter's name without _total); others get their name.
Names must match the transports' metrics() (runtime/transfer/ucx/sender.py, ucx/receiver.py)."""


class SampleCollector(Collector):
    """A prometheus_client collector over sample sources, read at every collection."""

    def __init__(self, sources: list[Source]):
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for source in self.sources:
            try:
                for name, labels, value in source():
                    by_name.setdefault(name, []).append((labels, value))
            except Exception:  # one bad source must not stop the rest
                log.exception("metrics source failed")
        for name, samples in by_name.items():
            label_names = sorted({k for labels, _ in samples for k in labels})
            kind = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            family = name.removesuffix("_total")
            metric = kind(name, HELP.get(family, family), labels=label_names)
            for labels, value in samples:
                metric.add_metric([str(labels.get(k, "")) for k in label_names], float(value))
            yield metric


def registry_of(sources: list[Source]) -> CollectorRegistry:
    """A registry of its own holding a SampleCollector over `sources`."""
    registry = CollectorRegistry()
    registry.register(SampleCollector(sources))
    return registry


def render(registry: CollectorRegistry) -> str:
    """The registry's Prometheus text exposition."""
    return generate_latest(registry).decode()


def parse(text: str) -> list[Sample]:
    """Every sample of an exposition, as (sample name, labels, value) (tests, drills)."""
    return [(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]
