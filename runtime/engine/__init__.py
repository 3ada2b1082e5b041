"""pdserve model engine: torch Llama with a paged K/V cache.

Public surface: `Engine`, `EngineConfig`, `ModelConfig`, `SamplingParams`,
`Sequence`, `CacheAbi`, the packed K/V export/import functions, and the errors.
"""

from .abi import CacheAbi
from .config import EngineConfig, ModelConfig
from .engine import Engine
from .errors import AbiMismatch, CheckpointError, EngineError, InvalidRequest, OutOfBlocks
from .kv_io import export_kv, import_kv
from .presets import PRESETS
from .sampler import SamplingParams
from .sequence import FinishReason, SeqState, Sequence

__all__ = [
    "AbiMismatch", "CacheAbi", "CheckpointError", "Engine", "EngineConfig", "EngineError",
    "FinishReason", "InvalidRequest", "ModelConfig", "OutOfBlocks", "PRESETS", "SamplingParams",
    "SeqState", "Sequence", "export_kv", "import_kv",
]
