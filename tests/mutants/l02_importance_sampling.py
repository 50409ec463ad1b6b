"""Planted bugs for lesson 02 (`exercises/src/02_importance_sampling.py`).

Each `Mutant` is the real solution cell of `function` with `old` replaced by `new` (see
`tests/conftest.py`), and `expected` a fragment the grader's message must contain.
`tests/test_grading_lesson02.py` checks that every one is caught with that message.
"""

from __future__ import annotations

from conftest import Mutant

# ---------------------------------------------------------------------------------------
# Exercise 1 · is_estimate
# ---------------------------------------------------------------------------------------

IS_ESTIMATE = [
    # w = mu / pi: the ratio upside down
    Mutant(
        "is_estimate",
        "inverted_weights",
        old="np.asarray(logp_target, dtype=np.float64) - np.asarray(logp_behaviour, dtype=np.float64)",
        new="np.asarray(logp_behaviour, dtype=np.float64) - np.asarray(logp_target, dtype=np.float64)",
        expected="the weights are inverted",
    ),
    # divides by the sum of the weights (self-normalised IS, biased)
    Mutant(
        "is_estimate",
        "self_normalised",
        old="np.mean(np.exp(log_w) * f)",
        new="np.sum(np.exp(log_w) * f) / np.sum(np.exp(log_w))",
        expected="the self-normalised estimate",
    ),
    # sums instead of averaging
    Mutant(
        "is_estimate",
        "sum_not_mean",
        old="np.mean(np.exp(log_w) * f)",
        new="np.sum(np.exp(log_w) * f)",
        expected="summed over the samples",
    ),
    # averages the weights and forgets the values
    Mutant(
        "is_estimate",
        "weights_only",
        old="np.mean(np.exp(log_w) * f)",
        new="np.mean(np.exp(log_w))",
        expected="the values are missing",
    ),
    # exponentiates each log-probability: exp(-1000) = 0, so 0 / 0
    Mutant(
        "is_estimate",
        "ratio_of_probabilities",
        old="log_w = np.asarray(logp_target, dtype=np.float64) - np.asarray(logp_behaviour, dtype=np.float64)\n"
        "    return float(np.mean(np.exp(log_w) * f))",
        new="w = np.exp(np.asarray(logp_target, dtype=np.float64))"
        " / np.exp(np.asarray(logp_behaviour, dtype=np.float64))\n"
        "    return float(np.mean(w * f))",
        expected="returned nan: exp(-1000) is 0.0",
    ),
    # returns the per-sample terms, not their mean
    Mutant(
        "is_estimate",
        "returns_array",
        old="return float(np.mean(np.exp(log_w) * f))",
        new="return np.exp(log_w) * f",
        expected="is an array of shape (5,); expected one number",
    ),
    # wrong mechanism (issue 45): clamps the log-ratio to [-20, 20] "for safety", as some
    # trainers do: a weight above e^20 is truncated, and the estimate is biased (02.4, not 02.2)
    Mutant(
        "is_estimate",
        "clamped_log_ratio",
        old="return float(np.mean(np.exp(log_w) * f))",
        new="return float(np.mean(np.exp(np.clip(log_w, -20.0, 20.0)) * f))",
        expected="capping or clamping the weight (or its log) is truncated IS (02.4)",
    ),
]

# ---------------------------------------------------------------------------------------
# Exercise 2 · effective_sample_size
# ---------------------------------------------------------------------------------------

EFFECTIVE_SAMPLE_SIZE = [
    # sum w^2 / (sum w)^2, upside down
    Mutant(
        "effective_sample_size",
        "inverse",
        old="float(total * total / squares)",
        new="float(squares / (total * total))",
        expected="the inverse of the ESS",
    ),
    # forgets to square the sum
    Mutant(
        "effective_sample_size",
        "sum_not_squared",
        old="float(total * total / squares)",
        new="float(total / squares)",
        expected="the sum of the weights must be squared",
    ),
    # returns ESS / N
    Mutant(
        "effective_sample_size",
        "divided_by_n",
        old="float(total * total / squares)",
        new="float(total * total / squares / len(w))",
        expected="that is ESS / N",
    ),
    # mean of the squares in the denominator
    Mutant(
        "effective_sample_size",
        "mean_of_squares",
        old="squares = np.sum(w * w)",
        new="squares = np.mean(w * w)",
        expected="not their mean",
    ),
    # no guard for all-zero weights: 0 / 0 = nan
    Mutant(
        "effective_sample_size",
        "nan_for_zeros",
        old="    if squares == 0:\n        return 0.0\n",
        new="",
        expected="all-zero weights give 0.0, not NaN",
    ),
]

# ---------------------------------------------------------------------------------------
# Exercise 3 · expected_ess_fraction
# ---------------------------------------------------------------------------------------

EXPECTED_ESS_FRACTION = [
    # returns E_mu[w^2] = 1 + chi2, forgetting to invert it
    Mutant(
        "expected_ess_fraction",
        "not_inverted",
        old="return float(1.0 / second_moment)",
        new="return float(second_moment)",
        expected="that is E_mu[w^2] = 1 + chi2 itself",
    ),
    # w = mu / pi: the ratio upside down
    Mutant(
        "expected_ess_fraction",
        "inverted_weights",
        old="np.exp(2.0 * log_pi - log_mu)",
        new="np.exp(2.0 * log_mu - log_pi)",
        expected="the weights are inverted",
    ),
    # the bound exp(-KL) of eq. 02.7 instead of the exact fraction
    Mutant(
        "expected_ess_fraction",
        "kl_bound",
        old="second_moment = np.sum(np.exp(2.0 * log_pi - log_mu))",
        new="second_moment = np.exp(np.sum(np.exp(log_pi) * (log_pi - log_mu)))",
        expected="that is the bound exp(-KL(pi || mu))",
    ),
    # E_pi[w^2] = sum_k pi_k w_k^2: averaged over the target, not the sampler
    Mutant(
        "expected_ess_fraction",
        "expectation_under_pi",
        old="np.exp(2.0 * log_pi - log_mu)",
        new="np.exp(3.0 * log_pi - 2.0 * log_mu)",
        expected="w^2 was averaged over pi",
    ),
    # 1 / chi2 instead of 1 / (1 + chi2)
    Mutant(
        "expected_ess_fraction",
        "one_over_chi2",
        old="return float(1.0 / second_moment)",
        new="return float(1.0 / (second_moment - 1.0))",
        expected="divided by chi2",
    ),
    # a mean over the actions instead of the sum
    Mutant(
        "expected_ess_fraction",
        "mean_not_sum",
        old="np.sum(np.exp(2.0 * log_pi - log_mu))",
        new="np.mean(np.exp(2.0 * log_pi - log_mu))",
        expected="averaged the terms over the K actions",
    ),
    # probabilities instead of log-probabilities: exp(-800) = 0, so 0 / 0
    Mutant(
        "expected_ess_fraction",
        "probability_space",
        old="np.exp(2.0 * log_pi - log_mu)",
        new="np.exp(log_pi) ** 2 / np.exp(log_mu)",
        expected="exp(-800) is 0.0 in floating point",
    ),
]

# ---------------------------------------------------------------------------------------
# Exercise 4 · token_and_sequence_ratios
# ---------------------------------------------------------------------------------------

TOKEN_AND_SEQUENCE_RATIOS = [
    # the geometric mean of the token ratios (length-normalised), not their product
    Mutant(
        "token_and_sequence_ratios",
        "geometric_mean",
        old="np.exp(log_ratio.sum(axis=1))",
        new="np.exp(log_ratio.sum(axis=1) / real.sum(axis=1))",
        expected="geometric mean",
    ),
    # ignores the mask: padding leaks into both results
    Mutant(
        "token_and_sequence_ratios",
        "ignores_mask",
        old="np.where(real, new - old, 0.0)",
        new="new - old",
        expected="include the padding",
    ),
    # mu / pi per token
    Mutant(
        "token_and_sequence_ratios",
        "inverted_ratio",
        old="np.where(real, new - old, 0.0)",
        new="np.where(real, old - new, 0.0)",
        expected="the token ratios are inverted",
    ),
    # token ratio 0 at padding instead of 1
    Mutant(
        "token_and_sequence_ratios",
        "zero_at_padding",
        old="return np.exp(log_ratio), ",
        new="return np.where(real, np.exp(log_ratio), 0.0), ",
        expected="are 0 at padding; expected 1.0",
    ),
    # ratio of probabilities: exp(-800) = 0, so 0 / 0
    Mutant(
        "token_and_sequence_ratios",
        "ratio_of_probabilities",
        old="np.where(real, new - old, 0.0)",
        new="np.where(real, np.log(np.exp(new) / np.exp(old)), 0.0)",
        expected="contains NaN or inf",
    ),
    # sums over the batch axis instead of time
    Mutant(
        "token_and_sequence_ratios",
        "sum_over_time_axis",
        old="log_ratio.sum(axis=1)",
        new="log_ratio.sum(axis=0)",
        expected="has shape (5,); expected shape (3,)",
    ),
    # wrong mechanism (issue 45): rebuilds the mask from each row's length, assuming the real
    # tokens come first: wrong for a prompt before the answer or a hole inside it
    Mutant(
        "token_and_sequence_ratios",
        "mask_from_lengths",
        old="real = np.asarray(mask, dtype=bool)",
        new="real = np.arange(new.shape[1])[None, :] < np.asarray(mask, dtype=bool).sum(axis=1)[:, None]",
        expected="a mask rebuilt from each row's length assumes the real tokens come first",
    ),
    # wrong mechanism (issue 45): masks by multiplying: -inf or NaN where mask is False survive
    # (0 * inf is NaN)
    Mutant(
        "token_and_sequence_ratios",
        "mask_by_multiplying",
        old="log_ratio = np.where(real, new - old, 0.0)",
        new="log_ratio = (new - old) * real",
        expected="multiplying by a 0 mask keeps them (0 * inf is NaN)",
    ),
]

# ---------------------------------------------------------------------------------------
# Exercise 5 · clipped_surrogate_loss
# ---------------------------------------------------------------------------------------

CLIPPED_SURROGATE_LOSS = [
    # max of the two terms instead of the min
    Mutant(
        "clipped_surrogate_loss",
        "max_not_min",
        old="torch.min(unclipped, clipped)",
        new="torch.max(unclipped, clipped)",
        expected="PPO takes the minimum",
    ),
    # keeps only the clipped term
    Mutant(
        "clipped_surrogate_loss",
        "clipped_term_only",
        old="torch.min(unclipped, clipped)",
        new="clipped",
        expected="the clipped term alone",
    ),
    # returns the surrogate, not minus it
    Mutant(
        "clipped_surrogate_loss",
        "no_minus",
        old="return -torch.min(",
        new="return torch.min(",
        expected="minimise minus the surrogate",
    ),
    # gradient flows into logp_old
    Mutant(
        "clipped_surrogate_loss",
        "old_not_detached",
        old="logp_new - logp_old.detach()",
        new="logp_new - logp_old",
        expected="a gradient flowed into `logp_old`",
    ),
    # gradient flows into the advantages
    Mutant(
        "clipped_surrogate_loss",
        "advantages_not_detached",
        old="adv = advantages.detach()",
        new="adv = advantages",
        expected="a gradient flowed into `advantages`",
    ),
    # sums instead of averaging
    Mutant(
        "clipped_surrogate_loss", "sum_not_mean", old=".mean()", new=".sum()", expected="expected -mean(A) = -0.625"
    ),
    # ratio mu / pi
    Mutant(
        "clipped_surrogate_loss",
        "inverted_ratio",
        old="torch.exp(logp_new - logp_old.detach())",
        new="torch.exp(logp_old.detach() - logp_new)",
        expected="points the wrong way",
    ),
    # clips the advantage instead of the ratio
    Mutant(
        "clipped_surrogate_loss",
        "clips_advantage",
        old="torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv",
        new="ratio * torch.clamp(adv, 1.0 - eps, 1.0 + eps)",
        expected="expected -mean(A) = -0.625",
    ),
    # returns a float (.item()), not a tensor
    Mutant(
        "clipped_surrogate_loss",
        "returns_float",
        old="torch.min(unclipped, clipped).mean()",
        new="torch.min(unclipped, clipped).mean().item()",
        expected="expected a torch tensor",
    ),
    # hard-codes eps = 0.2
    Mutant(
        "clipped_surrogate_loss",
        "ignores_eps",
        old="torch.clamp(ratio, 1.0 - eps, 1.0 + eps)",
        new="torch.clamp(ratio, 0.8, 1.2)",
        expected="clip the ratio to [1 - eps, 1 + eps]",
    ),
    # wrong mechanism (issue 45): the ratio as a ratio of probabilities: right for moderate
    # log-probabilities, 0 / 0 once they underflow
    Mutant(
        "clipped_surrogate_loss",
        "ratio_of_probabilities",
        old="ratio = torch.exp(logp_new - logp_old.detach())",
        new="ratio = torch.exp(logp_new) / torch.exp(logp_old.detach())",
        expected="exp(logp_new) / exp(logp_old) is 0 / 0",
    ),
]

MUTANTS: list[Mutant] = (
    IS_ESTIMATE + EFFECTIVE_SAMPLE_SIZE + EXPECTED_ESS_FRACTION + TOKEN_AND_SEQUENCE_RATIOS + CLIPPED_SURROGATE_LOSS
)
