"""A categorical bandit: the smallest problem where the policy gradient is known exactly (lesson 01).

A softmax policy ``pi = softmax(z)`` over ``K`` arms; arm ``k`` pays reward 1 with
probability ``mu_k`` and 0 otherwise (a "verifiable" reward: right or wrong). Then::

    J(z)      = sum_k pi_k mu_k                         (01.1, one step)
    grad_z J  = pi * (mu - J)                           (exact, elementwise)
    g_hat     = (1/N) sum_i (r_i - b) (onehot(a_i) - pi),   a_i ~ pi, r_i ~ Bernoulli(mu_{a_i})

The score-function estimate ``g_hat`` (:func:`course_lib.rl.pg.score_function_gradient`)
is unbiased for any constant ``b``; :meth:`CategoricalBandit.estimate_errors` measures
how fast it converges to the exact gradient as ``N`` grows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from course_lib.rl.pg import score_function_gradient, softmax


@dataclass(frozen=True)
class CategoricalBandit:
    """``K`` Bernoulli arms.

    Attributes:
        success_probs: ``[K]`` probability ``mu_k`` that arm ``k`` pays 1.
    """

    success_probs: tuple[float, ...]

    def __post_init__(self) -> None:
        mu = np.asarray(self.success_probs, dtype=np.float64)
        if mu.ndim != 1 or mu.size < 2 or np.any((mu < 0) | (mu > 1)):
            raise ValueError(f"success_probs must be >= 2 probabilities in [0, 1], got {self.success_probs}")

    @property
    def mu(self) -> NDArray[np.float64]:
        """``[K]`` success probabilities as an array."""
        return np.asarray(self.success_probs, dtype=np.float64)

    @property
    def n_arms(self) -> int:
        return len(self.success_probs)

    def expected_reward(self, logits: ArrayLike) -> float:
        """``J(z) = sum_k softmax(z)_k mu_k`` (eq. 01.1 for one step)."""
        return float(softmax(logits) @ self.mu)

    def exact_gradient(self, logits: ArrayLike) -> NDArray[np.float64]:
        """``grad_z J = pi * (mu - J)``: differentiate ``sum_k pi_k mu_k`` through the softmax."""
        pi = softmax(logits)
        return pi * (self.mu - pi @ self.mu)

    def pull(
        self, logits: ArrayLike, n: int, rng: np.random.Generator
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Sample ``n`` arms from ``softmax(logits)`` and their 0/1 rewards.

        Returns:
            ``(arms [n] int64, rewards [n] float64)``.
        """
        pi = softmax(logits)
        arms = rng.choice(self.n_arms, size=n, p=pi).astype(np.int64)
        rewards = (rng.random(n) < self.mu[arms]).astype(np.float64)
        return arms, rewards

    def estimate(
        self, logits: ArrayLike, n: int, rng: np.random.Generator, baseline: float = 0.0
    ) -> NDArray[np.float64]:
        """One score-function estimate of ``grad_z J`` from ``n`` pulls (eq. 01.2, 01.5)."""
        arms, rewards = self.pull(logits, n, rng)
        return score_function_gradient(logits, arms, rewards - baseline)

    def estimates(
        self, logits: ArrayLike, n: int, n_repeats: int, rng: np.random.Generator, baseline: float = 0.0
    ) -> NDArray[np.float64]:
        """``[n_repeats, K]`` independent estimates, each from ``n`` pulls (vectorised :meth:`estimate`).

        Row ``r`` is ``(1/n) sum_i w_ri onehot(a_ri) - pi * mean_i w_ri`` with
        ``w = reward - baseline``, the same number :func:`score_function_gradient` gives.
        """
        pi = softmax(logits)
        k = self.n_arms
        cdf = np.cumsum(pi)
        arms = np.minimum(np.searchsorted(cdf, rng.random((n_repeats, n)), side="right"), k - 1)
        w = (rng.random((n_repeats, n)) < self.mu[arms]).astype(np.float64) - baseline
        offsets = (np.arange(n_repeats) * k)[:, None]
        weighted = np.bincount((arms + offsets).ravel(), weights=w.ravel(), minlength=n_repeats * k)
        return weighted.reshape(n_repeats, k) / n - pi[None, :] * w.mean(axis=1, keepdims=True)

    def estimate_errors(
        self,
        logits: ArrayLike,
        sample_sizes: Sequence[int],
        n_repeats: int,
        seed: int,
        baseline: float = 0.0,
    ) -> NDArray[np.float64]:
        """Root-mean-square error ``sqrt(E||g_hat - grad J||^2)`` for each sample size.

        Args:
            logits: ``[K]`` policy logits.
            sample_sizes: the ``N`` values to try.
            n_repeats: independent estimates per ``N`` (the RMS is over these).
            seed: seeds one ``numpy`` generator for the whole sweep.
            baseline: constant ``b`` subtracted from every reward.

        Returns:
            ``[len(sample_sizes)]`` RMS errors.
        """
        rng = np.random.default_rng(seed)
        exact = self.exact_gradient(logits)
        out = np.empty(len(sample_sizes))
        for i, n in enumerate(sample_sizes):
            est = self.estimates(logits, int(n), n_repeats, rng, baseline)
            out[i] = float(np.sqrt(np.mean(np.sum((est - exact) ** 2, axis=1))))
        return out


def finite_difference_gradient(
    f: Callable[[NDArray[np.float64]], float], x: ArrayLike, h: float = 1e-5
) -> NDArray[np.float64]:
    """Central differences ``(f(x + h e_k) - f(x - h e_k)) / 2h`` for every coordinate ``k``.

    An independent check of an analytic gradient (error ``O(h^2)``).
    """
    x0 = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x0)
    for k in range(x0.size):
        e = np.zeros_like(x0)
        e.flat[k] = h
        out.flat[k] = (f(x0 + e) - f(x0 - e)) / (2 * h)
    return out
