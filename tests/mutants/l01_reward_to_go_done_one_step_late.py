"""Bug (lesson 01, reward_to_go): cuts the return with the NEXT step's done flag."""

import numpy as np

EXPECTED = "is wrong at index [0, 0]: got 1.0, expected 1.5"


def reward_to_go(rewards, dones, gamma):
    r = np.asarray(rewards, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    out = np.zeros_like(r)
    running = np.zeros(r.shape[1:])
    for t in reversed(range(r.shape[0])):
        cut = d[t + 1] if t + 1 < r.shape[0] else np.zeros(r.shape[1:])
        running = r[t] + gamma * (1.0 - cut) * running
        out[t] = running
    return out
