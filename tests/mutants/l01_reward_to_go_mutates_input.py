"""Bug (lesson 01, reward_to_go): accumulates into the caller's `rewards` array."""

import numpy as np

EXPECTED = "changed the `rewards` array it was given"


def reward_to_go(rewards, dones, gamma):
    r = np.asarray(rewards, dtype=np.float64)  # no copy when given a float64 array
    d = np.asarray(dones, dtype=np.float64)
    for t in reversed(range(r.shape[0] - 1)):
        r[t] = r[t] + gamma * (1.0 - d[t]) * r[t + 1]
    return r.copy()
