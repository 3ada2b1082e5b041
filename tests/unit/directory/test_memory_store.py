"""KV directory logic on the in-process store (no processes, fake clock)."""

from __future__ import annotations

import pytest

from kv_directory.config import DirectoryConfig
from kv_directory.memory_store import MemoryDirectoryStore
from kv_directory.store import DirectoryStore
from runtime.directory.records import LoadReport, TransferSpec, WorkerRef, chunk_list_digest
from runtime.directory.states import LEGAL_SOURCES, Outcome, TxnState, check_transition
from tests.support.directory.contract import DirectoryContract
from tests.support.directory.harness import Harness, make_spec, register


class FakeClock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        return self.now_s


class MemoryHarness(Harness):
    """Memory stores sharing one fake clock."""

    def __init__(self) -> None:
        self.clock = FakeClock()

    def open(self, **config: object) -> DirectoryStore:
        return MemoryDirectoryStore(DirectoryConfig(**config), clock=self.clock)

    def advance(self, seconds: float) -> None:
        self.clock.now_s += seconds

    def all_transactions(self, store):
        return store.all_transactions()


class TestMemoryDirectory(DirectoryContract):
    """The shared contract against MemoryDirectoryStore."""

    @pytest.fixture
    def harness(self):
        return MemoryHarness()

    def test_terminal_records_are_forgotten_after_retention(self, harness):
        store = harness.open(record_retention_s=5)
        p, d = register(store, "p0", "prefill"), register(store, "d0")
        store.reserve(make_spec(p, d))
        store.abort("t1", "client gone")
        harness.advance(4)
        assert store.lookup("t1") is not None  # a late retry still learns the truth
        harness.advance(2)
        assert store.lookup("t1") is None
        harness.assert_no_leaks(store)


def test_transition_table_is_the_drawn_machine():
    """The one transition table, spelled out: the contract tests trust it."""
    s = TxnState
    legal = {(old, new) for new, olds in LEGAL_SOURCES.items() for old in olds}
    assert legal == {
        (s.RESERVED, s.TRANSFERRING), (s.TRANSFERRING, s.VALIDATED), (s.VALIDATED, s.PUBLISHED),
        (s.PUBLISHED, s.RELEASED), (s.RESERVED, s.ABORTED), (s.TRANSFERRING, s.ABORTED),
        (s.VALIDATED, s.ABORTED),
    }
    assert not check_transition(s.RESERVED, s.PUBLISHED)
    assert not check_transition(s.ABORTED, s.TRANSFERRING)
    assert not check_transition(s.PUBLISHED, s.ABORTED)
    assert [st for st in s if st.is_unpublished] == [s.RESERVED, s.TRANSFERRING, s.VALIDATED]
    assert [st for st in s if st.is_terminal] == [s.RELEASED, s.ABORTED]
    assert Outcome.DUPLICATE.ok and not Outcome.STALE_GENERATION.ok


def test_config_env_overrides_and_validation():
    cfg = DirectoryConfig.from_env({"PD_REDIS_URL": "redis://h:1/2", "PD_LEASE_TTL_S": "1.5",
                                    "PD_REDIS_RETRIES": "0", "UNRELATED": "x"})
    assert (cfg.redis_url, cfg.lease_ttl_s, cfg.redis_retries) == ("redis://h:1/2", 1.5, 0)
    assert DirectoryConfig.from_env({}, txn_ttl_s=3).txn_ttl_s == 3
    assert all(var.startswith("PD_") for var in DirectoryConfig.env_names())
    for bad in ({"lease_ttl_s": 0}, {"redis_url": "http://x"}, {"key_prefix": ""}, {"redis_retries": -1}):
        with pytest.raises(ValueError):
            DirectoryConfig(**bad)
    with pytest.raises(ValueError, match="PD_TXN_TTL_S"):
        DirectoryConfig.from_env({"PD_TXN_TTL_S": "soon"})


def test_spec_validation():
    ref = WorkerRef("w", 1)
    with pytest.raises(ValueError):
        TransferSpec("t", "r", "acme", 0, ref, ref, "dg")  # generation starts at 1
    with pytest.raises(ValueError):
        TransferSpec("t", "r", "acme", 1, ref, ref, "dg", "")  # the chunk layout is named
    assert chunk_list_digest([(0, 1, 2, 3)]) != chunk_list_digest([(0, 1, 3, 2)])
    with pytest.raises(ValueError):
        WorkerRef("w", 0)
    with pytest.raises(ValueError):
        LoadReport(free_blocks=-1)
