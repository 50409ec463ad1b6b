"""Planted bugs in lesson 07's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

LOSS, LAG, TTT, DEC = "token_is_loss", "token_lags", "time_to_target", "inflight_decode"
RATIO = "log_ratio = logp_new.detach() - logp_behaviour"
WEIGHT = "w = torch.clamp(torch.exp(log_ratio), max=c)"
RETURN = "return float(np.asarray(times, dtype=np.float64)[hits[0] + window - 1])"
SAMPLE = "tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)"

MUTANTS: list[Mutant] = [
    # token_is_loss
    Mutant(LOSS, "no_truncation", WEIGHT, "w = torch.exp(log_ratio)", "not truncated"),
    Mutant(LOSS, "gradient_through_weight", RATIO, "log_ratio = logp_new - logp_behaviour", "must be a constant"),
    Mutant(
        LOSS,
        "sequence_ratio",
        WEIGHT,
        "w = torch.clamp(torch.exp((log_ratio * mask).sum(1, keepdim=True)), max=c)",
        "one per sequence",
    ),
    Mutant(LOSS, "inverted_ratio", RATIO, "log_ratio = logp_behaviour - logp_new.detach()", "inverted"),
    Mutant(LOSS, "mean_over_all_positions", "/ m.sum()", "/ m.numel()", "number of real tokens"),
    Mutant(LOSS, "padding_not_masked", "* logp_new * m).sum()", "* logp_new).sum()", "padding"),
    # token_lags
    Mutant(LAG, "counts_padding", "np.where(m, trainer_version - v, 0)", "(trainer_version - v)", "at the padding"),
    Mutant(
        LAG, "wrong_sign", "np.where(m, trainer_version - v, 0)", "np.where(m, v - trainer_version, 0)", "wrong sign"
    ),
    Mutant(LAG, "no_future_check", "if (v[m] > trainer_version).any():", "if False:", "expected ValueError"),
    Mutant(LAG, "float_lags", ".astype(np.int64)", ".astype(np.float64)", "int64"),
    Mutant(
        LAG,
        "per_sequence",
        "np.where(m, trainer_version - v, 0)",
        "np.where(m, (trainer_version - np.where(m, v, trainer_version).min(axis=1))[:, None], 0)",
        "one lag per sequence",
    ),
    # time_to_target
    Mutant(TTT, "update_index", RETURN, "return float(hits[0] + window - 1)", "update index"),
    Mutant(TTT, "strict_inequality", "means >= target", "means > target", "use >="),
    Mutant(TTT, "last_crossing", "[hits[0] + window - 1]", "[hits[-1] + window - 1]", "is the first"),
    Mutant(TTT, "none_for_never", "return math.inf", "return None", "math.inf"),
    Mutant(TTT, "window_start_time", "[hits[0] + window - 1]", "[hits[0]]", "window's first update"),
    # inflight_decode
    Mutant(
        DEC,
        "clears_cache",
        "load_flat_parameters(model, flat)",
        "load_flat_parameters(model, flat)\n                cache[0].zero_()\n                cache[1].zero_()",
        "keeps the cache",
    ),
    Mutant(DEC, "stamps_old_version", "version, flat = update", "flat = update[1]", "new version"),
    Mutant(
        DEC,
        "loads_older_versions",
        "if update is not None and update[0] > version:",
        "if update is not None:",
        "newer than the one held",
    ),
    Mutant(DEC, "greedy", SAMPLE, "tokens = logp.argmax(dim=1)", "most likely token"),
    Mutant(DEC, "global_rng", SAMPLE, "tokens = torch.multinomial(logp.exp(), 1).squeeze(1)", "global random state"),
    Mutant(
        DEC,
        "stores_probabilities",
        "logps.append(logp.gather(1, tokens[:, None]).squeeze(1))",
        "logps.append(logp.exp().gather(1, tokens[:, None]).squeeze(1))",
        "probabilities",
    ),
    Mutant(DEC, "position_not_advanced", "pos = pos + 1", "pos = pos", "full forward pass"),
    Mutant(DEC, "records_gradients", "with torch.no_grad():", "with torch.enable_grad():", "requires grad"),
]
