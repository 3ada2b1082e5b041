"""The engine's logits equal transformers' LlamaForCausalLM on the same checkpoint."""

from __future__ import annotations

import random

import pytest
import torch

from runtime.engine import Engine, EngineConfig, SamplingParams
from tests.support.engine import GQA, MHA, assert_no_leak, random_prompt, write_checkpoint

transformers = pytest.importorskip("transformers")

TOL = 1e-4
DECODE_STEPS = 32


def reference_logits(path, prompt: list[int], continuation: list[int]) -> list[torch.Tensor]:
    """transformers' last-position logits after the prompt and after each continuation token."""
    from transformers import DynamicCache, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                             attn_implementation="eager").eval()
    cache = DynamicCache()
    out = []
    with torch.no_grad():
        res = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        out.append(res.logits[0, -1])
        for t in continuation:
            res = model(input_ids=torch.tensor([[t]]), cache=res.past_key_values, use_cache=True)
            out.append(res.logits[0, -1])
    return out


@pytest.mark.parametrize("cfg_name,cfg,prompt_len,chunk", [
    ("gqa-llama3-rope", GQA, 150, 64),
    ("mha-tied", MHA, 77, 512),
])
def test_logits_match_transformers(tmp_path, cfg_name, cfg, prompt_len, chunk):
    path = write_checkpoint(cfg, tmp_path / cfg_name, seed=3)
    engine = Engine.from_checkpoint(path, EngineConfig(num_blocks=64, chunk_tokens=chunk,
                                                       attn_tile_tokens=64))
    prompt = random_prompt(random.Random(7), prompt_len, cfg.vocab_size)
    seq = engine.add_request("r", prompt, DECODE_STEPS + 1, SamplingParams(ignore_eos=True))
    engine.prefill(seq)
    ours = [engine.last_logits[0].clone()]
    for _ in range(DECODE_STEPS):
        engine.decode_step([seq])
        ours.append(engine.last_logits[0].clone())
    engine.free(seq)
    assert_no_leak(engine)

    ref = reference_logits(path, prompt, seq.output_ids[:DECODE_STEPS])
    assert len(ref) == len(ours) == DECODE_STEPS + 1
    diffs = [float((a - b).abs().max()) for a, b in zip(ours, ref)]
    assert max(diffs) <= TOL, f"max |logit diff| per step: {diffs}"
    # Greedy tokens follow from the logits: the reference agrees on every one of them.
    assert [int(r.argmax()) for r in ref] == seq.output_ids


def test_sharded_checkpoint_loads_identically(tmp_path):
    single = Engine.from_checkpoint(write_checkpoint(GQA, tmp_path / "one", seed=5))
    sharded = Engine.from_checkpoint(
        write_checkpoint(GQA, tmp_path / "many", seed=5, max_shard_bytes=64 * 1024))
    assert len(list((tmp_path / "many").glob("*.safetensors"))) > 1
    assert single.identity == sharded.identity
    assert single.abi.digest == sharded.abi.digest
    prompt = list(range(1, 40))
    params = SamplingParams(ignore_eos=True)
    assert single.generate(prompt, 8, params) == sharded.generate(prompt, 8, params)


def test_checkpoint_tokenizer_is_loaded_and_used(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = write_checkpoint(GQA, tmp_path / "tok", seed=1)
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "hello", "world", "pd"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    engine = Engine.from_checkpoint(path)
    ids = engine.encode("hello pd world")
    assert ids == [3, 5, 4]
    assert engine.decode(ids).split() == ["hello", "pd", "world"]
    assert len(engine.generate(ids, 4)) >= 1

    bare = Engine.from_checkpoint(write_checkpoint(GQA, tmp_path / "bare", seed=1))
    with pytest.raises(Exception, match="has no tokenizer"):
        bare.encode("hello")
