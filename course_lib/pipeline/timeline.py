"""Plots of lesson 07's runs: per-worker timelines (Gantt), learning curves, lags, throughput."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes

from course_lib.pipeline.system import RegimeReport

COLOURS = {"sync": "tab:red", "one_step": "tab:orange", "pipeline": "tab:blue"}
LABELS = {"sync": "synchronous", "one_step": "one-step async", "pipeline": "pipeline RL"}


def gantt(ax: Axes, report: RegimeReport, window: tuple[float, float]) -> None:
    """Busy intervals of the generator and the trainer in ``window`` (seconds); white is idle.
    In-flight weight updates are ticks on the generator's row."""
    lo, hi = window
    for row, (who, colour) in enumerate((("trainer", "tab:green"), ("generator", "tab:purple"))):
        spans = [(max(a, lo), min(b, hi) - max(a, lo)) for a, b in getattr(report, who) if b > lo and a < hi]
        ax.broken_barh(spans, (row - 0.35, 0.7), color=colour)
    swaps = [t for t, _ in report.swaps if lo <= t <= hi]
    if swaps:
        ax.vlines(swaps, 0.65, 1.35, color="k", lw=0.6, label="in-flight weight update")
        ax.legend(loc="upper right", fontsize=7)
    ax.set_yticks([0, 1], ["trainer", "generator"])
    ax.set_xlim(lo, hi)
    ax.set_xlabel("wall-clock time since the start (s)")
    ax.set_title(
        f"{LABELS[report.regime]}: generator busy {100 * report.busy_fraction('generator'):.0f}% "
        f"(slots {100 * report.slot_occupancy:.0f}% useful), trainer busy "
        f"{100 * report.busy_fraction('trainer'):.0f}%",
        fontsize=9,
    )


def smoothed(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points (shorter at the start)."""
    c = np.cumsum(np.insert(np.asarray(x, dtype=np.float64), 0, 0.0))
    n = np.arange(1, len(x) + 1)
    lo = np.maximum(n - window, 0)
    return (c[n] - c[lo]) / (n - lo)


def learning_curves(axes: Sequence[Axes], reports: Sequence[RegimeReport], window: int = 10) -> None:
    """Reward of the consumed batches vs wall-clock (left) and vs samples (right)."""
    for r in reports:
        reward = smoothed(r.series("reward"), window)
        samples = np.arange(1, len(r.metrics) + 1) * r.samples / len(r.metrics)
        axes[0].plot(r.series("time"), reward, color=COLOURS[r.regime], label=LABELS[r.regime])
        axes[1].plot(samples, reward, color=COLOURS[r.regime], label=LABELS[r.regime])
    axes[0].set_xlabel("wall-clock time (s)")
    axes[1].set_xlabel("answers consumed by the trainer (samples)")
    for ax in axes:
        ax.set_ylabel(f"reward of the batch ({window}-update mean)")
        ax.legend(fontsize=8)
    axes[0].set_title("Reward vs wall-clock")
    axes[1].set_title("Reward vs samples")


def lag_histogram(ax: Axes, reports: Sequence[RegimeReport]) -> None:
    """Distribution of the per-token lag (07.4) of every consumed token, per regime."""
    top = max(int(r.token_lags.max()) for r in reports)
    bins = np.arange(top + 2) - 0.5
    width = 0.8 / len(reports)
    for i, r in enumerate(reports):
        counts, _ = np.histogram(r.token_lags, bins=bins)
        ax.bar(
            np.arange(top + 1) + (i - (len(reports) - 1) / 2) * width,
            counts / counts.sum(),
            width,
            color=COLOURS[r.regime],
            label=f"{LABELS[r.regime]} (bound {r.lag_bound})",
        )
    ax.set_xticks(np.arange(top + 1))
    ax.set_xlabel("lag of a token (trainer version - version that sampled it, updates)")
    ax.set_ylabel("fraction of consumed tokens")
    ax.set_title("Per-token lag")
    ax.legend(fontsize=8)


def throughput_table(reports: Sequence[RegimeReport]) -> list[dict[str, float | str]]:
    """One row per report: tokens/s, its ratio to the first report's, utilisations, lags, ESS."""
    base = reports[0].tokens_per_second
    return [
        {
            "regime": LABELS[r.regime],
            "tokens/s": r.tokens_per_second,
            "x first": r.tokens_per_second / base,
            "gen busy": r.busy_fraction("generator"),
            "slots useful": r.slot_occupancy,
            "gen util": r.generation_utilisation,
            "train util": r.busy_fraction("trainer"),
            "lag max": float(r.token_lags.max()),
            "lag mean": float(r.token_lags.mean()),
            "ESS/N": float(r.series("ess").mean()),
        }
        for r in reports
    ]
