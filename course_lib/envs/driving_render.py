"""A top-down picture of a lesson-06 driving scenario (:mod:`course_lib.envs.driving`).

The only module of the driving env that imports matplotlib: road edges and dashed lane
lines, the agents' boxes, the ego's box, the route's target, and optionally ego
trajectories with a marker where each one ended by a collision or by leaving the road
(:func:`draw_scenario`); :func:`draw_episodes` runs a policy on a few scenarios and draws them.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax import Array
from matplotlib.axes import Axes
from matplotlib.patches import Polygon

from course_lib.envs.driving import (
    DEFAULT_PARAMS,
    EnvParams,
    EnvState,
    Policy,
    agent_boxes,
    box_corners,
    ego_box,
    episode_trajectory,
    outcome_name,
)


def _offset_line(state: EnvState, d: float) -> np.ndarray:
    """``[N, 2]`` the polyline at lateral offset ``d`` (m, left +) from the centreline."""
    xy, psi = np.asarray(state.road_xy), np.asarray(state.road_psi)
    return xy + d * np.stack([-np.sin(psi), np.cos(psi)], -1)


def draw_road(ax: Axes, state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> None:
    """Tarmac, the two road edges (solid) and the lane lines (dashed)."""
    n_lanes = int(state.n_lanes)
    half = n_lanes * params.lane_width / 2.0
    left, right = _offset_line(state, half), _offset_line(state, -half)
    ax.fill(np.r_[left[:, 0], right[::-1, 0]], np.r_[left[:, 1], right[::-1, 1]], color="0.92", zorder=0)
    for edge in (left, right):
        ax.plot(edge[:, 0], edge[:, 1], color="0.3", lw=1.5, zorder=1)
    for lane in range(1, n_lanes):
        line = _offset_line(state, -half + lane * params.lane_width)
        ax.plot(line[:, 0], line[:, 1], color="0.6", lw=0.8, ls=(0, (4, 4)), zorder=1)


def _zoom_to_route(ax: Axes, state: EnvState, params: EnvParams, margin: float = 15.0) -> None:
    """Axis limits around the road from its start to ``margin`` past the route's target."""
    end = float(state.route_s0) + params.route_length + 2 * margin
    n = int(np.clip(np.ceil(end / params.road_spacing), 2, np.asarray(state.road_xy).shape[0]))
    xy = np.asarray(state.road_xy)[:n]
    pad = margin + int(state.n_lanes) * params.lane_width / 2.0
    ax.set_xlim(xy[:, 0].min() - pad, xy[:, 0].max() + pad)
    ax.set_ylim(xy[:, 1].min() - pad, xy[:, 1].max() + pad)


def _draw_boxes(ax: Axes, boxes: np.ndarray, color: str, label: str) -> None:
    """Filled boxes from ``[K, 5]`` ``(cx, cy, heading, length, width)``; one legend entry."""
    for k, corners in enumerate(np.asarray(box_corners(jnp.asarray(boxes)))):
        ax.add_patch(
            Polygon(corners, closed=True, fc=color, ec="black", lw=0.6, zorder=3, label=label if k == 0 else None)
        )


def draw_scenario(
    ax: Axes,
    state: EnvState,
    params: EnvParams = DEFAULT_PARAMS,
    trajectories: Sequence[np.ndarray] | None = None,
    title: str = "Driving scenario (top-down)",
    outcomes: Sequence[str] | None = None,
) -> Axes:
    """Draw one (unbatched) scenario on ``ax``.

    Args:
        ax: the matplotlib axes.
        state: a single :class:`~course_lib.envs.driving.EnvState` (no batch axis).
        params: the env's constants (lane width, vehicle sizes).
        trajectories: ego paths, each ``[T, 2]`` (m), drawn as lines.
        title: the axes' title.
        outcomes: one per trajectory, ``"collision"``, ``"offroad"`` or anything else
            (:func:`~course_lib.envs.driving.outcome_name`); a collision ends its line
            with a red cross, an off-road with an orange triangle.

    Returns:
        ``ax``, with equal aspect and axes in metres.
    """
    draw_road(ax, state, params)
    _draw_boxes(ax, np.asarray(agent_boxes(state, params)), "tab:blue", "other vehicles (IDM)")
    _draw_boxes(ax, np.asarray(ego_box(state, params))[None], "tab:red", "ego")
    target = np.asarray(state.target)
    ax.plot(*target, marker="*", ms=14, color="gold", mec="black", zorder=4, ls="none", label="route target")
    markers = {"collision": ("x", "red"), "offroad": ("^", "darkorange")}
    seen: set[str] = set()
    for k, path in enumerate(trajectories or []):
        path = np.asarray(path)
        ax.plot(
            path[:, 0],
            path[:, 1],
            lw=1.2,
            alpha=0.8,
            zorder=2,
            color=plt.cm.viridis(k / max(len(trajectories or []), 1)),
        )
        outcome = (outcomes or [""] * (k + 1))[k]
        if outcome in markers:
            marker, color = markers[outcome]
            ax.plot(
                *path[-1],
                marker=marker,
                color=color,
                ms=9,
                mew=2,
                ls="none",
                zorder=5,
                label=None if outcome in seen else outcome,
            )
            seen.add(outcome)
    _zoom_to_route(ax, state, params)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    return ax


__all__ = ["draw_road", "draw_scenario"]


def draw_episodes(axes: Sequence[Axes], policy: Policy, key: Array, params: EnvParams = DEFAULT_PARAMS) -> list[str]:
    """One episode of ``policy`` per axes, from the scenarios of ``jax.random.split(key, len(axes))``
    (:func:`~course_lib.envs.driving.episode_trajectory`, all episodes in one vmapped program),
    each drawn by :func:`draw_scenario` with the ego's path and how the episode ended.

    Returns:
        The outcome of each episode (:func:`~course_lib.envs.driving.outcome_name`).
    """
    keys = jax.random.split(key, len(axes))
    first, xy, length, last = jax.jit(jax.vmap(lambda k: episode_trajectory(policy, k, params)))(keys)
    outcomes = []
    for i, ax in enumerate(axes):
        outcome = outcome_name(jax.tree.map(lambda a, i=i: a[i], last))
        steps = int(length[i])
        draw_scenario(
            ax,
            jax.tree.map(lambda a, i=i: a[i], first),
            params,
            trajectories=[np.asarray(xy[i, : steps + 1])],
            outcomes=[outcome],
            title=f"scenario {i}: {outcome} after {steps} steps",
        )
        outcomes.append(outcome)
    return outcomes
