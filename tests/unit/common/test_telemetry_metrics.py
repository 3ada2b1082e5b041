"""The worker's metrics go through prometheus_client: one registry per process, the
exposition parsed back with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from services.telemetry.metrics import MetricsFile, registry_of, render
from services.worker.config import WorkerConfig
from services.worker.process import metrics_file


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


def test_the_worker_metrics_file_has_engine_gauges_and_transport_counters(tmp_path):
    engine = SimpleNamespace(num_free_blocks=60, blocks=SimpleNamespace(num_blocks=64))
    loop = SimpleNamespace(engine=engine, pending_prefill_tokens=7, active_decode=2)
    sender = FakeSender()
    cfg = WorkerConfig(metrics_file=str(tmp_path / "metrics-{worker}.prom"), worker_id="w0")
    out = metrics_file(cfg, loop, sender, object())  # a transport without metrics() is skipped

    async def run():
        out.start()
        await asyncio.sleep(0)
        engine.num_free_blocks, sender.stats["chunks"] = 52, 3
        await out.stop()  # writes once more on the way out

    asyncio.run(run())
    fams = families((tmp_path / "metrics-w0.prom").read_text())
    assert fams["pd_engine_free_blocks"].type == "gauge"
    assert sample(fams, "pd_engine_free_blocks", "pd_engine_free_blocks") == 52
    assert sample(fams, "pd_engine_total_blocks", "pd_engine_total_blocks") == 64
    assert sample(fams, "pd_engine_pending_prefill_tokens", "pd_engine_pending_prefill_tokens") == 7
    assert sample(fams, "pd_engine_active_decode", "pd_engine_active_decode") == 2
    assert sample(fams, "pd_transfer_sent_chunks", "pd_transfer_sent_chunks_total") == 3


def test_no_path_no_file(tmp_path):
    async def run():
        f = MetricsFile("", registry_of([]))
        f.start()
        await f.stop()
    asyncio.run(run())
    assert not list(tmp_path.iterdir())
