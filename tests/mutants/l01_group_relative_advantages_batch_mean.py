"""Bug (lesson 01, group_relative_advantages): one mean and std over the whole batch, not per group."""

import numpy as np

EXPECTED = "got 0.25, expected 0.5"


def group_relative_advantages(rewards, normalize_std=True, eps=1e-6):
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean()
    return centred / (r.std() + eps) if normalize_std else centred
