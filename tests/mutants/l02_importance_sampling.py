"""Planted bugs for lesson 02's exercises, as small edits of the real solutions.

Each entry is ``(function, old, new, expected)``: the solution of ``function`` (taken from
``exercises/src/02_importance_sampling.py`` by ``tests/conftest.py``) with ``old``
replaced by ``new`` (``old`` must occur exactly once), and a fragment ``expected`` that the
grader's message must contain. ``tests/test_grading_lesson02.py`` runs them all.
"""

MUTANTS: list[tuple[str, str, str, str]] = [
    # is_estimate
    ("is_estimate",
     "np.asarray(logp_target, dtype=np.float64) - np.asarray(logp_behaviour, dtype=np.float64)",
     "np.asarray(logp_behaviour, dtype=np.float64) - np.asarray(logp_target, dtype=np.float64)",
     "the weights are inverted"),
    ("is_estimate", "np.mean(np.exp(log_w) * f)", "np.sum(np.exp(log_w) * f) / np.sum(np.exp(log_w))",
     "the self-normalised estimate"),
    ("is_estimate", "np.mean(np.exp(log_w) * f)", "np.sum(np.exp(log_w) * f)", "summed over the samples"),
    ("is_estimate", "np.mean(np.exp(log_w) * f)", "np.mean(np.exp(log_w))", "the values are missing"),
    ("is_estimate",
     "log_w = np.asarray(logp_target, dtype=np.float64) - np.asarray(logp_behaviour, dtype=np.float64)\n"
     "    return float(np.mean(np.exp(log_w) * f))",
     "w = np.exp(np.asarray(logp_target, dtype=np.float64)) / np.exp(np.asarray(logp_behaviour, dtype=np.float64))\n"
     "    return float(np.mean(w * f))",
     "returned nan: exp(-1000) is 0.0"),
    ("is_estimate", "return float(np.mean(np.exp(log_w) * f))", "return np.exp(log_w) * f",
     "is an array of shape (5,); expected one number"),
    # truncated_weights
    ("truncated_weights", "np.minimum(log_w, np.log(c))", "np.maximum(log_w, np.log(c))",
     "truncation only caps weights above c"),
    ("truncated_weights", "np.minimum(log_w, np.log(c))", "np.clip(log_w, -np.log(c), np.log(c))",
     "truncation is one-sided"),
    ("truncated_weights", "np.minimum(log_w, np.log(c))", "np.minimum(log_w, c)", "compare log w with log c"),
    ("truncated_weights", "np.minimum(log_w, np.log(c))", "np.minimum(log_w, 0.0)", "capped at 1, not at c"),
    ("truncated_weights", "np.exp(np.minimum(log_w, np.log(c)))", "np.minimum(log_w, np.log(c))",
     "these are log-weights"),
    ("truncated_weights", "np.exp(np.minimum(log_w, np.log(c)))", "np.minimum(np.exp(log_w), c)",
     "overflow encountered in exp"),
    # effective_sample_size
    ("effective_sample_size", "float(total * total / squares)", "float(squares / (total * total))",
     "the inverse of the ESS"),
    ("effective_sample_size", "float(total * total / squares)", "float(total / squares)",
     "the sum of the weights must be squared"),
    ("effective_sample_size", "float(total * total / squares)", "float(total * total / squares / len(w))",
     "that is ESS / N"),
    ("effective_sample_size", "squares = np.sum(w * w)", "squares = np.mean(w * w)",
     "not their mean"),
    ("effective_sample_size", "    if squares == 0:\n        return 0.0\n", "",
     "all-zero weights give 0.0, not NaN"),
    # token_and_sequence_ratios
    ("token_and_sequence_ratios", "np.exp(log_ratio.sum(axis=1))",
     "np.exp(log_ratio.sum(axis=1) / real.sum(axis=1))", "geometric mean"),
    ("token_and_sequence_ratios", "np.where(real, new - old, 0.0)", "new - old", "include the padding"),
    ("token_and_sequence_ratios", "np.where(real, new - old, 0.0)", "np.where(real, old - new, 0.0)",
     "the token ratios are inverted"),
    ("token_and_sequence_ratios", "return np.exp(log_ratio), ", "return np.where(real, np.exp(log_ratio), 0.0), ",
     "are 0 at padding; expected 1.0"),
    ("token_and_sequence_ratios", "np.where(real, new - old, 0.0)",
     "np.where(real, np.log(np.exp(new) / np.exp(old)), 0.0)", "contains NaN or inf"),
    ("token_and_sequence_ratios", "log_ratio.sum(axis=1)", "log_ratio.sum(axis=0)",
     "has shape (5,); expected shape (3,)"),
    # clipped_surrogate_loss
    ("clipped_surrogate_loss", "torch.min(unclipped, clipped)", "torch.max(unclipped, clipped)",
     "PPO takes the minimum"),
    ("clipped_surrogate_loss", "torch.min(unclipped, clipped)", "clipped", "the clipped term alone"),
    ("clipped_surrogate_loss", "return -torch.min(", "return torch.min(", "minimise minus the surrogate"),
    ("clipped_surrogate_loss", "logp_new - logp_old.detach()", "logp_new - logp_old",
     "a gradient flowed into `logp_old`"),
    ("clipped_surrogate_loss", "adv = advantages.detach()", "adv = advantages",
     "a gradient flowed into `advantages`"),
    ("clipped_surrogate_loss", ".mean()", ".sum()", "expected -mean(A) = -0.625"),
    ("clipped_surrogate_loss", "torch.exp(logp_new - logp_old.detach())", "torch.exp(logp_old.detach() - logp_new)",
     "points the wrong way"),
    ("clipped_surrogate_loss", "torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv",
     "ratio * torch.clamp(adv, 1.0 - eps, 1.0 + eps)", "expected -mean(A) = -0.625"),
    ("clipped_surrogate_loss", "torch.min(unclipped, clipped).mean()", "torch.min(unclipped, clipped).mean().item()",
     "expected a torch tensor"),
    ("clipped_surrogate_loss", "torch.clamp(ratio, 1.0 - eps, 1.0 + eps)", "torch.clamp(ratio, 0.8, 1.2)",
     "clip the ratio to [1 - eps, 1 + eps]"),
]
