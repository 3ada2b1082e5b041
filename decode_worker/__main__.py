"""`python -m decode_worker`: a decode worker process.

With `--serve-prefill` (PD_SERVE_PREFILL=1) the same process also serves
pd.v1.Prefill on its engine and registers as role mixed (a node with both roles,
runtime/worker/node.py). Prefill-only jobs and decode steps share the engine
loop (one prefill chunk, then one decode step), as colocated requests do.
"""

from __future__ import annotations

from runtime.worker.node import run_node
from runtime.worker.process import run_process


def main() -> None:
    run_process(lambda argv: run_node("decode", argv))


if __name__ == "__main__":
    main()
