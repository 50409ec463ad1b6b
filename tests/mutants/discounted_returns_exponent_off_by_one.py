"""Bug: discount exponent off by one, G_t = sum_k gamma^(k-t+1) r_k (r_t itself discounted)."""

import numpy as np

EXPECTED = "got 0.75, expected 1.5"


def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    r = np.asarray(rewards, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    out = np.zeros(len(r))
    g = float(bootstrap)
    for t in range(len(r) - 1, -1, -1):
        g = gamma * (r[t] + (1.0 - d[t]) * g)
        out[t] = g
    return out
