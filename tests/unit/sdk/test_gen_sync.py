"""The blocking client is generated from the asyncio one (client/gen_sync.py, unasync):
the checked-in `_sync/client.py` must equal a fresh run, and the two clients must offer
the same calls with the same signatures."""

from __future__ import annotations

import importlib.util
import inspect
import io
import tokenize
from pathlib import Path

import pytest

from pdserve_client import AsyncClient, AsyncTokenStream, Client, TokenStream

GEN_PATH = Path(__file__).resolve().parents[3] / "client" / "gen_sync.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_sync", GEN_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_sync_client_matches_a_fresh_generation(gen, tmp_path):
    fresh = gen.generate(tmp_path)
    assert [p.name for p in fresh] == ["client.py"]
    stale = gen.stale()
    assert stale == [], "pdserve_client/_sync is stale; run `make sync-client`:\n" + "".join(stale)
    assert (gen.SYNC_DIR / "client.py").read_text() == fresh[0].read_text()


def test_the_check_catches_a_hand_edit(gen, tmp_path):
    gen.generate(tmp_path)
    edited = tmp_path / "client.py"
    edited.write_text(edited.read_text().replace("def close(self) -> None:", "def close(self) -> None:  # tweak", 1))
    (diff,) = gen.stale(tmp_path)
    assert "-    def close(self) -> None:  # tweak" in diff and "+    def close(self) -> None:\n" in diff
    assert gen.stale(tmp_path / "missing") != []


def test_generated_code_is_blocking_and_marked(gen):
    text = (gen.SYNC_DIR / "client.py").read_text()
    assert text.startswith("# Generated from pdserve_client/_async/client.py by client/gen_sync.py")
    names = {t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.NAME}
    assert not names & {"async", "await", "_async", "AsyncClient", "AsyncTokenStream", "StopAsyncIteration"}
    assert "from pdserve_client._sync import _shims" in text


@pytest.mark.parametrize("sync_cls,async_cls", [(Client, AsyncClient), (TokenStream, AsyncTokenStream)])
def test_both_clients_offer_the_same_calls(sync_cls, async_cls):
    renames = {"__iter__": "__aiter__", "__next__": "__anext__", "__enter__": "__aenter__", "__exit__": "__aexit__"}

    def public(cls):
        return {name for name in vars(cls) if not name.startswith("_") or name in renames or
                name in renames.values()}

    assert {renames.get(n, n) for n in public(sync_cls)} | {"aclose"} >= public(async_cls)
    for name in public(sync_cls) - {"__init__"}:
        if not callable(getattr(sync_cls, name)):
            assert type(getattr(sync_cls, name)) is type(getattr(async_cls, name)), name  # the same properties
            continue
        sync_sig = inspect.signature(getattr(sync_cls, name))
        async_sig = inspect.signature(getattr(async_cls, renames.get(name, name)))
        assert list(sync_sig.parameters) == list(async_sig.parameters), name
    assert inspect.iscoroutinefunction(AsyncClient.status) and not inspect.iscoroutinefunction(Client.status)
