"""Bug: resets the running return after the wrong step (after storing G_t instead of before)."""

import numpy as np

EXPECTED = "episode ends mid-trajectory"


def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    r = np.asarray(rewards, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    out = np.zeros(len(r))
    g = float(bootstrap)
    for t in range(len(r) - 1, -1, -1):
        g = r[t] + gamma * g
        out[t] = g
        if d[t]:
            g = 0.0
    return out
