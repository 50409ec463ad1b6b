"""Returns and policy-gradient estimators (lessons 00-01).

Conventions (rlax-style, time-major): ``rewards[t]`` is the reward received after the
action at step ``t``; ``dones[t]`` is 1 when the episode ended at step ``t`` (terminated
or truncated), so nothing after ``t`` belongs to its return.

Lesson 00's equations: (00.1)-(00.2) the return ``G_t`` of every step:
:func:`discounted_returns`; (00.3) the return of every finished episode:
:func:`finished_episode_returns`.

Lesson 01's equations, by number:

- (01.1) ``J(theta) = E_{tau ~ pi_theta}[R(tau)]``
- (01.2) score-function / REINFORCE estimator ``g = E[sum_t grad log pi(a_t|s_t) R(tau)]``:
  :func:`score_function_gradient`, :func:`episode_returns`
- (01.3) reward-to-go ``G_t``: :func:`discounted_returns`
- (01.4) softmax score ``onehot(a) - pi``: :func:`categorical_score`
- (01.5) baseline ``G_t - b``: :func:`normalize_advantages`
- (01.6) group-relative advantage: :func:`group_relative_advantages`
- (01.7) surrogate loss: :func:`surrogate_loss`
- (01.8) estimator variance: :func:`gradient_variance`

torch is imported only inside :func:`surrogate_loss`, so the numpy parts stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    import torch


def discounted_returns(
    rewards: ArrayLike,
    dones: ArrayLike,
    gamma: float,
    bootstrap: ArrayLike = 0.0,
) -> NDArray[np.float64]:
    r"""Discounted return of every step, cut at episode ends.

    Lesson 00's equations (00.1) and (00.2), with ``d_t`` = ``dones[t]``::

        G_t = sum_{k=t}^{e(t)} gamma^(k-t) r_k                          (00.1)
        G_t = r_t + gamma (1 - d_t) G_{t+1},    G_T = 0                 (00.2)

    where ``e(t)`` is the last step of ``t``'s episode (Sutton & Barto, eqs. 3.11 and 3.9). With
    ``bootstrap``, ``G_T = bootstrap`` instead: the value of the state after the last
    step, used only if that step did not end an episode.

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


def finished_episode_returns(rewards: ArrayLike, dones: ArrayLike) -> NDArray[np.float64]:
    r"""The return of every episode that ended in the buffer, in order: what learning curves plot.

    Lesson 00's equation (00.3)::

        R_j = sum_{t=s_j}^{e_j} r_t = G_{s_j}|_{gamma = 1}              (00.3)

    for each episode ``j`` that ends at a step ``e_j`` with ``done = 1``; ``s_j`` is its
    first step (0, or the step after the previous episode's end). The sum is undiscounted
    (the "episodic return" CleanRL logs as ``charts/episodic_return``); it equals
    :func:`discounted_returns` with ``gamma = 1`` at each episode's first step. An episode
    still running after the last step has no return yet and is left out.

    Args:
        rewards: ``[T]`` rewards, episodes back to back.
        dones: ``[T]``, 1 where an episode ended at that step.

    Returns:
        ``[n_finished]`` float64, one return per ``done``, in time order.
    """
    r = np.asarray(rewards, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    if r.shape != d.shape or r.ndim != 1:
        raise ValueError(f"rewards {r.shape} and dones {d.shape} must both have shape [T]")
    ends = np.flatnonzero(d > 0)
    starts = np.concatenate([[0], ends + 1])[: len(ends)].astype(np.int64)
    return np.array([r[s : e + 1].sum() for s, e in zip(starts, ends, strict=True)], dtype=np.float64)


# ---------------------------------------------------------------------------------------
# Lesson 01: the score-function (REINFORCE) estimator and the advantages it is fed
# ---------------------------------------------------------------------------------------


def episode_returns(rewards: ArrayLike, dones: ArrayLike, gamma: float) -> NDArray[np.float64]:
    r"""The whole episode's return ``R(tau)``, assigned to every step of that episode.

    Equation (01.2) weights every ``grad log pi(a_t|s_t)`` of an episode by the same
    number, the discounted return from the episode's first step::

        R(tau)_t = G_{s(t)} = sum_{k=s(t)}^{e(t)} gamma^(k - s(t)) r_k

    where ``s(t)`` / ``e(t)`` are the first / last steps of ``t``'s episode (Williams,
    1992). Reward-to-go (01.3) replaces it by ``G_t`` = :func:`discounted_returns`.

    Args:
        rewards: ``[T]`` or ``[T, B]`` rewards.
        dones: same shape, 1 where an episode ended at that step.
        gamma: discount in ``[0, 1]``.

    Returns:
        ``[T]`` or ``[T, B]`` float64: ``G`` of each step's episode start.
    """
    g = discounted_returns(rewards, dones, gamma)
    d = np.asarray(dones, dtype=np.float64)
    out = np.empty_like(g)
    for t in range(g.shape[0]):
        if t == 0:
            out[t] = g[t]
        else:
            starts = d[t - 1] > 0  # the previous step ended an episode: a new one starts at t
            out[t] = np.where(starts, g[t], out[t - 1])
    return out


def softmax(logits: ArrayLike, axis: int = -1) -> NDArray[np.float64]:
    """Numerically stable softmax ``pi_k = exp(z_k) / sum_j exp(z_j)`` along ``axis``."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def categorical_score(logits: ArrayLike, actions: ArrayLike) -> NDArray[np.float64]:
    r"""Score of a softmax (categorical) policy: ``grad_z log pi(a) = onehot(a) - pi``.

    Equation (01.4). For logits ``z`` and ``pi = softmax(z)``,
    ``d log pi_a / d z_k = 1[k = a] - pi_k``.

    Args:
        logits: ``[K]`` logits shared by all samples, or ``[N, K]`` one row per sample.
        actions: ``[N]`` integer actions in ``[0, K)``.

    Returns:
        ``[N, K]`` float64 scores, one row per sample.
    """
    z = np.asarray(logits, dtype=np.float64)
    a = np.asarray(actions)
    if a.ndim != 1:
        raise ValueError(f"actions must be [N], got shape {a.shape}")
    if z.ndim == 1:
        z = np.broadcast_to(z, (a.shape[0], z.shape[0]))
    if z.ndim != 2 or z.shape[0] != a.shape[0]:
        raise ValueError(f"logits must be [K] or [N, K] with N = {a.shape[0]}, got shape {np.shape(logits)}")
    if a.size and (a.min() < 0 or a.max() >= z.shape[1]):
        raise ValueError(f"actions must lie in [0, {z.shape[1]}), got min {a.min()} max {a.max()}")
    score = -softmax(z, axis=-1)
    score[np.arange(a.shape[0]), a] += 1.0
    return score


def score_function_gradient(logits: ArrayLike, actions: ArrayLike, weights: ArrayLike) -> NDArray[np.float64]:
    r"""The score-function (REINFORCE) estimate of ``grad_z E_{a~pi}[f(a)]``.

    Equation (01.2) for one softmax distribution::

        g_hat = (1/N) sum_i w_i * (onehot(a_i) - pi),    a_i ~ pi = softmax(z)

    with ``w_i = f(a_i)`` (the reward) or ``f(a_i) - b`` (with a baseline, eq. 01.5).
    Unbiased for ``grad_z E[f]`` when ``b`` does not depend on ``a_i``.

    Args:
        logits: ``[K]`` logits of the sampling distribution.
        actions: ``[N]`` sampled actions.
        weights: ``[N]`` weight of each sample (reward, advantage).

    Returns:
        ``[K]`` float64 gradient estimate (zeros when ``N = 0``).
    """
    w = np.asarray(weights, dtype=np.float64)
    score = categorical_score(logits, actions)
    if w.shape != (score.shape[0],):
        raise ValueError(f"weights must be [N] = ({score.shape[0]},), got shape {w.shape}")
    if score.shape[0] == 0:
        return np.zeros(score.shape[1])
    return (w[:, None] * score).mean(axis=0)


def normalize_advantages(advantages: ArrayLike, eps: float = 1e-8) -> NDArray[np.float64]:
    """``(A - mean(A)) / (std(A) + eps)`` over all elements (population std, ddof = 0).

    The batch-mean baseline plus a rescaling that keeps the step size independent of
    the reward scale (common practice in REINFORCE/PPO implementations).
    """
    a = np.asarray(advantages, dtype=np.float64)
    if a.size == 0:
        return a.copy()
    return (a - a.mean()) / (a.std() + eps)


def group_relative_advantages(
    rewards: ArrayLike, normalize_std: bool = True, eps: float = 1e-6, ddof: int = 0
) -> NDArray[np.float64]:
    r"""Group-relative advantages (GRPO, Shao et al. 2024, arXiv 2402.03300, eq. 01.6).

    ``rewards[i, j]`` is the reward of answer ``j`` of the ``G`` answers sampled for
    prompt ``i``. The group's mean is the baseline; GRPO divides by its std::

        A_ij = (r_ij - mean_j r_ij) / (std_j r_ij + eps)     (normalize_std=True)
        A_ij =  r_ij - mean_j r_ij                           (normalize_std=False, Dr. GRPO)

    DeepSeekMath does not say which std. ``ddof = 1`` (the sample std, ``torch.std``'s
    default) is what TRL's GRPOTrainer (eps 1e-4) and verl's
    ``compute_grpo_outcome_advantage`` (eps 1e-6) compute; ``ddof = 0`` (numpy's default,
    the population std) is this function's default. A group whose answers all get the
    same reward has all-zero advantages: it carries no learning signal.

    Args:
        rewards: ``[B, G]`` rewards, one row per prompt.
        normalize_std: divide by the group's std.
        eps: added to the std (avoids 0/0 when all rewards of a group are equal).
        ddof: 0 for the population std, 1 for the sample std (needs ``G >= 2``).

    Returns:
        ``[B, G]`` float64 advantages.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"rewards must be [B, G] (prompts x answers per prompt), got shape {r.shape}")
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 (population std) or 1 (sample std), got {ddof}")
    if r.shape[1] == 0:
        return r.copy()
    centred = r - r.mean(axis=1, keepdims=True)
    if not normalize_std:
        return centred
    if r.shape[1] <= ddof:
        raise ValueError(f"the sample std (ddof = 1) needs G >= 2 answers per prompt, got G = {r.shape[1]}")
    return centred / (r.std(axis=1, ddof=ddof, keepdims=True) + eps)


def leave_one_out_advantages(rewards: ArrayLike) -> NDArray[np.float64]:
    r"""Leave-one-out (RLOO) advantages (Ahmadian et al. 2024, arXiv 2402.14740).

    Each answer's baseline is the mean reward of the *other* ``G - 1`` answers to its prompt::

        A_ij = r_ij - 1/(G - 1) sum_{k != j} r_ik  =  G/(G - 1) (r_ij - mean_j r_ij)

    The baseline does not contain the answer's own reward, so the estimator stays unbiased
    (``E[g] = grad J``), where the plain group mean shrinks it by ``1 - 1/G``.

    Args:
        rewards: ``[B, G]`` rewards, one row per prompt, ``G >= 2``.

    Returns:
        ``[B, G]`` float64 advantages.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] < 2:
        raise ValueError(f"rewards must be [B, G] with G >= 2 answers per prompt, got shape {r.shape}")
    n_g = r.shape[1]
    return r - (r.sum(axis=1, keepdims=True) - r) / (n_g - 1)


def surrogate_loss(logits: torch.Tensor, actions: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    r"""The loss whose gradient is minus the policy-gradient estimate (eq. 01.7).

    ::

        L(theta) = -(1/N) sum_i A_i * log pi_theta(a_i | s_i)
        grad L   = -(1/N) sum_i A_i * grad log pi_theta(a_i | s_i) = -g_hat

    ``A_i`` is a constant (detached): the estimator weights the score by it, it does
    not differentiate through it. Minimising ``L`` with any optimizer ascends ``J``.

    Args:
        logits: ``[N, K]`` policy logits for the ``N`` visited states (requires grad).
        actions: ``[N]`` integer actions taken.
        advantages: ``[N]`` weights ``A_i`` (reward-to-go, minus a baseline, ...).

    Returns:
        scalar tensor.
    """
    import torch

    if logits.ndim != 2:
        raise ValueError(f"logits must be [N, K], got shape {tuple(logits.shape)}")
    n = logits.shape[0]
    if tuple(actions.shape) != (n,) or tuple(advantages.shape) != (n,):
        raise ValueError(
            f"actions {tuple(actions.shape)} and advantages {tuple(advantages.shape)} must be [N] = ({n},)"
        )
    logp = torch.log_softmax(logits, dim=-1).gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return -(advantages.detach().to(logp.dtype) * logp).mean()


@dataclass(frozen=True)
class VarianceStats:
    """How noisy a gradient estimator is, from ``M`` independent estimates.

    Attributes:
        n_samples: ``M``, the number of independent estimates.
        mean_sq_norm: ``||mean g||^2``, the squared length of the average estimate.
        total_variance: ``sum_j Var[g_j]`` (ddof = 1): the expected squared distance
            of one estimate from the average, ``E||g - E g||^2``.
        relative_variance: ``total_variance / ||mean g||^2``, scale free (noise-to-signal).
        cosine_to_reference: mean over estimates of ``cos(g, reference)``; ``nan``
            without a reference. 1 means every single estimate points the right way.
    """

    n_samples: int
    mean_sq_norm: float
    total_variance: float
    relative_variance: float
    cosine_to_reference: float


def gradient_variance(samples: ArrayLike, reference: ArrayLike | None = None) -> VarianceStats:
    """Variance statistics of ``M`` gradient estimates (eq. 01.8).

    Args:
        samples: ``[M, D]`` estimates (each flattened to ``D`` numbers), ``M >= 2``.
        reference: ``[D]`` the exact gradient, if known (for the cosine).

    Returns:
        :class:`VarianceStats`.
    """
    g = np.asarray(samples, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] < 2:
        raise ValueError(f"samples must be [M, D] with M >= 2, got shape {g.shape}")
    mean = g.mean(axis=0)
    mean_sq = float(mean @ mean)
    total = float(g.var(axis=0, ddof=1).sum())
    rel = total / mean_sq if mean_sq > 0 else float("inf")
    cos = float("nan")
    if reference is not None:
        ref = np.asarray(reference, dtype=np.float64).reshape(-1)
        if ref.shape != (g.shape[1],):
            raise ValueError(f"reference must be [D] = ({g.shape[1]},), got shape {ref.shape}")
        norms = np.linalg.norm(g, axis=1) * np.linalg.norm(ref)
        cos = float(np.mean(np.where(norms > 0, (g @ ref) / np.where(norms > 0, norms, 1.0), 0.0)))
    return VarianceStats(g.shape[0], mean_sq, total, rel, cos)
