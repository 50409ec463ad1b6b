"""Bug (lesson 01, group_relative_advantages): no eps, so a group of equal rewards gives 0/0 = NaN."""

import numpy as np

EXPECTED = "contains nan at index [0, 0]"


def group_relative_advantages(rewards, normalize_std=True, eps=1e-6):
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean(axis=1, keepdims=True)
    if not normalize_std:
        return centred
    with np.errstate(invalid="ignore", divide="ignore"):
        return centred / r.std(axis=1, keepdims=True)
