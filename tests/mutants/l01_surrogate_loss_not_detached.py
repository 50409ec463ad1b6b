"""Bug (lesson 01, surrogate_loss): lets the gradient flow into the advantages."""

import torch

EXPECTED = "backpropagated into `advantages`"


def surrogate_loss(logits, actions, advantages):
    logp = torch.log_softmax(logits, dim=-1).gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return -(advantages * logp).mean()
