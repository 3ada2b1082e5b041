"""`pdctl drill`: a rollback, or a promotion, under load, checked end to end
(docs/runbooks/rollback.md walks an operator through it).

    pdctl drill rollback [--cluster local|kube] [--state-dir DIR] [--namespace NS --release NAME
                         [--context CTX]] [--router ADDR] [--rate R] [--duration S]
                         [--trigger-after S] [--max-tokens N] [--seed N] [--concurrency N] [--json]
    pdctl drill promote  (the same options, and --canary-fraction F [--canary-samples N]
                         [--slo-ttft-ms MS] [--slo-tpot-ms MS]: by default what the router's
                         canary gates need, so that they pass on a healthy cluster)

Prints one line per check (PASS/FAIL and its figure), the rollback's steps with their
duration and counts (or each promotion with its gates), the first failures; `--json`
prints the report as one JSON object instead. Exit 0 when every check passed, 1 when one
failed or the drill could not run, 2 on bad arguments, 130 on Ctrl-C (the load stops; a
rollback already started goes on: `pdctl release status`).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points
from typing import TextIO

from pdserve_client import contract
from pdserve_ops.drill.cluster import DrillCluster, DrillError
from pdserve_ops.drill.report import render
from pdserve_ops.drill.run import FALLBACK_SLO_MS, DrillOptions, promote_drill, rollback_drill

DRILLS = {"rollback": rollback_drill, "promote": promote_drill}


def _number(kind, minimum: float, strict: bool):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"expected a number {'>' if strict else '>='} {minimum:g}, got {text!r}")
        return value
    return parse


def add_parser(commands, shared: argparse.ArgumentParser) -> None:
    """Register `drill` on pdctl's sub-command set."""
    drill = commands.add_parser("drill", help="a rollback or a promotion under load, checked end to end")
    kinds = drill.add_subparsers(dest="drill", required=True, metavar="{rollback,promote}")
    defaults = DrillOptions()
    for name, text in (("rollback", "roll the release back under load, replace the decode workers, check"),
                       ("promote", "promote the release to ACTIVE under load, one state at a time through the gates")):
        p = kinds.add_parser(name, help=text)
        # Not pdctl's shared flags: a drill presents both identities (client for the load,
        # operator for the release), from the cluster it names.
        p.add_argument("--router", default=argparse.SUPPRESS, help="router host:port (default: the cluster's)")
        p.add_argument("--cluster", choices=("local", "kube"), default="local",
                       help="what the drill runs against (default: local)")
        p.add_argument("--state-dir", default=contract.LOCAL_STATE_DIR,
                       help=f"local: the `pdserve up` state dir (default: {contract.LOCAL_STATE_DIR})")
        p.add_argument("--namespace", help="kube: the release's namespace")
        p.add_argument("--release", help="kube: the Helm release name")
        p.add_argument("--context", help="kube: the kubeconfig context (default: the current one)")
        p.add_argument("--rate", type=_number(float, 0, True), default=defaults.rate_rps,
                       help=f"requests per second (default {defaults.rate_rps:g})")
        p.add_argument("--duration", type=_number(float, 0, True), default=defaults.duration_s,
                       help=f"the load runs at least this long, s (default {defaults.duration_s:g})")
        p.add_argument("--trigger-after", type=_number(float, 0, False), default=defaults.trigger_after_s,
                       help=f"start the rollback/promotions this long into the load, s "
                            f"(default {defaults.trigger_after_s:g})")
        p.add_argument("--max-tokens", type=_number(int, 0, True), default=defaults.max_tokens,
                       help=f"tokens per request (default {defaults.max_tokens})")
        p.add_argument("--seed", type=int, default=defaults.seed, help="seeds the prompts (default 0)")
        p.add_argument("--concurrency", type=_number(int, 0, True), default=defaults.concurrency,
                       help=f"requests in flight at most (default {defaults.concurrency})")
        p.add_argument("--canary-fraction", type=float, default=defaults.canary_fraction,
                       help=f"promote: the canary share (default {defaults.canary_fraction:g})")
        p.add_argument("--canary-samples", type=_number(int, 0, False), default=None,
                       help="promote: stay in CANARY until this many requests completed on each route "
                            "(default: what the router's canary gates judge on, its PD_CANARY_MIN_SAMPLES)")
        for clock, name in (("TTFT", "slo_ttft_ms"), ("TPOT", "slo_tpot_ms")):
            p.add_argument(f"--{name.replace('_', '-')}", type=_number(float, 0, False), default=None,
                           help=f"promote: {clock} target of each load request, 0 for none (default: the "
                                f"router's target, else {FALLBACK_SLO_MS[name]:g}, a ceiling a healthy "
                                "cluster meets on either route)")
        p.add_argument("--reason", default="", help="for the release history (default: the drill's name)")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.set_defaults(run=cmd_drill, offline=True)  # builds its own clients from the cluster


CLUSTER_GROUP = "pdserve.drill_clusters"
"""Entry points naming DrillCluster implementations installed beside the client: the
server package registers `local` (tooling/cluster/drill.py)."""


def make_cluster(args: argparse.Namespace) -> DrillCluster:
    """The DrillCluster the arguments name (kube's module is imported only when asked for)."""
    router = getattr(args, "router", None)
    if args.cluster == "local":
        found = {ep.name: ep for ep in entry_points(group=CLUSTER_GROUP)}
        if "local" not in found:
            raise DrillError("--cluster local needs the pdserve server package installed (it provides the "
                             f"{CLUSTER_GROUP} entry point `local`); this is a client-only install")
        return found["local"].load()(args.state_dir, router=router)
    if not args.namespace or not args.release:
        raise DrillError("--cluster kube needs --namespace and --release")
    try:
        from pdserve_ops.drill.kube import KubernetesCluster
    except ImportError as exc:
        raise DrillError(f"the Kubernetes drill is not available here: {exc}") from None
    return KubernetesCluster(args.namespace, args.release, context=args.context, router=router)


def options_of(args: argparse.Namespace) -> DrillOptions:
    """The DrillOptions the parsed arguments say (ValueError: values that do not go together)."""
    return DrillOptions(rate_rps=args.rate, duration_s=args.duration, trigger_after_s=args.trigger_after,
                        max_tokens=args.max_tokens, seed=args.seed, concurrency=args.concurrency,
                        canary_fraction=args.canary_fraction, reason=args.reason,
                        canary_samples=args.canary_samples, slo_ttft_ms=args.slo_ttft_ms,
                        slo_tpot_ms=args.slo_tpot_ms)


def cmd_drill(args: argparse.Namespace, out: TextIO) -> int:
    """Run the drill; print its report; 0 only when every check passed."""
    try:
        options = options_of(args)
    except ValueError as exc:
        print(f"pdctl: error: {exc}", file=sys.stderr)
        return 2
    try:
        cluster = make_cluster(args)
        try:
            report = DRILLS[args.drill](cluster, options)
        finally:
            cluster.close()
    except DrillError as exc:
        print(f"pdctl: drill {args.drill}: {exc}", file=sys.stderr)
        return 1
    out.write((json.dumps(report.to_dict()) if args.json else render(report)) + "\n")
    return 0 if report.passed else 1
