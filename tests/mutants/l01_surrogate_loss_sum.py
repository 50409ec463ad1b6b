"""Bug (lesson 01, surrogate_loss): sums over the samples instead of averaging."""

import torch

EXPECTED = "= 2.77259; expected -(1 * ln 0.5 + 3 * ln 0.5) / 2 = 1.38629"


def surrogate_loss(logits, actions, advantages):
    logp = torch.log_softmax(logits, dim=-1).gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return -(advantages.detach() * logp).sum()
