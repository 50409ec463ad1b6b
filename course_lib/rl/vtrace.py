r"""V-trace: off-policy value targets and policy-gradient advantages (lesson 03).

Espeholt et al. 2018, *IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures*, arXiv 1802.01561, section 4. Actors act with a behaviour
policy ``mu`` (the learner's weights of some updates ago); the learner updates ``pi``.
With truncated importance weights::

    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))                              (03.1)
    c_i   = min(c_bar,   pi(a_i|x_i) / mu(a_i|x_i)),   rho_bar >= c_bar

the V-trace target of the value at ``x_s`` (the paper's n-step sum, run to the end of
the unroll: ``n = T - s``) is::

    v_s = V(x_s) + sum_{t=s}^{T-1} ( prod_{i=s}^{t-1} gamma_i c_i ) delta_t V    (03.2)
    delta_t V = rho_t ( r_t + gamma_t V(x_{t+1}) - V(x_t) )

where the empty product (``t = s``) is 1: the product runs to ``t - 1``, not ``t`` (the
paper's common off-by-one). Computed backwards in one pass::

    v_s - V(x_s) = delta_s V + gamma_s c_s ( v_{s+1} - V(x_{s+1}) ),   v_T = V(x_T)   (03.3)

and the policy-gradient advantage, with its own threshold ``pg_rho_bar``::

    A_s = min(pg_rho_bar, pi(a_s|x_s) / mu(a_s|x_s)) ( r_s + gamma_s v_{s+1} - V(x_s) )    (03.4)
    v_T = V(x_T)

These are lesson 03's equations, copied here in plain text; ``tests/test_equations.py``
fails if a copy stops agreeing with the lesson's.

Conventions (rlax ``vtrace.py``, TorchBeast ``vtrace.py``): pure functions on one batch
of trajectories, time-major ``[T, B]``; ``discounts[t] = gamma * (1 - done_t)`` is 0
where an episode ended at step ``t``, so nothing leaks across episodes;
``bootstrap_value [B]`` is ``V(x_T)``, the value of the state after the unroll, and
``v_T = V(x_T)``. Everything is float64 numpy: targets are constants for the loss
(no gradient flows through them), so the learner calls these on detached values.

With ``rho_bar = c_bar = infinity`` and on-policy data (all ratios 1) ``v_s`` is the
n-step bootstrapped return ``sum_t gamma^(t-s) r_t + gamma^(T-s) V(x_T)``
(:func:`course_lib.rl.pg.discounted_returns` with ``bootstrap``); with all ratios 1 the
clipping never bites either.
"""

from __future__ import annotations

import math
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


def vtrace_recursion(
    deltas: NDArray[np.float64], discounts: NDArray[np.float64], cs: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``v_s - V(x_s)`` for every ``s``, by the backward recursion (03.3); all ``[T, B]``.

    ``deltas[s]`` is ``delta_s V = rho_s (r_s + gamma_s V(x_{s+1}) - V(x_s))``, ``discounts[s]``
    is ``gamma_s`` (0 where an episode ended), ``cs[s]`` is ``c_s``; the recursion starts
    from ``v_T - V(x_T) = 0``.
    """
    vs_minus_v = np.zeros_like(deltas)
    acc = np.zeros(deltas.shape[1:])  # v_{s+1} - V(x_{s+1}); 0 after the last step
    for s in reversed(range(deltas.shape[0])):
        acc = deltas[s] + discounts[s] * cs[s] * acc  # (03.3)
        vs_minus_v[s] = acc
    return vs_minus_v


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
    if clip_rho_threshold is not None and clip_c_threshold is not None and clip_rho_threshold < clip_c_threshold:
        raise ValueError(f"V-trace needs rho_bar >= c_bar, got {clip_rho_threshold} < {clip_c_threshold}")

    rhos = np.exp(log_rhos)
    clipped_rhos = truncated_ratios(log_rhos, clip_rho_threshold)
    cs = truncated_ratios(log_rhos, clip_c_threshold)
    values_tp1 = np.concatenate([values[1:], bootstrap[None]], axis=0)  # V(x_{t+1})
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)  # delta_t V

    vs = values + vtrace_recursion(deltas, discounts, cs)

    vs_tp1 = np.concatenate([vs[1:], bootstrap[None]], axis=0)  # v_{s+1}, v_T = V(x_T)
    pg_rhos = truncated_ratios(log_rhos, clip_pg_rho_threshold)
    pg_advantages = pg_rhos * (rewards + discounts * vs_tp1 - values)  # (03.4)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, rhos=rhos, clipped_rhos=clipped_rhos, cs=cs)


def discounts_from_dones(dones: ArrayLike, gamma: float) -> NDArray[np.float64]:
    """``gamma_t = gamma * (1 - done_t)``: ``[T, B]`` discounts that cut at episode ends."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    return gamma * (1.0 - np.asarray(dones, dtype=np.float64))


def vtrace_naive(
    log_rhos: ArrayLike,
    discounts: ArrayLike,
    rewards: ArrayLike,
    values: ArrayLike,
    bootstrap_value: ArrayLike,
    rho_bar: float | None = 1.0,
    c_bar: float | None = 1.0,
    *,
    inclusive: bool = False,
    trace_discount: bool = True,
) -> NDArray[np.float64]:
    """The V-trace targets (03.2) written as naively as possible: the test oracle of :func:`vtrace`.

    ``v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))``
    (Espeholt et al. 2018, eq. 1) with per-step discounts ``gamma_i`` (0 at episode ends)
    and ``V(x_T) = bootstrap_value``: one explicit sum per ``(s, b)`` and one explicit
    product per term, O(T^2), in plain Python floats. It shares no code with
    :func:`vtrace` (TorchBeast's ``vtrace_test.py`` idea); lesson 03's grader uses it as
    its oracle. ``None`` thresholds mean no truncation. ``inclusive=True`` runs the
    product to ``t`` instead of ``t - 1`` (the common off-by-one) and
    ``trace_discount=False`` leaves ``gamma_i`` out of the product: those bugs, computed,
    so that tests and grader messages can name them.

    Returns:
        ``[T, B]`` float64 targets ``v_s``.
    """
    lr = np.asarray(log_rhos, dtype=np.float64)
    disc = np.asarray(discounts, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    boot = np.asarray(bootstrap_value, dtype=np.float64)
    n_t, n_b = lr.shape
    out = np.zeros((n_t, n_b))
    for b in range(n_b):
        value = [float(v[t, b]) for t in range(n_t)] + [float(boot[b])]
        ratio = [math.exp(float(lr[t, b])) for t in range(n_t)]
        rho = [x if rho_bar is None else min(rho_bar, x) for x in ratio]
        c = [x if c_bar is None else min(c_bar, x) for x in ratio]
        for s in range(n_t):
            total = value[s]
            for t in range(s, n_t):
                product = 1.0
                for i in range(s, t + 1 if inclusive else t):
                    product *= (float(disc[i, b]) if trace_discount else 1.0) * c[i]
                delta = rho[t] * (float(r[t, b]) + float(disc[t, b]) * value[t + 1] - value[t])
                total += product * delta
            out[s, b] = total
    return out
