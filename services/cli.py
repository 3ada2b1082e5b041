"""`pdserve`: run the local cluster and manage checkpoints.

  pdserve up [--prefill N] [--decode M] [--mixed K] [--model PRESET|DIR] [--mode ...]
  pdserve down
  pdserve demo              up (unless running) + a few requests, printed with TTFT/TPOT
  pdserve client-cert T     a client certificate for tenant T from the local cluster's CA
  pdserve export-checkpoint --preset NAME --out DIR [--seed S] [--shard-mb MB]
"""

from __future__ import annotations

import argparse
import random
import sys

from pdserve_client import contract
from pdserve_client.spans import SPANS_FILE

DEFAULT_STATE = contract.LOCAL_STATE_DIR


def _spec(args):
    from services.cluster.launcher import ClusterSpec

    return ClusterSpec(prefill=args.prefill, decode=args.decode, mixed=args.mixed, model=args.model, mode=args.mode,
                       transport=args.transport, num_blocks=args.num_blocks,
                       state_dir=args.state_dir, insecure=args.insecure, traces=not args.no_traces,
                       otlp_endpoint=args.otlp_endpoint)


def cmd_up(args) -> int:
    from services.cluster.launcher import LocalCluster

    try:
        running = LocalCluster.load(args.state_dir)
        if all(running.alive().values()):
            print(running.router_address)
            return 0
        running.down()
    except FileNotFoundError:
        pass
    cluster = LocalCluster(_spec(args))
    address = cluster.up()
    from services.cluster.observability import metrics_lines

    for name, p in cluster.procs.items():
        print(f"  {name:<10} pid {p.pid:<7} {p.address:<22} log {p.log}", file=sys.stderr)
    if cluster.otlp_endpoint:
        print(f"  traces -> {cluster.otlp_endpoint}" + (f" ({cluster.state / SPANS_FILE}; pdctl trace REQUEST_ID)"
              if "collector" in cluster.procs else ""), file=sys.stderr)
    for line in metrics_lines(cluster.procs.values()):
        print(line, file=sys.stderr)
    print(address)
    return 0


def cmd_down(args) -> int:
    from services.cluster.launcher import LocalCluster

    try:
        cluster = LocalCluster.load(args.state_dir)
    except FileNotFoundError:
        print("no local cluster recorded in", args.state_dir, file=sys.stderr)
        return 0
    cluster.down()
    print("stopped", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from pdserve_client import Client
    from pdserve_client.tls import TlsFiles

    if cmd_up(args) != 0:
        return 1
    from services.cluster.launcher import LocalCluster

    cluster = LocalCluster.load(args.state_dir)
    address = cluster.router_address
    tls_files = None if cluster.spec.insecure else TlsFiles.in_dir(cluster.tls_dir, "client")
    client = Client(address, tls_files=tls_files)
    rng = random.Random(0)
    shared = [rng.randrange(3, 500) for _ in range(48)]
    split = shared + [rng.randrange(3, 500) for _ in range(20)]
    prompts = [
        ("disaggregated", [rng.randrange(3, 500) for _ in range(40)]),
        ("disaggregated", split),
        ("disaggregated", shared + [rng.randrange(3, 500) for _ in range(30)]),
        ("colocated", split),  # the second prompt again, on one worker: the same tokens
    ]
    served: dict[tuple[int, ...], tuple[str, list[int]]] = {}
    for mode, prompt in prompts:
        res = client.generate_full(prompt_ids=prompt, max_tokens=args.max_tokens, mode=mode,
                                   ignore_eos=True)
        print(f"[{res.route:<13}] prompt {len(prompt):>3} tokens -> {res.token_ids}")
        print(f"{'':16}TTFT {res.ttft_ms:7.1f} ms   TPOT {res.tpot_ms:6.2f} ms   "
              f"attempts {res.attempts}   request {res.request_id}")
        if res.route != mode:
            print(f"{'':16}asked for {mode}, served {res.route}: {res.failed_attempts or 'no such route'}")
        route, earlier = served.setdefault(tuple(prompt), (res.route, res.token_ids))
        if earlier is not res.token_ids:
            print(f"{'':16}the same prompt, {route} earlier: "
                  f"{'the same tokens' if earlier == res.token_ids else 'OTHER TOKENS (not exact)'}")
    print(f"\nrouter at {address}; try `pdctl status` or `pdctl generate --prompt-ids 1,2,3 "
          f"--max-tokens 8`; stop with `pdserve down` (or `make down`).")
    return 0


def cmd_client_cert(args) -> int:
    from services.cluster.launcher import LocalCluster

    cluster = LocalCluster.load(args.state_dir)
    cluster.issue_client(args.tenant)
    stem = cluster.tls_dir / f"client-{args.tenant}"
    print(f"PD_TLS_CERT={stem}.crt PD_TLS_KEY={stem}.key PD_TLS_CA={cluster.tls_dir / 'ca.crt'}")
    return 0


def cmd_export(args) -> int:
    from services.engine.checkpoint import export_preset

    path = export_preset(args.preset, args.out, seed=args.seed,
                         max_shard_bytes=int(args.shard_mb * 1024 * 1024))
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    from services.cluster.launcher import ClusterSpec

    ap = argparse.ArgumentParser(prog="pdserve", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "demo"):
        p = sub.add_parser(name)
        p.add_argument("--prefill", type=int, default=ClusterSpec.prefill)
        p.add_argument("--decode", type=int, default=ClusterSpec.decode)
        p.add_argument("--mixed", type=int, default=ClusterSpec.mixed,
                       help="decode workers that also serve Prefill (either phase, or both)")
        p.add_argument("--model", default=ClusterSpec.model)
        p.add_argument("--mode", default=ClusterSpec.mode, choices=contract.MODES)
        p.add_argument("--transport", default=ClusterSpec.transport, choices=("ucx", "tcp"))
        p.add_argument("--num-blocks", type=int, default=ClusterSpec.num_blocks)
        p.add_argument("--state-dir", default=DEFAULT_STATE)
        p.add_argument("--insecure", action="store_true",
                       help="no TLS, no certificates, no Redis password (debugging; every service warns)")
        p.add_argument("--otlp-endpoint", default="", metavar="URL",
                       help="send every process's spans to this OTLP/gRPC endpoint instead of the local "
                            "collector (http://host:4317 for plaintext, e.g. a local Jaeger)")
        p.add_argument("--no-traces", action="store_true", help="no local collector, no spans")
        if name == "demo":
            p.add_argument("--max-tokens", type=int, default=12)
    p = sub.add_parser("down")
    p.add_argument("--state-dir", default=DEFAULT_STATE)
    p = sub.add_parser("client-cert", help="issue a client certificate for a tenant from the local CA")
    p.add_argument("tenant")
    p.add_argument("--state-dir", default=DEFAULT_STATE)
    p = sub.add_parser("export-checkpoint")
    p.add_argument("--preset", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-mb", type=float, default=0)
    args = ap.parse_args(argv)
    handler = {"up": cmd_up, "down": cmd_down, "demo": cmd_demo, "client-cert": cmd_client_cert,
               "export-checkpoint": cmd_export}[args.cmd]
    try:
        return handler(args)
    except (ValueError, OSError, RuntimeError, TimeoutError) as e:
        print(f"pdserve {args.cmd}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
