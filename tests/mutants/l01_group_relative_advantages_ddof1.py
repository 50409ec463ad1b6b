"""Bug (lesson 01, group_relative_advantages): sample std (ddof = 1) instead of the population std."""

import numpy as np

EXPECTED = "got -0.707107, expected -1"


def group_relative_advantages(rewards, normalize_std=True, eps=1e-6):
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean(axis=1, keepdims=True)
    return centred / (r.std(axis=1, ddof=1, keepdims=True) + eps) if normalize_std else centred
