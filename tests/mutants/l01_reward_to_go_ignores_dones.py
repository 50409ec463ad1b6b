"""Bug (lesson 01, reward_to_go): ignores `dones`, so returns leak across episode ends."""

import numpy as np

EXPECTED = "got 1.875, expected 1.5"


def reward_to_go(rewards, dones, gamma):
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(r)
    running = np.zeros(r.shape[1:])
    for t in reversed(range(r.shape[0])):
        running = r[t] + gamma * running
        out[t] = running
    return out
