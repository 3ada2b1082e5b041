"""LayerDigest (runtime/engine/digest.py): the K/V digest built as layers become final, in any
order, equals Engine.kv_digest — and differs when one byte of any layer differs."""

from __future__ import annotations

import random

import pytest

from runtime.engine import SamplingParams
from runtime.engine.digest import LayerDigest
from tests.support.engine import random_prompt, tiny_engine

GREEDY = SamplingParams(temperature=0.0)


@pytest.mark.parametrize("order", ["in order", "reversed", "shuffled", "none before the end"])
def test_layer_by_layer_equals_the_whole_prompt_digest(order):
    engine = tiny_engine()
    seq = engine.add_request("r", random_prompt(random.Random(5), 77), 4, GREEDY)  # a partial last block
    engine.prefill(seq)
    layers = list(range(engine.model_cfg.num_hidden_layers))
    if order == "reversed":
        layers.reverse()
    elif order == "shuffled":
        random.Random(1).shuffle(layers)
    elif order == "none before the end":
        layers = []
    digest = LayerDigest(engine, seq)
    for i, layer in enumerate(layers):
        digest.final(layer)
        assert digest.hashed == (i + 1 if order == "in order" else digest.hashed)
    if order == "reversed":
        assert digest.hashed == engine.model_cfg.num_hidden_layers  # layer 0 came last, then all
    assert digest.hexdigest() == engine.kv_digest(seq)
    engine.free(seq)


def test_a_changed_byte_in_the_last_layer_changes_it():
    engine = tiny_engine()
    seq = engine.add_request("r", random_prompt(random.Random(6), 40), 4, GREEDY)
    engine.prefill(seq)
    before = LayerDigest(engine, seq)
    for layer in range(engine.model_cfg.num_hidden_layers - 1):
        before.final(layer)
    last = engine.model_cfg.num_hidden_layers - 1
    engine.cache.v[last][seq.block_table[0]].view(-1)[3] += 1.0
    assert before.hexdigest() == engine.kv_digest(seq)  # the change is in: the layer was not final yet
    assert LayerDigest(engine, seq).hexdigest() == before.hexdigest()
    engine.cache.v[last][seq.block_table[0]].view(-1)[3] -= 1.0
    assert engine.kv_digest(seq) != before.hexdigest()
    engine.free(seq)


def test_a_fragmented_block_table_hashes_the_same_gathered_or_run_by_run(monkeypatch):
    """Past GATHER_RUNS runs the digest hashes one gathered copy per K and V: the same bytes
    in the same order as a view per run."""
    from runtime.engine import engine as engine_module

    engine = tiny_engine(num_blocks=64)
    fillers = [engine.add_request(f"f{i}", random_prompt(random.Random(i), 16), 1, GREEDY, reuse_prefix=False)
               for i in range(64)]  # the whole pool, a block each
    for f in fillers[::2]:
        engine.free(f)  # every other block free: the next sequence's table is fragmented
    seq = engine.add_request("frag", random_prompt(random.Random(9), 300), 4, GREEDY, reuse_prefix=False)
    engine.prefill(seq)
    table = seq.block_table
    runs = 1 + sum(1 for a, b in zip(table, table[1:], strict=False) if b != a + 1)
    assert runs > engine_module.GATHER_RUNS
    gathered = engine.kv_digest(seq)
    monkeypatch.setattr(engine_module, "GATHER_RUNS", 10_000)
    assert engine.kv_digest(seq) == gathered
    assert engine.kv_digest(seq, num_tokens=123) == LayerDigest(engine, seq, num_tokens=123).hexdigest()
    monkeypatch.setattr(engine_module, "GATHER_RUNS", 0)
    assert engine.kv_digest(seq, num_tokens=123) == LayerDigest(engine, seq, num_tokens=123).hexdigest()
    engine.free(seq)
    for f in fillers[1::2]:
        engine.free(f)
