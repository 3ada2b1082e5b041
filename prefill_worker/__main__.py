"""`python -m prefill_worker`: a prefill worker process (runtime/worker/node.py)."""

from __future__ import annotations

from runtime.worker.node import run_node
from runtime.worker.process import run_process


def main() -> None:
    run_process(lambda argv: run_node("prefill", argv))


if __name__ == "__main__":
    main()
