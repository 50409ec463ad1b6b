"""Bug: computes in place in the caller's `rewards` array (right values, clobbered input)."""

import numpy as np

EXPECTED = "changed the `rewards` array it was given"


def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    r = np.asarray(rewards, dtype=np.float64)  # no copy when rewards is already float64
    d = np.asarray(dones, dtype=np.float64)
    if len(r):
        r[-1] = r[-1] + gamma * (1.0 - d[-1]) * bootstrap
    for t in range(len(r) - 2, -1, -1):
        r[t] = r[t] + gamma * (1.0 - d[t]) * r[t + 1]
    return r.copy()
