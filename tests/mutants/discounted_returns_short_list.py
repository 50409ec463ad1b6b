"""Bug: loop bound off by one and a list returned: a list of length T - 1."""

EXPECTED = "is a list of length 3; expected a numpy array of shape (4,)"


def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    out = []
    g = float(bootstrap)
    for t in range(len(rewards) - 2, -1, -1):
        g = rewards[t] + gamma * (1 - dones[t]) * g
        out.insert(0, g)
    return out
