"""Plots of lesson 07's runs: per-worker timelines (Gantt), learning curves and lags."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes

from course_lib.pipeline.system import RegimeReport

COLOURS = {
    "colocated_sync": "tab:brown",
    "conventional": "tab:red",
    "pipeline_drain": "tab:purple",
    "conventional_split": "tab:olive",
    "conventional_engines": "tab:orange",
    "sync_dp": "tab:brown",
    "conventional_dp": "tab:red",
    "split_sync": "tab:pink",
    "sync": "tab:pink",
    "one_step": "tab:orange",
    "pipeline": "tab:blue",
    "pipeline_no_is": "tab:gray",
    "pipeline_recompute": "tab:cyan",
}
LABELS = {
    "colocated_sync": "colocated synchronous",
    "conventional": "conventional RL (k steps/round)",
    "pipeline_drain": "pipeline, drain-then-swap",
    "conventional_split": "conventional, split cores",
    "conventional_engines": "conventional RL, an engine per core",
    "sync_dp": "synchronous (k = 1)",
    "conventional_dp": "conventional RL (k = 4)",
    "split_sync": "synchronous, split cores",
    "sync": "synchronous, split cores",
    "one_step": "one-step async",
    "pipeline": "pipeline RL",
    "pipeline_no_is": "pipeline, no IS correction",
    "pipeline_recompute": "pipeline, KV cache recomputed",
}


def gantt(ax: Axes, report: RegimeReport, window: tuple[float, float]) -> None:
    """Busy intervals of the generator and the trainer in ``window`` (seconds); white is idle.
    In-flight weight updates are ticks on the generator's row. With an engine per core
    (``n_generators > 1``) the generator row is the engines together (busy when any is) and
    the trainer row is rank 0 of the data-parallel trainer (the other ranks work at the same time)."""
    lo, hi = window
    for row, (who, colour) in enumerate((("trainer", "tab:green"), ("generator", "tab:purple"))):
        spans = [(max(a, lo), min(b, hi) - max(a, lo)) for a, b in getattr(report, who) if b > lo and a < hi]
        ax.broken_barh(spans, (row - 0.35, 0.7), color=colour)
    swaps = [t for t, _ in report.swaps if lo <= t <= hi]
    if swaps:
        ax.vlines(swaps, 0.65, 1.35, color="k", lw=0.6, label="in-flight weight update")
        ax.legend(loc="upper right", fontsize=7)
    engines = getattr(report, "n_generators", 1) > 1
    ax.set_yticks(
        [0, 1], ["trainer (both cores)" if engines else "trainer", "engines (both cores)" if engines else "generator"]
    )
    ax.set_xlim(lo, hi)
    ax.set_xlabel("wall-clock time since the start (s)")
    ax.set_title(
        f"{LABELS[report.arm]}: generator busy {100 * report.busy_fraction('generator'):.0f}% "
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


def mean_curve(reports: Sequence[RegimeReport], window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over seeds of one arm: (mean time of update ``i``, mean and standard error of the
    ``window``-update trailing mean of the batch reward at update ``i``)."""
    times = np.mean([r.series("time") for r in reports], axis=0)
    curves = np.array([smoothed(r.series("reward"), window) for r in reports])
    return times, curves.mean(0), curves.std(0, ddof=1) / np.sqrt(len(reports)) if len(reports) > 1 else 0 * times


def reward_vs_time(
    axes: Sequence[Axes], runs: Mapping[str, Sequence[RegimeReport]], window: int, warm: float, target: float
) -> None:
    """Reward of the consumed batches (mean over seeds, shaded +- 1 standard error) vs
    wall-clock time (left) and vs updates (right), with the warm start and the target levels."""
    for arm, reports in runs.items():
        times, mean, se = mean_curve(reports, window)
        updates = np.arange(1, len(mean) + 1)
        for ax, x in ((axes[0], times), (axes[1], updates)):
            ax.plot(
                x[window - 1 :], mean[window - 1 :], color=COLOURS[arm], label=f"{LABELS[arm]} ({len(reports)} seeds)"
            )
            ax.fill_between(
                x[window - 1 :], (mean - se)[window - 1 :], (mean + se)[window - 1 :], color=COLOURS[arm], alpha=0.2
            )
    for ax in axes:
        ax.axhline(warm, color="k", ls=":", lw=1, label=f"warm start ({warm:.2f})")
        ax.axhline(target, color="k", ls="--", lw=1, label=f"target ({target:.2f})")
        ax.set_ylabel(f"reward of the consumed batches ({window}-update mean)")
        ax.legend(fontsize=7)
    axes[0].set_xlabel("wall-clock time since the start (s)")
    axes[1].set_xlabel("trainer updates")
    axes[0].set_title("Reward vs wall-clock")
    axes[1].set_title("Reward vs updates (= samples)")


def learning_curves(axes: Sequence[Axes], reports: Sequence[RegimeReport], window: int = 10) -> None:
    """Reward of the consumed batches vs wall-clock (left) and vs samples (right)."""
    for r in reports:
        reward = smoothed(r.series("reward"), window)
        samples = np.arange(1, len(r.metrics) + 1) * r.samples / len(r.metrics)
        axes[0].plot(r.series("time"), reward, color=COLOURS[r.arm], label=LABELS[r.arm])
        axes[1].plot(samples, reward, color=COLOURS[r.arm], label=LABELS[r.arm])
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
            color=COLOURS[r.arm],
            label=f"{LABELS[r.arm]} (bound {r.lag_bound})",
        )
    ax.set_xticks(np.arange(top + 1))
    ax.set_xlabel("lag of a token (trainer version - version that sampled it, updates)")
    ax.set_ylabel("fraction of consumed tokens")
    ax.set_title("Per-token lag")
    ax.legend(fontsize=8)
