"""Bug (lesson 01, group_relative_advantages): always divides by the std, ignoring normalize_std."""

import numpy as np

EXPECTED = "got 0.999998, expected 0.5"


def group_relative_advantages(rewards, normalize_std=True, eps=1e-6):
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + eps)
