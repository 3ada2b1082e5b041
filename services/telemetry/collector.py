"""A small local OTLP trace collector (issue 18; work in progress): `pdserve up` will
start it so traces work with no extra setup. It accepts OTLP/gRPC exports and appends
each span as one JSON line (trace and span ids in hex, parent, name, service, start and
end in ns, attributes) to a file under the state dir; `pdctl trace` reads that file.

    python -m services.telemetry.collector --listen 127.0.0.1:0 --out spans.jsonl
"""

from __future__ import annotations

import json
import threading
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else str(v)


class SpanFile(trace_service_pb2_grpc.TraceServiceServicer):
    """Appends every exported span to `path` as a JSON line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def Export(self, request, context):
        lines = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                        "parent_id": s.parent_span_id.hex(), "name": s.name,
                        "service": resource.get("service.name", ""),
                        "instance": resource.get("service.instance.id", ""),
                        "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                        "status": s.status.code, "attributes": {a.key: _value(a.value) for a in s.attributes},
                        "events": [{"name": e.name, "t_ns": e.time_unix_nano,
                                    "attributes": {a.key: _value(a.value) for a in e.attributes}} for e in s.events],
                    }))
        with self._lock, self.path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
        return trace_service_pb2.ExportTraceServiceResponse()


def start(listen: str, out: str | Path, credentials: grpc.ServerCredentials | None = None) -> tuple[grpc.Server, int]:
    """A running collector on `listen` writing to `out`; (server, port). TODO(issue 18):
    mutual TLS and the access table like every other port (credentials given here)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(SpanFile(out), server)
    port = server.add_secure_port(listen, credentials) if credentials else server.add_insecure_port(listen)
    server.start()
    return server, port


def read(path: str | Path) -> list[dict]:
    """Every span recorded in `path` (none if the file does not exist yet)."""
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line] if p.exists() else []
