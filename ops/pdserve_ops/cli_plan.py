"""`pdctl plan` and `pdctl profile save`: capacity planning with pdserve's simulator.

    pdctl plan --trace FILE --slo-ttft-ms T --slo-tpot-ms P --gpus N --profile NAME|FILE [--json] [--png F]
    pdctl profile save FILE [--transfer-jsonl bench-transfer.jsonl] [--layers L]

The simulator (the `sim` package) lives in the pdserve package beside the router whose
decision code it runs; pdctl, which needs only the client SDK, imports it when one of
these commands runs, and says so when it is not installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TextIO

from pdserve_client.client import Client

EXIT_USAGE = 2
"""Must match pdserve_ops/cli.py EXIT_USAGE: bad arguments or input."""

NEEDS_SIM = ("pdctl {cmd} runs pdserve's simulator, which ships in the pdserve package (the repository "
             "root: pip install .); it is not importable here: {err}")


def _sim_cli(cmd: str):
    try:
        from sim import cli
    except ImportError as e:
        raise SystemExit(f"pdctl: error: {NEEDS_SIM.format(cmd=cmd, err=e)}") from e
    return cli


def add_parser(commands, shared: argparse.ArgumentParser) -> None:
    """Register `plan` and `profile` on pdctl's sub-commands."""
    p = commands.add_parser(
        "plan", help="how many prefill, decode and mixed workers a trace needs (simulated)",
        description="Simulate configurations of prefill, decode and mixed workers (and tensor parallel "
                    "degrees) serving a trace, with the router's own decision code, and print the best "
                    "by goodput per GPU: the highest rate at which 90%% of requests meet both targets.")
    p.add_argument("--trace", required=True, help="CSV with columns TIMESTAMP,ContextTokens,GeneratedTokens")
    p.add_argument("--slo-ttft-ms", type=float, required=True, help="time-to-first-token target, ms")
    p.add_argument("--slo-tpot-ms", type=float, required=True, help="time-per-output-token target, ms")
    p.add_argument("--gpus", type=int, required=True, help="GPU budget")
    p.add_argument("--profile", required=True,
                   help="a saved profile file (pdctl profile save) or a built-in name, e.g. h100-llama3-8b "
                        "(every tensor parallel degree) or h100-llama3-8b-tp2")
    p.add_argument("--requests", type=int, default=1000, help="requests of the trace to replay (default 1000)")
    p.add_argument("--start", type=int, default=0, help="first request of the trace to replay (default 0)")
    p.add_argument("--tolerance", type=float, default=0.04, help="relative precision of each goodput (default 0.04)")
    p.add_argument("--top", type=int, default=5, help="configurations to print (default 5)")
    p.add_argument("--png", default="", help="write the attainment-against-rate plot here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=cmd_plan, offline=True)

    prof = commands.add_parser("profile", help="simulator profiles of this cluster",
                               description="Profiles the simulator and `pdctl plan` run on.")
    sub = prof.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    save = sub.add_parser("save", parents=[shared], help="save this cluster's calibrated profile to a file",
                          description="The cost profile and capacity every worker measured and registered "
                                      "(their median), a transfer profile and the hand-off's fixed costs, "
                                      "as a file `pdctl plan --profile FILE` and the simulator read.")
    save.add_argument("file", help="where to write the profile (JSON)")
    save.add_argument("--name", default="", help="the profile's name (default: the file's stem)")
    save.add_argument("--model", default="", help="what model the workers serve (recorded)")
    save.add_argument("--layers", type=int, default=1, help="model layers: streamed transfers overlap per layer")
    save.add_argument("--transfer-jsonl", default="",
                      help="bench/transfer.py's JSON lines: fit the transfer's latency and bandwidth to them")
    save.add_argument("--transfer-path", default="pdserve-ucx", help="which path of those lines (default pdserve-ucx)")
    save.add_argument("--transfer-latency-ms", type=float, default=1.0,
                      help="without --transfer-jsonl: the transfer's fixed latency, ms (default 1)")
    save.add_argument("--transfer-gb-per-s", type=float, default=1.0,
                      help="without --transfer-jsonl: the transfer's bandwidth, GB/s (default 1)")
    save.add_argument("--colocated-ms", type=float, default=1.0, help="a colocated TTFT's fixed overhead, ms")
    save.add_argument("--split-ms", type=float, default=2.0, help="a split TTFT's fixed overhead, ms")
    save.add_argument("--handoff-ms", type=float, default=5.0,
                      help="the hand-off's control plane after the transfer (reserve, commit, publish), ms")
    save.set_defaults(run=cmd_profile_save, default_identity="operator")


def cmd_plan(args: argparse.Namespace, out: TextIO) -> int:
    """Run the planner on the trace (offline: no router)."""
    cli = _sim_cli("plan")
    try:
        return cli.plan(args, out)
    except (ValueError, OSError) as e:  # a bad trace, profile or target: say which
        print(f"pdctl: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def cmd_profile_save(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Read every worker's registered profile from the router and save the cluster's."""
    cli = _sim_cli("profile save")
    workers = [dataclasses.asdict(w) for w in client.status().workers]
    try:
        return cli.profile_save(workers, args, out)
    except (ValueError, OSError) as e:
        print(f"pdctl: error: {e}", file=sys.stderr)
        return EXIT_USAGE
