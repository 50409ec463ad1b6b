"""Bug (lesson 01, reward_to_go): treats the rollout as [B, T] (time on axis 1)."""

import numpy as np

EXPECTED = "is wrong at index"


def reward_to_go(rewards, dones, gamma):
    r = np.asarray(rewards, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    out = np.zeros_like(r)
    running = np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * (1.0 - d[:, t]) * running
        out[:, t] = running
    return out
