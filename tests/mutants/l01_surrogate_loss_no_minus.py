"""Bug (lesson 01, surrogate_loss): forgets the minus sign, so minimising it descends J."""

import torch

EXPECTED = "check the minus sign"


def surrogate_loss(logits, actions, advantages):
    logp = torch.log_softmax(logits, dim=-1).gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return (advantages.detach() * logp).mean()
