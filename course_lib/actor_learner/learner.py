r"""The IMPALA learner: the V-trace actor-critic loss and one update (lesson 03).

Espeholt et al. 2018 (arXiv 1802.01561), section 4.2: with V-trace targets ``v_s`` and
advantages ``A_s`` (:func:`course_lib.rl.vtrace.vtrace`) treated as constants, each step
``s`` of a batch contributes::

    policy gradient   -A_s log pi(a_s|x_s)                                   (03.5)
    baseline          baseline_cost * 1/2 (v_s - V(x_s))^2
    entropy bonus     -entropy_cost * H(pi(.|x_s))

"No correction" is the same loss with every ``log(pi/mu)`` set to 0: n-step returns
and unweighted advantages, as if the stale data were on-policy.

:func:`loss_terms` works on time-major ``[T, N]`` tensors of any number of independent
columns, so the multi-process learner (:class:`Learner`) and the single-process
controlled-lag ablation (:mod:`course_lib.pipeline.lag`, many agents at once) share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from course_lib.actor_learner.timers import Timings
from course_lib.rl.vtrace import VTraceReturns, discounts_from_dones, vtrace


@dataclass(frozen=True)
class LossConfig:
    """Coefficients and thresholds of the IMPALA loss."""

    gamma: float = 0.99
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    rho_bar: float = 1.0
    c_bar: float = 1.0
    pg_rho_bar: float = 1.0


@dataclass
class LossTerms:
    """Per-step terms of the loss (03.5), each ``[T, N]``, and the V-trace output."""

    pg: torch.Tensor
    baseline: torch.Tensor
    entropy: torch.Tensor
    vtrace: VTraceReturns
    log_rhos: NDArray[np.float64]

    def total(self, cfg: LossConfig) -> torch.Tensor:
        """The scalar loss: every term averaged over all ``T x N`` steps."""
        return self.pg.mean() + cfg.baseline_cost * self.baseline.mean() - cfg.entropy_cost * self.entropy.mean()


def loss_terms(
    logits: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    behaviour_logp: torch.Tensor,
    rewards: torch.Tensor | NDArray[np.float64],
    dones: torch.Tensor | NDArray[np.bool_] | NDArray[np.float64],
    cfg: LossConfig,
    correct: bool | torch.Tensor = True,
) -> LossTerms:
    """The IMPALA loss terms of a time-major batch.

    Args:
        logits: ``[T + 1, N, K]`` the learner's logits at ``x_0 .. x_T`` (the last row is unused).
        values: ``[T + 1, N]`` the learner's ``V(x_0) .. V(x_T)``; ``V(x_T)`` bootstraps.
        actions: ``[T, N]`` actions taken.
        behaviour_logp: ``[T, N]`` ``log mu(a_t|x_t)`` recorded by the actor.
        rewards, dones: ``[T, N]`` (dones as bools or 0/1 floats).
        cfg: coefficients and thresholds.
        correct: V-trace (True), no correction (False), or a ``[N]`` bool mask per column.

    Returns:
        :class:`LossTerms`.
    """
    n_t = actions.shape[0]
    if logits.shape[:2] != (n_t + 1, actions.shape[1]) or values.shape != logits.shape[:2]:
        raise ValueError(
            f"logits {tuple(logits.shape)} and values {tuple(values.shape)} must be [T + 1, N(, K)] "
            f"with [T, N] = {tuple(actions.shape)}"
        )
    logp_all = torch.log_softmax(logits[:n_t], dim=-1)
    target_logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    log_rhos = (target_logp.detach() - behaviour_logp).double().numpy()
    mask = np.asarray(correct.numpy() if isinstance(correct, torch.Tensor) else correct, dtype=np.float64)
    log_rhos = log_rhos * mask
    vt = vtrace(
        log_rhos=log_rhos,
        discounts=discounts_from_dones(np.asarray(dones), cfg.gamma),
        rewards=np.asarray(rewards, dtype=np.float64),
        values=values[:n_t].detach().double().numpy(),
        bootstrap_value=values[n_t].detach().double().numpy(),
        clip_rho_threshold=cfg.rho_bar,
        clip_c_threshold=cfg.c_bar,
        clip_pg_rho_threshold=cfg.pg_rho_bar,
    )
    vs = torch.from_numpy(vt.vs).to(values.dtype)
    advantages = torch.from_numpy(vt.pg_advantages).to(values.dtype)
    return LossTerms(
        pg=-advantages * target_logp,
        baseline=0.5 * (vs - values[:n_t]) ** 2,
        entropy=-(logp_all.exp() * logp_all).sum(-1),
        vtrace=vt,
        log_rhos=log_rhos,
    )


def rollout_lag(learner_version: int, versions: torch.Tensor | NDArray[np.int64]) -> NDArray[np.int64]:
    """Policy lag of each rollout column: ``learner_version - min_t versions[t, b]``.

    The learner about to apply update ``learner_version + 1`` holds weights of version
    ``learner_version``; a column acted with versions ``versions[:, b]`` (which may change
    mid-unroll when weights arrive); its lag is counted from the oldest.

    Args:
        learner_version: updates the learner's weights reflect.
        versions: ``[T, B]`` weight version that chose each action.

    Returns:
        ``[B]`` int64 lags, each ``>= 0``.

    Raises:
        ValueError: if some version is newer than the learner's (a bookkeeping bug).
    """
    v = np.asarray(versions, dtype=np.int64)
    if v.ndim != 2 or v.shape[0] == 0:
        raise ValueError(f"versions must be [T, B] with T >= 1, got shape {v.shape}")
    if (v > learner_version).any():
        raise ValueError(f"a rollout has version {int(v.max())}, newer than the learner's {learner_version}")
    return learner_version - v.min(axis=0)


LEARNER_PHASES = ("wait for batch", "learn", "publish weights")


class Learner:
    """The learner's model, optimizer and version; :meth:`update` applies one batch.

    Args:
        model: the :class:`~course_lib.actor_learner.model.ActorCritic` to train.
        lr: Adam learning rate.
        cfg: loss coefficients and thresholds.
        correct: use V-trace (True) or no correction (False).
        max_grad_norm: clip the gradient's global norm (IMPALA used 40).
    """

    def __init__(
        self, model: nn.Module, lr: float, cfg: LossConfig, correct: bool = True, max_grad_norm: float = 40.0
    ) -> None:
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.cfg = cfg
        self.correct = correct
        self.max_grad_norm = max_grad_norm
        self.version = 0
        self.timings = Timings(LEARNER_PHASES)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One gradient step on ``batch`` (``[T(+1), N, ...]`` as :meth:`RolloutBuffers.batch`
        gives); returns scalar metrics. The version goes up by one."""
        with self.timings.phase("learn"):
            logits, values = self.model(batch["obs"])
            terms = loss_terms(
                logits,
                values,
                batch["actions"],
                batch["behaviour_logp"],
                batch["rewards"].numpy(),
                batch["dones"].numpy(),
                self.cfg,
                self.correct,
            )
            loss = terms.total(self.cfg)
            self.optimizer.zero_grad()
            loss.backward()
            grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
            self.optimizer.step()
            self.version += 1
        return {
            "loss": float(loss.detach()),
            "pg_loss": float(terms.pg.mean().detach()),
            "baseline_loss": float(terms.baseline.mean().detach()),
            "entropy": float(terms.entropy.mean().detach()),
            "grad_norm": grad_norm,
            "mean_rho": float(terms.vtrace.rhos.mean()),
            "clipped_rho_fraction": float((terms.vtrace.rhos > self.cfg.rho_bar).mean()),
        }
