"""The intake budget: how many bytes of Generate requests the router holds between
receipt and admission at once.

A request's bytes become a parsed message and then a prompt of Python ints before the
orchestrator admits or refuses it (awaiting the cluster snapshot on the way), and each
such step costs a multiple of the message. Requests charge their message's size here
for that stretch; one that would pass the budget is refused RESOURCE_EXHAUSTED at once,
before it is parsed (a retryable status: the same request may pass a moment later).
A request alone always fits, so no legal message is refused for its size alone.
"""

from __future__ import annotations

from router.types import StatusCode

from .refusal import Refusal

_MiB = 1 << 20


class IntakeBudget:
    """Bytes charged by requests between receipt and admission. The servicer runs on one
    event loop, so charges need no lock."""

    def __init__(self, limit_bytes: int, env_name: str = "PD_ROUTER_INTAKE_BYTES"):
        assert limit_bytes > 0
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._env_name = env_name

    def take(self, size_bytes: int) -> Refusal | None:
        """Charge `size_bytes`; a refusal (nothing charged) when that would pass the limit."""
        if self.held_bytes and self.held_bytes + size_bytes > self.limit_bytes:
            return Refusal(StatusCode.RESOURCE_EXHAUSTED,
                           f"the router's intake is full: it admits up to {self.limit_bytes / _MiB:.0f} MiB of "
                           f"requests at once ({self._env_name}) and this one's {size_bytes / _MiB:.1f} MiB "
                           "would pass that; send it again shortly")
        self.held_bytes += size_bytes
        return None

    def give_back(self, size_bytes: int) -> None:
        """Return what `take` charged."""
        self.held_bytes -= size_bytes
        assert self.held_bytes >= 0, "the intake budget gave back more than it charged"
