r"""V-trace: off-policy value targets and policy-gradient advantages (lesson 03).

Espeholt et al. 2018, *IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures*, arXiv 1802.01561, section 4. Actors act with a behaviour
policy ``mu`` (the learner's weights of some updates ago); the learner updates ``pi``.
With truncated importance weights::

    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))                      (03.1)
    c_i   = min(c_bar,   pi(a_i|x_i) / mu(a_i|x_i)),   rho_bar >= c_bar

the n-step V-trace target of the value at ``x_s`` is::

    v_s = V(x_s) + sum_{t=s}^{s+n-1} ( prod_{i=s}^{t-1} gamma_i c_i ) delta_t V      (03.2)
    delta_t V = rho_t ( r_t + gamma_t V(x_{t+1}) - V(x_t) )

where the empty product (``t = s``) is 1: the product runs to ``t - 1``, not ``t`` (the
paper's common off-by-one). Computed backwards in one pass::

    v_s - V(x_s) = delta_s V + gamma_s c_s ( v_{s+1} - V(x_{s+1}) )                   (03.3)

and the policy-gradient advantage, with its own threshold ``pg_rho_bar``::

    A_s = min(pg_rho_bar, pi/mu)_s ( r_s + gamma_s v_{s+1} - V(x_s) )                 (03.4)

Conventions (rlax ``vtrace.py``, TorchBeast ``vtrace.py``): pure functions on one batch
of trajectories, time-major ``[T, B]``; ``discounts[t] = gamma * (1 - done_t)`` is 0
where an episode ended at step ``t``, so nothing leaks across episodes;
``bootstrap_value [B]`` is ``V(x_T)``, the value of the state after the unroll, and
``v_T = V(x_T)``. Everything is float64 numpy: targets are constants for the loss
(no gradient flows through them), so the learner calls these on detached values.

With ``rho_bar = c_bar = infinity`` and on-policy data (all ratios 1) ``v_s`` is the
n-step bootstrapped return ``sum_t gamma^(t-s) r_t + gamma^(T-s) V(x_T)``
(:func:`course_lib.pg.discounted_returns` with ``bootstrap``); with all ratios 1 the
clipping never bites either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray


@dataclass(frozen=True)
class VTraceReturns:
    """What :func:`vtrace` returns, all ``[T, B]`` float64.

    Attributes:
        vs: value targets ``v_s`` (03.2), regress ``V(x_s)`` towards them.
        pg_advantages: ``min(pg_rho_bar, pi/mu)_s (r_s + gamma_s v_{s+1} - V(x_s))`` (03.4).
        rhos: the untruncated ratios ``pi/mu``.
        clipped_rhos: ``min(rho_bar, pi/mu)`` (03.1).
        cs: ``min(c_bar, pi/mu)`` (03.1), the trace coefficients.
    """

    vs: NDArray[np.float64]
    pg_advantages: NDArray[np.float64]
    rhos: NDArray[np.float64]
    clipped_rhos: NDArray[np.float64]
    cs: NDArray[np.float64]


def _as_time_major(name: str, x: ArrayLike, shape: tuple[int, ...] | None) -> NDArray[np.float64]:
    a = np.asarray(x, dtype=np.float64)
    if shape is None:
        if a.ndim != 2:
            raise ValueError(f"{name} must be time-major [T, B], got shape {a.shape}")
    elif a.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (like log_rhos), got {a.shape}")
    return a


def truncated_ratios(log_rhos: ArrayLike, threshold: float | None) -> NDArray[np.float64]:
    """``min(threshold, exp(log_rhos))`` (03.1); ``threshold=None`` leaves them untruncated."""
    rhos = np.exp(np.asarray(log_rhos, dtype=np.float64))
    return rhos if threshold is None else np.minimum(threshold, rhos)


def vtrace(
    log_rhos: ArrayLike,
    discounts: ArrayLike,
    rewards: ArrayLike,
    values: ArrayLike,
    bootstrap_value: ArrayLike,
    clip_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> VTraceReturns:
    r"""V-trace targets and advantages of a batch of trajectories (03.1)-(03.4).

    Espeholt et al. 2018, arXiv 1802.01561, eq. (1) and section 4.2.

    Args:
        log_rhos: ``[T, B]`` ``log pi(a_t|x_t) - log mu(a_t|x_t)``.
        discounts: ``[T, B]`` ``gamma_t``: ``gamma``, or 0 where the episode ended at ``t``.
        rewards: ``[T, B]`` ``r_t``, received after the action at ``t``.
        values: ``[T, B]`` ``V(x_t)`` under the learner's current value function.
        bootstrap_value: ``[B]`` ``V(x_T)``, the state after the last step.
        clip_rho_threshold: ``rho_bar`` (None: no truncation).
        clip_c_threshold: ``c_bar`` (None: no truncation).
        clip_pg_rho_threshold: ``pg_rho_bar`` for the advantage (None: no truncation).

    Returns:
        :class:`VTraceReturns`.
    """
    log_rhos = _as_time_major("log_rhos", log_rhos, None)
    shape = log_rhos.shape
    discounts = _as_time_major("discounts", discounts, shape)
    rewards = _as_time_major("rewards", rewards, shape)
    values = _as_time_major("values", values, shape)
    bootstrap = np.asarray(bootstrap_value, dtype=np.float64)
    if bootstrap.shape != shape[1:]:
        raise ValueError(f"bootstrap_value must be [B] = {shape[1:]}, got {bootstrap.shape}")
    if None not in (clip_rho_threshold, clip_c_threshold) and clip_rho_threshold < clip_c_threshold:  # type: ignore[operator]
        raise ValueError(f"V-trace needs rho_bar >= c_bar, got {clip_rho_threshold} < {clip_c_threshold}")

    rhos = np.exp(log_rhos)
    clipped_rhos = truncated_ratios(log_rhos, clip_rho_threshold)
    cs = truncated_ratios(log_rhos, clip_c_threshold)
    values_tp1 = np.concatenate([values[1:], bootstrap[None]], axis=0)  # V(x_{t+1})
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)  # delta_t V

    vs_minus_v = np.zeros_like(values)
    acc = np.zeros(shape[1:], dtype=np.float64)  # v_{t+1} - V(x_{t+1}); 0 at t + 1 = T
    for t in range(shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc  # (03.3)
        vs_minus_v[t] = acc
    vs = vs_minus_v + values

    vs_tp1 = np.concatenate([vs[1:], bootstrap[None]], axis=0)  # v_{s+1}, v_T = V(x_T)
    pg_rhos = truncated_ratios(log_rhos, clip_pg_rho_threshold)
    pg_advantages = pg_rhos * (rewards + discounts * vs_tp1 - values)  # (03.4)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, rhos=rhos, clipped_rhos=clipped_rhos, cs=cs)


def discounts_from_dones(dones: ArrayLike, gamma: float) -> NDArray[np.float64]:
    """``gamma_t = gamma * (1 - done_t)``: ``[T, B]`` discounts that cut at episode ends."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    return gamma * (1.0 - np.asarray(dones, dtype=np.float64))
