"""How an attempt ends: the Prefill's reply settled, and on any failure or cancel the
directory's Abort first, then the workers' Cancel (docs/design.md, Failures). A mixin of
AttemptRunner."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from router.requests.attempt import Attempt
from router.requests.handoff import transfer_id
from router.types import WorkerCallError

log = logging.getLogger("router.requests.attempts")  # (its records keep their logger's name)


class AttemptTeardown:
    """Ending an attempt, whatever happened to it."""

    async def _settle_prefill(self, att: Attempt) -> None:
        """After a complete event, give a still-running Prefill call a moment to
        return (its reply can trail a short decode), then cancel it."""
        task = att.prefill_task
        if task is None or att.prefill_done:
            return
        await asyncio.wait({task}, timeout=self._cfg.cancel_timeout_s)
        if task.done():
            if task.result() is not None:  # its event was queued behind the complete event
                self._prefill_returned(att, task.result())
            return
        task.cancel()
        await self._quietly(self._workers.cancel_prefill(att.prefill, self.req.request_id, att.generation,
                                                         "request complete", self._cfg.cancel_timeout_s))

    async def _teardown(self, att: Attempt, reason: str) -> None:
        """Release everything `att` holds, in the contract's order; never raises."""
        rid, g, limit = self.req.request_id, att.generation, self._cfg.cancel_timeout_s
        if att.reserve_task is not None:  # the Reserve answered first: an Abort must not overtake it
            await asyncio.wait({att.reserve_task}, timeout=self._cfg.directory_timeout_s)
        if att.txn_open:
            await self._quietly(self._directory.abort_txn(rid, transfer_id(rid, g), g, reason, limit))
        calls = []
        if att.decode_engaged:
            calls.append(asyncio.create_task(self._quietly(
                self._workers.cancel_decode(att.decode, rid, g, reason, limit, discard_kv=att.discard_kv))))
        if att.stream_task is not None:
            att.stream_task.cancel()
        if att.prefill_engaged and att.prefill is not None:
            calls.append(asyncio.create_task(self._quietly(
                self._workers.cancel_prefill(att.prefill, rid, g, reason, limit))))
        if att.prefill_task is not None:
            att.prefill_task.cancel()
        await asyncio.gather(*calls)
        for task in (att.stream_task, att.prefill_task):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    async def _quietly(call: Coroutine[Any, Any, Any]) -> None:
        try:
            await call
        except WorkerCallError as exc:
            log.warning("teardown call failed: %s", exc)
        except Exception:
            log.exception("teardown call raised")
