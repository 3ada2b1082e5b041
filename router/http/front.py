"""The front built from the router's settings, and started beside its gRPC server."""

from __future__ import annotations

from router.config import RouterConfig
from router.requests.chat import ChatTemplate
from router.requests.orchestrator import Orchestrator
from runtime.common.settings import SettingsError
from runtime.security.tls import Security

from .app import Front, FrontConfig
from .keys import ApiKeys, KeyFileError
from .prompt import Prompts
from .server import HttpListener, start_http


def build_front(config: RouterConfig, orchestrator: Orchestrator, security: Security) -> Front:
    """The Front of `orchestrator` as `config` names it; SettingsError when its key file
    cannot be read (a router that would refuse every caller should not start)."""
    keys = None
    if security.secure and config.api_keys_file:
        try:
            keys = ApiKeys.load(config.api_keys_file)
        except KeyFileError as exc:
            raise SettingsError(f"PD_ROUTER_API_KEYS: {exc}") from None
    tokenizer = orchestrator.tokenizer
    template = ChatTemplate.load(config.model, tokenizer) if tokenizer is not None else None
    origins = tuple(o.strip() for o in config.http_cors_origins.split(",") if o.strip())
    front_config = FrontConfig(config.served_name(), config.http_max_body_bytes, secure=security.secure,
                               cors_origins=origins)
    return Front(orchestrator, front_config, Prompts(tokenizer, template), keys)


async def start_front(config: RouterConfig, orchestrator: Orchestrator, security: Security) -> HttpListener | None:
    """The front listening on config.http_listen (None when that is empty)."""
    if not config.http_listen:
        return None
    front = build_front(config, orchestrator, security)
    return await start_http(front.app, config.http_listen, security)
