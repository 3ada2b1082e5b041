"""Engine benchmark: pdserve vs transformers on the same weights, dtype and threads.

Decode tokens/s at several batch sizes (prompt P, output O, prefill excluded) and
prefill tokens/s at several prompt lengths. The baseline is transformers'
`generate` with its own cache (decode = generate(O) - generate(1)), and its
forward with `logits_to_keep=1` for prefill. One JSON line per point:
{"bench": "engine", "metric": ..., "batch": ..., "value": ..., "baseline": ..., "ratio": ...}
with ratio = pdserve / transformers, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine import Engine, EngineConfig, SamplingParams
from runtime.engine.checkpoint import export_preset


def emit(**row) -> None:
    print(json.dumps({"bench": "engine", **row}), flush=True)


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)]


def ours_decode(engine: Engine, batch: int, prompt: int, output: int, vocab: int) -> float:
    params = SamplingParams(ignore_eos=True)
    seqs = [engine.add_request(f"b{i}", p, output, params, reuse_prefix=False)
            for i, p in enumerate(prompts(batch, prompt, vocab, batch))]
    for s in seqs:
        engine.prefill(s)
    t0 = time.perf_counter()
    steps = 0
    while not all(s.is_finished for s in seqs):
        engine.decode_step([s for s in seqs if not s.is_finished])
        steps += 1
    dt = time.perf_counter() - t0
    for s in seqs:
        engine.free(s)
    assert engine.num_free_blocks == engine.blocks.num_blocks
    return batch * steps / dt


def hf_decode(model, batch: int, prompt: int, output: int, vocab: int) -> float:
    ids = torch.tensor(prompts(batch, prompt, vocab, batch))
    mask = torch.ones_like(ids)

    def run(n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0

    return batch * (output - 1) / (run(output) - run(1))


def ours_prefill(engine: Engine, n: int, vocab: int, repeats: int) -> float:
    times = []
    for r in range(repeats):
        seq = engine.add_request("p", prompts(1, n, vocab, 100 + r)[0], 1, reuse_prefix=False)
        t0 = time.perf_counter()
        engine.prefill(seq)
        times.append(time.perf_counter() - t0)
        engine.free(seq)
    return n / statistics.median(times)


def hf_prefill(model, n: int, vocab: int, repeats: int) -> float:
    from transformers import DynamicCache

    times = []
    for r in range(repeats):
        ids = torch.tensor(prompts(1, n, vocab, 100 + r))
        t0 = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ids, cache=DynamicCache(), use_cache=True, logits_to_keep=1)
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,8,16,32")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--prefill", default="128,512,2048")
    ap.add_argument("--chunk-tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(n) for n in args.prefill.split(",")]
    bs = 16
    per_seq = -(-(max(args.prompt + args.output, max(lengths) + 1)) // bs)
    cfg = EngineConfig(num_blocks=per_seq * max(batches) + 8, block_size=bs,
                       chunk_tokens=args.chunk_tokens, torch_threads=args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = export_preset(args.preset, Path(tmp) / args.preset)
        engine = Engine.from_checkpoint(path, cfg)
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    vocab = engine.model_cfg.vocab_size
    emit(metric="config", preset=args.preset, threads=args.threads, dtype="float32",
         prompt=args.prompt, output=args.output, chunk_tokens=args.chunk_tokens,
         baseline="transformers " + __import__("transformers").__version__,
         attn_impl=model.config._attn_implementation)
    # Warm both (allocator, MKL buffers) before timing anything.
    ours_prefill(engine, 64, vocab, 1)
    hf_prefill(model, 64, vocab, 1)
    for n in lengths:
        ours, base = ours_prefill(engine, n, vocab, args.repeats), hf_prefill(model, n, vocab, args.repeats)
        emit(metric="prefill_tokens_per_s", batch=1, prompt_tokens=n, value=round(ours, 1),
             baseline=round(base, 1), ratio=round(ours / base, 3))
    for b in batches:
        ours = ours_decode(engine, b, args.prompt, args.output, vocab)
        base = hf_decode(model, b, args.prompt, args.output, vocab)
        emit(metric="decode_tokens_per_s", batch=b, value=round(ours, 1), baseline=round(base, 1),
             ratio=round(ours / base, 3))


if __name__ == "__main__":
    main()
