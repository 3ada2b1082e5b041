"""pdserve model engine: torch Llama with a paged K/V cache.

Public surface: `Engine`, `EngineConfig`, `ModelConfig`, `SamplingParams`,
`Sequence`, `CacheAbi`, the K/V export/import functions, and the errors.
"""

from .abi import CacheAbi
from .config import EngineConfig, ModelConfig
from .engine import Engine
from .errors import AbiMismatch, CheckpointError, EngineError, InvalidRequest, OutOfBlocks
from .kv_io import BlockRun, block_runs, commit_import, export_kv, import_kv, kv_byte_views
from .presets import PRESETS
from .sampler import SamplingParams
from .sequence import FinishReason, SeqState, Sequence

__all__ = [
    "AbiMismatch", "BlockRun", "CacheAbi", "CheckpointError", "Engine", "EngineConfig",
    "EngineError", "FinishReason", "InvalidRequest", "ModelConfig", "OutOfBlocks", "PRESETS",
    "SamplingParams", "SeqState", "Sequence", "block_runs", "commit_import", "export_kv",
    "import_kv", "kv_byte_views",
]
