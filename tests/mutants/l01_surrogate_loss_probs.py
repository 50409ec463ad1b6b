"""Bug (lesson 01, surrogate_loss): weights the probability, not the log-probability."""

import torch

EXPECTED = "expected -(1 * ln 0.5 + 3 * ln 0.5) / 2 = 1.38629"


def surrogate_loss(logits, actions, advantages):
    p = torch.softmax(logits, dim=-1).gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return -(advantages.detach() * p).mean()
