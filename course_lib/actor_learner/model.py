"""The actor-critic network that actors, the inference server and the learner share (lesson 03)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    """Two tanh hidden layers of width ``hidden``."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, out_dim)
    )


class ActorCritic(nn.Module):
    """``obs [..., obs_dim] -> (logits [..., n_actions], value [...])``: separate policy and value MLPs."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.policy = mlp(obs_dim, hidden, n_actions)
        self.value = mlp(obs_dim, hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(obs).squeeze(-1)


def sample_actions(logits: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(actions [N], log mu(actions) [N])`` sampled from ``softmax(logits [N, K])``."""
    logp = torch.log_softmax(logits, dim=-1)
    actions = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return actions, logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
