"""Calibrated profiles: the transfer fit, the workers' median, the file format."""

from __future__ import annotations

import json

import pytest

from sim.calibrate import engine_from_workers, transfer_from_bench
from sim.profile import SimProfile
from tests.unit.sim.conftest import make_profile


def test_transfer_fit_recovers_latency_and_bandwidth():
    lat_ms, gbps = 0.8, 2.5
    lines = ["not json", json.dumps({"bench": "transfer", "metric": "config"})]
    for mib in (1, 16, 64, 256):
        ms = lat_ms + mib * 2**20 / (gbps * 1e6)
        lines.append(json.dumps({"bench": "transfer", "path": "pdserve-ucx", "size_mib": mib,
                                 "gbps": mib * 2**20 / (ms / 1000) / 1e9}))
        lines.append(json.dumps({"bench": "transfer", "path": "raw-tcp", "size_mib": mib, "gbps": 9.0}))
    t = transfer_from_bench(lines)
    assert t.latency_ms == pytest.approx(lat_ms, rel=1e-6) and t.gb_per_s == pytest.approx(gbps, rel=1e-6)
    with pytest.raises(ValueError, match="need two"):
        transfer_from_bench(lines[:3])


def test_engine_takes_the_median_and_the_smallest_limits():
    def worker(scale, blocks):
        return {"profile": {"prefill_base_ms": 1.0 * scale, "prefill_ms_per_token": 0.1 * scale,
                            "prefill_ms_per_pair": 0.0, "decode_base_ms": 5.0 * scale, "decode_ms_per_seq": 0.1,
                            "decode_ms_per_context_token": 0.0, "kv_bytes_per_block": 4096, "source": "calibrated"},
                "capacity": {"total_blocks": blocks, "max_decode_batch": 64, "max_prefill_tokens": 256,
                             "block_size": 16, "vocab_size": 1000, "max_model_len": 2048}}
    e = engine_from_workers([worker(1, 500), worker(3, 400), worker(2, 600), {"profile": {}, "capacity": {}}])
    assert e.cost.prefill_ms_per_token == pytest.approx(0.2) and e.cost.decode_base_ms == pytest.approx(10.0)
    assert e.total_blocks == 400 and e.max_prefill_tokens == 256 and e.max_model_len == 2048
    with pytest.raises(ValueError, match="no worker declared"):
        engine_from_workers([{"profile": {}, "capacity": {}}])


def test_profile_file_round_trip_and_refusals(tmp_path):
    p = make_profile()
    f = tmp_path / "p.json"
    p.save(f)
    assert SimProfile.load(f) == p
    f.write_text(json.dumps({**json.loads(f.read_text()), "format": "something-else"}))
    with pytest.raises(ValueError, match="not a pdserve simulator profile"):
        SimProfile.load(f)
    f.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        SimProfile.load(f)


def test_a_host_round_trips_and_is_checked(tmp_path):
    import dataclasses

    from sim.profile import HostProfile

    p = dataclasses.replace(make_profile(), host=HostProfile(2.0, 0.3, 1.5))
    f = tmp_path / "h.json"
    p.save(f)
    assert SimProfile.load(f).host == HostProfile(2.0, 0.3, 1.5)
    with pytest.raises(ValueError, match="cores must be > 0"):
        HostProfile(0.0)
