"""Bug (lesson 01, surrogate_loss): normalises over the batch axis (dim 0) instead of the actions."""

import torch

EXPECTED = "random case 1 (N=1, K=2"


def surrogate_loss(logits, actions, advantages):
    logp = torch.log_softmax(logits, dim=0).gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return -(advantages.detach() * logp).mean()
