"""Migration benchmark: what a request pays when its decode worker dies mid-stream
(docs/design.md, Failures).

Two local clusters of real processes run side by side (`small`, 1 prefill + 2 decode
workers, secure, UCX): one whose router resumes a migrated request (the next attempt
prefills the prompt followed by all but the last token given, PD_ROUTER_RESUME_MID_STREAM=1),
one whose router regenerates the tokens given one decode step at a time (=0, the
baseline). For each k, each cluster in turn (which goes first alternates) runs a request
of MAX_TOKENS tokens, SIGKILLs its decode worker once k tokens arrived, and records the
stall: the longest wait for a token after the kill (tokens the worker sent before it died
may still arrive first). The killed worker is started again before
the next run. Every run's tokens are checked against an uninterrupted run's.

One JSON line per (k, router): the median stall, its spread, and `ratio`, the resume
router's median over the baseline's from the same run; then a table.

    python bench/migration.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tooling.cluster.launcher import ClusterSpec, LocalCluster

PROMPT = list(range(3, 67))  # 64 tokens
MAX_TOKENS = 200
ROUTERS = {"resume": "1", "regenerate": "0"}


def up(state: Path, resume: str, model: str) -> LocalCluster:
    c = LocalCluster(ClusterSpec(state_dir=str(state), model=model, prefill=1, decode=2,
                                 env={"PD_ROUTER_RESUME_MID_STREAM": resume}))
    c.up()
    return c


def migrate_after(c: LocalCluster, k: int, reference: list[int]) -> dict:
    """One request whose decode worker is killed after k tokens: the stall and the check."""
    tokens, times, t_kill = [], [], 0.0
    with c.client(timeout_s=300) as sdk:
        stream = sdk.generate(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True)
        for event in stream:
            tokens.append(event.token_id)
            if len(tokens) == k:
                c.signal(stream.route.decode_worker)
                t_kill = time.monotonic()
                times.append(t_kill)
            elif t_kill:
                times.append(time.monotonic())
        result = stream.result
    c.revive()
    return {"stall_s": max(b - a for a, b in zip(times, times[1:])), "attempts": result.attempts,
            "exact": tokens == reference and result.token_ids == reference}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="k 12 and 190, one run each")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="small")
    args = ap.parse_args()
    ks, repeats = ((12, 190), 1) if args.quick else ((12, 100, 190), args.repeats)
    with tempfile.TemporaryDirectory(prefix="pd-migration-") as tmp:
        clusters = {name: up(Path(tmp) / name, flag, args.model) for name, flag in ROUTERS.items()}
        try:
            with clusters["regenerate"].client(timeout_s=300) as sdk:
                reference = sdk.generate_full(prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True).token_ids
            rows = []
            for k in ks:
                stalls: dict[str, list[float]] = {name: [] for name in ROUTERS}
                exact = True
                for i in range(repeats):
                    order = list(ROUTERS) if (i + ks.index(k)) % 2 == 0 else list(reversed(ROUTERS))
                    for name in order:
                        run = migrate_after(clusters[name], k, reference)
                        exact &= run["exact"] and run["attempts"] == 2
                        stalls[name].append(run["stall_s"])
                base = statistics.median(stalls["regenerate"])
                for name in ROUTERS:
                    med = statistics.median(stalls[name])
                    row = {"bench": "migration", "model": args.model, "k": k, "router": name,
                           "stall_s": round(med, 3), "min_s": round(min(stalls[name]), 3),
                           "max_s": round(max(stalls[name]), 3), "runs": repeats,
                           "ratio": round(med / base, 3), "baseline": "regenerate", "exact": exact}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            for c in clusters.values():
                c.down()
    print(f"\n{'k':>5} {'router':>11} {'stall s':>8} {'min':>6} {'max':>6} {'ratio':>6} exact")
    for r in rows:
        print(f"{r['k']:>5} {r['router']:>11} {r['stall_s']:>8.3f} {r['min_s']:>6.3f} {r['max_s']:>6.3f} "
              f"{r['ratio']:>6.3f} {r['exact']}")


if __name__ == "__main__":
    main()
