"""Planted bugs for lesson 01 (`exercises/src/01_policy_gradients.py`).

Each `Mutant` is the real solution cell of `function` with `old` replaced by `new` (see
`tests/conftest.py`), and `expected` a fragment the grader's message must contain.
`tests/test_grading_lesson01.py` checks that every one is caught with that message.
"""

from __future__ import annotations

from conftest import Mutant

# ---------------------------------------------------------------------------------------
# Exercise 1 · reward_to_go
# ---------------------------------------------------------------------------------------

REWARD_TO_GO = [
    # cuts the return with the NEXT step's done flag
    Mutant(
        "reward_to_go",
        "done_one_step_late",
        old="(1.0 - d[t])",
        new="(1.0 - (d[t + 1] if t + 1 < r.shape[0] else 0.0))",
        expected="is wrong at index [0, 0]: got 1.0, expected 1.5",
    ),
    # ignores `dones`, so returns leak across episode ends
    Mutant(
        "reward_to_go",
        "ignores_dones",
        old="gamma * (1.0 - d[t]) * running",
        new="gamma * running",
        expected="got 1.875, expected 1.5",
    ),
    # keeps the input's dtype, so the output is allocated like it and integer rewards truncate
    Mutant(
        "reward_to_go",
        "integer_dtype",
        old="r = np.asarray(rewards, dtype=np.float64)",
        new="r = np.asarray(rewards)",
        expected="has dtype int64; expected a float array",
    ),
    # accumulates into the caller's `rewards` array (np.asarray does not copy a float64 array)
    Mutant(
        "reward_to_go",
        "mutates_input",
        old="""\
    out = np.zeros_like(r)
    running = np.zeros(r.shape[1:], dtype=np.float64)
    for t in reversed(range(r.shape[0])):
        running = r[t] + gamma * (1.0 - d[t]) * running
        out[t] = running
    return out""",
        new="""\
    for t in reversed(range(r.shape[0] - 1)):
        r[t] = r[t] + gamma * (1.0 - d[t]) * r[t + 1]
    return r.copy()""",
        expected="changed the `rewards` array it was given",
    ),
    # treats the rollout as [B, T] (time on axis 1)
    Mutant(
        "reward_to_go",
        "time_on_axis_1",
        old="""\
    running = np.zeros(r.shape[1:], dtype=np.float64)
    for t in reversed(range(r.shape[0])):
        running = r[t] + gamma * (1.0 - d[t]) * running
        out[t] = running""",
        new="""\
    running = np.zeros(r.shape[0], dtype=np.float64)
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * (1.0 - d[:, t]) * running
        out[:, t] = running""",
        expected="is wrong at index",
    ),
    # allocates the output in float32 (half the memory): the statement asks for float64
    Mutant(
        "reward_to_go",
        "float32_output",
        old="out = np.zeros_like(r)",
        new="out = np.zeros_like(r, dtype=np.float32)",
        expected="has dtype float32; the statement asks for float64",
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
    return centred / (r.std(axis=1, keepdims=True) + eps)""",
        new="""\
    centred = r - r.mean()
    if not normalize_std:
        return centred
    return centred / (r.std() + eps)""",
        expected="got 0.25, expected 0.5",
    ),
    # sample std (ddof = 1) instead of the population std
    Mutant(
        "group_relative_advantages",
        "ddof1",
        old="r.std(axis=1, keepdims=True)",
        new="r.std(axis=1, ddof=1, keepdims=True)",
        expected="got -0.707107, expected -1",
    ),
    # eps inside the square root, sqrt(var + eps)
    Mutant(
        "group_relative_advantages",
        "eps_in_sqrt",
        old="(r.std(axis=1, keepdims=True) + eps)",
        new="np.sqrt(r.var(axis=1, keepdims=True) + eps)",
        expected="got -0.57735, expected -0.5",
    ),
    # always divides by the std, ignoring normalize_std
    Mutant(
        "group_relative_advantages",
        "ignores_flag",
        old="    if not normalize_std:\n        return centred\n",
        new="",
        expected="got 0.999998, expected 0.5",
    ),
    # no eps, so a group of equal rewards gives 0/0 = NaN
    Mutant(
        "group_relative_advantages",
        "nan_for_ties",
        old="    return centred / (r.std(axis=1, keepdims=True) + eps)",
        new="""\
    with np.errstate(invalid="ignore", divide="ignore"):
        return centred / r.std(axis=1, keepdims=True)""",
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
        old="reward_to_go(rewards, dones, gamma)",
        new="reward_to_go(rewards, np.zeros_like(np.asarray(dones, dtype=np.float64)), gamma)",
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
    # normalises with torch's .std(), whose default is the sample std (ddof = 1)
    Mutant(
        "reinforce_update",
        "torch_std",
        old="""\
    g = reward_to_go(rewards, dones, gamma)
    adv = (g - g.mean()) / (g.std() + 1e-8)""",
        new="""\
    g = torch.as_tensor(reward_to_go(rewards, dones, gamma))
    adv = ((g - g.mean()) / (g.std() + 1e-8)).numpy()""",
        expected="the std is the sample std (ddof = 1",
    ),
    # weights every step by its column's total reward instead of its reward-to-go
    Mutant(
        "reinforce_update",
        "whole_column_return",
        old="g = reward_to_go(rewards, dones, gamma)",
        new="g = np.broadcast_to(np.asarray(rewards, dtype=np.float64).sum(axis=0), np.shape(rewards))",
        expected="expected -lr * dL/dtheta",
    ),
    # wrong mechanism (issue 45): the discount of the first test it was tried on, not `gamma`
    Mutant(
        "reinforce_update",
        "fixed_gamma",
        old="g = reward_to_go(rewards, dones, gamma)",
        new="g = reward_to_go(rewards, dones, 0.9)",
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

MUTANTS: list[Mutant] = REWARD_TO_GO + SURROGATE_LOSS + GROUP_RELATIVE_ADVANTAGES + REINFORCE_UPDATE
