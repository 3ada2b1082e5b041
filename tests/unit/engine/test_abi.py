"""The cache ABI names the engine and its numerics: two workers pair only on equal digests
(runtime/engine/abi.py), so another engine, another numerics version of this one, or a
worker that does not promise batch invariance never receives this engine's K/V."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.engine.abi import PDSERVE_ENGINE
from runtime.engine.errors import AbiMismatch
from tests.support.engine import tiny_engine


@pytest.fixture(scope="module")
def abi():
    return tiny_engine(num_blocks=8).abi


def test_this_engine_names_itself_and_promises_batch_invariance(abi):
    assert abi.engine == PDSERVE_ENGINE and abi.batch_invariant
    assert abi.to_dict()["engine"] == PDSERVE_ENGINE and f"engine {PDSERVE_ENGINE}" in abi.summary()


@pytest.mark.parametrize(("change", "named"), [
    (dict(engine="vllm/0.32.0"), "engine: 'vllm/0.32.0' vs local 'pdserve/1'"),
    (dict(engine="pdserve/2"), "engine: 'pdserve/2'"),
    (dict(batch_invariant=False), "batch_invariant: False vs local True"),
])
def test_another_engine_or_numerics_does_not_pair(abi, change, named):
    other = dataclasses.replace(abi, **change)
    assert other.digest != abi.digest
    with pytest.raises(AbiMismatch, match=named):
        abi.check_compatible(other)
    with pytest.raises(AbiMismatch, match=abi.digest):
        abi.check_compatible(other.digest)
    if not other.batch_invariant:
        assert "(not batch-invariant)" in other.summary()
