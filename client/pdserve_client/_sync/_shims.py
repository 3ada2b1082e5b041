"""The blocking twin of `_async/_shims.py`: the same names and signatures over blocking grpc.

Written by hand (unasync does not touch it); `_sync/client.py`, generated from
`_async/client.py`, imports it where the async source imports its twin.
"""

from __future__ import annotations

import grpc

from pdserve_client import tls, wire
from pdserve_client.rpc.pd.v1 import admin_pb2_grpc, router_pb2, router_pb2_grpc

GenerateCall = grpc.Call
"""An open Router.Generate call (blocking grpc's is also an iterator of GenerateEvent)."""


class RouterChannel:
    """The channel to the router and its two stubs, opened at once.

    Unlike the asyncio one it does not wait for first use: a blocking client is
    shared by threads (a ThreadPoolExecutor of generate calls), and opening in
    the constructor leaves no first-use race between them.
    """

    def __init__(self, address: str, files: tls.TlsFiles | None):
        self.address = address
        self._channel = tls.channel(address, files, "router", wire.CHANNEL_OPTIONS)
        self._stubs = (router_pb2_grpc.RouterStub(self._channel), admin_pb2_grpc.AdminStub(self._channel))

    def stubs(self) -> tuple[router_pb2_grpc.RouterStub, admin_pb2_grpc.AdminStub]:
        """(Router, Admin) stubs on the channel."""
        return self._stubs

    def close(self) -> None:
        """Close the channel; its open calls are cancelled and later calls fail."""
        self._channel.close()


def next_event(call: GenerateCall) -> router_pb2.GenerateEvent | None:
    """The call's next event, or None once the server ended the stream; raises grpc.RpcError."""
    try:
        return next(call)
    except StopIteration:
        return None


class StreamClosing:
    """Nothing to add: a blocking stream's `close()` is its only spelling."""
