"""Generate's intake: a request's wire bytes checked before they become Python objects.

    wire bytes -> sizes (wire.py): request id, tenant, prompt length    INVALID_ARGUMENT
               -> the intake budget (budget.py)                        RESOURCE_EXHAUSTED
               -> parsed -> the caller's tenant                        INVALID_ARGUMENT, PERMISSION_DENIED
               -> GenerateParams, for the orchestrator's admission      (its own refusals)

The servicer registers Generate without a deserializer (`add_router_servicer`), so the
bytes reach `Intake.read` as they came. A prompt of token ids costs ~40 bytes an id once
the ids are Python ints, against 1-3 on the wire: a 7.4 MB prompt longer than any
worker takes raised the router's peak RSS by 25x the message to refuse it, and kept
it all. Read here, the same refusal costs what gRPC's own copies of the message do
(~3.5x it at the peak), given back once the call is over (heap.py). Refusals are
values (refusal.py), so no traceback keeps the frames that hold the bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from pdserve_client import contract
from pdserve_client.rpc.pd.v1 import common_pb2, router_pb2
from router import convert
from router.requests.admission import known_max_model_len
from router.types import GenerateParams, RouterError, StatusCode

from . import wire
from .budget import IntakeBudget
from .refusal import Refusal, quote, too_long

SERVICE = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name
GENERATE = f"/{SERVICE}/Generate"


class Intake:
    """Reads Generate requests for one router: `view` is its ClusterView (the prompt limit
    comes from the workers' max_model_len), `budget` bounds the bytes read at once."""

    def __init__(self, view, budget: IntakeBudget):
        self._view = view
        self.budget = budget

    @contextlib.asynccontextmanager
    async def read(self, data: bytes, caller_tenant: str | None,
                   left_s: float | None) -> AsyncIterator[GenerateParams | Refusal]:
        """The request in `data` as GenerateParams, or its refusal. Its bytes stay charged to
        the budget until the block ends: the caller submits the request inside it.
        `caller_tenant`: the tenant its certificate names (None: insecure); `left_s`: the
        call's gRPC deadline, the tighter budget when it is."""
        sizes = wire.sizes(data)
        refusal = None if sizes is None else await self._check(sizes)
        if refusal is None:
            refusal = self.budget.take(len(data))
        if refusal is not None:
            yield refusal
            return
        try:
            yield await self._parsed(data, sizes is None, caller_tenant, left_s)
        finally:
            self.budget.give_back(len(data))

    async def _check(self, sizes: wire.RequestSizes) -> Refusal | None:
        """The checks that need only the request's sizes."""
        for field, size, limit in (("request_id", sizes.request_id_bytes, contract.MAX_REQUEST_ID_BYTES),
                                   ("tenant", sizes.tenant_bytes, contract.MAX_TENANT_BYTES)):
            if size > limit:
                return too_long(field, size, limit)
        if sizes.prompt_tokens is None:
            return None
        try:
            limit = await known_max_model_len(self._view)
        except RouterError as exc:
            return Refusal.of(exc)
        if limit is not None and sizes.prompt_tokens > limit:
            return Refusal(StatusCode.INVALID_ARGUMENT,
                           f"prompt is {sizes.prompt_tokens} tokens; no worker takes more than {limit} "
                           "(its max_model_len, prompt and generated tokens together)")
        return None

    async def _parsed(self, data: bytes, check_sizes: bool, caller_tenant: str | None,
                      left_s: float | None) -> GenerateParams | Refusal:
        """The request parsed, its sizes checked now when the wire reading could not."""
        try:
            request = router_pb2.GenerateRequest.FromString(data)
        except DecodeError as exc:
            return Refusal(StatusCode.INVALID_ARGUMENT,
                           f"{GENERATE}: the request is not a valid protobuf message of its type "
                           f"({type(exc).__name__}: {exc})")
        refusal = await self._check(sizes_of(request)) if check_sizes else None
        if refusal is not None:
            return refusal
        if caller_tenant is not None and request.tenant and request.tenant != caller_tenant:
            return Refusal(StatusCode.PERMISSION_DENIED, f"tenant {quote(request.tenant)} is not the caller's "
                                                         f"({quote(caller_tenant)}, from its certificate)")
        try:
            params = convert.generate_params_from_pb(request)
        except RouterError as exc:
            return Refusal.of(exc)
        if caller_tenant is not None:
            params = dataclasses.replace(params, tenant=caller_tenant)
        if left_s is not None and (not params.deadline_ms or left_s * 1000 < params.deadline_ms):
            # The client's own gRPC deadline is the tighter budget: size worker calls by it.
            params = dataclasses.replace(params, deadline_ms=max(1, int(left_s * 1000)))
        return params


def sizes_of(request: router_pb2.GenerateRequest) -> wire.RequestSizes:
    """The sizes of a parsed request (one the wire reading left to the parser)."""
    tokens = len(request.prompt_token_ids.ids) if request.WhichOneof("prompt") == "prompt_token_ids" else None
    return wire.RequestSizes(len(request.request_id.encode()), len(request.tenant.encode()), tokens)


def add_router_servicer(servicer, server: grpc.aio.Server) -> None:
    """router_pb2_grpc.add_RouterServicer_to_server, but Generate gets its request's bytes
    unparsed (`Intake.read` reads them)."""
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate, request_deserializer=None,
            response_serializer=router_pb2.GenerateEvent.SerializeToString),
        "Cancel": grpc.unary_unary_rpc_method_handler(
            servicer.Cancel, request_deserializer=common_pb2.CancelRequest.FromString,
            response_serializer=common_pb2.CancelResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
