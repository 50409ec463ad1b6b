"""Planted bugs in lesson 03's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

VT, PG, LS, UNR = "vtrace_targets", "pg_advantages", "learner_step", "actor_unroll"
STEP = "acc = deltas[t] + discounts[t] * cs[t] * acc"
CLIP = "clipped_rhos, cs = np.minimum(rho_bar, rhos), np.minimum(c_bar, rhos)"
WEIGHTS = "weights = np.minimum(pg_rho_bar, np.exp(np.asarray(log_rhos, dtype=np.float64)))"
SAMPLE = "actions = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)"
COPY = "    batch = {name: torch.cat([tensor[i] for i in full], dim=1) for name, tensor in slots.items()}"
FREE = (
    "    for index in full:  # the batch is a copy: the actors may refill these slots while we learn\n"
    "        free_queue.put(index)"
)
STEP_TAIL = (
    '    versions = batch["versions"].numpy()\n'
    "    if (versions > learner.version).any():\n"
    '        raise ValueError(f"a rollout has version {versions.max()}, newer than the learner\'s {learner.version}")\n'
    "    lags = learner.version - versions.min(axis=0)\n"
    "    learner.update(batch)\n"
    "    weights.publish(learner.model, learner.version)\n"
    "    return lags"
)
CHECK = (
    "    if (versions > learner.version).any():\n"
    '        raise ValueError(f"a rollout has version {versions.max()}, newer than the learner\'s {learner.version}")'
)

MUTANTS: list[Mutant] = [
    # vtrace_targets
    Mutant(
        VT,
        "inclusive_product",
        STEP,
        "acc = discounts[t] * cs[t] * (deltas[t] + acc)",
        "the trace product includes c_t of the term itself",
    ),
    Mutant(
        VT,
        "rho_and_c_swapped",
        CLIP,
        "clipped_rhos, cs = np.minimum(c_bar, rhos), np.minimum(rho_bar, rhos)",
        "rho_bar and c_bar are swapped",
    ),
    Mutant(VT, "no_truncation", CLIP, "clipped_rhos, cs = rhos, rhos", "the ratios are not truncated"),
    Mutant(
        VT,
        "no_bootstrap",
        "np.concatenate([values[1:], bootstrap_value[None]], axis=0)",
        "np.concatenate([values[1:], np.zeros_like(bootstrap_value)[None]], axis=0)",
        "the bootstrap value V(x_T) is ignored",
    ),
    Mutant(VT, "trace_without_discount", STEP, "acc = deltas[t] + cs[t] * acc", "the trace ignores the discounts"),
    Mutant(VT, "returns_vs_minus_v", "vs[t] = values[t] + acc", "vs[t] = acc", "add V(x_s) to get the target"),
    Mutant(VT, "ratio_not_exponentiated", "rhos = np.exp(log_rhos)", "rhos = log_rhos", "is wrong at index"),
    Mutant(VT, "writes_into_values", "vs = np.zeros_like(values)", "vs = values", "changed the `values` array"),
    # wrong mechanism (issue 45): the per-step discounts read as one gamma times "not done"
    Mutant(
        VT,
        "one_gamma",
        "    discounts = np.asarray(discounts, dtype=np.float64)\n",
        "    discounts = np.asarray(discounts, dtype=np.float64)\n"
        "    discounts = discounts.max() * (discounts > 0)  # gamma, or 0 where the episode ended\n",
        "discounts[t] is the step's own gamma_t",
    ),
    # wrong mechanism (issue 45): the printed double sum (03.2) transcribed, O(T^2), instead of the backward
    # recursion (03.3): right on every short trajectory
    Mutant(
        VT,
        "double_sum_of_03_2",
        "    for t in reversed(range(values.shape[0])):\n"
        "        acc = deltas[t] + discounts[t] * cs[t] * acc\n"
        "        vs[t] = values[t] + acc\n",
        "    n_t = values.shape[0]\n"
        "    for s in range(n_t):  # (03.2) as printed: one sum per s, one trace product per term\n"
        "        total, trace = values[s].copy(), np.ones_like(bootstrap_value)\n"
        "        for t in range(s, n_t):\n"
        "            total = total + trace * deltas[t]\n"
        "            trace = trace * discounts[t] * cs[t]\n"
        "        vs[s] = total\n",
        "O(T^2): the double sum of (03.2); use the backward recursion (03.3)",
    ),
    # the same double sum, its inner loop stopped once every column's trace product is 0 (still exact): on
    # trajectories with frequent episode ends it is nearly O(T); the long case has no end and no trace below 1
    Mutant(
        VT,
        "double_sum_early_exit",
        "    for t in reversed(range(values.shape[0])):\n"
        "        acc = deltas[t] + discounts[t] * cs[t] * acc\n"
        "        vs[t] = values[t] + acc\n",
        "    n_t = values.shape[0]\n"
        "    for s in range(n_t):  # (03.2) as printed, stopping where the trace product is 0\n"
        "        total, trace = values[s].copy(), np.ones_like(bootstrap_value)\n"
        "        for t in range(s, n_t):\n"
        "            total = total + trace * deltas[t]\n"
        "            trace = trace * discounts[t] * cs[t]\n"
        "            if not trace.any():\n"
        "                break\n"
        "        vs[s] = total\n",
        "O(T^2): the double sum of (03.2); use the backward recursion (03.3)",
    ),
    # pg_advantages
    Mutant(
        PG,
        "uses_v_s",
        "vs_tp1 = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)",
        "vs_tp1 = vs",
        "it needs the next target v_{s+1}",
    ),
    Mutant(
        PG,
        "uses_next_value",
        "vs_tp1 = np.concatenate([vs[1:]",
        "vs_tp1 = np.concatenate([np.asarray(values, dtype=np.float64)[1:]",
        "bootstraps from V(x_{s+1})",
    ),
    Mutant(
        PG,
        "no_truncation",
        WEIGHTS,
        "weights = np.exp(np.asarray(log_rhos, dtype=np.float64))",
        "the ratio is not truncated",
    ),
    Mutant(PG, "no_ratio", WEIGHTS, "weights = np.ones_like(vs)", "the ratio is missing"),
    Mutant(PG, "no_discount", "np.asarray(discounts, dtype=np.float64) * vs_tp1", "vs_tp1", "gamma_s is missing"),
    Mutant(
        PG, "subtracts_vs", "- np.asarray(values, dtype=np.float64))", "- vs)", "subtract the value estimate V(x_s)"
    ),
    # learner_step
    # wrong mechanism (issue 45): the slots handed back before the batch is copied (a race with the actors)
    Mutant(
        LS,
        "frees_before_copying",
        COPY + "\n" + FREE,
        FREE + "\n" + COPY,
        "an actor had already refilled",
    ),
    # wrong mechanism (issue 45): the slots handed back only after the update (acting and learning never overlap)
    Mutant(
        LS,
        "frees_after_the_update",
        FREE + "\n" + STEP_TAIL,
        STEP_TAIL.replace(
            "    return lags",
            FREE.replace("the batch is a copy: the actors may refill these slots while we learn", "hand them back now")
            + "\n    return lags",
        ),
        "frees the slots after learner.update",
    ),
    # wrong mechanism (issue 45): the versions checked only after the update (broken data trains the model)
    Mutant(
        LS,
        "checks_after_the_update",
        CHECK + "\n    lags = learner.version - versions.min(axis=0)\n    learner.update(batch)\n",
        "    lags = learner.version - versions.min(axis=0)\n    learner.update(batch)\n"
        "    if (lags < 0).any():  # checked once the step is done\n"
        '        raise ValueError("a rollout has a version newer than the learner\'s")\n',
        "called learner.update before raising",
    ),
    # wrong mechanism (issue 45): the weights published before the update, stamped with the version to come
    Mutant(
        LS,
        "publishes_before_the_update",
        "    learner.update(batch)\n    weights.publish(learner.model, learner.version)\n",
        "    weights.publish(learner.model, learner.version + 1)\n    learner.update(batch)\n",
        "publishes before learner.update",
    ),
    Mutant(
        LS,
        "lag_after_the_update",
        "    lags = learner.version - versions.min(axis=0)\n    learner.update(batch)\n",
        "    learner.update(batch)\n    lags = learner.version - versions.min(axis=0)\n",
        "the lag is measured after the update",
    ),
    Mutant(LS, "newest_version", "versions.min(axis=0)", "versions.max(axis=0)", "counted from the newest"),
    Mutant(
        LS,
        "counts_the_version_itself",
        "    learner.update(batch)\n",
        "    learner.update(batch)\n    learner.version += 1\n",
        "published version 8; expected 7",
    ),
    Mutant(LS, "no_future_check", "if (versions > learner.version).any():", "if False:", "expected ValueError"),
    Mutant(
        LS,
        "stacked_slots",
        "torch.cat([tensor[i] for i in full], dim=1)",
        "torch.stack([tensor[i] for i in full])",
        "stacked on a new axis",
    ),
    # actor_unroll
    Mutant(
        UNR,
        "obs_after_step",
        "obs, reward, terminated, truncated, _ = envs.step(actions.numpy())",
        "obs, reward, terminated, truncated, _ = envs.step(actions.numpy())\n"
        '            slot["obs"][t] = torch.as_tensor(obs)',
        "the observation the action was chosen at",
    ),
    Mutant(
        UNR,
        "no_bootstrap_obs",
        'slot["obs"][n_t] = torch.as_tensor(obs, dtype=torch.float32)',
        "pass",
        "the observation after the last step",
    ),
    Mutant(
        UNR,
        "stores_probabilities",
        "= logp.gather(1, actions.unsqueeze(1))",
        "= logp.exp().gather(1, actions.unsqueeze(1))",
        "holds probabilities",
    ),
    Mutant(UNR, "greedy", SAMPLE, "actions = logp.argmax(dim=1)", "sample with torch.multinomial"),
    Mutant(
        UNR,
        "global_rng",
        SAMPLE,
        "actions = torch.multinomial(logp.exp(), 1).squeeze(1)",
        "not torch's global random state",
    ),
    Mutant(UNR, "records_gradients", "with torch.no_grad():", "if True:", "requires grad after the unroll"),
    Mutant(
        UNR,
        "forgets_version",
        'slot["versions"][t] = version',
        'slot["versions"][t] = 0',
        "slot['versions'] (version=42)",
    ),
    Mutant(
        UNR,
        "rebinds_rewards",
        'slot["rewards"][t] = torch.as_tensor(reward, dtype=torch.float32)',
        'slot["rewards"] = torch.as_tensor(reward, dtype=torch.float32)',
        "replaced slot['rewards'] by a new tensor",
    ),
    # wrong mechanism (issue 45): a truncated episode (time limit) not recorded as an episode end
    Mutant(
        UNR,
        "dones_ignore_truncation",
        'slot["dones"][t] = torch.as_tensor(np.logical_or(terminated, truncated))',
        'slot["dones"][t] = torch.as_tensor(terminated)',
        "truncated",
    ),
    # wrong mechanism (issue 45): the policy run with autograd on (a graph built every step), the outputs detached
    Mutant(
        UNR,
        "acts_with_autograd",
        "    with torch.no_grad():\n        for t in range(n_t):\n"
        "            x = torch.as_tensor(obs, dtype=torch.float32)\n            logits, _ = policy(x)\n",
        "    if True:  # the stored values are detached below\n        for t in range(n_t):\n"
        "            x = torch.as_tensor(obs, dtype=torch.float32)\n            logits = policy(x)[0].detach()\n",
        "with autograd on",
    ),
]
