"""Architecture diagrams of lesson 03: IMPALA and SEED RL side by side, drawn with matplotlib."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ACTOR, LEARNER, WIRE_DATA, WIRE_WEIGHTS = "#d9ead3", "#cfe2f3", "#38761d", "#b45f06"


def _box(ax: Axes, x: float, y: float, w: float, h: float, text: str, colour: str) -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.03", facecolor=colour, edgecolor="#333333", lw=1.0
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=8)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], colour: str) -> None:
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="->", color=colour, lw=1.4))


def architecture_diagram(n_actors: int = 3) -> Figure:
    """Two panels: IMPALA (a policy copy in every actor; unrolls in, weights out) and SEED RL
    (env-only actors; observations in, actions out; one batched inference beside the learner)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    ys = [1.6 - 1.6 * i for i in range(n_actors)]
    panels = {
        "impala": (
            "actor {i} (CPU)\n8 envs + policy copy\nsamples a ~ mu",
            "learner (accelerator)\nwaits for a batch of unrolls\nV-trace loss, update\npublishes weights v + 1",
            "unroll [T, B] + log mu + version, once per unroll",
            "weights, whenever they are new",
            "IMPALA (Espeholt et al. 2018): inference on the actors;\ntrajectories and weights cross the wire",
        ),
        "seed": (
            "actor {i} (CPU)\n8 envs\nno policy",
            "learner (accelerator)\nbatched inference for all actors\nassembles unrolls, V-trace\n"
            "update; weights stay here",
            "observations + rewards, every step",
            "actions, every step",
            "SEED RL (Espeholt et al. 2020): inference central and batched;\nobservations and actions cross the wire",
        ),
    }
    for ax, (actor_text, learner_text, up, down, title) in zip(axes, panels.values()):
        for i, y in enumerate(ys):
            _box(ax, 0.0, y, 2.0, 0.9, actor_text.format(i=i), ACTOR)
            _arrow(ax, (1.05, y + 0.12), (3.3, 0.25 - 0.2 * i), WIRE_DATA)
            _arrow(ax, (3.3, -0.05 - 0.2 * i), (1.05, y - 0.18), WIRE_WEIGHTS)
        _box(ax, 4.75, 0.0, 2.8, 1.9, learner_text, LEARNER)
        ax.legend(
            handles=[
                Line2D([], [], color=WIRE_DATA, lw=1.4, label=up),
                Line2D([], [], color=WIRE_WEIGHTS, lw=1.4, label=down),
            ],
            loc="lower center",
            bbox_to_anchor=(0.5, -0.2),
            fontsize=7.5,
            frameon=False,
            ncol=1,
        )
        ax.set_title(title, fontsize=10)
        ax.set_xlim(-1.3, 6.3)
        ax.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
        ax.set_xlabel(
            "left: actor processes; right: the learner's process (one machine here, a cluster in the papers)",
            fontsize=8,
        )
        ax.set_xticks([])
        ax.set_yticks([])
        for side in ("top", "right", "left", "bottom"):
            ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
