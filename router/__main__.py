"""`python -m router --listen HOST:PORT --directory HOST:PORT [--mode M] [--model M] [--http-listen HOST:PORT]`.

Flags override RouterConfig.from_env() (the PD_* variables declared in router/config.py);
a bad setting exits 2 with a one-line message.
Serves Router + Admin with health and reflection, and the HTTP front when asked, until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from router.config import MODES, RouterConfig
from router.requests.text import load_tokenizer
from router.server import serve
from runtime.common.grpc_server import setup_logging
from runtime.common.settings import SettingsError
from runtime.security.tls import Security
from runtime.telemetry import tracing


def parse_args(argv: list[str] | None = None) -> RouterConfig:
    """Command line (over the environment) -> RouterConfig."""
    ap = argparse.ArgumentParser(prog="python -m router", description=__doc__.splitlines()[0])
    ap.add_argument("--listen", help="gRPC listen address host:port (PD_ROUTER_LISTEN)")
    ap.add_argument("--directory", help="directory service host:port (PD_DIRECTORY_ADDR)")
    ap.add_argument("--mode", choices=MODES, help="default route for requests without a mode (PD_ROUTER_MODE)")
    ap.add_argument("--model", help="checkpoint directory (tokenizer.json) or preset name (PD_MODEL)")
    ap.add_argument("--http-listen", help="the OpenAI-compatible HTTPS front's host:port (PD_ROUTER_HTTP_LISTEN, "
                                          "default off)")
    ap.add_argument("--log-level", help="logging level (PD_LOG_LEVEL)")
    ap.add_argument("--metrics-listen", help="/metrics host:port (PD_METRICS_LISTEN, default off)")
    args = ap.parse_args(argv)
    try:
        return RouterConfig.from_env(listen_addr=args.listen, directory_addr=args.directory,
                                     default_mode=args.mode, model=args.model, log_level=args.log_level,
                                     metrics_listen=args.metrics_listen, http_listen=args.http_listen)
    except SettingsError as exc:  # one line, not a traceback
        print(f"router: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    config = parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging("router", config.log_level)
    try:
        security = Security.from_env("router")
    except SettingsError as exc:
        print(f"router: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    tracing.configure("router", "router", files=security.files, trust_baggage=False)
    tokenizer = load_tokenizer(config.model)
    try:
        asyncio.run(serve(config, security, tokenizer))
    except SettingsError as exc:  # a capability key missing or unreadable
        print(f"router: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
