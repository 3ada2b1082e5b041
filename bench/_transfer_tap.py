"""A pass-through gRPC proxy in front of a prefill worker that keeps its PrefillTimings.

The router reads PrefillResult but does not pass `timings` (queue/compute/
transfer/total ms, measured inside the prefill worker) on to clients. The
benchmark registers the worker under this proxy's address (PD_ADVERTISE), so
the router's Prefill and Cancel calls pass through here unchanged (raw bytes,
deadline and metadata forwarded) and each Prefill result's timings are recorded.
"""

from __future__ import annotations

from concurrent import futures

import grpc

from pdserve_client.rpc.pd.v1 import prefill_pb2
from runtime.security.tls import Security

PREFILL_METHOD = "/pd.v1.Prefill/Prefill"


class PrefillTap(grpc.GenericRpcHandler):
    """Forwards every call to `target` (Prefill's requests as they come); records Prefill
    timings in `timings`."""

    def __init__(self, server: Security | None = None, caller: Security | None = None):
        """server: the certificate the tap answers with (a prefill worker's: the router
        checks it); caller: the one it forwards with (the router's: only it calls a worker)."""
        self.target = ""
        self.timings: list[dict] = []
        self._caller = caller or Security.insecure()
        self._channel: grpc.Channel | None = None
        self._server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[self])
        creds = (server or Security.insecure()).server_credentials()
        port = self._server.add_secure_port("127.0.0.1:0", creds) if creds is not None else \
            self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self._server.start()

    def connect(self, target: str) -> None:
        """Forward to the prefill worker at `target` from now on."""
        self.target = target
        self._channel = self._caller.channel(target, "prefill")

    def service(self, details):
        method = details.method

        def forward(request, context) -> bytes:
            """`request`: the bytes of a unary call."""
            try:
                return self._channel.unary_unary(method)(request, timeout=context.time_remaining(),
                                                         metadata=context.invocation_metadata())
            except grpc.RpcError as e:
                context.abort(e.code(), e.details() or "")

        def forward_prefill(requests, context):
            """Prefill's requests as they come (the job, then its grant), its events as they
            come (token 0, then the result, whose timings are kept)."""
            call = self._channel.stream_stream(method)(requests, timeout=context.time_remaining(),
                                                        metadata=context.invocation_metadata())
            try:
                for response in call:
                    event = prefill_pb2.PrefillEvent.FromString(response)
                    if event.HasField("result"):
                        t = event.result.timings
                        self.timings.append(dict(queue_ms=t.queue_ms, compute_ms=t.compute_ms,
                                                 transfer_ms=t.transfer_ms, total_ms=t.total_ms))
                    yield response
            except grpc.RpcError as e:
                context.abort(e.code(), e.details() or "")

        if method == PREFILL_METHOD:
            return grpc.stream_stream_rpc_method_handler(forward_prefill)
        return grpc.unary_unary_rpc_method_handler(forward)

    def close(self) -> None:
        self._server.stop(grace=None)
        if self._channel is not None:
            self._channel.close()
