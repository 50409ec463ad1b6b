"""Bug: ignores `dones`, so returns leak across episode boundaries."""

import numpy as np

EXPECTED = "got 3.439, expected 1.9"


def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros(len(r))
    g = float(bootstrap)
    for t in range(len(r) - 1, -1, -1):
        g = r[t] + gamma * g
        out[t] = g
    return out
