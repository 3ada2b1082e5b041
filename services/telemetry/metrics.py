"""Process metrics in the Prometheus text format, written to a file (textfile-collector style).

A worker started with PD_METRICS_FILE=<path> rewrites that file every
`interval_s` (atomically: write then rename) with the samples its sources
return; node_exporter's textfile collector, a sidecar, or a test reads it.

    source() -> [(name, {label: value}, number), ...]
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

Sample = tuple[str, dict[str, str], float]
Source = Callable[[], Iterable[Sample]]


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples: Iterable[Sample]) -> str:
    """Samples as Prometheus text exposition lines (labels sorted, one sample per line)."""
    lines = []
    for name, labels, value in samples:
        if labels:
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            lines.append(f"{name}{{{body}}} {float(value)!r}")
        else:
            lines.append(f"{name} {float(value)!r}")
    return "\n".join(lines) + "\n"


def parse(text: str) -> list[Sample]:
    """Inverse of `render` for its own output (tests, drills)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = {}
        if rest:
            for part in rest.rstrip("}").split('",'):
                k, _, v = part.partition('="')
                labels[k] = v.rstrip('"')
        out.append((name, labels, float(value)))
    return out


class MetricsFile:
    """Rewrites `path` with every source's samples every interval_s (no-op without a path)."""

    def __init__(self, path: str, sources: list[Source], interval_s: float = 1.0):
        self.path, self.sources, self.interval_s = path, sources, interval_s
        self._task: asyncio.Task | None = None

    def write(self) -> None:
        samples: list[Sample] = []
        for source in self.sources:
            try:
                samples.extend(source())
            except Exception:  # one bad source must not stop the rest
                log.exception("metrics source failed")
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(render(samples))
        os.replace(tmp, self.path)

    def start(self) -> None:
        if self.path:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="metrics")

    async def _run(self) -> None:
        while True:
            try:
                self.write()
            except OSError as e:
                log.warning("metrics file %s: %s", self.path, e)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self.write()
