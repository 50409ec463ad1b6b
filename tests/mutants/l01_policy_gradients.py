"""Planted bugs for lesson 01 (`exercises/src/01_policy_gradients.py`).

Each `Mutant` is the real solution cell of `function` with `old` replaced by `new` (see
`tests/conftest.py`), and `expected` a fragment the grader's message must contain.
`tests/test_grading_lesson01.py` checks that every one is caught with that message.
"""

from __future__ import annotations

from conftest import Mutant

# ---------------------------------------------------------------------------------------
# Exercise 1 · rloo_advantages
# ---------------------------------------------------------------------------------------

RLOO_ADVANTAGES = [
    # wrong mechanism: the whole group's mean (GRPO's baseline), each answer's own reward included
    Mutant(
        "rloo_advantages",
        "own_reward_included",
        old="    others = (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1)",
        new="    others = r.mean(axis=1, keepdims=True)",
        expected="each answer's own reward is in its baseline",
    ),
    # divides the others' sum by G instead of G - 1
    Mutant(
        "rloo_advantages",
        "divides_by_g",
        old="/ (r.shape[1] - 1)",
        new="/ r.shape[1]",
        expected="the other answers' rewards are divided by G; there are G - 1 of them",
    ),
    # leaves one out of the whole batch, mixing prompts
    Mutant(
        "rloo_advantages",
        "whole_batch",
        old="    others = (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1)",
        new="    others = (r.sum() - r) / (r.size - 1)",
        expected="the baseline is the mean of the other rewards of the whole batch",
    ),
    # baseline minus reward
    Mutant(
        "rloo_advantages",
        "wrong_sign",
        old="    return r - others",
        new="    return others - r",
        expected="the advantages have the wrong sign",
    ),
    # wrong mechanism: the group mean rescaled by G / (G - 1) only for G = 2 (the case a learner checks by hand)
    Mutant(
        "rloo_advantages",
        "scaled_mean_g2_only",
        old="    others = (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1)\n    return r - others",
        new="    c = r - r.mean(axis=1, keepdims=True)\n    return 2 * c if r.shape[1] == 2 else c",
        expected="each answer's own reward is in its baseline",
    ),
    # keeps the input's dtype: integer rewards give an integer (truncated) result
    Mutant(
        "rloo_advantages",
        "integer_dtype",
        old="    r = np.asarray(rewards, dtype=np.float64)\n    others = (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1)\n    return r - others",
        new="    r = np.asarray(rewards)\n    others = (r.sum(axis=1, keepdims=True) - r) // (r.shape[1] - 1)\n    return r - others",
        expected="expected a float array",
    ),
    # writes into the caller's array (np.asarray does not copy a float64 array)
    Mutant(
        "rloo_advantages",
        "mutates_input",
        old="    return r - others",
        new="    r -= others\n    return r.copy()",
        expected="changed the `rewards` array it was given",
    ),
]

# ---------------------------------------------------------------------------------------
# Exercise 2 · surrogate_loss
# ---------------------------------------------------------------------------------------

SURROGATE_LOSS = [
    # returns a Python float, which autograd cannot differentiate
    Mutant("surrogate_loss", "item", old=".mean()", new=".mean().item()", expected="expected a torch tensor"),
    # forgets the minus sign, so minimising it descends J
    Mutant("surrogate_loss", "no_minus", old="return -(", new="return (", expected="check the minus sign"),
    # lets the gradient flow into the advantages
    Mutant(
        "surrogate_loss",
        "not_detached",
        old="advantages.detach()",
        new="advantages",
        expected="backpropagated into `advantages`",
    ),
    # weights the probability, not the log-probability
    Mutant(
        "surrogate_loss",
        "probs",
        old="torch.log_softmax(logits, dim=-1)",
        new="torch.softmax(logits, dim=-1)",
        expected="expected -(1 * ln 0.5 + 3 * ln 0.5) / 2 = 1.38629",
    ),
    # normalises over the batch axis (dim 0) instead of the actions
    Mutant("surrogate_loss", "softmax_over_batch", old="dim=-1", new="dim=0", expected="random case 1 (N=1, K=2"),
    # sums over the samples instead of averaging
    Mutant(
        "surrogate_loss",
        "sum",
        old=".mean()",
        new=".sum()",
        expected="= 2.77259; expected -(1 * ln 0.5 + 3 * ln 0.5) / 2 = 1.38629",
    ),
    # wrong mechanism (issue 45): log(softmax(...)), which the statement forbids: right values
    # for moderate logits, log(0) = -inf once an action's probability underflows
    Mutant(
        "surrogate_loss",
        "log_of_softmax",
        old="torch.log_softmax(logits, dim=-1)",
        new="torch.log(torch.softmax(logits, dim=-1))",
        expected="softmax gives exactly 0.0 for a logit 1000 below the others",
    ),
    # wrong mechanism (issue 45): log(softmax(...) + eps) "fixes" the -inf by clipping the
    # log-probability at log(eps): finite, and wrong exactly where the gradient matters most
    Mutant(
        "surrogate_loss",
        "log_of_softmax_plus_eps",
        old="torch.log_softmax(logits, dim=-1)",
        new="torch.log(torch.softmax(logits, dim=-1) + 1e-10)",
        expected="(the log of a softmax clipped or shifted by an eps)",
    ),
    # wrong mechanism (issue 45): the softmax written out as exp(z) / sum exp(z), without the
    # max shift: exp(1000) overflows to inf, and inf / inf is NaN
    Mutant(
        "surrogate_loss",
        "unshifted_exp",
        old="torch.log_softmax(logits, dim=-1)",
        new="torch.log(torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True))",
        expected="use torch.log_softmax(logits, dim=-1)",
    ),
]

# ---------------------------------------------------------------------------------------
# Exercise 3 · group_relative_advantages
# ---------------------------------------------------------------------------------------

GROUP_RELATIVE_ADVANTAGES = [
    # one mean and std over the whole batch, not per group
    Mutant(
        "group_relative_advantages",
        "batch_mean",
        old="""\
    centred = r - r.mean(axis=1, keepdims=True)
    if not normalize_std:
        return centred
    return centred / (r.std(axis=1, ddof=1, keepdims=True) + eps)""",
        new="""\
    centred = r - r.mean()
    if not normalize_std:
        return centred
    return centred / (r.std(ddof=1) + eps)""",
        expected="got 0.25, expected 0.5",
    ),
    # wrong mechanism: each group's own mean, but one std over the whole batch (right on one group)
    Mutant(
        "group_relative_advantages",
        "batch_std",
        old="r.std(axis=1, ddof=1, keepdims=True)",
        new="r.std(ddof=1)",
        expected="gives zeros, not NaN: group_relative_advantages(rewards of shape (3, 4)) is wrong at index [2, 0]",
    ),
    # wrong mechanism: the mean is not subtracted before dividing by the std
    Mutant(
        "group_relative_advantages",
        "mean_not_subtracted",
        old="    return centred / (r.std(axis=1, ddof=1, keepdims=True) + eps)",
        new="    return r / (r.std(axis=1, ddof=1, keepdims=True) + eps)",
        expected="(r - mean) / std, both over the row",
    ),
    # wrong mechanism: the answer's own reward left out of its baseline (RLOO's leave-one-out mean), which
    # the statement's (01.6) does not do: the mean of the other G - 1 answers
    Mutant(
        "group_relative_advantages",
        "own_reward_excluded",
        old="centred = r - r.mean(axis=1, keepdims=True)",
        new="centred = r - (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1)",
        expected="got 0.666667, expected 0.5",
    ),
    # wrong mechanism: the spread of 0/1 rewards written as sqrt(p (1 - p)), the population std only when every
    # reward is 0 or 1
    Mutant(
        "group_relative_advantages",
        "bernoulli_std",
        old="r.std(axis=1, ddof=1, keepdims=True)",
        new="np.sqrt(np.abs(r.mean(axis=1, keepdims=True) * (1.0 - r.mean(axis=1, keepdims=True))))",
        expected="(r - mean) / std, both over the row",
    ),
    # wrong mechanism: the spread as the root mean square of the rewards, not of their deviations: equal to the
    # sample std on the group [0, 1]
    Mutant(
        "group_relative_advantages",
        "uncentred_rms",
        old="r.std(axis=1, ddof=1, keepdims=True)",
        new="np.sqrt((r**2).mean(axis=1, keepdims=True))",
        expected="gives zeros, not NaN: group_relative_advantages(rewards of shape (3, 4)) is wrong at index [2, 0]",
    ),
    # wrong mechanism: the sample std for groups of 2 and the population std otherwise
    Mutant(
        "group_relative_advantages",
        "mixed_conventions",
        old="r.std(axis=1, ddof=1, keepdims=True)",
        new="r.std(axis=1, ddof=int(r.shape[1] == 2), keepdims=True)",
        expected="use one convention for every group",
    ),
    # eps inside the square root, sqrt(var + eps)
    Mutant(
        "group_relative_advantages",
        "eps_in_sqrt",
        old="(r.std(axis=1, ddof=1, keepdims=True) + eps)",
        new="np.sqrt(r.var(axis=1, ddof=1, keepdims=True) + eps)",
        expected="eps is added to the std, outside the square root",
    ),
    # wrong mechanism: the std clamped at eps (max(std, eps)) instead of eps added to it
    Mutant(
        "group_relative_advantages",
        "eps_as_floor",
        old="(r.std(axis=1, ddof=1, keepdims=True) + eps)",
        new="np.maximum(r.std(axis=1, ddof=1, keepdims=True), eps)",
        expected="eps is added to the std, outside the square root",
    ),
    # always divides by the std, ignoring normalize_std
    Mutant(
        "group_relative_advantages",
        "ignores_flag",
        old="    if not normalize_std:\n        return centred\n",
        new="",
        expected="expected 0.5",
    ),
    # no eps, so a group of equal rewards gives 0/0 = NaN
    Mutant(
        "group_relative_advantages",
        "nan_for_ties",
        old="    return centred / (r.std(axis=1, ddof=1, keepdims=True) + eps)",
        new="""\
    with np.errstate(invalid="ignore", divide="ignore"):
        return centred / r.std(axis=1, ddof=1, keepdims=True)""",
        expected="contains nan at index [0, 0]",
    ),
]

# ---------------------------------------------------------------------------------------
# Exercise 4 · reinforce_update
# ---------------------------------------------------------------------------------------

REINFORCE_UPDATE = [
    # maximises the surrogate loss, moving against the policy gradient
    Mutant(
        "reinforce_update",
        "ascends_loss",
        old="loss.backward()",
        new="(-loss).backward()",
        expected="moved opposite to a policy-gradient step",
    ),
    # sums rewards to the end of the rollout, across episode ends
    Mutant(
        "reinforce_update",
        "ignores_dones",
        old="discounted_returns(rewards, dones, gamma)",
        new="discounted_returns(rewards, np.zeros_like(np.asarray(dones, dtype=np.float64)), gamma)",
        expected="the returns run across episode ends",
    ),
    # returns the loss recomputed after the step
    Mutant(
        "reinforce_update",
        "loss_after_step",
        old="    return loss.item()",
        new="""\
    with torch.no_grad():
        return surrogate_loss(policy(obs_t), actions_t, adv_t).item()""",
        expected="expected the surrogate loss before the step",
    ),
    # never clears old gradients, so stale .grad values leak into the step
    Mutant(
        "reinforce_update",
        "no_zero_grad",
        old="    optimizer.zero_grad()\n",
        new="",
        expected="call optimizer.zero_grad() before loss.backward()",
    ),
    # subtracts nothing and divides by nothing: the weights are the raw reward-to-go
    Mutant(
        "reinforce_update",
        "not_normalized",
        old="adv = (g - g.mean()) / (g.std() + 1e-8)",
        new="adv = g",
        expected="the weights are not normalised",
    ),
    # returns the loss tensor instead of a float
    Mutant(
        "reinforce_update",
        "returns_tensor",
        old="return loss.item()",
        new="return loss",
        expected="return a Python float (loss.item())",
    ),
    # wrong mechanism: normalises each env's column on its own (a mean and std per env), not the whole batch
    Mutant(
        "reinforce_update",
        "per_column_normalisation",
        old="adv = (g - g.mean()) / (g.std() + 1e-8)",
        new="adv = (g - g.mean(axis=0)) / (g.std(axis=0) + 1e-8)",
        expected="the weights are normalised within each env's column",
    ),
    # wrong mechanism: subtracts the mean but does not divide by the std
    Mutant(
        "reinforce_update",
        "mean_only",
        old="adv = (g - g.mean()) / (g.std() + 1e-8)",
        new="adv = g - g.mean()",
        expected="expected -lr * dL/dtheta",
    ),
    # weights every step by its column's total reward instead of its reward-to-go
    Mutant(
        "reinforce_update",
        "whole_column_return",
        old="g = discounted_returns(rewards, dones, gamma)",
        new="g = np.broadcast_to(np.asarray(rewards, dtype=np.float64).sum(axis=0), np.shape(rewards))",
        expected="expected -lr * dL/dtheta",
    ),
    # wrong mechanism (issue 45): the discount of the first test it was tried on, not `gamma`
    Mutant(
        "reinforce_update",
        "fixed_gamma",
        old="g = discounted_returns(rewards, dones, gamma)",
        new="g = discounted_returns(rewards, dones, 0.9)",
        expected="not the gamma passed in (0.5)",
    ),
    # wrong mechanism (issue 45): a hand-written SGD step with the optimizer's lr instead of
    # optimizer.step(): right for plain SGD, wrong for Adam, momentum or weight decay
    Mutant(
        "reinforce_update",
        "manual_sgd_step",
        old="""\
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()""",
        new="""\
    policy.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in policy.parameters():
            p -= optimizer.param_groups[0]["lr"] * p.grad""",
        expected="a plain SGD step, but the optimizer passed in has weight_decay=0.5",
    ),
    # wrong mechanism (issue 45): sums the per-step terms itself instead of averaging them
    Mutant(
        "reinforce_update",
        "inline_sum",
        old="    loss = surrogate_loss(policy(obs_t), actions_t, adv_t)",
        new="""\
    logp = torch.log_softmax(policy(obs_t), dim=-1).gather(1, actions_t.unsqueeze(1)).squeeze(1)
    loss = -(adv_t * logp).sum()""",
        expected="the loss is a sum over the T * B = 15 steps",
    ),
]

MUTANTS: list[Mutant] = RLOO_ADVANTAGES + SURROGATE_LOSS + GROUP_RELATIVE_ADVANTAGES + REINFORCE_UPDATE
