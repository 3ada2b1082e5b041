"""A real headless Chromium for tests, driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: the browser reads commands from fd 3 and writes replies and
events to fd 4, each a JSON object ending in NUL). Standard library only: no
websocket client, no playwright download. `make install` puts the Debian `chromium`
package on the machine; without it, or if it will not start, open() raises
BrowserUnavailable with the fix, so a test fails (it does not skip).

    with Chromium.open() as browser:
        page = browser.load(Path("trace.html"))     # navigates, waits for the load event
        page.evaluate("document.title")
        page.errors                                  # console errors, uncaught exceptions, log errors
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "install it with `apt-get install -y chromium` (`make install` does)"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--mute-audio", "--remote-debugging-pipe")


class BrowserUnavailable(RuntimeError):
    """No Chromium on this machine, or it did not start or answer."""


def find_binary() -> str:
    """The Chromium executable: $PD_CHROMIUM, else the first of BINARIES on PATH."""
    explicit = os.environ.get("PD_CHROMIUM")
    if explicit:
        return explicit
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserUnavailable(f"no Chromium found (looked for {', '.join(BINARIES)} on PATH): {INSTALL_HINT}")


def _high_fd(fd: int) -> int:
    """A copy of fd numbered >= 10, so dup2 onto 3 and 4 in the child cannot clobber it."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


@dataclass
class Page:
    """One tab, attached with a flat session; `errors` collects what the page reported."""

    browser: Chromium
    session_id: str
    errors: list[str] = field(default_factory=list)
    loaded: threading.Event = field(default_factory=threading.Event)

    def send(self, method: str, params: dict | None = None, timeout_s: float = 30.0) -> dict:
        return self.browser.send(method, params, session_id=self.session_id, timeout_s=timeout_s)

    def evaluate(self, expression: str, timeout_s: float = 30.0):
        """The JSON value of a JS expression in the page; an exception there raises."""
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": True}, timeout_s)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def on_event(self, method: str, params: dict) -> None:
        if method == "Page.loadEventFired":
            self.loaded.set()
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console." + params["type"] + ": " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.errors.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            e = params["entry"]
            self.errors.append(f"log.{e.get('source')}: {e.get('text')} {e.get('url', '')}".rstrip())


class Chromium:
    """A headless Chromium process and its DevTools pipe; use as a context manager."""

    _GONE = {"error": {"message": "the browser closed its DevTools pipe"}}

    def __init__(self, binary: str, start_timeout_s: float = 60.0):
        self.binary = binary
        self.profile = tempfile.mkdtemp(prefix="pd-chromium-")
        self._ids = itertools.count(1)
        self._replies: dict[int, queue.Queue] = {}
        self._pages: dict[str, Page] = {}
        self._lock = threading.Lock()
        self._gone = False
        self.stderr_path = Path(self.profile) / "stderr.log"
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        to_child_r, from_child_w = _high_fd(to_child_r), _high_fd(from_child_w)

        # In the child, before exec: fd 3 reads commands, fd 4 writes replies (dup2 clears
        # close-on-exec; every other descriptor Python opened is close-on-exec, PEP 446).
        def plumb() -> None:
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        with open(self.stderr_path, "wb") as stderr:
            try:
                self.proc = subprocess.Popen(
                    [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                    stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, close_fds=False,
                    preexec_fn=plumb, start_new_session=True)
            except OSError as e:
                raise BrowserUnavailable(f"cannot run {binary}: {e}; {INSTALL_HINT}") from e
            finally:
                os.close(to_child_r)
                os.close(from_child_w)
        self._reader = threading.Thread(target=self._read, name="chromium-devtools", daemon=True)
        self._reader.start()
        try:
            version = self.send("Browser.getVersion", timeout_s=start_timeout_s)
        except (TimeoutError, BrowserUnavailable) as e:
            output = self._tail()
            self.close()
            raise BrowserUnavailable(f"{binary} did not answer on its DevTools pipe: {e}; "
                                     f"its output: {output or '(none)'}") from e
        self.version = version.get("product", "")

    @classmethod
    def open(cls, start_timeout_s: float = 60.0) -> Chromium:
        """Start the system Chromium headless; BrowserUnavailable (with the fix) if it cannot."""
        return cls(find_binary(), start_timeout_s)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tail(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(none)"

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_child, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    self._dispatch(json.loads(raw))
        with self._lock:  # the browser is gone: wake every waiter, and refuse new ones
            self._gone = True
            for q in self._replies.values():
                q.put(self._GONE)

    def _dispatch(self, message: dict) -> None:
        if "id" in message:
            with self._lock:
                q = self._replies.get(message["id"])
            if q is not None:
                q.put(message)
        elif message.get("sessionId") in self._pages:
            self._pages[message["sessionId"]].on_event(message.get("method", ""), message.get("params", {}))

    def send(self, method: str, params: dict | None = None, session_id: str | None = None,
             timeout_s: float = 30.0) -> dict:
        """One DevTools command; its result (an error reply raises BrowserUnavailable)."""
        call_id = next(self._ids)
        message = {"id": call_id, "method": method, "params": params or {}}
        if session_id:
            message["sessionId"] = session_id
        q: queue.Queue = queue.Queue()
        with self._lock:
            self._replies[call_id] = q
            if self._gone:
                q.put(self._GONE)
        try:
            os.write(self._to_child, json.dumps(message).encode() + b"\0")
            reply = q.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no reply to {method} in {timeout_s} s") from None
        except BrokenPipeError:
            raise BrowserUnavailable(f"the browser exited (rc {self.proc.poll()})") from None
        finally:
            with self._lock:
                self._replies.pop(call_id, None)
        if "error" in reply:
            raise BrowserUnavailable(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def new_page(self) -> Page:
        """A fresh tab with Page, Runtime and Log events on."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        self._pages[session] = page
        for domain in ("Page", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        return page

    def load(self, path: Path, timeout_s: float = 30.0) -> Page:
        """A new tab showing the file, after its load event (and a beat for late errors)."""
        page = self.new_page()
        reply = page.send("Page.navigate", {"url": path.resolve().as_uri()})
        if reply.get("errorText"):
            raise AssertionError(f"navigating to {path}: {reply['errorText']}")
        if not page.loaded.wait(timeout_s):
            raise TimeoutError(f"{path} did not finish loading in {timeout_s} s")
        page.evaluate("new Promise(r => setTimeout(r, 50))")  # let queued console events arrive
        return page

    def close(self) -> None:
        """Ask the browser to quit, then make sure; remove the profile."""
        if self.proc.poll() is None:
            try:
                os.write(self._to_child, json.dumps({"id": next(self._ids), "method": "Browser.close"}).encode()
                         + b"\0")
            except OSError:
                pass
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        try:
            os.close(self._to_child)
        except OSError:
            pass
        shutil.rmtree(self.profile, ignore_errors=True)
