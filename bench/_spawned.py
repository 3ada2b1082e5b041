"""A spawned process that serves commands, and its parent's handle on it: the
plumbing bench/transfer.py's peers and the tests' worker processes share
(tests/support/spawned.py). Standard library only; not a benchmark.

The child imports `target` by name ("package.module" or "package.module:Class"),
takes the module, or an instance `Class(**init)`, as its command namespace, and
runs an asyncio loop that executes each command as its own task, so a command may
wait (for a transfer to land) while the parent sends the next one:

    parent                            child
    start(cmd, **kw) -> id     --->   (id, cmd, kw)
                                      value = namespace.cmd(**kw), awaited if a coroutine
    result(id, timeout_s)      <---   (id, True, value) | (id, False, traceback)
    close()                    --->   None: cancel running commands, then
                                      `await namespace.at_exit()` if it has one

One convention for every user: a command that raises comes back as RemoteError
carrying the child's traceback; no reply within the timeout (the handle's
`call_timeout_s` unless the call gives `timeout_s`) raises TimeoutError; close()
waits CLOSE_TIMEOUT_S for a clean exit, then kills. A plain (not async) command
runs on the child's loop and blocks it until it returns.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import itertools
import multiprocessing as mp
import os
import time
import traceback

from runtime.common.tasks import TaskSet

CLOSE_TIMEOUT_S = 10.0


class RemoteError(RuntimeError):
    """A command raised in the child; the message holds the child's traceback."""


class Spawned:
    """The parent's handle: `start` + `result`, or `call` for both."""

    def __init__(self, name: str, target: str, *, call_timeout_s: float = 60.0, **init):
        ctx = mp.get_context("spawn")
        self.name, self.call_timeout_s = name, call_timeout_s
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, target, init), name=name, daemon=True)
        self.proc.start()
        child.close()
        self._ids = itertools.count()
        self._sent: dict[int, str] = {}  # id -> command, for the messages
        self._replies: dict[int, tuple[bool, object]] = {}

    def start(self, cmd: str, **kwargs) -> int:
        """Send one command; its reply is collected by `result`."""
        i = next(self._ids)
        self._sent[i] = cmd
        self.conn.send((i, cmd, kwargs))
        return i

    def result(self, i: int, timeout_s: float | None = None):
        """The value of command `i` (replies to other commands are kept for theirs)."""
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        what = f"{self.name}.{self._sent[i]}"
        deadline = time.monotonic() + timeout_s
        while i not in self._replies:
            if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{what}: no reply in {timeout_s} s")
            j, ok, value = self.conn.recv()
            self._replies[j] = (ok, value)
        del self._sent[i]
        ok, value = self._replies.pop(i)
        if not ok:
            raise RemoteError(f"{what} failed:\n{value}")
        return value

    def call(self, cmd: str, timeout_s: float | None = None, **kwargs):
        """`start` then `result`: a blocking remote call."""
        return self.result(self.start(cmd, **kwargs), timeout_s)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()

    def close(self) -> int | None:
        """Ask the child to stop; kill it if it has not within CLOSE_TIMEOUT_S. Its exit code."""
        try:
            self.conn.send(None)
        except OSError:  # the child is gone already
            pass
        self.proc.join(CLOSE_TIMEOUT_S)
        if self.proc.is_alive():
            self.kill()
        return self.proc.exitcode


# ---- child side ---------------------------------------------------------------------


def _namespace(target: str, init: dict):
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)(**init) if attr else module


def _serve(conn, target: str, init: dict) -> None:
    asyncio.run(_serve_async(conn, _namespace(target, init)))


async def _serve_async(conn, namespace) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()

    def readable() -> None:
        try:
            inbox.put_nowait(conn.recv())
        except (EOFError, OSError):  # the parent is gone: stop as if told to
            loop.remove_reader(conn.fileno())
            inbox.put_nowait(None)

    async def run(i: int, cmd: str, kwargs: dict) -> None:
        try:
            value = getattr(namespace, cmd)(**kwargs)
            reply = (i, True, await value if inspect.isawaitable(value) else value)
        except Exception:  # noqa: BLE001 - reported to the parent, which decides
            reply = (i, False, traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:
            pass

    loop.add_reader(conn.fileno(), readable)
    tasks = TaskSet()
    while (msg := await inbox.get()) is not None:
        tasks.spawn(run(*msg))
    loop.remove_reader(conn.fileno())
    await tasks.cancel()
    if (at_exit := getattr(namespace, "at_exit", None)) is not None:
        await at_exit()
