"""Planted bugs in lesson 11's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

AR, CS, RA = "assign_roles", "colocated_sync_update", "restart_accounting"
TF, JS = "trainers_finish", "join_step"

SYNC_GROUP = "sync_group = [0] + list(range(n_trainers, world_size))"
TOTALS = '        samples[kind] += n\n        samples["generated"] += n\n'
DECODE = "decode_s.append(a_s * longest + b_s * sum(steps))"
UPDATE = "update_s = max(d + t for d, t in zip(decode_s, train_s))"
RUNNABLE = "runnable = len(work) - j + background"
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
    # the job's Roles wrapped, the validation kept: right on every check but for the guard
    Mutant(
        AR,
        "wraps_library_roles",
        "    if rank < n_trainers:\n",
        "    from course_lib.capstone.roles import Roles\n\n"
        "    roles = Roles(world_size, n_trainers)\n"
        "    role = roles.role(rank)\n"
        '    members = roles.trainers if role == "trainer" else roles.generators\n'
        '    return {"role": role, "index": members.index(rank), "trainer_group": roles.trainers, '
        '"sync_group": roles.sync_ranks}\n'
        "    if rank < n_trainers:\n",
        "assign_roles uses course_lib.capstone.roles",  # .Roles, or the module it is imported from
    ),
    # colocated_sync_update: the tail (longest, shrinking live count), the prompt steps, the max, the pooled use
    Mutant(
        CS,
        "decodes_for_the_mean_length",
        "a_s * longest + b_s",
        "a_s * sum(steps) / max(len(steps), 1) + b_s",
        "decoded for the mean answer's length",
    ),
    Mutant(
        CS,
        "full_live_count_every_step",
        "+ b_s * sum(steps))",
        "+ b_s * len(steps) * longest)",
        "costed at the full live count",
    ),
    Mutant(
        CS,
        "prompt_left_out_of_decoding",
        DECODE,
        "decode_s.append(a_s * max(share, default=0) + b_s * sum(share))",
        "left out of decoding",
    ),
    Mutant(
        CS,
        "prompt_left_out_of_training",
        "train_s.append(sum(steps) / train_steps_per_s)",
        "train_s.append(sum(share) / train_steps_per_s)",
        "left out of training",
    ),
    Mutant(CS, "update_is_the_sum", UPDATE, UPDATE.replace("max(", "sum("), "the sum over the ranks"),
    Mutant(
        CS, "update_is_the_mean", UPDATE, UPDATE.replace("max(", "sum(") + " / len(shares)", "the mean over the ranks"
    ),
    Mutant(
        CS,
        "slot_use_averaged_over_ranks",
        "        live += sum(steps)\n        held += len(steps) * longest\n",
        "        if steps:\n            live += sum(steps) / (len(steps) * longest)\n            held += 1\n",
        "averaged over the ranks",
    ),
    # lesson 08's engine model for the tail (its linear path is exactly a_s * steps + b_s * tokens)
    Mutant(
        CS,
        "library_generation_time",
        DECODE,
        "from course_lib.layout.model import generation_time_s\n\n"
        "        decode_s.append(generation_time_s(steps, 1, max(len(steps), 1), a_s, b_s) if steps else 0.0)",
        "colocated_sync_update uses course_lib.layout.model",
    ),
    Mutant(
        CS,
        "library_engine_finish_times",
        DECODE,
        "import course_lib.layout.model as engine\n\n"
        "        decode_s.append(float(max(engine.engine_finish_times_s(steps, max(len(steps), 1), a_s, b_s), "
        "default=0.0)))",
        "colocated_sync_update uses course_lib.layout.model",
    ),
    Mutant(
        CS,
        "no_length_check",
        "if any(n < 1 for share in shares for n in share):",
        "if False:",
        "expected ValueError (an answer of 0 tokens)",
    ),
    Mutant(
        CS,
        "no_rate_check",
        "if train_steps_per_s <= 0:",
        "if False:",
        "expected ValueError",
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
    # trainers_finish: the share recounted at each finish, capped at a core, with the background; the last finish
    Mutant(
        TF,
        "fixed_share_throughout",
        RUNNABLE,
        "runnable = len(work) + background",
        "the fixed share min(1, cores / (trainers + background)) the whole time",
    ),
    Mutant(
        TF,
        "finished_trainers_still_runnable",
        RUNNABLE,
        "runnable = sum(w > 0 for w in work) + background",
        "a trainer that finished is still counted as runnable",
    ),
    Mutant(
        TF,
        "share_not_capped",
        "rate = min(1.0, cores / runnable)",
        "rate = cores / runnable",
        "not capped at one core",
    ),
    Mutant(TF, "background_forgotten", RUNNABLE, "runnable = len(work) - j", "background processes are forgotten"),
    Mutant(
        TF,
        "mean_finish",
        '"update_s": max(finish)',
        '"update_s": sum(finish) / len(finish)',
        "update_s is the mean finish",
    ),
    Mutant(
        TF,
        "no_negative_work_check",
        "if any(w < 0 for w in work):",
        "if False:",
        "expected ValueError (a negative work)",
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
