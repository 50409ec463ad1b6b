"""Lesson 07's loss and per-token bookkeeping for sequences that mix policy versions.

A sequence sampled while the weights changed in flight holds tokens from several
policies: token ``t`` of sequence ``i`` was sampled by version ``v_it`` with log-prob
``log mu_it``. The trainer, at version ``u``, weighs every token by its own truncated
ratio (eq. 07.1-07.2), with the group-relative advantage of its sequence (eq. 07.3)::

    w_it = min(c, exp(log pi_u(y_it) - log mu_it))                        (07.1)
    L    = -(1 / #tokens) sum_{i,t real} sg[w_it] * A_i * log pi_u(y_it)   (07.2)
    A_i  = (r_i - mean_group r) / (std_group r + eps)                      (07.3)
    lag_it = u - v_it,   ESS / N = (sum w)^2 / (N sum w^2)                 (07.4)

The trainer's batch comes from :func:`pad_groups`: finished groups of answers (as the
generators send them) padded into ``[N, T]`` tensors, one row per answer, group after group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from course_lib.lm.task import PAD
from course_lib.rl.importance import ess_from_log_weights
from course_lib.rl.pg import group_relative_advantages


def pad_groups(groups: list[dict[str, Any]], pad: int = PAD) -> dict[str, Any]:
    """Right-padded ``[N, T]`` tensors of the groups' answers, one row per answer, group after group:
    ``tokens`` (prompt + answer, then ``pad``), behaviour log-probs ``logp``, ``versions``, the answer
    ``mask``; and ``rewards [n_groups, G]`` (float64).

    A group is ``{"prompt": [...], "answers": [{"answer", "logp", "versions", "reward"}, ...]}``:
    ``logp`` and ``versions`` hold one entry per answer token (``log mu_it`` and ``v_it``).
    """
    rows = [(a, g) for g in groups for a in g["answers"]]
    n_t = max(len(g["prompt"]) + len(a["answer"]) for a, g in rows)
    tokens = torch.full((len(rows), n_t), pad, dtype=torch.long)
    logp = torch.zeros(len(rows), n_t)
    versions = torch.zeros(len(rows), n_t, dtype=torch.long)
    mask = torch.zeros(len(rows), n_t, dtype=torch.bool)
    for i, (a, g) in enumerate(rows):
        p, n = len(g["prompt"]), len(a["answer"])
        tokens[i, :p] = torch.as_tensor(g["prompt"])
        tokens[i, p : p + n] = torch.as_tensor(a["answer"])
        logp[i, p : p + n] = torch.as_tensor(a["logp"])
        versions[i, p : p + n] = torch.as_tensor(a["versions"])
        mask[i, p : p + n] = True
    rewards = np.array([[a["reward"] for a in g["answers"]] for g in groups], dtype=np.float64)
    return {"tokens": tokens, "logp": logp, "versions": versions, "mask": mask, "rewards": rewards}


def group_token_advantages(rewards: ArrayLike, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Eq. 07.3 broadcast to tokens: ``rewards [n_groups, G]``, ``mask [n_groups * G, T]``
    (sequences group after group) -> ``[n_groups * G, T]`` float32, 0 outside the mask."""
    adv = group_relative_advantages(rewards, eps=eps).reshape(-1)
    if adv.shape[0] != mask.shape[0]:
        raise ValueError(f"rewards hold {adv.shape[0]} sequences, mask {mask.shape[0]}: mask must be [n_groups * G, T]")
    return torch.as_tensor(adv, dtype=torch.float32)[:, None] * mask.float()


def token_lags(trainer_version: int, versions: ArrayLike, mask: ArrayLike) -> NDArray[np.int64]:
    """Eq. 07.4: ``trainer_version - versions`` on real tokens, 0 elsewhere, ``[N, T]`` int64.

    Raises:
        ValueError: a real token's version is newer than the trainer's (a bookkeeping bug).
    """
    v = np.asarray(versions, dtype=np.int64)
    m = np.asarray(mask, dtype=bool)
    if v.shape != m.shape:
        raise ValueError(f"versions {v.shape} and mask {m.shape} must have the same shape")
    if (v[m] > trainer_version).any():
        raise ValueError(f"a token has version {int(v[m].max())}, newer than the trainer's {trainer_version}")
    return np.where(m, trainer_version - v, 0).astype(np.int64)


def pipeline_loss(
    logp_new: torch.Tensor,
    logp_behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    c: float,
    correct: bool = True,
) -> torch.Tensor:
    """Eq. 07.1-07.2, all inputs ``[N, T]``: one truncated importance weight per token, a
    constant (no gradient through it), the mean over the real tokens. ``correct=False``
    drops the correction (every weight 1: plain REINFORCE on whatever the sampler produced).
    Equals ``course_lib.rl.importance.truncated_is_loss(..., level="token")``. The padding
    (mask 0) may hold any log-prob, even -inf: the real tokens are selected before any
    arithmetic (a mask applied by multiplication alone would turn -inf * 0 into nan)."""
    real = mask.bool()
    logp_new = torch.where(real, logp_new, 0.0)
    logp_behaviour = torch.where(real, logp_behaviour, 0.0)
    log_ratio = logp_new.detach() - logp_behaviour  # log pi_u - log mu, per token
    w = torch.clamp(torch.exp(log_ratio), max=c) if correct else torch.ones_like(log_ratio)
    m = mask.to(logp_new.dtype)
    return -(w * advantages * logp_new * m).sum() / m.sum()


def token_ess_fraction(log_ratios: ArrayLike, mask: ArrayLike) -> float:
    """ESS / N of the real tokens' untruncated weights (eq. 07.4); 1 when on-policy."""
    lr = np.asarray(log_ratios, dtype=np.float64)[np.asarray(mask, dtype=bool)]
    return float(ess_from_log_weights(lr)) / max(lr.size, 1)
