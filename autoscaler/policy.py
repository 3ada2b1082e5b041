"""When to resize the pools: the planner's recommendation, damped. Pure: no I/O, the clock
is an argument.

Each decision takes the pools' current sizes and the planner's target for the observed
load (`Target`, or None when there is none: no observation, or no configuration meets the
targets) and gives a `Decision`, a change or a hold, always with its reason. Per pool:

    target clamped to [min, max]     the bounds win over the planner
    a streak of agreeing targets     every target since `since` above the size (up) or
                                     every one below it (down); a target on the size, the
                                     other way, or none ends the streak
    up after up_stable_s             to the lowest target of the streak (all asked for
    down after down_stable_s         at least that), or the highest for a down streak
    at most max_step a decision      the rest waits for the next decisions
    cool-down                        no change for cooldown_s after any change; streaks
                                     go on counting meanwhile

Hysteresis is the pair of windows: a short one up (a missed SLO costs now) and a long
one down (a worker removed too early must be started again, minutes of model load).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .config import POOLS, AutoscalerSettings


@dataclass(frozen=True, slots=True)
class Sizes:
    """Workers per pool."""

    prefill: int = 0
    decode: int = 0
    mixed: int = 0

    def of(self, pool: str) -> int:
        """The size of `pool`."""
        return getattr(self, pool)

    def with_size(self, pool: str, n: int) -> Sizes:
        """A copy with `pool` at `n`."""
        return dataclasses.replace(self, **{pool: n})

    def as_dict(self) -> dict[str, int]:
        """{pool: size}, in POOLS order."""
        return {p: self.of(p) for p in POOLS}

    def __str__(self) -> str:
        return ", ".join(f"{p} {self.of(p)}" for p in POOLS)


@dataclass(frozen=True, slots=True)
class Target:
    """The planner's sizes for the observed load, and why (its figures, in words)."""

    prefill: int
    decode: int
    mixed: int
    reason: str

    @property
    def sizes(self) -> Sizes:
        """The sizes alone."""
        return Sizes(self.prefill, self.decode, self.mixed)


@dataclass(frozen=True, slots=True)
class Decision:
    """What one decision did (`changed` empty: a hold) and why."""

    at_s: float
    current: Sizes
    new: Sizes
    target: Sizes | None
    reason: str
    changed: tuple[str, ...] = ()

    @property
    def action(self) -> str:
        """'scale' or 'hold'."""
        return "scale" if self.changed else "hold"

    def to_dict(self) -> dict:
        """JSON-ready (the status record's form: `pdctl autoscale status` reads it)."""
        return {"at_s": self.at_s, "action": self.action, "current": self.current.as_dict(),
                "new": self.new.as_dict(), "target": self.target.as_dict() if self.target else None,
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Rules:
    """The policy's knobs (AutoscalerSettings has them from the environment)."""

    up_stable_s: float = 30.0
    down_stable_s: float = 300.0
    cooldown_s: float = 60.0
    max_step: int = 1
    bounds: dict[str, tuple[int, int]] = field(default_factory=lambda: {p: (0, 1 << 30) for p in POOLS})

    def __post_init__(self):
        assert self.max_step >= 1 and min(self.up_stable_s, self.down_stable_s, self.cooldown_s) >= 0, self
        assert all(lo <= hi for lo, hi in self.bounds.values()), self.bounds

    @classmethod
    def of(cls, s: AutoscalerSettings) -> Rules:
        """The rules the settings give."""
        return cls(s.up_stable_s, s.down_stable_s, s.cooldown_s, s.max_step, {p: s.bounds(p) for p in POOLS})

    def clamp(self, pool: str, n: int) -> int:
        """`n` within `pool`'s bounds."""
        lo, hi = self.bounds[pool]
        return max(lo, min(hi, n))


@dataclass(slots=True)
class _Streak:
    """Targets on one side of a pool's size since `since_s`; `bound` the one all agree on."""

    up: bool
    since_s: float
    bound: int


class Policy:
    """Decisions from targets (see the module docstring); keeps the streaks and the last change."""

    def __init__(self, rules: Rules):
        self.rules = rules
        self._streaks: dict[str, _Streak] = {}
        self._last_change_s: float | None = None

    def decide(self, now_s: float, current: Sizes, target: Target | None, why_none: str = "") -> Decision:
        """The decision at `now_s` for pools at `current`; `target` None holds (`why_none` says why)."""
        if target is None:
            self._streaks.clear()  # a gap breaks agreement
            return Decision(now_s, current, current, None, f"hold: no target: {why_none or 'none given'}")
        wanted = Sizes(*(self.rules.clamp(p, target.sizes.of(p)) for p in POOLS))
        self._follow(now_s, current, wanted)
        left = self._cooldown_left(now_s)
        if left > 0:
            waiting = "; ".join(self._waiting(now_s, current, wanted))
            return Decision(now_s, current, current, wanted, f"hold: cool-down {left:.0f} s left"
                            + (f" ({waiting})" if waiting else "") + f"; planner: {target.reason}")
        new, parts = current, []
        for pool, streak in list(self._streaks.items()):
            elapsed = now_s - streak.since_s
            if elapsed < (self.rules.up_stable_s if streak.up else self.rules.down_stable_s):
                continue
            have = current.of(pool)
            step = max(-self.rules.max_step, min(self.rules.max_step, streak.bound - have))
            new = new.with_size(pool, have + step)
            parts.append(f"{pool} {have} -> {have + step}: {'up' if streak.up else 'down'} after {elapsed:.0f} s "
                         f"stable (wanted {streak.bound})")
            del self._streaks[pool]  # the next streak starts from the new size
        if parts:
            self._last_change_s = now_s
            changed = tuple(p for p in POOLS if new.of(p) != current.of(p))
            return Decision(now_s, current, new, wanted, "; ".join(parts) + f"; planner: {target.reason}", changed)
        waiting = "; ".join(self._waiting(now_s, current, wanted)) or f"at target ({current})"
        return Decision(now_s, current, current, wanted, f"hold: {waiting}; planner: {target.reason}")

    def _follow(self, now_s: float, current: Sizes, wanted: Sizes) -> None:
        """Extend, start or end each pool's streak with this target."""
        for pool in POOLS:
            want, have = wanted.of(pool), current.of(pool)
            streak = self._streaks.get(pool)
            if want == have:
                self._streaks.pop(pool, None)
            elif streak is None or streak.up != (want > have):
                self._streaks[pool] = _Streak(want > have, now_s, want)
            else:
                streak.bound = min(streak.bound, want) if streak.up else max(streak.bound, want)

    def _cooldown_left(self, now_s: float) -> float:
        if self._last_change_s is None:
            return 0.0
        return self._last_change_s + self.rules.cooldown_s - now_s

    def _waiting(self, now_s: float, current: Sizes, wanted: Sizes) -> list[str]:
        """One phrase per pool whose streak has not lasted long enough yet."""
        out = []
        for pool, streak in self._streaks.items():
            need = self.rules.up_stable_s if streak.up else self.rules.down_stable_s
            out.append(f"{pool} wants {wanted.of(pool)} (now {current.of(pool)}), {'up' if streak.up else 'down'} "
                       f"after {need:.0f} s stable ({now_s - streak.since_s:.0f} s so far)")
        return out
