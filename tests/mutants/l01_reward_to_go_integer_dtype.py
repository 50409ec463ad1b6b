"""Bug (lesson 01, reward_to_go): output allocated like the input, so integer rewards truncate."""

import numpy as np

EXPECTED = "has dtype int64; expected a float array"


def reward_to_go(rewards, dones, gamma):
    r = np.asarray(rewards)
    d = np.asarray(dones, dtype=np.float64)
    out = np.zeros_like(r)
    running = np.zeros(r.shape[1:])
    for t in reversed(range(r.shape[0])):
        running = r[t] + gamma * (1.0 - d[t]) * running
        out[t] = running
    return out
