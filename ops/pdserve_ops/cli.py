"""`pdctl`: talk to a pdserve router from the shell.

    pdctl generate --prompt "Hello" --max-tokens 16 [--mode colocated] [--json]
    pdctl generate --prompt-ids 1,2,3 --max-tokens 8 --ids
    pdctl status [--json]
    pdctl transactions [--state aborted] [--tenant T] [--limit N] [--json]
    pdctl cancel REQUEST_ID
    pdctl set-mode rolled_back --reason "drill"
    pdctl trace REQUEST_ID [--json] [--html page.html]     (reads the span file; trace_cmd.py)
    pdctl blocks [--orphans-only] [--request R] [--worker W] [--json]   (cli_blocks.py)
    pdctl release status | promote [TARGET] | rollback [--reason R]     (cli_release.py)
    pdctl drill rollback | promote [--cluster local|kube] [--rate R] ...  (cli_drill.py)
    pdctl autoscale status [--kube --namespace NS --release R] [--json]  (cli_autoscale.py)

`--router` (before or after the command) defaults to $PD_ROUTER, then the
local launcher's `.pdserve/router.addr`, then 127.0.0.1:50080. The certificate
presented is the local launcher's `.pdserve/tls/client.crt` (`operator.crt` for
set-mode, blocks, release promote and rollback; `--identity` picks another), or $PD_TLS_CERT/KEY/CA.
Exit codes: 0 ok, 1 the router or the connection reported an error (CODE:
message on stderr), 2 bad arguments, 130 interrupted (the request is cancelled),
141 stdout closed early (`pdctl ... | head`: quietly, as a tool SIGPIPE ends).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from pdserve_client import wire
from pdserve_client.client import Client
from pdserve_client.options import OPTION_NAMES, GenerateOptions
from pdserve_client.release import stopped_routes_of
from pdserve_client.tls import TlsConfigError
from pdserve_client.types import GenerationResult, PdError
from pdserve_ops import cli_autoscale, cli_blocks, cli_drill, cli_plan, cli_release, trace_cmd
from pdserve_ops.tables import POOL_HEADERS, POOL_HELP, pool_cells, table

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE_CLOSED = 0, 1, 2, 130, 141


def _token_id_list(text: str) -> list[int]:
    """'1,2, 3' -> [1, 2, 3] (argparse type)."""
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"expected non-negative comma-separated token ids, got {text!r}")
    return ids


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_generate(commands, shared: argparse.ArgumentParser) -> None:
    """`pdctl generate`: one flag per GenerateOptions field."""
    gen = commands.add_parser("generate", parents=[shared], help="generate tokens, streaming them as they arrive")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-ids", type=_token_id_list, help="prompt token ids, e.g. 1,2,3")
    # One flag per GenerateOptions field, --name-with-dashes; cmd_generate reads them back by field name.
    gen.add_argument("--max-tokens", type=_positive_int, required=True, help="most tokens to generate")
    gen.add_argument("--mode", choices=sorted(wire.MODES), help="serving mode (default: router's)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    gen.add_argument("--top-p", type=float, default=1.0, help="1 disables top-p")
    gen.add_argument("--seed", type=int, default=None, help="sampler seed")
    gen.add_argument("--stop-token-ids", type=_token_id_list, default=[], help="extra stop ids, e.g. 2,13")
    gen.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-sequence")
    gen.add_argument("--first-step", type=int, default=0,
                     help="resume: the prompt ends with this many tokens already given; the rest follow")
    gen.add_argument("--logprobs", type=int, default=None,
                     help="log-probabilities with each token: the chosen token's and the N most likely (0..20)")
    gen.add_argument("--tenant", default="", help="tenant (default: the one the client certificate names)")
    gen.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT target for admission/routing")
    gen.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT target for admission/routing")
    gen.add_argument("--priority", type=int, default=0,
                     help="place among the tenant's requests in the admission queue: higher first (-1000..1000)")
    gen.add_argument("--request-id", default=None, help="request id (default: a fresh uuid)")
    gen.add_argument("--deadline-s", type=float, default=None, help="request deadline, s")
    gen.add_argument("--ids", action="store_true", help="print token ids instead of text")
    gen.add_argument("--json", action="store_true", help="print one JSON object when done")
    gen.set_defaults(run=cmd_generate)


def build_parser() -> argparse.ArgumentParser:
    """The pdctl argument parser (one sub-command per operation)."""
    # --router/--timeout are accepted before or after the command; SUPPRESS keeps a
    # value given before the command from being reset by the sub-parser's default.
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--router", default=argparse.SUPPRESS, help="router host:port")
    shared.add_argument("--identity", default=argparse.SUPPRESS,
                        help="certificate to present from .pdserve/tls: client (default) or operator "
                             "(set-mode's and blocks' default); $PD_TLS_CERT/KEY/CA override both")
    shared.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="unary call timeout, s")

    parser = argparse.ArgumentParser(prog="pdctl", description="pdserve client")
    parser.add_argument("--router", default=None,
                        help="router host:port (default: $PD_ROUTER, ./.pdserve/router.addr, 127.0.0.1:50080)")
    parser.add_argument("--timeout", type=float, default=30.0, help="unary call timeout, s (default 30)")
    parser.add_argument("--identity", default=None, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_generate(commands, shared)

    status = commands.add_parser("status", parents=[shared], help="workers, blocks, open transactions, mode",
                                 description="Every live worker's load and K/V pool, open transactions and "
                                             "the release mode. " + POOL_HELP)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=cmd_status)

    txns = commands.add_parser("transactions", parents=[shared], help="list transfer transactions")
    txns.add_argument("--state", action="append", choices=sorted(wire.TXN_STATES), default=[],
                      help="only this state (repeatable)")
    txns.add_argument("--tenant", default="", help="only this tenant")
    txns.add_argument("--limit", type=int, default=0, help="most to list (0 = router default)")
    txns.add_argument("--json", action="store_true", help="print JSON")
    txns.set_defaults(run=cmd_transactions)

    cancel = commands.add_parser("cancel", parents=[shared], help="cancel a running request")
    cancel.add_argument("request_id", help="request id to cancel")
    cancel.add_argument("--reason", default="pdctl cancel", help="reason recorded by the router")
    cancel.add_argument("--json", action="store_true", help="print JSON")
    cancel.set_defaults(run=cmd_cancel)

    set_mode = commands.add_parser("set-mode", parents=[shared], help="change the release mode (rollback: rolled_back)")
    set_mode.add_argument("mode", choices=list(wire.RELEASE_MODES), help="target release mode")
    set_mode.add_argument("--canary-fraction", type=float, default=0.0, help="canary share in [0, 1]")
    set_mode.add_argument("--reason", default="", help="why, for the audit log")
    set_mode.add_argument("--json", action="store_true", help="print JSON")
    set_mode.set_defaults(run=cmd_set_mode, default_identity="operator")

    trace_cmd.register(commands)
    cli_blocks.add_parser(commands, shared)
    cli_release.add_parser(commands, shared)
    cli_drill.add_parser(commands, shared)
    cli_autoscale.add_parser(commands, shared)
    cli_plan.add_parser(commands, shared)
    return parser


class _TokenLine:
    """Tokens written as they arrive (text, or ids with --ids; nothing with --json) on
    a line that `end` closes only if the tokens opened one: a router without a
    tokenizer streams empty text, and an empty line says nothing."""

    def __init__(self, out: TextIO, ids: bool, quiet: bool):
        self.out, self.ids, self.quiet = out, ids, quiet
        self.open = False
        self.shown = 0
        """Characters of text shown."""

    def write(self, token) -> None:
        """Show one token (and flush: the user watches it arrive)."""
        self._show("" if self.quiet else f"{token.token_id} " if self.ids else token.text)

    def rest(self, text: str) -> None:
        """Show what the whole `text` has past the pieces shown (Complete.text_tail: the
        bytes of a character no later token completed)."""
        if not (self.quiet or self.ids):
            self._show(text[self.shown:])

    def _show(self, piece: str) -> None:
        if piece:
            self.out.write(piece)
            self.out.flush()
            self.open = not piece.endswith("\n")
            self.shown += len(piece)

    def end(self) -> None:
        """End the line the tokens left open, if they did."""
        if self.open:
            self.out.write("\n")
            self.open = False


def cmd_generate(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Stream tokens to `out`, then a summary line (or one JSON object with --json)."""
    options = GenerateOptions(**{name: getattr(args, name) for name in OPTION_NAMES})
    stream = client.generate(args.prompt, prompt_ids=args.prompt_ids, options=options)
    line = _TokenLine(out, args.ids, args.json)
    with stream:
        try:
            for token in stream:
                line.write(token)
            result = stream.collect()
            line.rest(result.text)
        except (PdError, KeyboardInterrupt):
            line.end()  # before the error on stderr
            raise
    if args.mode == "disaggregated" and result.route != "disaggregated" and not result.failed_attempts:
        _say_why_not(client, result.route)
    if args.json:
        out.write(json.dumps(result.to_dict()) + "\n")
        return EXIT_OK
    line.end()
    if not args.ids and result.token_ids and not result.text:
        # A router without a tokenizer streams empty text; show what was generated.
        out.write("token_ids: " + ",".join(map(str, result.token_ids)) + "\n")
    out.write(summary_line(result) + "\n")
    return EXIT_OK


def _say_why_not(client: Client, route: str) -> None:
    """On stderr: the release, when it is why a request that asked for disaggregated ran
    `route` with no attempt failed (a rollback stops those routes)."""
    why = stopped_routes_of(client)
    if why:
        print(f"pdctl: asked for disaggregated, served {route}: {why}", file=sys.stderr)


def summary_line(r: GenerationResult) -> str:
    """One-line summary of a finished generation (client-side latencies first)."""
    workers = f"{r.prefill_worker}->{r.decode_worker}" if r.prefill_worker else r.decode_worker
    return (f"-- request_id={r.request_id} route={r.route} workers={workers or '-'} finish={r.finish_reason} "
            f"tokens={r.num_tokens} ttft_ms={r.ttft_ms:.2f} tpot_ms={r.tpot_ms:.2f} latency_ms={r.latency_ms:.2f} "
            f"server_ttft_ms={r.server_ttft_ms:.2f} server_tpot_ms={r.server_tpot_ms:.2f} attempts={r.attempts}")


def cmd_status(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Print cluster status."""
    s = client.status()
    if args.json:
        out.write(json.dumps(s.to_dict()) + "\n")
        return EXIT_OK
    out.write(f"mode: {s.mode}  canary_fraction: {s.canary_fraction:.2f}  route_epoch: {s.route_epoch}  "
              f"open_transactions: {s.open_transactions}\n")
    out.write(f"decode blocks: free {s.free_blocks}  reserved {s.reserved_blocks}  total {s.total_blocks}\n")
    rows = [(w.worker_id, w.role, w.epoch,
             *pool_cells(free=w.free_blocks, cached=w.cached_blocks, reserved=w.reserved_blocks,
                         active=w.active_blocks, total=w.total_blocks),
             w.pending_prefill_tokens, w.active_decode_batch, w.address) for w in s.workers]
    out.write(table(("WORKER", "ROLE", "EPOCH", *POOL_HEADERS, "PENDING_PREFILL", "BATCH", "ADDRESS"), rows) + "\n")
    for w in s.workers:
        if w.colocated_only_reason:
            out.write(f"{w.worker_id}: colocated only, no K/V hand-off: {w.colocated_only_reason}\n")
    return EXIT_OK


def cmd_transactions(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Print transfer transactions, newest first."""
    txns = client.transactions(states=args.state, tenant=args.tenant, limit=args.limit)
    if args.json:
        out.write(json.dumps([t.to_dict() for t in txns]) + "\n")
        return EXIT_OK
    rows = [(t.request_id, t.transfer_id, t.state, t.generation, t.attempt,
             f"{t.source_worker_id}@{t.source_epoch}", f"{t.destination_worker_id}@{t.destination_epoch}",
             t.chunks_expected, t.abort_reason or "-") for t in txns]
    out.write(table(("REQUEST", "TRANSFER", "STATE", "GEN", "ATTEMPT", "SOURCE", "DESTINATION", "CHUNKS", "ABORT"),
                     rows) + "\n")
    out.write(f"{len(txns)} transaction(s)\n")
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Cancel one request (idempotent; an unknown id is reported, not an error)."""
    found = client.cancel(args.request_id, reason=args.reason)
    if args.json:
        out.write(json.dumps({"request_id": args.request_id, "found": found}) + "\n")
    else:
        out.write(f"{args.request_id}: {'cancelled' if found else 'not found (unknown or already gone)'}\n")
    return EXIT_OK


def cmd_set_mode(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Change the release mode and print the steps the router ran."""
    change = client.set_mode(args.mode, canary_fraction=args.canary_fraction, reason=args.reason)
    if args.json:
        out.write(json.dumps(change.to_dict()) + "\n")
        return EXIT_OK
    out.write(f"mode: {change.previous_mode} -> {change.mode}  route_epoch: {change.route_epoch}\n")
    for step in change.steps:
        out.write(f"  {step}\n")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pdctl` console script; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or bad arguments (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    out = sys.stdout
    try:
        code = _run(args, out)
        out.flush()  # here, not at exit: a reader that left is caught below
        return code
    except BrokenPipeError:
        # The reader is gone (`| head` read its lines): nothing to report to anyone. Later
        # writes, the interpreter's last flush included, go to /dev/null instead of raising.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return EXIT_PIPE_CLOSED
    except TlsConfigError as e:
        print(f"pdctl: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except PdError as e:
        out.flush()
        print(f"pdctl: error: {e.code}: {e.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("pdctl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace, out: TextIO) -> int:
    """Run the parsed command: offline ones on local files, the rest with a Client."""
    if getattr(args, "offline", False):  # reads local files, needs no router
        return args.run(args, out)
    identity = args.identity or getattr(args, "default_identity", "client")
    with Client(args.router, timeout_s=args.timeout, identity=identity) as client:
        return args.run(client, args, out)


if __name__ == "__main__":
    sys.exit(main())
