"""Per-layer tallies of a hand-off's chunks, for its data-plane spans (docs/observability.md): one event
per layer, however many chunks the layer took, so a trace grows with the model's depth and
not with the prompt's length (prefill_worker/tracing.py, decode_worker/tracing.py)."""

from __future__ import annotations

from pdserve_client import spans as S


class LayerTally:
    """Chunks, bytes and the last chunk's time (ns) of each layer, as they come."""

    __slots__ = ("layers",)

    def __init__(self):
        self.layers: dict[int, list[int]] = {}
        """layer -> [chunks, bytes, its last chunk's time (ns)]."""

    def __bool__(self) -> bool:
        return bool(self.layers)

    def add(self, layer: int, nbytes: int, at_ns: int) -> None:
        """One chunk of `layer`, of `nbytes`, at `at_ns`."""
        entry = self.layers.get(layer)
        if entry is None:
            self.layers[layer] = [1, nbytes, at_ns]
        else:
            entry[0] += 1
            entry[1] += nbytes
            entry[2] = at_ns

    def events(self, name: str) -> list[tuple[str, int, dict]]:
        """One `name` event per layer {pd.layer, pd.chunks, pd.bytes} at its last chunk's
        time, in time order (a span's `events`)."""
        by_time = sorted(self.layers.items(), key=lambda item: (item[1][2], item[0]))
        return [(name, at, {S.LAYER: layer, S.CHUNKS: chunks, S.BYTES: nbytes})
                for layer, (chunks, nbytes, at) in by_time]

    def totals(self) -> dict[str, int]:
        """{pd.layers, pd.chunks, pd.bytes} over every layer (a span's attributes)."""
        return {S.LAYERS: len(self.layers), S.CHUNKS: sum(e[0] for e in self.layers.values()),
                S.BYTES: sum(e[1] for e in self.layers.values())}
