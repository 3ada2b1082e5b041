"""Fault benchmark: the reliability goal's figures in one table (docs/design.md, Failures).

On local clusters of real processes (tiny model), one run injects:

  kill <process>   SIGKILL of the prefill worker, the decode worker, the directory,
                   Redis or the router holding a request, at each hand-off step
                   (tooling/cluster/faults.STEPS), then a restart
  cancel / deadline  a client cancel, or a deadline passing, at each step
  cancel storm     1,000 requests, two thirds cancelled at random moments
  burst            200 concurrent requests needing several times the K/V pool
  redis restart    Redis SIGKILLed under steady traffic, back with and without
                   its data files

and reports per fault kind: faults injected, requests affected, failed (requests
that should have completed and did not; a killed router's own requests and
cancelled or timed-out ones are expected to end, reported as `expected_ends`),
hung, blocks leaked and transactions left open once the cluster settled, and
stale publications (tokens differing from a fault-free run, publications never
released, fences moving backwards). A fault-free baseline row of the same
requests comes from the same run. One JSON line per row, then the table.

    python bench/faults.py [--quick]   (--quick: one step per process, storm 200)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tooling.cluster.faults import STEPS, FaultRunner, fault_env, kill_cases
from tooling.cluster.launcher import ClusterSpec, LocalCluster
from tooling.cluster.load import burst, cancel_storm, redis_restart

PAUSE_S = 2.0
COLUMNS = ("fault", "injected", "affected", "failed", "expected_ends", "hung", "blocks_leaked",
           "open_txns", "stale_publications")


def cluster(state: Path, **kw) -> LocalCluster:
    c = LocalCluster(ClusterSpec(state_dir=str(state), **kw))
    c.up()
    return c


def emit(row: dict) -> dict:
    print(json.dumps({"bench": "faults", **row}), flush=True)
    return row


def seeded_prompts(n: int, seed: int, max_prompt: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(1, max_prompt + 1))] for _ in range(n)]


def matrix(root: Path, quick: bool) -> list[dict]:
    events = root / "m" / "events.jsonl"
    c = cluster(root / "m", prefill=2, decode=2, lease_ttl_s=2.0, env=fault_env(events, PAUSE_S))
    rows: dict[str, dict] = defaultdict(lambda: dict.fromkeys(COLUMNS[1:], 0))
    try:
        prompt = [random.Random(15).randrange(3, 500) for _ in range(150)]
        runner = FaultRunner(c, events, prompt, max_tokens=8, pause_s=PAUSE_S)
        base = rows["none (baseline)"]
        for _ in range(5):
            r = runner.run("none", "", "reserved")  # stopped at no step: a plain request
            base["affected"] += 1
            base["failed"] += r.outcome != "ok"
            base["hung"] += r.outcome == "hung"
            base["blocks_leaked"] += r.held_blocks
            base["open_txns"] += r.open_txns
            base["stale_publications"] += r.stale_publications
        cases = [("kill", v, s) for v, s in kill_cases()] + \
                [(a, "", s) for a in ("cancel", "deadline") for s in STEPS]
        if quick:
            cases = [c_ for c_ in cases if c_[2] in ("chunk", "published")]
        for action, victim, step in cases:
            r = runner.run(action, victim, step)
            row = rows[f"{action} {victim}".strip()]
            row["injected"] += 1
            row["affected"] += r.reached
            expected_end = action != "kill" or victim == "router"
            ended = r.outcome.startswith("failed")
            row["failed"] += ended and not expected_end
            row["expected_ends"] += ended and expected_end
            row["hung"] += r.outcome == "hung"
            row["blocks_leaked"] += r.held_blocks
            row["open_txns"] += r.open_txns
            row["stale_publications"] += r.stale_publications
            print(f"# {action} {victim}@{step}: {r.outcome} tokens_match={r.tokens_match} "
                  f"attempts={r.attempts} settle={r.settle_s:.1f}s", file=sys.stderr, flush=True)
    finally:
        c.down()
    return [emit({"fault": k, **v}) for k, v in rows.items()]


def load_rows(root: Path, quick: bool) -> list[dict]:
    out = []
    # A short transaction TTL: a transaction whose abort Redis lost with its last second of
    # AOF (appendfsync everysec) is reaped by it within the settle window.
    c = cluster(root / "s", prefill=1, decode=1, num_blocks=512, env={"PD_TXN_TTL_S": "15"})
    try:
        storm = cancel_storm(c, n=200 if quick else 1000)
        out.append(storm)
        out.append(burst(c, seeded_prompts(200, 15, 400), "disaggregated"))
        prompt = list(range(3, 120))
        out.append(redis_restart(c, prompt, keep_data=True))
        out.append(redis_restart(c, prompt, keep_data=False))
    finally:
        c.down()
    return [emit({"fault": r.name, "injected": r.faults, "affected": r.requests, "failed": r.failed,
                  "expected_ends": r.faults if r.name == "cancel storm" else 0, "hung": r.hung,
                  "blocks_leaked": r.held_blocks, "open_txns": r.open_txns,
                  "stale_publications": r.wrong_tokens, "took_s": round(r.took_s, 1)}) for r in out]


def table(rows: list[dict]) -> str:
    cells = [list(COLUMNS)] + [[str(r.get(k, "")) for k in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two steps per process, a storm of 200")
    args = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pd-faults-") as tmp:
        rows = matrix(Path(tmp), args.quick) + load_rows(Path(tmp), args.quick)
    print(table(rows))
    print(f"# {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
