"""pdserve client SDK: `Client` (blocking), `AsyncClient` (asyncio) and the `pdctl` CLI.

Modules: `types` (returned values and PdError), `wire` (pd.v1 encoding and
error mapping), `stream` (event folding and client-side TTFT/TPOT),
`client` / `aio` (the two clients), `address` (where the router is), `cli`.
"""

from services.sdk.address import resolve_router_address
from services.sdk.aio import AsyncClient, AsyncTokenStream
from services.sdk.client import Client, TokenStream
from services.sdk.types import (
    ClusterStatus,
    GenerationResult,
    ModeChange,
    PdError,
    RouteInfo,
    TokenEvent,
    TransactionInfo,
    WorkerStatus,
)

__all__ = [
    "AsyncClient", "AsyncTokenStream", "Client", "ClusterStatus", "GenerationResult", "ModeChange", "PdError",
    "RouteInfo", "TokenEvent", "TokenStream", "TransactionInfo", "WorkerStatus", "resolve_router_address",
]
