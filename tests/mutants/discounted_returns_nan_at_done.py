"""Bug: "cuts" the return by dividing by (1 - done), which gives NaN at every episode end."""

import numpy as np

EXPECTED = "contains nan at index 0; expected finite values"


def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    r = np.asarray(rewards, dtype=np.float64)
    d = np.asarray(dones, dtype=np.float64)
    out = np.zeros(len(r))
    g = float(bootstrap)
    with np.errstate(all="ignore"):
        for t in range(len(r) - 1, -1, -1):
            g = r[t] + gamma * g * (1.0 - d[t]) / (1.0 - d[t])
            out[t] = g
    return out
