"""`pdctl autoscale status`: what the SLA autoscaler decided and why (docs/autoscaler.md).

    pdctl autoscale status [--state-dir DIR] [--json]
    pdctl autoscale status --kube --namespace NS --release NAME [--context CTX] [--json]

Reads the status record the autoscaler publishes after every decision: locally the file
`<state dir>/autoscaler.json` (`python -m tooling.cluster.autoscale`), on Kubernetes the key
`status.json` of the ConfigMap `<fullname>-autoscaler` (a `get`: the chart's
`<fullname>-autoscaler-status` Role grants exactly that). Prints the pools' sizes now and
the target, the observed load, the last decision with its reason, and the recent ones.
Needs no router; the kube form needs the `kube` extra (pip install 'pdserve-ops[kube]').
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import TextIO

from pdserve_client import contract
from pdserve_ops.tables import table

STATUS_FILE = "autoscaler.json"  # Must match STATUS_FILE in tooling/cluster/autoscale.py
STATUS_KEY = "status.json"  # Must match STATUS_KEY in autoscaler/kube.py
STATUS_FORMAT = "pdserve-autoscaler-status/1"  # Must match STATUS_FORMAT in autoscaler/loop.py
POOLS = ("prefill", "decode", "mixed")
RECENT = 10
"""Recent decisions shown (the record keeps the autoscaler's PD_AUTOSCALER_HISTORY)."""


class StatusError(RuntimeError):
    """No status record where asked, or one this pdctl cannot read."""


def add_parser(commands, shared: argparse.ArgumentParser) -> None:
    """Register `autoscale` on pdctl's sub-command set."""
    auto = commands.add_parser("autoscale", help="the SLA autoscaler: what it decided and why")
    actions = auto.add_subparsers(dest="action", required=True, metavar="{status}")
    status = actions.add_parser("status", help="pool sizes, target, observed load, the last decisions and why",
                                description=__doc__.split("\n")[0])
    status.add_argument("--state-dir", default=contract.LOCAL_STATE_DIR,
                        help=f"local: the `pdserve up` state dir holding {STATUS_FILE} "
                             f"(default: {contract.LOCAL_STATE_DIR})")
    status.add_argument("--kube", action="store_true",
                        help="read the status ConfigMap of a Helm release instead of the local file")
    status.add_argument("--namespace", help="kube: the release's namespace")
    status.add_argument("--release", help="kube: the Helm release name")
    status.add_argument("--context", help="kube: the kubeconfig context (default: the current one)")
    status.add_argument("--json", action="store_true", help="print the status record as JSON")
    status.set_defaults(run=cmd_status, offline=True)  # reads a file or the Kubernetes API, no router


def read_local(state_dir: str) -> dict:
    """The record `python -m tooling.cluster.autoscale` keeps in `state_dir`."""
    path = Path(state_dir) / STATUS_FILE
    try:
        return _checked(json.loads(path.read_text()), str(path))
    except FileNotFoundError:
        raise StatusError(f"no autoscaler status at {path}: is `python -m tooling.cluster.autoscale {state_dir}` "
                          "running?") from None
    except ValueError as e:
        raise StatusError(f"{path}: not a status record: {e}") from None


def read_kube(namespace: str, release: str, context: str | None) -> dict:
    """The record in the release's `<fullname>-autoscaler` ConfigMap."""
    try:
        from pdserve_ops.drill.kube import ApiException, api_client, fullname
        from pdserve_ops.drill.kube import k8s as k8s_client
    except ImportError as e:
        raise StatusError(str(e)) from None
    name = f"{fullname(release)}-autoscaler"
    with api_client(context) as api:
        try:
            cm = k8s_client.CoreV1Api(api).read_namespaced_config_map(name, namespace)
        except ApiException as e:
            hint = " (is the chart's autoscaler.enabled true?)" if e.status == 404 else ""
            raise StatusError(f"ConfigMap {namespace}/{name}: {e.status} {e.reason}{hint}") from None
    text = (cm.data or {}).get(STATUS_KEY)
    if not text:
        raise StatusError(f"ConfigMap {namespace}/{name} holds no {STATUS_KEY} yet: the autoscaler has not "
                          "decided anything (is its pod running?)")
    try:
        return _checked(json.loads(text), f"{namespace}/{name}")
    except ValueError as e:
        raise StatusError(f"{namespace}/{name}: not a status record: {e}") from None


def _checked(record: dict, where: str) -> dict:
    if not isinstance(record, dict) or record.get("format") != STATUS_FORMAT:
        got = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise StatusError(f"{where}: status format {got!r}, this pdctl reads {STATUS_FORMAT!r}")
    return record


def _when(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _sizes(sizes: dict | None) -> str:
    return ", ".join(f"{p} {sizes[p]}" for p in POOLS if p in sizes) if sizes else "-"


def render(record: dict) -> str:
    """The record as an operator reads it."""
    last = record["last"]
    load = record.get("load")
    lines = [f"autoscaler ({record['scaler']}), updated {_when(record['updated_s'])}",
             f"pools:  {_sizes(record['current'])}",
             f"target: {_sizes(record.get('target'))}",
             f"load:   {load['summary'] if load else 'not observed'}",
             f"last:   {last['reason']}", ""]
    rows = [(_when(d["at_s"]), d["action"], _sizes(d["current"]), _sizes(d["new"]), d["reason"])
            for d in record["decisions"][:RECENT]]
    lines.append(table(("WHEN", "ACTION", "FROM", "TO", "REASON"), rows))
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    """Print the autoscaler's status record; 1 when there is none to read."""
    try:
        if args.kube:
            if not args.namespace or not args.release:
                print("pdctl: autoscale status --kube needs --namespace and --release", file=sys.stderr)
                return 2
            record = read_kube(args.namespace, args.release, args.context)
        else:
            record = read_local(args.state_dir)
    except (StatusError, RuntimeError) as e:  # RuntimeError: the drill's DrillError (no credentials)
        print(f"pdctl: autoscale status: {e}", file=sys.stderr)
        return 1
    out.write((json.dumps(record) if args.json else render(record)) + "\n")
    return 0
