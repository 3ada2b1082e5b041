"""One checked transition function for the lifecycles kept as Enums outside the
directory (the router's attempt, the decode reservation, the prefill task): a
table of legal moves, and a move that raises on anything else (a bug) and then
changes nothing. The directory's own table is runtime/directory/states.py (it is
rendered into Lua, so it keeps its own shape)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Generic, TypeVar

S = TypeVar("S", bound=enum.Enum)


class Moves(Generic[S]):
    """The legal moves of one lifecycle: state -> the states it may move to."""

    def __init__(self, moves: Mapping[S, Iterable[S]]):
        self._next = {state: frozenset(to) for state, to in moves.items()}

    def allows(self, current: S, to: S) -> bool:
        return to in self._next[current]

    def check(self, current: S, to: S, what: str) -> S:
        """`to`, when `what` may move from `current` to it; else RuntimeError naming both."""
        if not self.allows(current, to):
            raise RuntimeError(f"{what}: {current.name} -> {to.name} is not a legal move")
        return to
