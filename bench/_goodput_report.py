"""Goodput benchmark: the rate search, the goodput figure, the progress bar, the plot.

Rate search (coarse to fine): start at r0; while every tested rate passes,
double; while every tested rate fails, halve; once a passing rate lies below
a failing one, bisect that bracket geometrically until it is narrower than
`resolution` (or the caller's point budget runs out).

Goodput: the highest tested rate whose joint attainment reaches the target,
then linearly interpolated in attainment towards the lowest failing rate
above it ("interpolated"). With no failing rate above it the figure is that
tested rate, a lower bound ("highest_tested_lower_bound"); with no passing
rate at all it is 0 ("none_passed"), and below the lowest tested rate.

A target "x >= k * y" is judged on those bounds (`at_least`): met when x's
figure reaches k times the most y can be, not met when it misses k times y's
figure, undecided in between (a y whose sweep never failed is unbounded above).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

from _goodput_run import PointResult


class RateSearch:
    """Chooses the next rate to test from the pass/fail results so far."""

    def __init__(self, r0: float, factor: float = 2.0, resolution: float = 1.15,
                 min_rps: float = 0.02, max_rps: float = 64.0):
        assert r0 > 0 and factor > 1 and resolution > 1
        self.r0, self.factor, self.resolution = r0, factor, resolution
        self.min_rps, self.max_rps = min_rps, max_rps
        self.passed: list[float] = []
        self.failed: list[float] = []

    def record(self, rate: float, passed: bool) -> None:
        """Add one tested rate."""
        (self.passed if passed else self.failed).append(rate)

    def next_rate(self) -> float | None:
        """The next rate to test, or None when the search has converged or left its range."""
        if not self.passed and not self.failed:
            return self.r0
        if not self.passed:
            r = min(self.failed) / self.factor
            return r if r >= self.min_rps else None
        best = max(self.passed)
        above = [f for f in self.failed if f > best]
        if not above:
            r = best * self.factor
            return r if r <= self.max_rps else None
        hi = min(above)
        if hi / best < self.resolution:
            return None
        return math.sqrt(best * hi)


@dataclass(frozen=True, slots=True)
class Goodput:
    """Goodput of one (workload, mode) sweep."""

    goodput_rps: float
    method: str
    """'interpolated', 'highest_tested_lower_bound' or 'none_passed'."""
    highest_passing_rps: float | None
    lowest_failing_above_rps: float | None

    @property
    def upper_rps(self) -> float:
        """The most the sweep allows the goodput to be (attainment falls with rate): the
        figure itself once a failing rate bounds it, the lowest tested rate when none
        passed, unbounded (inf) when every tested rate passed."""
        if self.method == "interpolated":
            return self.goodput_rps
        if self.method == "none_passed":
            return self.lowest_failing_above_rps if self.lowest_failing_above_rps is not None else math.inf
        return math.inf


def at_least(x: Goodput, y: Goodput, k: float) -> tuple[bool | None, str]:
    """Does the sweeps' evidence say x >= k * y? (met, why). True only when x's figure
    (a lower bound when every rate of x passed) reaches k times the most y can be
    (`upper_rps`); False when even y's figure is out of reach, or x is 0; None
    (undecided) in between, e.g. when y's sweep never found a failing rate."""
    if x.goodput_rps <= 0:
        return False, "no rate passed" if x.method == "none_passed" else "goodput 0"
    if x.goodput_rps >= k * y.upper_rps:
        if y.method == "none_passed":
            return True, f"the other's goodput is below its lowest tested rate {y.upper_rps:.3g} rps"
        return True, ""
    if x.goodput_rps < k * y.goodput_rps:
        return False, ""
    return None, (f"undecided: the other's goodput is at least {y.goodput_rps:.3g} rps "
                  f"({y.method}), at most {y.upper_rps:.3g}")


def goodput(points: list[PointResult], target: float) -> Goodput:
    """Highest rate with joint attainment >= target (see the module docstring)."""
    passing = [p for p in points if p.passed(target)]
    if not passing:
        return Goodput(0.0, "none_passed", None, min((p.rate_rps for p in points), default=None))
    best = max(passing, key=lambda p: p.rate_rps)
    above = [p for p in points if p.rate_rps > best.rate_rps and not p.passed(target)]
    if not above:
        return Goodput(best.rate_rps, "highest_tested_lower_bound", best.rate_rps, None)
    fail = min(above, key=lambda p: p.rate_rps)
    frac = (best.joint_attainment - target) / (best.joint_attainment - fail.joint_attainment)
    rate = best.rate_rps + frac * (fail.rate_rps - best.rate_rps)
    return Goodput(rate, "interpolated", best.rate_rps, fail.rate_rps)


class Progress:
    """A one-line progress bar on stderr: work units done of a total, plus a status text.

    On a terminal it redraws in place; otherwise it prints a line per `step`
    (not per `update`) so a log file stays readable.
    """

    WIDTH = 28

    def __init__(self, total: float):
        self.total = max(total, 1e-9)
        self.done = 0.0
        self.t0 = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.text = ""

    def _draw(self, partial: float = 0.0) -> str:
        frac = min(1.0, (self.done + partial) / self.total)
        fill = int(frac * self.WIDTH)
        elapsed = int(time.monotonic() - self.t0)
        return (f"[{'#' * fill}{'-' * (self.WIDTH - fill)}] {100 * frac:3.0f}% "
                f"{elapsed // 60}:{elapsed % 60:02d} {self.text}")

    def update(self, text: str, partial: float = 0.0) -> None:
        """Redraw with `partial` units of the current step done."""
        self.text = text
        if self.tty:
            sys.stderr.write("\r\033[K" + self._draw(partial))
            sys.stderr.flush()

    def step(self, units: float = 1.0, text: str | None = None) -> None:
        """Finish `units` units of work (0 units: nothing to show)."""
        if units <= 0:
            return
        self.done += units
        if text is not None:
            self.text = text
        if self.tty:
            self.update(self.text)
        else:
            print(self._draw(), file=sys.stderr, flush=True)

    def close(self) -> None:
        """End the bar's line."""
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


MODE_STYLE = {"colocated": ("tab:blue", "o", "-"), "disaggregated": ("tab:orange", "s", "--"),
              "auto": ("tab:green", "^", "-.")}


def plot(path: str, results: dict[str, dict[str, list[PointResult]]],
         goodputs: dict[str, dict[str, Goodput]], target: float, subtitle: str) -> str | None:
    """PNG of joint attainment vs rate, one panel per workload, one line per mode.

    Returns None on success, or why no PNG was written (matplotlib missing).
    """
    try:
        import matplotlib
        import matplotlib.ticker
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no PNG: {e}"
    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, workload in zip(axes[0], names):
        for mode, points in results[workload].items():
            pts = sorted(points, key=lambda p: p.rate_rps)
            color, marker, line = MODE_STYLE.get(mode, ("tab:gray", "x", ":"))
            g = goodputs[workload][mode].goodput_rps
            ax.plot([p.rate_rps for p in pts], [p.joint_attainment for p in pts], marker=marker,
                    linestyle=line, color=color, label=f"{mode} (goodput {g:.2f} rps)")
            # 95% interval of each point's attainment (a dozen requests: one is 8%).
            ax.errorbar([p.rate_rps for p in pts], [p.joint_attainment for p in pts],
                        yerr=[[p.joint_attainment - p.joint_interval[0] for p in pts],
                              [p.joint_interval[1] - p.joint_attainment for p in pts]],
                        fmt="none", ecolor=color, alpha=0.35, capsize=2, linewidth=1)
            if g > 0:
                ax.axvline(g, color=color, linestyle=":", linewidth=1)
        ax.axhline(target, color="gray", linestyle="--", linewidth=1)
        # Log x (the search doubles and halves), ticked at the rates actually tested.
        rates = sorted({round(p.rate_rps, 3) for pts in results[workload].values() for p in pts})
        ax.set_xscale("log")
        if rates:
            ax.set_xlim(rates[0] / 1.4, rates[-1] * 1.4)
            ax.set_xticks(rates, [f"{r:.3g}" for r in rates], fontsize=7, rotation=45)
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("joint SLO attainment (TTFT and TPOT)")
        ax.set_title(f"workload: {workload}")
        ax.legend(fontsize=8, loc="lower left")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(subtitle, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
