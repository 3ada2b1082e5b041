"""The HTTP front over an in-process orchestrator (tests/support/orchestrator.py's FakeCluster),
served by the real uvicorn on loopback with HTTPS, on an event loop in a thread of its own
so that tests drive it with the official, blocking `openai` client."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from pathlib import Path

import openai
import pytest

from router.http.app import Front, FrontConfig
from router.http.keys import ApiKeys, append, create
from router.http.prompt import Prompts
from router.http.server import start_http
from router.requests.chat import ChatTemplate
from router.requests.orchestrator import Orchestrator
from router.requests.text import load_tokenizer
from tests.support import pki
from tests.support.orchestrator import FakeCluster, config, two_by_two

MODEL = "tiny"


class Served:
    """A front, its orchestrator and fake cluster, and the loop they run on."""

    def __init__(self, fake: FakeCluster, tmp: Path, secure: bool = True, cors: tuple[str, ...] = (), **cfg):
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.key, line = create("acme")
        self.other_key, other = create("globex")
        keys_file = tmp / "api-keys"
        append(keys_file, line)
        append(keys_file, other)
        tokenizer = load_tokenizer(MODEL)
        self.orch = Orchestrator(fake, fake, config(**cfg), tokenizer)
        security = pki.security("router", "router") if secure else pki.Security.insecure()
        front = Front(self.orch, FrontConfig(MODEL, 64 << 10, secure=secure, cors_origins=cors),
                      Prompts(tokenizer, ChatTemplate.load(MODEL, tokenizer)), ApiKeys.load(keys_file))
        self.listener = self.call(start_http(front.app, "127.0.0.1:0", security))
        self.url = f"{self.listener.scheme}://127.0.0.1:{self.listener.port}/v1"
        self.ca = str(pki.paths("router", "router")[2])
        self.tls = ssl.create_default_context(cafile=self.ca)

    def call(self, coro, timeout_s: float = 20.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def client(self, key: str | None = None, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key or self.key, max_retries=0,
                             http_client=openai.DefaultHttpxClient(verify=self.tls), **kw)

    def wait_idle(self, timeout_s: float = 5.0) -> None:
        """Until no request is in flight (a cancelled one tears down in the background)."""
        deadline = time.monotonic() + timeout_s
        while self.orch.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        self.call(self.orch.drain())

    def close(self) -> None:
        self.call(self.listener.close())
        self.call(self.orch.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture
def served(tmp_path):
    s = Served(two_by_two(), tmp_path)
    yield s
    s.close()
