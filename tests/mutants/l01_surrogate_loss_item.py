"""Bug (lesson 01, surrogate_loss): returns a Python float, which autograd cannot differentiate."""

import torch

EXPECTED = "expected a torch tensor"


def surrogate_loss(logits, actions, advantages):
    logp = torch.log_softmax(logits, dim=-1).gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return -(advantages.detach() * logp).mean().item()
