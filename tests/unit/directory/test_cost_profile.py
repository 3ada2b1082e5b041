"""CostProfile: validation, JSON, proto round trip, and storage with the worker
record in both directory stores (memory here; Redis when the session has one)."""

from __future__ import annotations

import math
import uuid

import pytest

from kv_directory.config import DirectoryConfig
from kv_directory.memory_store import MemoryDirectoryStore
from pdserve_client.rpc.pd.v1 import common_pb2
from runtime.directory.cost_profile import CostProfile
from runtime.directory.records import LoadReport, WorkerCapacity, WorkerInfo, WorkerRole
from runtime.directory.wire import (
    BadRequest,
    profile_from_pb,
    profile_to_pb,
    worker_record_from_pb,
    worker_record_to_pb,
)

PROFILE = CostProfile(prefill_base_ms=1.5, prefill_ms_per_token=0.02, prefill_ms_per_pair=1e-6,
                      decode_base_ms=3.0, decode_ms_per_seq=0.25, decode_ms_per_context_token=1e-4,
                      kv_bytes_per_block=65536, source="calibrated")


def _info(profile: CostProfile = PROFILE) -> WorkerInfo:
    return WorkerInfo("decode-0", WorkerRole.DECODE, "127.0.0.1:1", "127.0.0.1:2", "abi",
                      WorkerCapacity(total_blocks=64, block_size=16), profile)


def test_rejects_negative_and_non_finite():
    with pytest.raises(ValueError, match="prefill_ms_per_token"):
        CostProfile(prefill_ms_per_token=-1.0)
    with pytest.raises(ValueError, match="decode_base_ms"):
        CostProfile(decode_base_ms=math.nan)
    with pytest.raises(BadRequest, match="profile"):
        profile_from_pb(common_pb2.CostProfile(decode_base_ms=math.inf))


def test_json_and_proto_round_trip():
    assert CostProfile.from_json(PROFILE.to_json()) == PROFILE
    assert CostProfile.from_json("") == CostProfile()
    assert not CostProfile().declared and PROFILE.declared
    assert profile_from_pb(profile_to_pb(PROFILE)) == PROFILE


def test_memory_store_keeps_profile_and_context_load():
    store = MemoryDirectoryStore(DirectoryConfig())
    rec = store.register_worker(_info())
    store.heartbeat("decode-0", rec.epoch, LoadReport(active_decode_batch=2, active_context_tokens=300))
    (w,) = store.snapshot().workers
    assert w.profile == PROFILE
    assert w.load.active_context_tokens == 300
    assert worker_record_from_pb(worker_record_to_pb(w)) == w


def test_redis_store_keeps_profile_and_context_load(redis_server):
    from kv_directory.redis_store import RedisDirectoryStore

    store = RedisDirectoryStore(DirectoryConfig(redis_url=redis_server.url,
                                                key_prefix="{pdprof-" + uuid.uuid4().hex[:8] + "}"))
    try:
        rec = store.register_worker(_info())
        store.heartbeat("decode-0", rec.epoch, LoadReport(active_decode_batch=2, active_context_tokens=300))
        (w,) = store.snapshot().workers
        assert w.profile == PROFILE
        assert w.load.active_context_tokens == 300
        store.register_worker(_info(CostProfile()))  # re-registration replaces it
        assert store.snapshot().workers[0].profile == CostProfile()
    finally:
        store.close()
