"""Hugging Face Llama-format checkpoints: one loading path for presets and real models.

A checkpoint directory holds `config.json`, `model.safetensors` or a sharded
`model.safetensors.index.json`, and optionally `tokenizer.json` (with
`tokenizer_config.json` and `chat_template.jinja` beside it, as transformers saves them).
Presets are exported in exactly this format (`pdserve export-checkpoint`), their
tokenizer included (runtime/engine/preset_tokenizer.py), so tests of the loader cover the
path a real model takes on a GPU cluster. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .errors import CheckpointError
from .preset_tokenizer import save_preset_tokenizer
from .presets import DEFAULT_SEED, hf_weight_shapes, preset_config, seeded_weights

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def load_checkpoint(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read config and weights (float tensors as stored) from a checkpoint directory."""
    root = Path(path)
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{root}: no config.json")
    try:
        cfg = ModelConfig.from_hf_dict(json.loads(cfg_file.read_text()))
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{cfg_file}: {e}") from e
    try:
        weights = _read_weights(root)
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise CheckpointError(f"{root}: cannot read weights: {e}") from e
    check_weights(cfg, weights)
    return cfg, weights


def _read_weights(root: Path) -> dict[str, torch.Tensor]:
    if (root / INDEX_NAME).is_file():
        index = json.loads((root / INDEX_NAME).read_text())
        weights: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            weights.update(load_file(str(root / shard)))
        return weights
    if (root / SINGLE_NAME).is_file():
        return load_file(str(root / SINGLE_NAME))
    raise CheckpointError(f"{root}: neither {SINGLE_NAME} nor {INDEX_NAME}")


def check_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
    """Every expected tensor present with the right shape; no unknown extras."""
    expected = hf_weight_shapes(cfg)
    missing = [n for n in expected if n not in weights]
    if missing:
        raise CheckpointError(f"missing tensors: {missing[:5]}{'...' if len(missing) > 5 else ''}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise CheckpointError(f"{name}: shape {tuple(weights[name].shape)}, expected {shape}")
    # rotary inv_freq buffers are harmless leftovers of older exports.
    extra = [n for n in weights if n not in expected and "rotary_emb" not in n
             and not (cfg.tie_word_embeddings and n == "lm_head.weight")]
    if extra:
        raise CheckpointError(f"unexpected tensors: {extra[:5]}")


def save_checkpoint(cfg: ModelConfig, weights: dict[str, torch.Tensor], out: str | Path,
                    max_shard_bytes: int = 0) -> Path:
    """Write config.json and safetensors (sharded with an index when max_shard_bytes > 0)."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    cfg_dict = cfg.to_hf_dict()
    cfg_dict["torch_dtype"] = "float32"
    (root / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True))
    tensors = {k: v.contiguous() for k, v in weights.items()}
    if max_shard_bytes <= 0:
        save_file(tensors, str(root / SINGLE_NAME), metadata={"format": "pt"})
        return root
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(root / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}
    (root / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True))
    return root


def export_preset(name: str, out: str | Path, seed: int = DEFAULT_SEED,
                  max_shard_bytes: int = 0) -> Path:
    """`pdserve export-checkpoint`: write preset `name` as a Hugging Face directory, its
    tokenizer and chat template included (transformers' AutoTokenizer loads them)."""
    cfg = preset_config(name)
    root = save_checkpoint(cfg, seeded_weights(cfg, seed), out, max_shard_bytes)
    save_preset_tokenizer(cfg, root)
    return root


def load_tokenizer(path: str | Path):
    """The `tokenizers.Tokenizer` in a checkpoint directory, or None when absent."""
    tok_file = Path(path) / "tokenizer.json"
    if not tok_file.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tok_file))
