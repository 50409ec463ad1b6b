"""Planted bugs in lesson 11's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

AR, SA, RA = "assign_roles", "sync_and_admit", "restart_accounting"
DP = "data_parallel_losses"

SYNC_GROUP = "sync_group = [0] + list(range(n_trainers, world_size))"
BOUND = "k < consumed + (max_lag + 1) * B"
NORM = "/ n_tokens)"
LOSS_LINE = 'losses.append(-(w * s["adv"][:, None] * logp_new * m).sum() / n_tokens)'
TOTALS = '        samples[kind] += n\n        samples["generated"] += n\n'

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
        "calls course_lib's pipeline_loss",
    ),
]
