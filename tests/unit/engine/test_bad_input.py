"""Bad input: every rejection names the problem with its numbers, and holds no block.

Each test ends with `assert_no_leak`: a rejected request, a failed import or a
failed allocation must leave the pool exactly as full as it found it.
"""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.engine import (
    AbiMismatch,
    CheckpointError,
    Engine,
    EngineConfig,
    InvalidRequest,
    OutOfBlocks,
    SamplingParams,
    export_kv,
    import_kv,
)
from runtime.engine.prefix import hash_blocks
from runtime.engine.presets import PRESETS
from tests.support.engine import assert_no_leak, random_prompt, tiny_engine, write_checkpoint

GREEDY = SamplingParams(ignore_eos=True)
VOCAB = PRESETS["tiny"].vocab_size  # 512


def _prompt(n: int, seed: int = 0) -> list[int]:
    return random_prompt(random.Random(seed), n, VOCAB)


def _cache_is_zero(engine: Engine) -> bool:
    return int(torch.count_nonzero(engine.cache.kv)) == 0


# ---- admission -------------------------------------------------------------

def test_empty_prompt():
    engine = tiny_engine()
    with pytest.raises(InvalidRequest, match="prompt is empty"):
        engine.add_request("r", [], 4)
    assert_no_leak(engine)


@pytest.mark.parametrize("n", [64, 65, 200])
def test_prompt_at_or_over_context_length(n):
    engine = tiny_engine(max_model_len=64)
    with pytest.raises(InvalidRequest) as e:
        engine.add_request("r", _prompt(n), 1)
    msg = str(e.value)
    assert f"prompt of {n} tokens" in msg and "context length 64" in msg
    assert "at most 63" in msg
    assert_no_leak(engine)


def test_prompt_just_under_context_length_is_accepted():
    engine = tiny_engine(max_model_len=64)
    out = engine.generate(_prompt(63), 1, GREEDY)
    assert len(out) == 1
    assert_no_leak(engine)


def test_prompt_plus_max_tokens_over_context():
    engine = tiny_engine(max_model_len=64)
    with pytest.raises(InvalidRequest) as e:
        engine.add_request("r", _prompt(60), 5)
    msg = str(e.value)
    assert "prompt 60 + max_tokens 5" in msg and "context length 64" in msg
    assert_no_leak(engine)
    # Exactly filling the context is allowed, and stops by length there.
    seq = engine.add_request("fits", _prompt(60), 4, GREEDY)
    engine.prefill(seq)
    while not seq.is_finished:
        engine.decode_step([seq])
    assert len(seq.output_ids) == 4 and seq.num_tokens == 64
    engine.free(seq)
    assert_no_leak(engine)


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_max_tokens_not_positive(max_tokens):
    engine = tiny_engine()
    with pytest.raises(InvalidRequest, match=rf"max_tokens must be >= 1, got {max_tokens}\b"):
        engine.add_request("r", _prompt(10), max_tokens)
    assert_no_leak(engine)


@pytest.mark.parametrize("bad", [-1, VOCAB, VOCAB + 1000])
def test_token_id_outside_vocabulary(bad):
    engine = tiny_engine()
    prompt = _prompt(20)
    prompt[7] = bad
    with pytest.raises(InvalidRequest) as e:
        engine.add_request("r", prompt, 4)
    msg = str(e.value)
    assert f"token id {bad} at position 7" in msg and f"[0, {VOCAB})" in msg
    assert_no_leak(engine)


def test_boundary_token_ids_are_accepted():
    engine = tiny_engine()
    assert len(engine.generate([0, VOCAB - 1, 5], 2, GREEDY)) == 2
    assert_no_leak(engine)


# ---- sampling parameters and model specs ------------------------------------

@pytest.mark.parametrize("kw,text", [
    (dict(temperature=-0.5), "temperature -0.5 is not a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature nan is not a finite number >= 0"),
    (dict(temperature=float("inf")), "temperature inf is not a finite number >= 0"),
    (dict(top_p=float("nan")), "top_p nan not in (0, 1]"),
    (dict(top_p=0.0), "top_p 0.0 not in (0, 1]"),
    (dict(top_p=1.5), "top_p 1.5 not in (0, 1]"),
    (dict(top_p=-0.1), "top_p -0.1 not in (0, 1]"),
    (dict(top_k=-1), "top_k -1 < 0"),
])
def test_invalid_sampling_params(kw, text):
    engine = tiny_engine()
    with pytest.raises(ValueError) as e:
        engine.add_request("r", _prompt(10), 4, SamplingParams(**kw))
    assert text in str(e.value)
    assert_no_leak(engine)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError) as e:
        Engine.from_preset("huge")
    assert "'huge'" in str(e.value) and "'tiny'" in str(e.value) and "'small'" in str(e.value)
    with pytest.raises(ValueError, match="neither a preset"):
        Engine.from_spec("no-such-model-or-dir")


def test_max_model_len_over_model_positions():
    with pytest.raises(ValueError, match="max_model_len 4096 exceeds the model's 2048"):
        tiny_engine(max_model_len=4096)


# ---- checkpoints -------------------------------------------------------------

@pytest.fixture
def checkpoint(tmp_path):
    """A valid single-file checkpoint of the tiny preset."""
    path = write_checkpoint(PRESETS["tiny"], tmp_path / "ck", seed=1)
    Engine.from_checkpoint(path)  # loads as written
    return path


def test_checkpoint_without_config_json(checkpoint):
    (checkpoint / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        Engine.from_checkpoint(checkpoint)


def test_checkpoint_with_unreadable_config(checkpoint):
    (checkpoint / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        Engine.from_checkpoint(checkpoint)


def test_checkpoint_without_weights(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        Engine.from_checkpoint(checkpoint)


def test_checkpoint_missing_a_tensor(checkpoint):
    f = checkpoint / "model.safetensors"
    weights = load_file(str(f))
    del weights["model.layers.2.mlp.up_proj.weight"]
    save_file(weights, str(f))
    with pytest.raises(CheckpointError, match=r"missing tensors: \['model.layers.2.mlp.up_proj"):
        Engine.from_checkpoint(checkpoint)


def test_checkpoint_tensor_with_wrong_shape(checkpoint):
    f = checkpoint / "model.safetensors"
    weights = load_file(str(f))
    name = "model.layers.1.self_attn.k_proj.weight"  # (2 heads * 8, 64)
    weights[name] = weights[name][:8].contiguous()
    save_file(weights, str(f))
    with pytest.raises(CheckpointError) as e:
        Engine.from_checkpoint(checkpoint)
    assert name in str(e.value) and "(8, 64)" in str(e.value) and "(16, 64)" in str(e.value)


def test_checkpoint_with_unexpected_tensor(checkpoint):
    f = checkpoint / "model.safetensors"
    weights = load_file(str(f))
    weights["model.layers.9.extra.weight"] = torch.zeros(3)
    save_file(weights, str(f))
    with pytest.raises(CheckpointError, match="unexpected tensors.*layers.9.extra"):
        Engine.from_checkpoint(checkpoint)


# ---- block pool -----------------------------------------------------------------

def test_more_blocks_than_the_pool():
    engine = tiny_engine(num_blocks=8)
    # 100 + 60 - 1 tokens of K/V -> 10 blocks of 16.
    with pytest.raises(OutOfBlocks) as e:
        engine.add_request("r", _prompt(100), 60)
    assert (e.value.needed_blocks, e.value.free_blocks, e.value.total_blocks) == (10, 8, 8)
    assert "need 10 K/V blocks, 8 free of 8" in str(e.value)
    assert_no_leak(engine)


def test_out_of_blocks_counts_blocks_held_by_others():
    engine = tiny_engine(num_blocks=8)
    holder = engine.add_request("holder", _prompt(40, seed=1), 9)  # 48 tokens -> 3 blocks
    with pytest.raises(OutOfBlocks) as e:
        engine.add_request("r", _prompt(80), 17)  # 96 tokens -> 6 blocks
    assert (e.value.needed_blocks, e.value.free_blocks, e.value.total_blocks) == (6, 5, 8)
    assert engine.num_free_blocks == 5
    fits = engine.add_request("fits", _prompt(80), 1)  # 5 blocks: exactly what is free
    assert engine.num_free_blocks == 0
    for s in (fits, holder):
        engine.free(s)
    assert_no_leak(engine)


def test_out_of_blocks_with_cached_prefix_takes_no_reference():
    engine = tiny_engine(num_blocks=8)
    shared = _prompt(64, seed=2)
    engine.generate(shared, 1, GREEDY)  # 4 full blocks, now cached and unreferenced
    assert engine.blocks.num_cached == 4
    holder = engine.add_request("holder", _prompt(20, seed=3), 10)  # 2 fresh blocks
    prompt = shared[:48] + _prompt(60, seed=4)  # hits the first 3 cached blocks
    hits = engine.blocks.match_prefix(hash_blocks(prompt, 16, engine.abi.digest))
    assert len(hits) == 3
    # 108 + 37 - 1 tokens -> 9 blocks, 3 of them hits: 6 fresh, but reusing the hits
    # takes them out of the evictable pool, so only 6 - 3 = 3 are free.
    with pytest.raises(OutOfBlocks) as e:
        engine.add_request("r", prompt, 37)
    assert (e.value.needed_blocks, e.value.free_blocks, e.value.total_blocks) == (6, 3, 8)
    assert [engine.blocks.blocks[b].ref_count for b in hits] == [0, 0, 0]
    assert all(b in engine.blocks.lru for b in hits) and engine.blocks.num_cached == 4
    assert engine.num_free_blocks == 6
    # Exactly the free count fits: 60 + 37 - 1 tokens -> 6 blocks, 3 hits + 3 fresh.
    fits = engine.add_request("fits", prompt[:60], 37)
    assert fits.num_cached_tokens == 48 and fits.block_table[:3] == hits
    assert engine.num_free_blocks == 0
    for s in (fits, holder):
        engine.free(s)
    assert_no_leak(engine)


# ---- K/V import ---------------------------------------------------------------------

def _exported(engine: Engine, prompt: list[int]) -> tuple[bytes, int]:
    """Prefill `prompt` on `engine`, export its K/V, free it: (bytes, first token)."""
    seq = engine.add_request("src", prompt, 4, GREEDY)
    first = engine.prefill(seq)
    data = export_kv(engine, seq)
    engine.free(seq)
    assert_no_leak(engine)
    return data, first


@pytest.mark.parametrize("other", [dict(seed=1), dict(block_size=32, attn_tile_tokens=64)],
                         ids=["other-weights", "other-block-size"])
def test_import_with_another_engines_abi(other):
    cfg = {k: v for k, v in other.items() if k != "seed"}
    seed = other.get("seed", 0)
    src = Engine.from_preset("tiny", seed=seed, cfg=EngineConfig(num_blocks=32, **cfg))
    dst = tiny_engine(num_blocks=32)
    assert src.abi.digest != dst.abi.digest
    prompt = _prompt(40)
    data, _ = _exported(src, prompt)
    seq = dst.add_request("dst", prompt, 4, GREEDY)
    with pytest.raises(AbiMismatch) as e:
        import_kv(dst, seq, data, src.abi.digest)
    assert src.abi.digest in str(e.value) and dst.abi.digest in str(e.value)
    assert _cache_is_zero(dst)  # nothing was written
    # The field-level check names what differs.
    field = "model_identity" if seed else "block_size: 32 vs local 16"
    with pytest.raises(AbiMismatch, match=field):
        dst.abi.check_compatible(src.abi)
    dst.free(seq)
    assert_no_leak(dst)


@pytest.mark.parametrize("delta", [-1, +1, -2048])
def test_import_payload_of_wrong_length(delta):
    engine = tiny_engine(num_blocks=32)
    prompt = _prompt(40)  # 3 blocks
    data, _ = _exported(engine, prompt)
    engine.blocks.clear_cache()
    engine.cache.kv.zero_()
    bad = data[:delta] if delta < 0 else data + bytes(delta)
    seq = engine.add_request("dst", prompt, 4, GREEDY, reuse_prefix=False)
    with pytest.raises(InvalidRequest) as e:
        import_kv(engine, seq, bad, engine.abi.digest)
    assert f"{len(bad)} bytes, expected {len(data)} for 3 blocks" in str(e.value)
    assert _cache_is_zero(engine)
    engine.free(seq)
    assert_no_leak(engine)


def test_import_block_range_outside_the_sequence():
    engine = tiny_engine(num_blocks=32)
    prompt = _prompt(40)
    data, _ = _exported(engine, prompt)
    seq = engine.add_request("dst", prompt, 4, GREEDY, reuse_prefix=False)  # 3 blocks
    with pytest.raises(InvalidRequest, match=r"block range \[2, 5\) outside the sequence's 3"):
        import_kv(engine, seq, data, engine.abi.digest, first=2, count=3)
    with pytest.raises(InvalidRequest, match=r"block range \[-1, "):
        import_kv(engine, seq, data, engine.abi.digest, first=-1, count=3)
    engine.free(seq)
    assert_no_leak(engine)


@pytest.mark.parametrize("token", [-1, VOCAB])
def test_commit_import_with_first_token_outside_vocabulary(token):
    engine = tiny_engine(num_blocks=32)
    prompt = _prompt(40)
    data, _ = _exported(engine, prompt)
    seq = engine.add_request("dst", prompt, 4, GREEDY, reuse_prefix=False)
    import_kv(engine, seq, data, engine.abi.digest)
    with pytest.raises(InvalidRequest, match=f"first token {token} is outside"):
        engine.commit_import(seq, token)
    assert not seq.output_ids
    engine.free(seq)
    assert_no_leak(engine)


@pytest.mark.parametrize("damage", ["missing-shard", "corrupt-index", "corrupt-weights"])
def test_checkpoint_with_broken_weight_files(tmp_path, damage):
    path = write_checkpoint(PRESETS["tiny"], tmp_path / "ck", seed=1, max_shard_bytes=64 * 1024)
    shards = sorted(path.glob("*.safetensors"))
    if damage == "missing-shard":
        shards[1].unlink()
    elif damage == "corrupt-index":
        (path / "model.safetensors.index.json").write_text("{not json")
    else:
        shards[0].write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read weights"):
        Engine.from_checkpoint(path)


@pytest.mark.parametrize("bad", [1.7, True, "5"])
def test_non_integer_token_id_is_rejected(bad):
    engine = tiny_engine()
    with pytest.raises(InvalidRequest, match="position 2 is not an integer"):
        engine.add_request("r", [1, 2, bad], 4)
    assert_no_leak(engine)
