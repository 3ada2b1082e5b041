"""pdserve client SDK: `Client` (blocking), `AsyncClient` (asyncio) and the `pdctl` CLI.

Modules: `options` (GenerateOptions, the options of a generation), `types`
(returned values and PdError), `wire` (pd.v1 encoding and error mapping),
`stream` (event folding and client-side TTFT/TPOT), `client` / `aio` (the two
clients, one source: `_async/client.py`, from which `_sync/client.py` is
generated), `address` (where the router is), `cli`.
"""

from pdserve_client.address import resolve_router_address
from pdserve_client.aio import AsyncClient, AsyncTokenStream
from pdserve_client.client import Client, TokenStream
from pdserve_client.options import GenerateOptions
from pdserve_client.types import (
    ClusterStatus,
    GenerationResult,
    InvalidArgumentError,
    ModeChange,
    PdError,
    RouteInfo,
    TokenEvent,
    TokenLogprobs,
    TransactionInfo,
    WorkerStatus,
)

__all__ = [
    "AsyncClient", "AsyncTokenStream", "Client", "ClusterStatus", "GenerateOptions", "GenerationResult",
    "InvalidArgumentError", "ModeChange", "PdError", "RouteInfo", "TokenEvent", "TokenLogprobs", "TokenStream",
    "TransactionInfo", "WorkerStatus", "resolve_router_address",
]
