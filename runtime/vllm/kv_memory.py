"""vLLM's K/V tensors as pdserve's transport sees them (docs/design.md, The engine: vLLM behind the contract).

Two ways to the bytes, one code path above them:

    direct    the transport reads and writes the cache itself: views of each layer's
              tensor, one per run of consecutive blocks. Only where the cache is host
              memory with whole blocks contiguous (vLLM-CPU: [blocks, kv_heads, block,
              2 * head_dim]).
    staged    each handed-off sequence gets a host buffer of its prompt's blocks,
              [layers, blocks, bytes per block] (pinned beside a GPU): a sender's blocks
              are copied into it when the transport asks for them (`views`) or the digest
              hashes them; a receiver's land in it, and `stage_in` copies them into the
              cache at the commit, before vLLM may read them. Any device, any layout vLLM
              gives (block-major, or K and V planes [2, blocks, ...]); the price is one
              device-host copy each way.

`auto` stages exactly when direct is impossible (a GPU's cache, or K and V in planes).
Bytes per block are the same either way, K then V of the block as the layout orders them,
so a direct worker and a staged one of the same layout exchange K/V (their ABI is equal).
"""

from __future__ import annotations

import re

import torch

from runtime.engine.engine import physical_runs

LAYER = re.compile(r"\.layers\.(\d+)\.")


def layer_index(name: str) -> int | None:
    """The decoder layer a vLLM attention layer's name names (model.layers.3.self_attn.attn)."""
    m = LAYER.search(f".{name}")
    return None if m is None else int(m.group(1))


def first_slots(block: memoryview, dtype: torch.dtype, planes: bool, ranks: int, heads: int, block_size: int,
                slots: int) -> bytes:
    """One block's bytes (`ranks` shards of it, in rank order) with each shard's token slots
    past `slots` left out, K then V as the layout orders them: K and V planes, [2, block,
    heads, head_dim] per shard; block-major (vLLM-CPU), [heads, 2, block, head_dim]."""
    raw = torch.frombuffer(block, dtype=torch.uint8).view(dtype)
    if planes:
        rows = raw.view(ranks, 2, block_size, -1)[:, :, :slots]
    else:
        rows = raw.view(ranks, heads, 2, block_size, -1)[:, :, :, :slots]
    return rows.contiguous().view(torch.uint8).numpy().tobytes()


class KvMemory:
    """The registered K/V tensors of one vLLM engine, and the staging buffers of its sequences."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], layers: int, block_size: int, staging: str = "auto"):
        by_index = {layer_index(name): t for name, t in kv_caches.items()}
        if sorted(i for i in by_index if i is not None) != list(range(layers)):
            raise RuntimeError(f"vLLM registered K/V for layers {sorted(map(str, by_index))}, expected 0..{layers - 1}")
        self.tensors = [by_index[i] for i in range(layers)]
        t = self.tensors[0]
        self.planes = t.dim() >= 3 and t.shape[0] == 2 and t.shape[1] != 2
        """K and V in two planes [2, blocks, ...] (GPU backends), not within each block."""
        self.block_elems = t[0, 0].numel() * 2 if self.planes else t[0].numel()
        self.block_bytes = self.block_elems * t.element_size()
        self.device = t.device
        direct_ok = self.device.type == "cpu" and not self.planes and all(x.is_contiguous() for x in self.tensors)
        if staging not in ("auto", "on", "off"):
            raise ValueError(f"staging {staging!r}: auto, on or off")
        if staging == "off" and not direct_ok:
            raise RuntimeError(f"vLLM's K/V ({self.device}, {tuple(t.shape)}) cannot be read in place: stage it "
                               "(PD_VLLM_HOST_STAGING=auto or on)")
        self.staged = staging == "on" or not direct_ok
        self.layout = (f"vllm:{'kv-planes' if self.planes else 'block-major'}:{tuple(t.shape[1 + self.planes:])}"
                       f":{t.dtype}")
        self._flat = [] if not direct_ok else [memoryview(x.view(torch.uint8).numpy()).cast("B") for x in self.tensors]
        self._mirrors: dict[int, tuple[torch.Tensor, list[memoryview]]] = {}

    # ---- one layer's blocks on the cache's device ------------------------------------------
    def gather(self, layer: int, ids: list[int]) -> torch.Tensor:
        """uint8 [len(ids), block_bytes]: those blocks of `layer`, K then V each."""
        t, idx = self.tensors[layer], torch.tensor(ids, dtype=torch.long, device=self.device)
        if self.planes:
            rows = torch.stack([t[0].index_select(0, idx), t[1].index_select(0, idx)], dim=1)
        else:
            rows = t.index_select(0, idx)
        return rows.reshape(len(ids), -1).view(torch.uint8)

    def scatter(self, layer: int, ids: list[int], rows: torch.Tensor) -> None:
        """Write uint8 rows [len(ids), block_bytes] into those blocks of `layer`."""
        t, idx = self.tensors[layer], torch.tensor(ids, dtype=torch.long, device=self.device)
        src = rows.to(self.device).view(t.dtype)
        if self.planes:
            kv = src.reshape(len(ids), 2, *t.shape[2:])
            t[0].index_copy_(0, idx, kv[:, 0])
            t[1].index_copy_(0, idx, kv[:, 1])
        else:
            t.index_copy_(0, idx, src.reshape(len(ids), *t.shape[1:]))

    # ---- staging buffers -----------------------------------------------------------------------
    def open(self, key: int, blocks: int) -> None:
        """A host buffer for a sequence's `blocks` prompt blocks, every layer (staged only)."""
        if self.staged and key not in self._mirrors:
            pin = self.device.type == "cuda"
            buf = torch.empty((len(self.tensors), blocks, self.block_bytes), dtype=torch.uint8, pin_memory=pin)
            self._mirrors[key] = buf, [memoryview(buf[i].numpy()).cast("B") for i in range(len(self.tensors))]

    def close(self, key: int) -> None:
        self._mirrors.pop(key, None)

    def stage_out(self, key: int, table: list[int], first: int, count: int, layers: range | None = None) -> None:
        """Copy blocks [first, first + count) of the sequence from the cache into its buffer."""
        buf = self._mirrors[key][0]
        for layer in layers if layers is not None else range(len(self.tensors)):
            if count:
                buf[layer, first:first + count].copy_(self.gather(layer, table[first:first + count]))

    def stage_in(self, key: int, table: list[int], first: int, last: int) -> None:
        """Copy blocks [first, last) from the sequence's buffer into the cache (received K/V)."""
        if self.staged and last > first:
            buf = self._mirrors[key][0]
            for layer in range(len(self.tensors)):
                self.scatter(layer, table[first:last], buf[layer, first:last])
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

    # ---- what the transport and the digest read ----------------------------------------------
    def source(self, key: int, table: list[int], layer: int) -> tuple[memoryview, list[int]]:
        """(flat bytes, block index of each logical block) of `layer` for the sequence."""
        if self.staged:
            return self._mirrors[key][1][layer], list(range(len(table)))
        return self._flat[layer], table

    def views(self, key: int, table: list[int], layer: int, first: int, count: int) -> list[memoryview]:
        """One view per run of consecutive blocks of logical blocks [first, first + count)."""
        flat, index = self.source(key, table, layer)
        bpb = self.block_bytes
        return [flat[start * bpb:(start + n) * bpb] for start, n in physical_runs(index, first, count)]

    def tail(self, key: int, table: list[int], layer: int, block: int, slots: int, block_size: int) -> bytes:
        """The first `slots` token slots of a logical block, K then V, head by head (the layout's
        order with the slots past them left out)."""
        flat, index = self.source(key, table, layer)
        t = self.tensors[layer]
        return first_slots(flat[index[block] * self.block_bytes:(index[block] + 1) * self.block_bytes], t.dtype,
                           self.planes, 1, 0 if self.planes else t.shape[1], block_size, slots)


class SharedStaging:
    """Staging for a tensor-parallel engine: the K/V lives in the rank processes, each with
    its share of the heads; each handed-off sequence's buffer is shared memory,
    [layers, blocks, ranks, shard bytes], which the ranks fill and drain (the connector's
    `wait_for_save` and `start_load_kv`, told by its metadata) and the transport and the
    digest read here. A block on the wire is its shards in rank order."""

    staged = True
    device = torch.device("cpu")

    def __init__(self, layers: int, ranks: int, shard_shape: tuple[int, ...], dtype: torch.dtype, planes: bool):
        self.layers, self.ranks, self.planes, self.dtype = layers, ranks, planes, dtype
        self.shard_shape = shard_shape
        """One rank's block: [kv_heads / ranks, block, 2 * head_dim] (block-major) or
        [2, block, kv_heads / ranks, head_dim] (K and V planes)."""
        self.shard_bytes = int(torch.Size(shard_shape).numel()) * torch.empty((), dtype=dtype).element_size()
        self.block_bytes = ranks * self.shard_bytes
        self.layout = f"vllm:{'kv-planes' if planes else 'block-major'}:tp{ranks}:{shard_shape}:{dtype}"
        self._shm: dict[int, tuple[object, list[memoryview]]] = {}
        self._retiring: list[tuple[object, list[memoryview]]] = []

    def open(self, key: int, blocks: int) -> None:
        from multiprocessing import shared_memory

        if key in self._shm:
            return
        shm = shared_memory.SharedMemory(create=True, size=max(1, self.layers * blocks * self.block_bytes))
        per_layer = blocks * self.block_bytes
        self._shm[key] = shm, [shm.buf[i * per_layer:(i + 1) * per_layer] for i in range(self.layers)]

    def name(self, key: int) -> str:
        return self._shm[key][0].name

    def close(self, key: int) -> None:
        """The buffer's name goes now (no rank opens it again); its mapping once no view of it
        is left (a sender's last views may still be referenced), at a later close."""
        got = self._shm.pop(key, None)
        if got is not None:
            got[0].unlink()
            self._retiring.append(got)
        still = []
        for shm, views in self._retiring:
            try:
                for v in views:
                    v.release()
                shm.close()
            except BufferError:
                still.append((shm, views))
        self._retiring = still

    def stage_out(self, *args, **kwargs) -> None:
        """The ranks copy out (PdserveConnector.wait_for_save)."""

    def stage_in(self, *args, **kwargs) -> None:
        """The ranks copy in (PdserveConnector.start_load_kv)."""

    def views(self, key: int, table: list[int], layer: int, first: int, count: int) -> list[memoryview]:
        bpb = self.block_bytes
        return [self._shm[key][1][layer][first * bpb:(first + count) * bpb]] if count else []

    def tail(self, key: int, table: list[int], layer: int, block: int, slots: int, block_size: int) -> bytes:
        """Each shard's first `slots` token slots, in rank order."""
        return first_slots(self._shm[key][1][layer][block * self.block_bytes:(block + 1) * self.block_bytes],
                           self.dtype, self.planes, self.ranks, 0 if self.planes else self.shard_shape[0],
                           block_size, slots)


def shard_io(kv: KvMemory, rank: tuple[int, int], layers: int, span: tuple[str, int, int, list[int]],
             out: bool) -> None:
    """A rank's side of SharedStaging: `rank` is (this rank, ranks); `span` (shared buffer, its
    blocks, first logical block, physical blocks `ids`). Copy this rank's shard of those
    blocks out of its cache into the buffer, or (out=False) into its cache from it."""
    from multiprocessing import shared_memory

    (rank, ranks), (name, blocks, first, ids) = rank, span
    shm = shared_memory.SharedMemory(name=name)
    try:
        buf = torch.frombuffer(shm.buf, dtype=torch.uint8, count=layers * blocks * ranks * kv.block_bytes)
        buf = buf.view(layers, blocks, ranks, kv.block_bytes)
        for layer in range(layers):
            if out:
                buf[layer, first:first + len(ids), rank].copy_(kv.gather(layer, ids))
            else:
                kv.scatter(layer, ids, buf[layer, first:first + len(ids), rank].clone())
        del buf
    finally:
        shm.close()
