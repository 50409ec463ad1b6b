"""Planted bugs for lesson 02 (`exercises/src/02_importance_sampling.py`).

Each `Mutant` is the real solution cell of `function` with `old` replaced by `new` (see
`tests/conftest.py`), and `expected` a fragment the grader's message must contain.
`tests/test_grading_lesson02.py` checks that every one is caught with that message.
"""

from __future__ import annotations

from conftest import Mutant

# ---------------------------------------------------------------------------------------
# Exercise 1 · tis_ppo_loss
# ---------------------------------------------------------------------------------------

_LOG_R = "torch.clamp(torch.where(real, logp_new - old, 0.0), -20.0, 20.0)"
_LOG_V = "torch.clamp(torch.where(real, old - logp_behaviour.detach(), 0.0), -20.0, log_c)"
_SURR = "torch.min(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)"
_MEAN = "-per_token.sum() / real.sum()"
_MASKED_BLOCK = """    log_v = torch.clamp(torch.where(real, old - logp_behaviour.detach(), 0.0), -20.0, log_c)
    ratio = torch.exp(log_r)
    adv = advantages.detach()[:, None]
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)
    per_token = torch.where(real, torch.exp(log_v) * surrogate, 0.0)"""
_MULTIPLIED_BLOCK = """    log_v = torch.clamp((old - logp_behaviour.detach()) * real, -20.0, log_c)
    ratio = torch.exp(log_r)
    adv = advantages.detach()[:, None]
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)
    per_token = torch.exp(log_v) * surrogate * real"""

TIS_PPO_LOSS = [
    # wrong mechanism: the weight built from logp_new and differentiated
    Mutant(
        "tis_ppo_loss",
        "differentiated_weight",
        old=_LOG_V,
        new="torch.clamp(torch.where(real, logp_new - logp_behaviour.detach(), 0.0), -20.0, log_c)",
        expected="the weight was built from logp_new and differentiated",
    ),
    # the weight not detached from logp_old: a gradient flows into the constant
    Mutant(
        "tis_ppo_loss",
        "weight_not_detached",
        old="old - logp_behaviour.detach()",
        new="logp_old - logp_behaviour.detach()",
        expected="a gradient flowed into `logp_old`",
    ),
    # cap on the wrong ratio: pi_theta / mu (detached)
    Mutant(
        "tis_ppo_loss",
        "cap_on_pi_theta_over_mu",
        old=_LOG_V,
        new="torch.clamp(torch.where(real, logp_new.detach() - logp_behaviour.detach(), 0.0), -20.0, log_c)",
        expected="the cap is on pi_theta / mu",
    ),
    # no cap
    Mutant(
        "tis_ppo_loss",
        "not_capped",
        old=_LOG_V,
        new="torch.clamp(torch.where(real, old - logp_behaviour.detach(), 0.0), -20.0, 20.0)",
        expected="was not capped",
    ),
    # cap from both sides
    Mutant(
        "tis_ppo_loss",
        "capped_both_sides",
        old=_LOG_V,
        new="torch.clamp(torch.where(real, old - logp_behaviour.detach(), 0.0), -log_c, log_c)",
        expected="weights below 1 were raised",
    ),
    # cap on the wrong quantity: the weighted term v * PPO's term
    Mutant(
        "tis_ppo_loss",
        "term_capped",
        old="    per_token = torch.where(real, torch.exp(log_v) * surrogate, 0.0)",
        new="    v = torch.exp(torch.clamp(torch.where(real, old - logp_behaviour.detach(), 0.0), -20.0, 20.0))\n"
        "    per_token = torch.where(real, torch.clamp(v * surrogate, max=c), 0.0)",
        expected="the cap was applied to the weighted term",
    ),
    # PPO's clip against mu instead of pi_old
    Mutant(
        "tis_ppo_loss",
        "clip_against_mu",
        old=_LOG_R,
        new="torch.clamp(torch.where(real, logp_new - logp_behaviour.detach(), 0.0), -20.0, 20.0)",
        expected="PPO's ratio was taken against mu",
    ),
    # max of the two terms
    Mutant(
        "tis_ppo_loss", "max_not_min", old="torch.min(ratio * adv", new="torch.max(ratio * adv", expected="torch.max"
    ),
    # the ratio clipped from above only: wrong for negative advantages
    Mutant(
        "tis_ppo_loss",
        "upper_clip_only",
        old="torch.clamp(ratio, 1.0 - eps, 1.0 + eps)",
        new="torch.clamp(ratio, max=1.0 + eps)",
        expected="clipped from above only",
    ),
    # eps ignored
    Mutant(
        "tis_ppo_loss",
        "ignores_eps",
        old="torch.clamp(ratio, 1.0 - eps, 1.0 + eps)",
        new="torch.clamp(ratio, 0.8, 1.2)",
        expected="eps=0.1",
    ),
    # wrong normalisation: every position, per answer, PipelineRL's batch size
    Mutant("tis_ppo_loss", "mean_over_padding", old=_MEAN, new="-per_token.mean()", expected="padding included"),
    Mutant(
        "tis_ppo_loss",
        "mean_per_answer",
        old=_MEAN,
        new="-(per_token.sum(dim=1) / real.sum(dim=1)).mean()",
        expected="averaged each answer's tokens",
    ),
    Mutant(
        "tis_ppo_loss",
        "divided_by_batch_size",
        old=_MEAN,
        new="-per_token.sum() / real.shape[0]",
        expected="PipelineRL's normalisation",
    ),
    Mutant("tis_ppo_loss", "no_minus", old=_MEAN, new="per_token.sum() / real.sum()", expected="the wrong sign"),
    # masking by multiplying: 0 * NaN is NaN at padding
    Mutant("tis_ppo_loss", "mask_multiplied", old=_MASKED_BLOCK, new=_MULTIPLIED_BLOCK, expected="0 * NaN is NaN"),
    # float32 overflow: PPO's log-ratio not clamped
    Mutant(
        "tis_ppo_loss",
        "no_clamp",
        old=_LOG_R,
        new="torch.where(real, logp_new - old, 0.0)",
        expected="exp(100) overflows",
    ),
    # upcast to float64 and never clamp: finite at +-100, but r A is unbounded for A < 0 (exp(30)
    # in float32, inf at 800 in float64)
    Mutant(
        "tis_ppo_loss",
        "float64_no_clamp",
        old=_LOG_R,
        new="torch.where(real, logp_new.double() - old.double(), 0.0)",
        expected="only the clamp bounds r A when A < 0",
    ),
    # c = inf: log v capped at log c = inf only, exp(100) overflows float32
    Mutant(
        "tis_ppo_loss",
        "log_v_unclamped_at_inf",
        old="    log_c = min(math.log(c), 20.0)",
        new="    log_c = math.log(c)",
        expected="clamp log v to [-20, 20] as well",
    ),
    # linear space: a ratio of probabilities
    Mutant(
        "tis_ppo_loss",
        "ratio_of_probabilities",
        old="ratio = torch.exp(log_r)",
        new="ratio = torch.exp(torch.where(real, logp_new, 0.0)) / torch.exp(torch.where(real, old, 0.0))",
        expected="is not finite",
    ),
    Mutant(
        "tis_ppo_loss",
        "advantages_not_detached",
        old="advantages.detach()[:, None]",
        new="advantages[:, None]",
        expected="a gradient flowed into `advantages`",
    ),
    Mutant(
        "tis_ppo_loss", "returns_float", old=_MEAN, new="(" + _MEAN + ").item()", expected="expected a torch tensor"
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
    # wrong mechanism: the sequence ratio as a product of the token ratios, exponentiated before
    # summing: right while the running product stays finite, inf once it passes e^709
    Mutant(
        "token_and_sequence_ratios",
        "product_of_exponentials",
        old="np.exp(log_ratio.sum(axis=1))",
        new="np.prod(np.exp(log_ratio), axis=1)",
        expected="exponentiate the sum of the log-ratios",
    ),
    Mutant(
        "token_and_sequence_ratios",
        "long_double_running_product",
        old="np.exp(log_ratio.sum(axis=1))",
        new="np.prod(np.exp(log_ratio.astype(np.longdouble)), axis=1).astype(np.float64)",
        expected="even in long double",
    ),
]

MUTANTS: list[Mutant] = TIS_PPO_LOSS + EFFECTIVE_SAMPLE_SIZE + EXPECTED_ESS_FRACTION + TOKEN_AND_SEQUENCE_RATIOS
