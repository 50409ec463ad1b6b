"""Planted bugs in lesson 11's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

AR, SA, RA = "assign_roles", "sync_and_admit", "restart_accounting"
DP, JS = "data_parallel_losses", "join_step"

SYNC_GROUP = "sync_group = [0] + list(range(n_trainers, world_size))"
BOUND = "k < consumed + (max_lag + 1) * B"
NORM = "/ n_tokens)"
LOSS_LINE = 'losses.append(-(w * s["adv"][:, None] * logp_new * m).sum() / n_tokens)'
TOTALS = '        samples[kind] += n\n        samples["generated"] += n\n'
PULL_THEN_ADMIT = (
    "    if announced > version:  # newer weights: load them before the next decoding step\n"
    "        version = announced\n"
    "    may_start = version >= 0 and k < consumed + (max_lag + 1) * B\n"
)
WELCOME = "    n = store.get(f\"welcome/{me['nonce']}\")\n    if n is None:\n        return None\n"

MUTANTS: list[Mutant] = [
    # assign_roles: the boundary, the index within the role, the groups, the validation
    Mutant(AR, "boundary_off_by_one", "if rank < n_trainers:", "if rank <= n_trainers:", "off by one at the trainer"),
    Mutant(
        AR,
        "generators_from_the_end",
        '"generator", rank - n_trainers',
        '"generator", world_size - 1 - rank',
        "counted from the wrong end",
    ),
    Mutant(AR, "global_index", '"generator", rank - n_trainers', '"generator", rank', "not the global rank"),
    Mutant(
        AR,
        "sync_group_without_source",
        SYNC_GROUP,
        "sync_group = list(range(n_trainers, world_size))",
        "needs trainer 0",
    ),
    Mutant(AR, "sync_group_of_everyone", SYNC_GROUP, "sync_group = list(range(world_size))", "the other trainers"),
    Mutant(
        AR,
        "groups_depend_on_rank",
        "trainer_group = list(range(n_trainers))",
        'trainer_group = list(range(n_trainers)) if role == "trainer" else []',
        "trainer_group is []",
    ),
    Mutant(AR, "no_rank_check", "if not 0 <= rank < world_size:", "if rank >= world_size:", "a negative rank"),
    Mutant(
        AR, "no_generator_check", "if n_trainers >= world_size:", "if n_trainers > world_size:", "no generator left"
    ),
    # sync_and_admit: the pull, the bound, the weights, the validation
    Mutant(SA, "pulls_older_version", "if announced > version:", "if announced != version:", "an older version"),
    Mutant(SA, "never_pulls", "        version = announced\n", "        pass\n", "never pulls"),
    Mutant(SA, "bound_one_group_over", BOUND, "k <= consumed + (max_lag + 1) * B", "off by one in the backpressure"),
    Mutant(SA, "bound_too_tight", BOUND, "k < consumed + max_lag * B", "too tight"),
    Mutant(SA, "starts_without_weights", "version >= 0 and ", "", "no weights yet"),
    Mutant(SA, "bound_from_announced", BOUND, "k < announced * B + (max_lag + 1) * B", "not from the announced"),
    Mutant(SA, "no_validation", "if max_lag < 0 or B < 1:", "if B < 0:", "expected ValueError"),
    Mutant(
        SA,
        "admits_before_pulling",
        PULL_THEN_ADMIT,
        "    may_start = version >= 0 and k < consumed + (max_lag + 1) * B\n"
        "    if announced > version:\n"
        "        version = announced\n",
        "with the version held before this step's pull",
    ),
    # restart_accounting: which copy counts, the boundaries, the totals
    Mutant(
        RA,
        "keeps_groups_after_checkpoint",
        'kind = "consumed" if attempt == owner else "discarded"',
        'kind = "consumed"',
        "generated after the checkpoint",
    ),
    Mutant(
        RA,
        "first_attempts_copy",
        "                    owner = a\n",
        "                    owner = a\n                    break\n",
        "the first attempt's copy",
    ),
    Mutant(
        RA, "step_boundary_off_by_one", "if step <= update:", "if step < update:", "off by one at the step boundary"
    ),
    Mutant(
        RA, "last_update_off_by_one", "if update >= final_step:", "if update > final_step:", "off by one at the last"
    ),
    Mutant(
        RA,
        "late_groups_all_leftover",
        'kind = "leftover" if attempt == last else "discarded"',
        'kind = "leftover"',
        "not left over",
    ),
    Mutant(RA, "counts_groups", TOTALS, TOTALS.replace("+= n", "+= 1"), "count samples"),
    Mutant(
        RA,
        "sorts_the_input",
        "    for attempt, k, n in generated:\n",
        "    generated.sort()\n    for attempt, k, n in generated:\n",
        "changed its inputs",
    ),
    # data_parallel_losses: the normaliser (local, per-rank mean, padding), sg[], the mask, the clip, the library
    Mutant(DP, "local_token_count", NORM, "/ m.sum())", "its own (local) token count"),
    Mutant(DP, "per_rank_mean", NORM, "/ (m.sum() * len(shards)))", "averaged over the ranks"),
    Mutant(DP, "no_stop_gradient", "logp_new.detach() - ", "logp_new - ", "sg[w] is a constant"),
    Mutant(DP, "padding_in_the_count", 'int(s["mask"].sum())', 's["mask"].numel()', "includes padding"),
    Mutant(DP, "unmasked_sum", "* logp_new * m).sum()", "* logp_new).sum()", "multiply every term by the mask"),
    Mutant(
        DP,
        "untruncated_weights",
        'torch.clamp(torch.exp(logp_new.detach() - s["logp_behaviour"]), max=clip_c)',
        'torch.exp(logp_new.detach() - s["logp_behaviour"])',
        "not truncated",
    ),
    Mutant(
        DP,
        "calls_the_library",
        LOSS_LINE,
        "from course_lib.pipeline.loss import pipeline_loss\n\n"
        '        part = pipeline_loss(logp_new, s["logp_behaviour"], s["adv"][:, None] * m, m, clip_c)\n'
        "        losses.append(part * m.sum() / n_tokens)",
        "uses course_lib.pipeline.loss.pipeline_loss",  # the runner-wide guard, before any check
    ),
    # wrong mechanism (issue 45): the lesson's c = 2 written in, right on every batch graded at c = 2
    Mutant(DP, "truncates_at_a_constant", "max=clip_c)", "max=2.0)", "truncated at 2 whatever clip_c is"),
    # wrong mechanism (issue 45): N_tok counts only the tokens that carry a signal (A != 0)
    Mutant(
        DP,
        "skips_zero_advantage_tokens",
        'n_tokens = sum(int(s["mask"].sum()) for s in shards)',
        'n_tokens = sum(int((s["mask"] & (s["adv"] != 0)[:, None]).sum()) for s in shards)',
        "leaves out the answers with a zero advantage",
    ),
    # join_step: where the number comes from, the fresh key, the newest check, ready vs join, the
    # welcome per nonce, stepping aside, never waiting inside a call
    # wrong mechanism (issue 45): the number read off the counter, no welcome at all
    Mutant(
        JS,
        "number_from_the_counter",
        WELCOME,
        '    n = store.get("attempts", 0) or None\n    if n is None:\n        return None\n',
        "took the number from `attempts` itself",
    ),
    # wrong mechanism (issue 45): a nonce derived from the rank, the same in every attempt
    Mutant(
        JS,
        "nonce_from_the_rank",
        '    if "nonce" not in me:  # post a key only this process will wait at\n        me["nonce"] = me["fresh"]()',
        '    if "nonce" not in me:\n        me["nonce"] = f"rank-{rank}"',
        "was not fresh",
    ),
    # wrong mechanism (issue 45): a welcome taken at its word, without the newest check
    Mutant(
        JS,
        "trusts_any_welcome",
        'if n != store.get("attempts", 0):  # welcomed by a dead attempt\'s rank 0: join again',
        "if False:",
        "without checking",
    ),
    # wrong mechanism (issue 45): join/k taken as the sign that rank k joined
    Mutant(JS, "join_key_counts_as_ready", 'if f"ready/{n}/{k}" in store:', 'if f"join/{k}" in store:', "only ready/"),
    # wrong mechanism (issue 45): each rank welcomed once, the dead rank's nonce included
    Mutant(
        JS,
        "welcomes_each_rank_once",
        'if nonce is not None and me["welcomed"].get(k) != nonce:',
        'if nonce is not None and k not in me["welcomed"]:',
        "remember the nonce you welcomed",
    ),
    Mutant(
        JS,
        "never_steps_aside",
        'if store["attempts"] != n:  # a newer attempt started: this one is dead',
        "if False:",
        "step aside",
    ),
    # wrong mechanism (issue 45): a blocking wait inside one call
    Mutant(
        JS,
        "waits_inside_the_call",
        WELCOME,
        "    n = store.get(f\"welcome/{me['nonce']}\")\n    while n is None:\n"
        "        n = store.get(f\"welcome/{me['nonce']}\")\n",
        "must not wait",
    ),
    Mutant(JS, "new_number_every_call", 'if "n" not in me:', "if True:", "takes the next number once"),
]
