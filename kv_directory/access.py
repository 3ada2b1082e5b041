"""Who may call the directory, the identity checks its servicer makes (docs/design.md,
Security), and how its refusals become statuses (`rpc`).

`ACCESS` lets a method through for the certificate roles it names
(runtime/security/tls.py `Access`); the servicer then binds the call to the caller:
a worker acts only under the id its certificate names (`as_worker`), and only a
transaction's two ends move it (kv_directory/server.py `_transition`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import grpc

from pdserve_client.rpc.pd.v1 import directory_pb2
from runtime.directory.records import DirectoryUnavailable
from runtime.directory.wire import BadRequest
from runtime.security.pki import Identity
from runtime.security.tls import WORKERS, access_table, caller

SERVICE_NAME = directory_pb2.DESCRIPTOR.services_by_name["Directory"].full_name

_CONTROL = frozenset({"router", "operator"})
ACCESS = access_table(SERVICE_NAME, {
    # A worker registers, renews and leaves only under the id its certificate names (the servicer checks).
    "RegisterWorker": WORKERS, "Heartbeat": WORKERS, "DeregisterWorker": WORKERS,
    # Only the router creates a transaction; only its two ends move it (the servicer checks),
    # and the router may abort it too.
    "Reserve": {"router"}, "Begin": WORKERS, "Validated": WORKERS, "Publish": WORKERS,
    "Release": WORKERS, "Abort": WORKERS | {"router"},
    "Lookup": WORKERS | _CONTROL, "ClusterSnapshot": _CONTROL, "ListOpenTransactions": _CONTROL,
    "GetRouteEpoch": WORKERS | _CONTROL, "AdvanceRouteEpoch": _CONTROL,
    # The destination consumes the nonce of the capability it was shown (the servicer checks).
    "ConsumeNonce": frozenset({"decode", "mixed"}),
    # Every router follows the release; only a router moves it (Admin is the operator's way in).
    "GetRelease": WORKERS | _CONTROL, "WriteRelease": {"router"},
})
"""Who may call what (runtime/security/tls.py `Access`); finer checks in the servicer."""

log = logging.getLogger(__name__)

WORKER_ROLE_OF_CERT = {"prefill": "prefill", "decode": "decode", "mixed": "mixed"}
"""Certificate role -> the WorkerRole value a worker holding it may register as."""


class Denied(Exception):
    """The caller's identity does not allow this call (PERMISSION_DENIED, the message says why)."""


def as_worker(context, secure: bool, worker_id: str) -> Identity | None:
    """The caller, who must be the worker `worker_id` (by certificate); None when insecure."""
    if not secure:
        return None
    identity = caller(context)
    if identity is None or identity.role not in WORKERS or identity.name != worker_id:
        raise Denied(f"caller {identity} may not act as worker {worker_id!r}")
    return identity


def rpc(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A servicer method whose BadRequest is INVALID_ARGUMENT, Denied PERMISSION_DENIED and
    DirectoryUnavailable UNAVAILABLE."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Denied as exc:
            log.warning("%s refused: %s", handler.__name__, exc)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except DirectoryUnavailable as exc:
            log.warning("%s: store unavailable: %s", handler.__name__, exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"directory store unavailable: {exc}")

    return wrapper
