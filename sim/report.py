"""The planner's plot: attainment of both targets against the arrival rate, one line per
configuration (the colocated baseline dashed), the 90% line, per GPU on the x axis so
configurations of different sizes compare."""

from __future__ import annotations

from pathlib import Path

from sim.plan import Plan


def plot(plan: Plan, path: str | Path, title: str = "", top: int = 4) -> Path:
    """Write the PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    shown = list(plan.configurations[:top])
    for mode in ("colocated", "disaggregated", "auto"):
        best = plan.best(mode)
        if best is not None and best not in shown:
            shown.append(best)
    for c in shown:
        pts = sorted(c.points)
        ax.plot([r / c.gpus for r, _ in pts], [a * 100 for _, a in pts], marker="o", markersize=3,
                linestyle="--" if c.mode == "colocated" else "-",
                label=f"{c.label()}: {c.goodput_per_gpu:.3g} rps/GPU")
    ax.axhline(plan.targets.share * 100, color="grey", linewidth=0.8)
    ax.set_xlabel("arrival rate per GPU (requests/s)")
    ax.set_ylabel("requests meeting both targets (%)")
    ax.set_ylim(0, 102)
    ax.set_title(title or f"{plan.gpus} GPUs, TTFT <= {plan.targets.slo_ttft_ms:g} ms, "
                          f"TPOT <= {plan.targets.slo_tpot_ms:g} ms", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
