"""pdserve's KV connector for vLLM (its KV connector API v1): how vLLM's scheduler and
attention layers take part in pdserve's hand-off (docs/design.md, The engine: vLLM behind the contract).

One class, two instances in the worker process (vLLM makes one per role): the scheduler
side decides what vLLM allocates and keeps, the worker side hears each attention layer
finish. Both answer to the `VllmEngine` that owns the engine core (engine.py), which
binds itself to them after start-up (`bind`); the engine core runs in the worker process
(vLLM's uni-process executor), so the two sides and the engine share one thread.

    vLLM calls (scheduler side)       pdserve's meaning
    get_num_new_matched_tokens        a Reserve: the prompt past the local prefix hit comes
                                      from a prefill worker, asynchronously
    update_state_after_alloc          the blocks it allocated are the ones the Reserve grants
    build_connector_meta              which tokens of which request this step writes
    request_finished                  blocks stay until pdserve frees the sequence
    (worker side)
    save_kv_layer                     a layer's K/V of those tokens is written: on_layer
    get_finished                      a received prompt was validated and published: vLLM
                                      may schedule it (commit_import)
    start_load_kv                     its first step: a seeded sampler draws the prefill's
                                      token 0 once, so token 1 is colocated's

What pdserve's transport moves (the bytes) never passes through vLLM: the sender reads
the blocks vLLM wrote, the receiver writes the blocks vLLM granted, both through
`VllmEngine.kv_views` (views of the registered K/V tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

if TYPE_CHECKING:
    import torch

RECEIVE = "receive"
"""kv_transfer_params {"pdserve": RECEIVE}: a decode worker's reservation."""


@dataclass
class PdserveMeta(KVConnectorMetadata):
    """One step's writes: vLLM request id -> (first token, end) of the tokens it computes."""

    writes: dict[str, tuple[int, int]] = field(default_factory=dict)
    stage_out: dict[str, tuple[str, int, int, list[int]]] = field(default_factory=dict)
    """Tensor-parallel: (shared buffer, its blocks, first logical block, physical blocks) each
    rank copies its shard of out of its cache after this step's forward (wait_for_save)."""
    stage_in: dict[str, tuple[str, int, int, list[int]]] = field(default_factory=dict)
    """Tensor-parallel: the same, copied into each rank's cache (start_load_kv), then reported
    received (get_finished): the commit of a staged reservation."""
    advance: list[str] = field(default_factory=list)
    """Received requests scheduled for the first time: their sampler already drew token 0
    on the prefill's side, so theirs draws once before token 1 (VllmEngine.advance_samplers)."""


class PdserveConnector(KVConnectorBase_V1):
    """The connector of both roles; its engine (`bind`) holds pdserve's state."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.engine = None
        self.kv_caches: dict[str, torch.Tensor] = {}
        self.received: set[str] = set()
        self._shard_kv = None  # a tensor-parallel rank's view of its cache (kv_memory.KvMemory)
        """Worker side: requests whose K/V was committed, for the next get_finished."""

    def bind(self, engine) -> None:
        """The VllmEngine that answers for this connector."""
        self.engine = engine

    # ---- scheduler side ---------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        if (request.kv_transfer_params or {}).get("pdserve") != RECEIVE:
            return 0, False
        count = request.num_prompt_tokens - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0 and self.engine is not None:
            self.engine.on_allocated(request.request_id, request.num_prompt_tokens - num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> PdserveMeta:
        return PdserveMeta() if self.engine is None else self.engine.connector_meta(scheduler_output)

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        # A pdserve sequence's blocks are its until `free` (a sender may still read them).
        return (self.engine is not None and self.engine.holds(request.request_id)), None

    # ---- worker side --------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.kv_caches = dict(kv_caches)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        """Nothing to load (the receiver wrote the blocks before the commit); a received
        request's seeded sampler catches up with the prefill's draw of token 0."""
        meta = self._get_connector_metadata()
        if not isinstance(meta, PdserveMeta):
            return
        if self.engine is not None and meta.advance:
            self.engine.advance_samplers(meta.advance)
        for vid, span in meta.stage_in.items():  # a tensor-parallel rank
            self._shards(span, out=False)
            self.received.add(vid)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for (start_load_kv)."""

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if self.engine is not None and isinstance(meta, PdserveMeta) and meta.writes:
            self.engine.layer_written(layer_name, meta.writes)

    def wait_for_save(self) -> None:
        """Sends are pdserve's, on its event loop; the blocks stay until `free`. A tensor-parallel
        rank copies its shard of this step's prompt blocks into the shared buffers first."""
        meta = self._get_connector_metadata()
        if isinstance(meta, PdserveMeta):
            for span in meta.stage_out.values():
                self._shards(span, out=True)

    def _shards(self, span: tuple[str, int, int, list[int]], out: bool) -> None:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        from .kv_memory import KvMemory, shard_io

        if self._shard_kv is None:
            self._shard_kv = KvMemory(self.kv_caches, len(self.kv_caches), 0, "on")
        shard_io(self._shard_kv, (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()),
                 len(self.kv_caches), span, out)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done, self.received = self.received, set()
        return None, (done or None)
