"""Planted bugs in lesson 07's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

LOSS, LAG, SHARE, DEC, RF = "token_is_loss", "token_lags", "share_loss", "inflight_decode", "refill_free_slots"
RATIO = "log_ratio = logp_new.detach() - logp_behaviour"
WEIGHT = "w = torch.clamp(torch.exp(log_ratio), max=c)"
SELECT = (
    "    logp_new = torch.where(mask, logp_new, 0.0)  # the padding's terms are then w * A * 0 = 0\n"
    "    logp_behaviour = torch.where(mask, logp_behaviour, 0.0)\n"
)
LOSS_RETURN = "    return -(w * advantages[:, None] * logp_new).sum() / mask.sum()"  # the cell's last line
SHARE_SELECT = (
    "    logp_new = torch.where(m, logp_new[rows], 0.0)\n"
    "    logp_behaviour = torch.where(m, logp_behaviour[rows], 0.0)\n"
)
SHARE_WEIGHT = "    w = torch.clamp(torch.exp(logp_new.detach() - logp_behaviour), max=c)\n"
SHARE_SUM = "(w * advantages[rows][:, None] * logp_new).sum() / n_real"
SAMPLE = "tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)"
LOAD = "                load_flat_parameters(model, flat)\n"
DECODE_LOOP = (
    "    new_tokens, logps, versions = [], [], []\n"
    "    with torch.no_grad():\n"
    "        for _ in range(n_steps):\n"
    "            update = poll()\n"
    "            if update is not None and update[0] > version:\n"
    "                version, flat = update\n"
    "                load_flat_parameters(model, flat)\n"
    "            logp = torch.log_softmax(model.step(tokens, pos, cache), dim=-1)\n"
    "            tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)\n"
    "            new_tokens.append(tokens)\n"
    "            logps.append(logp.gather(1, tokens[:, None]).squeeze(1))\n"
    "            versions.append(torch.full_like(tokens, version))\n"
)
CLONE = "    tokens, pos = tokens.clone(), pos.clone()\n"
STEP = "            logp = torch.log_softmax(model.step(tokens, pos, cache), dim=-1)\n"
BOUND = "            if k >= consumed + (max_lag + 1) * groups_per_batch:\n"
ADMIT = "            state.update(group=k, prompt=next(prompts), left=group_size, next_group=k + 1)\n"

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
    Mutant(LOSS, "mean_over_all_positions", "/ mask.sum()", "/ mask.numel()", "number of real tokens"),
    Mutant(LOSS, "padding_not_masked", SELECT, "", "padding"),
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
    # share_loss: a data-parallel rank's share of the loss
    Mutant(SHARE, "own_count", "/ n_real", "/ m.sum()", "its own real-token count"),
    Mutant(SHARE, "divided_by_the_shares", "/ n_real", "/ m.sum() * len(rows) / len(mask)", "number of shares"),
    Mutant(
        SHARE,
        "per_answer",
        SHARE_SUM,
        "((w * advantages[rows][:, None] * logp_new).sum(1) / m.sum(1)).sum() / len(mask)",
        "per answer",
    ),
    Mutant(
        SHARE,
        "gradient_through_weight",
        "logp_new.detach() - logp_behaviour",
        "logp_new - logp_behaviour",
        "through the importance weight",
    ),
    Mutant(
        SHARE,
        "every_row",
        "    m = mask[rows]\n",
        "    rows = torch.arange(len(mask))\n    m = mask[rows]\n",
        "every row",
    ),
    Mutant(
        SHARE,
        "multiplies_by_the_mask",
        SHARE_SELECT + SHARE_WEIGHT,
        "    logp_new, logp_behaviour = logp_new[rows], logp_behaviour[rows]\n"
        + SHARE_WEIGHT
        + "    w = w * m  # the mask applied by multiplication\n",
        "-inf * 0",
    ),
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
    # wrong mechanism (issue 45): the truncation level copied from the example instead of the argument c
    Mutant(
        LOSS, "level_as_a_constant", WEIGHT, "w = torch.clamp(torch.exp(log_ratio), max=1.5)", "not at the argument c"
    ),
    Mutant(
        LOSS,
        "mean_per_answer",
        LOSS_RETURN,
        "    return -((w * advantages[:, None] * logp_new).sum(1) / mask.sum(1)).mean()",
        "per answer",
    ),
    # padding that holds -inf (lesson-07 review): a mask applied by multiplication turns -inf * 0
    # into nan (this was the solution before), and a torch.where on the finished product keeps the
    # loss right but sends nan back through backward where both log-probs are -inf (-inf - -inf)
    Mutant(
        LOSS,
        "multiplies_by_the_mask",
        SELECT + "    log_ratio = logp_new.detach() - logp_behaviour\n    " + WEIGHT + "\n" + LOSS_RETURN,
        "    log_ratio = logp_new.detach() - logp_behaviour\n    "
        + WEIGHT
        + "\n    m = mask.to(logp_new.dtype)\n"
        + "    return -(w * advantages[:, None] * logp_new * m).sum() / m.sum()",
        "-inf * 0",
    ),
    Mutant(
        LOSS,
        "where_on_the_product",
        SELECT + "    log_ratio = logp_new.detach() - logp_behaviour\n    " + WEIGHT + "\n" + LOSS_RETURN,
        "    log_ratio = logp_new.detach() - logp_behaviour\n    "
        + WEIGHT
        + "\n    terms = torch.where(mask, w * advantages[:, None] * logp_new, 0.0)  # selected after computing\n"
        + "    return -terms.sum() / mask.sum()",
        "sends nan back through backward",
    ),
    # wrong mechanism (issue 45): the new version stamped, its weights never loaded
    Mutant(
        DEC,
        "weights_not_loaded",
        "                version, flat = update\n" + LOAD,
        "                version, flat = update\n",
        "OLD weights",
    ),
    # wrong mechanism (issue 45): the new weights loaded into a copy of the model, which then decodes
    Mutant(
        DEC,
        "loads_into_a_copy",
        "                version, flat = update\n" + LOAD,
        "                version, flat = update\n"
        "                import copy\n"
        "                model = copy.deepcopy(model)  # leave the caller's model alone\n" + LOAD,
        "into a copy",
    ),
    # wrong mechanism (issue 45): reproducible and not greedy, but not the model's distribution
    Mutant(
        DEC,
        "uniform_sampling",
        SAMPLE,
        "tokens = torch.randint(0, logp.shape[-1], tokens.shape, generator=generator)",
        "torch.multinomial",
    ),
    Mutant(
        DEC,
        "pos_in_place",
        "    tokens, pos = tokens.clone(), pos.clone()\n" + DECODE_LOOP + "            pos = pos + 1\n",
        "    tokens = tokens.clone()\n" + DECODE_LOOP + "            pos += 1  # the caller's tensor, in place\n",
        "changed the `pos` tensor",
    ),
    # wrong mechanism (lesson-07 review): right tokens and log-probs, but the steps decode into a
    # copy of the KV cache, so the cache the generator carries on from is never written
    Mutant(
        DEC,
        "decodes_into_a_cache_copy",
        CLONE,
        CLONE + "    cache = (cache[0].clone(), cache[1].clone())  # leave the caller's cache alone\n",
        "wrote into a copy",
    ),
    Mutant(
        DEC,
        "fresh_cache_copy_at_the_swap",
        LOAD,
        LOAD + "                cache = (cache[0].clone(), cache[1].clone())  # a new cache\n",
        "wrote into a copy",
    ),
    # wrong mechanism (lesson-07 review): at the swap, the steps of this call are re-encoded with
    # the new weights (a recompute), instead of keeping the cache as the old weights wrote it
    Mutant(
        DEC,
        "recomputes_the_cache_at_the_swap",
        CLONE + DECODE_LOOP,
        CLONE
        + "    fed = []  # (token, position) of every step, to re-encode them at a swap\n"
        + DECODE_LOOP.replace(
            LOAD,
            LOAD + "                for token, p in fed:\n                    model.step(token, p, cache)\n",
        ).replace(STEP, "            fed.append((tokens, pos))\n" + STEP),
        "were rewritten",
    ),
    # wrong mechanism (lesson-07 review): a version equal to the one held is loaded too (>=)
    Mutant(
        DEC,
        "loads_an_equal_version",
        "if update is not None and update[0] > version:",
        "if update is not None and update[0] >= version:",
        "not >=",
    ),
    # wrong mechanism (lesson-07 review): one position counter for the whole batch (row 0's,
    # advanced each step): right when every row sits at the same position, wrong for the slots
    # of a continuous batch, which sit at different positions
    Mutant(
        DEC,
        "shared_position_counter",
        STEP,
        STEP.replace("model.step(tokens, pos, cache)", "model.step(tokens, torch.full_like(pos, int(pos[0])), cache)"),
        "a shared counter",
    ),
    # refill_free_slots: the bound, the prompts, the started group, the state
    Mutant(RF, "window_off_by_one", BOUND, BOUND.replace(">=", ">"), "off by one"),
    Mutant(RF, "window_without_plus_one", BOUND, BOUND.replace("(max_lag + 1)", "max_lag"), "not max_lag B"),
    Mutant(
        RF,
        "consumed_as_updates",
        BOUND,
        BOUND.replace("consumed + (max_lag + 1) * groups_per_batch", "(consumed + max_lag + 1) * groups_per_batch"),
        "consumed counts groups",
    ),
    # wrong mechanism (issue 45): a prompt per answer: the answers of a group no longer share a prompt
    Mutant(
        RF,
        "prompt_per_answer",
        '        sampler.start(slot, state["prompt"], state["group"])',
        '        sampler.start(slot, next(prompts), state["group"])',
        "different prompts",
    ),
    # wrong mechanism (issue 45): the prompt taken before the admission test, lost when the group waits
    Mutant(
        RF,
        "prompt_taken_first",
        BOUND + "                break  # backpressure: group k's tokens would lag more than max_lag updates\n" + ADMIT,
        "            prompt = next(prompts)  # the next group's prompt, before the test\n"
        + BOUND
        + "                break\n"
        + ADMIT.replace("prompt=next(prompts)", "prompt=prompt"),
        "it is lost",
    ),
    # wrong mechanism (issue 45): backpressure tested before every answer: a started group stalls
    Mutant(
        RF,
        "gate_every_answer",
        '    for slot in sampler.free_slots():\n        if state["left"] == 0:',
        "    for slot in sampler.free_slots():\n"
        '        if state["next_group"] >= consumed + (max_lag + 1) * groups_per_batch:\n'
        "            break\n"
        '        if state["left"] == 0:',
        "rest of a group already started",
    ),
    # wrong mechanism (issue 45): whole groups only: free slots idle while a group could start
    Mutant(
        RF,
        "whole_groups_only",
        "    for slot in sampler.free_slots():\n",
        "    free = sampler.free_slots()\n"
        "    for slot in free:\n"
        '        if state["left"] == 0 and len(free) - started < group_size:\n'
        "            break  # wait until a whole group fits\n",
        "waited for G free slots",
    ),
    Mutant(
        RF,
        "state_rebound",
        "    started = 0\n",
        "    started = 0\n    state = dict(state)  # a local copy\n",
        "kept between calls",
    ),
    Mutant(
        RF,
        "free_slots_sorted",
        "    for slot in sampler.free_slots():\n",
        "    for slot in sorted(sampler.free_slots()):\n",
        "in sorted order",
    ),
]
