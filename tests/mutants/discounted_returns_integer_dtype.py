"""Bug: output allocated with np.zeros_like(rewards), so integer rewards give integer returns."""

import numpy as np

EXPECTED = "expected a float array"


def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    r = np.asarray(rewards)
    out = np.zeros_like(r)
    g = float(bootstrap)
    for t in range(len(r) - 1, -1, -1):
        g = r[t] + gamma * (1 - dones[t]) * g
        out[t] = g
    return out
