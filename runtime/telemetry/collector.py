"""A small local OTLP trace collector, so traces work with no extra setup: `pdserve up`
starts it and points every process at it. It accepts OTLP/gRPC exports and appends each
span as one JSON line (fields below) to a file under the state dir (SPANS_FILE in
pdserve_client/spans.py); `pdctl trace` reads that file.

    python -m runtime.telemetry.collector --listen 127.0.0.1:0 --out spans.jsonl

Its port is like every other: mutual TLS with a `collector` certificate, and only
pdserve's services (router, directory, workers) may export — a client could otherwise
write spans into another tenant's trace. PD_INSECURE=1 turns that off with the rest.
It runs at the span export threads' nice value (tracing.EXPORT_NICE): on the cores it
shares with the cluster it is on no request's path.

One line per span: trace_id, span_id, parent_id ('' for a root; hex), name, service
(service.name), instance (service.instance.id), start_ns, end_ns, status (0 unset,
1 ok, 2 error), status_message, attributes {}, events [{name, t_ns, attributes}].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from pathlib import Path

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from runtime.common.grpc_server import setup_logging, start_server, wait_for_shutdown
from runtime.common.private_files import private_open
from runtime.security.tls import Security, access_table
from runtime.telemetry.tracing import EXPORT_NICE

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
EXPORTERS = frozenset({"router", "directory", "prefill", "decode", "mixed"})
ACCESS = access_table(SERVICE, {"Export": EXPORTERS})
"""Who may export spans: pdserve's own services."""


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else str(v)


def _attributes(attrs) -> dict:
    return {a.key: _value(a.value) for a in attrs}


def span_lines(request: trace_service_pb2.ExportTraceServiceRequest) -> list[str]:
    """Every span of an export request as a JSON line (see the module docstring)."""
    lines = []
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                lines.append(json.dumps({
                    "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                    "parent_id": s.parent_span_id.hex(), "name": s.name,
                    "service": resource.get("service.name", ""),
                    "instance": resource.get("service.instance.id", ""),
                    "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                    "status": s.status.code, "status_message": s.status.message,
                    "attributes": _attributes(s.attributes),
                    "events": [{"name": e.name, "t_ns": e.time_unix_nano, "attributes": _attributes(e.attributes)}
                               for e in s.events],
                }))
    return lines


class SpanFile(trace_service_pb2_grpc.TraceServiceServicer):
    """Appends every exported span to `path` as a JSON line (one write per export, so a
    reader never sees half a batch's line). The file is its owner's alone (0600, a folder
    it makes 0700): spans name every tenant's request ids, transfer ids and digests, which
    /metrics shows only to the operator and monitor roles."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.spans = 0

    async def Export(self, request, context):
        lines = span_lines(request)
        if lines:
            with private_open(self.path, "a") as f:
                f.write("".join(line + "\n" for line in lines))
            self.spans += len(lines)
        return trace_service_pb2.ExportTraceServiceResponse()


async def start(listen: str, out: str | Path, security: Security | None = None):
    """A running collector on `listen` writing to `out`: (server, port, health)."""
    security = security or Security.insecure()
    return await start_server(listen, [(trace_service_pb2_grpc.add_TraceServiceServicer_to_server,
                                        SpanFile(out), SERVICE)], security, ACCESS)


def read(path: str | Path) -> list[dict]:
    """Every span recorded in `path` (none if the file does not exist yet)."""
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line] if p.exists() else []


async def _serve(listen: str, out: str) -> None:
    server, port, health = await start(listen, out, Security.from_env("collector"))
    log.info("collector listening on port %d, writing %s", port, out)
    await wait_for_shutdown(server, health)


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve until SIGTERM/SIGINT."""
    p = argparse.ArgumentParser(prog="python -m runtime.telemetry.collector", description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:4317", help="host:port (port 0 = any)")
    p.add_argument("--out", required=True, help="the JSON-lines file spans are appended to")
    args = p.parse_args(argv)
    setup_logging("collector")
    if EXPORT_NICE:
        os.nice(EXPORT_NICE)  # every thread it starts from here on inherits it
    try:
        asyncio.run(_serve(args.listen, args.out))
    except ValueError as exc:  # no certificates and not PD_INSECURE
        print(f"collector: bad configuration: {exc}", flush=True)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
