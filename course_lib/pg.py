"""Returns and policy-gradient estimators (lessons 00-01).

Conventions (rlax-style, time-major): ``rewards[t]`` is the reward received after the
action at step ``t``; ``dones[t]`` is 1 when the episode ended at step ``t`` (terminated
or truncated), so nothing after ``t`` belongs to its return.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def discounted_returns(
    rewards: ArrayLike,
    dones: ArrayLike,
    gamma: float,
    bootstrap: ArrayLike = 0.0,
) -> NDArray[np.float64]:
    r"""Discounted return of every step, cut at episode ends.

    Equation (00.1)::

        G_t = r_t + gamma * (1 - done_t) * G_{t+1},    G_T = bootstrap

    i.e. ``G_t = sum_{k=t}^{e(t)} gamma^(k-t) r_k`` where ``e(t)`` is the last step of
    ``t``'s episode (Sutton & Barto, eq. 3.8). ``bootstrap`` is the value of the state
    after the last step, used only if that step did not end an episode.

    Args:
        rewards: ``[T]`` or ``[T, B]`` rewards.
        dones: same shape, 1 where an episode ended at that step.
        gamma: discount in ``[0, 1]``.
        bootstrap: scalar or ``[B]`` value of the state after step ``T - 1``.

    Returns:
        ``[T]`` or ``[T, B]`` float64 returns.
    """
    r = np.asarray(rewards, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    if r.shape != d.shape:
        raise ValueError(f"rewards {r.shape} and dones {d.shape} must have the same shape [T] or [T, B]")
    if r.ndim not in (1, 2):
        raise ValueError(f"rewards must be [T] or [T, B], got shape {r.shape}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    out = np.empty_like(r)
    running = np.broadcast_to(np.asarray(bootstrap, dtype=np.float64), r.shape[1:]).copy()
    for t in range(r.shape[0] - 1, -1, -1):
        running = r[t] + gamma * (1.0 - d[t]) * running
        out[t] = running
    return out
