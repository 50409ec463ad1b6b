"""Planted bugs in lesson 03's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

VT, PG, LAG, UNR = "vtrace_targets", "pg_advantages", "rollout_lag", "actor_unroll"
STEP = "acc = deltas[t] + discounts[t] * cs[t] * acc"
CLIP = "clipped_rhos, cs = np.minimum(rho_bar, rhos), np.minimum(c_bar, rhos)"
WEIGHTS = "weights = np.minimum(pg_rho_bar, np.exp(np.asarray(log_rhos, dtype=np.float64)))"
SAMPLE = "actions = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)"

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
    # rollout_lag
    Mutant(LAG, "newest_version", "v.min(axis=0)", "v.max(axis=0)", "counted from the newest"),
    Mutant(LAG, "last_step", "v.min(axis=0)", "v[-1]", "counted from the newest"),
    Mutant(
        LAG,
        "wrong_sign",
        "return learner_version - v.min(axis=0)",
        "return v.min(axis=0) - learner_version",
        "the wrong sign",
    ),
    Mutant(LAG, "no_future_check", "if (v > learner_version).any():", "if False:", "expected ValueError"),
    Mutant(
        LAG,
        "float_lags",
        "v = np.asarray(versions, dtype=np.int64)",
        "v = np.asarray(versions, dtype=np.float64)",
        "return integers",
    ),
    Mutant(
        LAG,
        "per_step_lags",
        "return learner_version - v.min(axis=0)",
        "return learner_version - v",
        "expected shape (2,)",
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
]
