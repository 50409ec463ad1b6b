"""Bug (lesson 01, reinforce_update): normalises with torch's .std(), whose default is the sample std (ddof = 1)."""

import numpy as np
import torch

EXPECTED = "the std is the sample std (ddof = 1"


def _reward_to_go(rewards, dones, gamma):
    r = np.asarray(rewards, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    out = np.zeros_like(r)
    running = np.zeros(r.shape[1:])
    for t in reversed(range(r.shape[0])):
        running = r[t] + gamma * (1.0 - d[t]) * running
        out[t] = running
    return out


def _loss(policy, obs, actions, adv):
    obs_t = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
    obs_t = obs_t.reshape(-1, obs_t.shape[-1])
    actions_t = torch.as_tensor(np.asarray(actions)).reshape(-1).long()
    adv_t = torch.as_tensor(np.asarray(adv).reshape(-1), dtype=torch.float32)
    logp = torch.log_softmax(policy(obs_t), dim=-1).gather(1, actions_t.unsqueeze(1)).squeeze(1)
    return -(adv_t * logp).mean()


def reinforce_update(policy, optimizer, obs, actions, rewards, dones, gamma):
    g = torch.as_tensor(_reward_to_go(rewards, dones, gamma))
    adv = ((g - g.mean()) / (g.std() + 1e-8)).numpy()
    loss = _loss(policy, obs, actions, adv)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
