"""What the asyncio client does that a rename cannot turn into the blocking client.

`_async/client.py` is written once and unasync derives `_sync/client.py` from it
(dropping async/await, renaming Async* names and `_async` to `_sync`). The few
places where grpc.aio and blocking grpc differ in more than spelling live here,
and `_sync/_shims.py` defines the same names with the same signatures:

- `RouterChannel`: grpc.aio binds a channel to the event loop that creates it,
  so the channel opens on first use, inside the running loop (the client can be
  built outside it, before `asyncio.run`). The blocking one opens at once.
- `next_event`: an aio call is read with `read()`, which returns `EOF` at the
  end; a blocking call is an iterator that raises StopIteration.
- `StreamClosing`: async streams also answer `aclose()`, as async generators do.
"""

from __future__ import annotations

import grpc.aio

from pdserve_client import tls, wire
from pdserve_client.rpc.pd.v1 import admin_pb2_grpc, router_pb2, router_pb2_grpc

GenerateCall = grpc.aio.UnaryStreamCall
"""An open Router.Generate call."""


class RouterChannel:
    """The channel to the router and its two stubs, opened by the first `stubs()`."""

    def __init__(self, address: str, files: tls.TlsFiles | None):
        self.address = address
        self._files = files
        self._channel: grpc.aio.Channel | None = None
        self._stubs: tuple[router_pb2_grpc.RouterStub, admin_pb2_grpc.AdminStub] | None = None

    def stubs(self) -> tuple[router_pb2_grpc.RouterStub, admin_pb2_grpc.AdminStub]:
        """(Router, Admin) stubs on the channel, opening it if needed."""
        if self._channel is None:
            self._channel = tls.aio_channel(self.address, self._files, "router", wire.CHANNEL_OPTIONS)
            self._stubs = (router_pb2_grpc.RouterStub(self._channel), admin_pb2_grpc.AdminStub(self._channel))
        return self._stubs

    async def close(self) -> None:
        """Close the channel (its open calls are cancelled); a later `stubs()` opens a new one."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


async def next_event(call: GenerateCall) -> router_pb2.GenerateEvent | None:
    """The call's next event, or None once the server ended the stream; raises grpc.RpcError."""
    event = await call.read()
    return None if event is grpc.aio.EOF else event


class StreamClosing:
    """`aclose()` for a token stream whose `close()` cancels its call."""

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Async spelling of `close` (matches async generators)."""
        self.close()
