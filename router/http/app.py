"""The front's routes (a Starlette app) and what every request passes before it generates:
its size, its key, its body, its model, its prompt."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pdserve_client import contract
from router.requests.admission import known_max_model_len
from router.requests.orchestrator import Orchestrator
from router.types import GenerateParams, Mode, RouterError, Sampling, Slo
from runtime.telemetry import tracing

from . import schema
from .errors import ApiError, bad_request
from .generation import Generation, Job
from .keys import ApiKeys
from .logprobs import LogprobsFormat
from .prompt import Prompts
from .reply import Shape

log = logging.getLogger(__name__)


@dataclasses.dataclass
class FrontConfig:
    """What the front serves, as the router's settings name it."""

    model_name: str
    """The name clients pass as `model` (and /v1/models lists)."""
    max_body_bytes: int
    secure: bool = True
    """Keys required (False: PD_INSECURE, every caller is let in, as on the gRPC front)."""
    cors_origins: tuple[str, ...] = ()
    """Origins browsers may call from (Starlette's CORSMiddleware); none: no CORS."""


def _json(obj, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(obj), status, headers, media_type="application/json")


def _error(err: ApiError) -> Response:
    return Response(err.body(), err.status, err.headers(), media_type="application/json")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no such path, a method the path does not take) in OpenAI's shape."""
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return _error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind))


class Front:
    """The HTTP front of one router over its orchestrator."""

    def __init__(self, orchestrator: Orchestrator, config: FrontConfig, prompts: Prompts,
                 keys: ApiKeys | None = None):
        self.orch = orchestrator
        self.config = config
        self.prompts = prompts
        self.keys = keys
        self.started = int(time.time())
        self._routes = Starlette(routes=[
            Route("/v1/completions", self._guard(self.completions), methods=["POST"]),
            Route("/v1/chat/completions", self._guard(self.chat), methods=["POST"]),
            Route("/v1/models", self._guard(self.models), methods=["GET"]),
            Route("/v1/models/{model:path}", self._guard(self.model), methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
        ], exception_handlers={HTTPException: _http_error}, middleware=[
            Middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                       allow_headers=["authorization", "content-type", "x-request-id", "traceparent"],
                       expose_headers=["x-request-id", "x-pdserve-route", "x-pdserve-ttft-ms", "retry-after"]),
        ] if config.cors_origins else [])
        self._counted = orchestrator.metrics.http_responses
        self._paths = frozenset(r.path for r in self._routes.routes)

    async def app(self, scope, receive, send) -> None:
        """The ASGI app: the routes, each response counted by endpoint and status."""
        if scope["type"] != "http":
            return await self._routes(scope, receive, send)
        endpoint = scope["path"] if scope["path"] in self._paths else "other"
        status = "499"

        async def counting(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self._routes(scope, receive, counting)
        finally:
            self._counted.labels(endpoint, status).inc()

    @staticmethod
    def _guard(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request):
            try:
                return await handler(request)
            except ApiError as err:
                return _error(err)
            except Exception:  # a bug: this request gets a 500, the router goes on
                log.exception("%s %s failed", request.method, request.url.path)
                return _error(ApiError(500, "internal error in the router's HTTP front (logged)", "internal_error"))
        return endpoint

    # ---- the checks ---------------------------------------------------------------
    def tenant(self, request: Request) -> str | None:
        """The tenant the request's key names; None without security (the body may name one)."""
        if not self.config.secure:
            return None
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "no API key: send the header 'Authorization: Bearer <key>' "
                                "(`pdserve api-key create TENANT` makes one)", "authentication_error")
        tenant = self.keys.tenant_of(key.strip()) if self.keys is not None else None
        if tenant is None:
            why = "" if self.keys is not None and len(self.keys) else \
                " (this router has no API keys: set PD_ROUTER_API_KEYS to a key file)"
            raise ApiError(401, "the API key is not valid" + why, "authentication_error")
        return tenant

    async def body(self, request: Request) -> bytes:
        """The request's body, refused 413 past the limit before it is all read."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the body is {declared} bytes; at most {limit}", code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the body is over {limit} bytes", code="body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.config.model_name:
            raise ApiError(404, f"model {model[:128]!r} is not served here; this router serves "
                                f"{self.config.model_name!r} (GET /v1/models)", "not_found_error", "model",
                           "model_not_found")

    async def limit_tokens(self) -> int | None:
        """The most tokens a request may hold, prompt and output (None: no worker says)."""
        try:
            return await known_max_model_len(self.orch.view)
        except RouterError:
            return None

    # ---- the routes --------------------------------------------------------------
    async def completions(self, request: Request) -> Response | Generation:
        tenant = self.tenant(request)
        req = schema.parse(schema.CompletionRequest, await self.body(request))
        self.check_model(req.model)
        prompt, echo = self.prompts.completion(req)
        return await self._generation(request, req, tenant, prompt, req.max_tokens, chat=False, echo=echo)

    async def chat(self, request: Request) -> Response | Generation:
        tenant = self.tenant(request)
        req = schema.parse(schema.ChatRequest, await self.body(request))
        self.check_model(req.model)
        prompt = self.prompts.chat(req)
        return await self._generation(request, req, tenant, prompt, req.token_budget, chat=True)

    async def _generation(self, request: Request, req: schema.Common, tenant: str | None,
                          prompt: tuple[int, ...], max_tokens: int | None, chat: bool, echo: str = "") -> Generation:
        limit = await self.limit_tokens()
        if limit is not None and len(prompt) >= limit:
            raise ApiError(413, f"the prompt is {len(prompt)} tokens; this model holds at most {limit} "
                                "(prompt and output together)", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
        if max_tokens is None:  # as many as fit
            fit = self.orch.config.max_tokens_limit
            max_tokens = min(fit, limit - len(prompt)) if limit is not None else fit
        params = self.params(request, req, tenant, prompt, max_tokens)
        shape = Shape.of(chat, params.request_id, self.config.model_name, req.include_usage)
        parent = tracing.extract(request.headers)
        fmt = LogprobsFormat(self.prompts.tokenizer, chat) if params.sampling.logprobs is not None else None
        return Generation(self.orch, Job(params, shape, req.stream, req.stop_strings, echo, parent, fmt))

    def params(self, request: Request, req: schema.Common, tenant: str | None, prompt: tuple[int, ...],
               max_tokens: int) -> GenerateParams:
        """The request as the orchestrator takes it (the gRPC front's GenerateParams)."""
        if tenant is not None and req.tenant is not None and req.tenant != tenant:
            raise ApiError(403, f"tenant {req.tenant[:64]!r} is not the API key's", "permission_error", "tenant")
        request_id = req.request_id or request.headers.get("x-request-id") or uuid.uuid4().hex
        if len(request_id.encode()) > contract.MAX_REQUEST_ID_BYTES:
            raise bad_request(f"request id is {len(request_id.encode())} bytes; at most "
                              f"{contract.MAX_REQUEST_ID_BYTES}", "request_id")
        sampling = Sampling(req.temperature, req.top_k, req.top_p, req.seed, ignore_eos=req.ignore_eos,
                            logprobs=req.logprobs_asked)
        return GenerateParams(request_id=request_id, tenant=tenant if tenant is not None else req.tenant or "",
                              prompt_token_ids=prompt, max_tokens=max_tokens, sampling=sampling,
                              mode=Mode[req.mode.upper()] if req.mode else Mode.UNSPECIFIED,
                              deadline_ms=req.deadline_ms, slo=Slo(req.slo_ttft_ms, req.slo_tpot_ms),
                              priority=req.priority)

    async def models(self, request: Request) -> Response:
        self.tenant(request)
        return _json({"object": "list", "data": [await self._model_card()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{model}: the served model's card, 404 for any other."""
        self.tenant(request)
        self.check_model(request.path_params["model"])
        return _json(await self._model_card())

    async def _model_card(self) -> dict:
        """The served model as OpenAI lists one, with its length and the workers' cache ABI digests."""
        cluster = self.orch.view.last
        digests = sorted({w.cache_abi_digest for w in cluster.workers if w.cache_abi_digest}) if cluster else []
        return {"id": self.config.model_name, "object": "model", "created": self.started, "owned_by": "pdserve",
                "max_model_len": await self.limit_tokens(), "cache_abi_digests": digests}

    async def health(self, request: Request) -> Response:
        """Liveness: the router's loop answers."""
        return _json({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        """Readiness: the directory answered and a decode-capable worker is registered."""
        try:
            cluster = await self.orch.view.get()
        except RouterError as exc:
            return _json({"status": "not ready", "reason": exc.message}, 503)
        decoders = sum(1 for w in cluster.workers if w.can_decode)
        if not decoders:
            return _json({"status": "not ready", "reason": "no decode-capable worker is registered"}, 503)
        return _json({"status": "ready", "workers": len(cluster.workers), "decode_workers": decoders})
