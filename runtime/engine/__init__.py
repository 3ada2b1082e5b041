"""pdserve model engine: torch Llama with a paged K/V cache.

Public surface: `Engine`, `EngineConfig`, `ModelConfig`, `SamplingParams`,
`Sequence`, `CacheAbi`, the packed K/V export/import functions, and the errors.
Each is imported when first named (PEP 562), so a process that needs only a preset's
config or tokenizer (the router) does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CacheAbi": "abi", "EngineConfig": "config", "ModelConfig": "config", "Engine": "engine",
    "AbiMismatch": "errors", "CheckpointError": "errors", "EngineError": "errors", "InvalidRequest": "errors",
    "OutOfBlocks": "errors", "export_kv": "kv_io", "import_kv": "kv_io", "PRESETS": "presets",
    "SamplingParams": "sampler", "FinishReason": "sequence", "SeqState": "sequence", "Sequence": "sequence",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
