"""Bug (lesson 01, group_relative_advantages): eps inside the square root, sqrt(var + eps)."""

import numpy as np

EXPECTED = "got -0.57735, expected -0.5"


def group_relative_advantages(rewards, normalize_std=True, eps=1e-6):
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean(axis=1, keepdims=True)
    return centred / np.sqrt(r.var(axis=1, keepdims=True) + eps) if normalize_std else centred
