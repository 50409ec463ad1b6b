"""Planted bugs in lesson 08's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

MB, BS, MX, ES = "max_batch", "balanced_split", "max_lag_steps", "engine_schedule"
KV = "kv_per_token = 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * shape.kv_bytes_per_elem"
FLOOR = "n = math.floor(free_bytes / (kv_per_token * context_tokens))"
FREE = "free_bytes = memory_fraction * gpu.memory_bytes - shape.weight_bytes"
PICK = "n_samplers = max(sorted(candidates), key=lambda n: min(n * p, (n_gpus - n) * c))"
STAR = "n_star = n_gpus * c / (p + c)"
CEIL = "lag = math.ceil(mean_lag + lead_s / step_s - 1e-9)"
LEAD = "lead_s = (lengths.max() - lengths.mean()) * step_latency_s"
CAPPED = "return min(lag, math.floor(max_lag))"
HARD = "return (longest * step_latency_s + weight_sync_s) / steps"
REFILL = "heapq.heappush(free_at, int(start[j]) + int(length))"
LOOP = (
    "    for j, length in enumerate(lengths):\n"
    "        start[j] = heapq.heappop(free_at)\n"
    "        heapq.heappush(free_at, int(start[j]) + int(length))\n"
)

MUTANTS: list[Mutant] = [
    # max_batch: bytes vs bits, K and V, the per-layer factor, floor vs round, the usable memory
    Mutant(MB, "no_k_and_v", KV, KV.replace("2 * shape.n_layers", "shape.n_layers"), "a key AND a value"),
    Mutant(MB, "no_layers", KV, KV.replace("2 * shape.n_layers * ", "2 * "), "multiply by n_layers"),
    Mutant(MB, "bits", KV, KV.replace("shape.kv_bytes_per_elem", "8 * shape.kv_bytes_per_elem"), "counts bits"),
    Mutant(MB, "round", FLOOR, FLOOR.replace("math.floor", "round"), "rounded to the nearest"),
    Mutant(MB, "ceil", FLOOR, FLOOR.replace("math.floor", "math.ceil"), "rounded up"),
    Mutant(MB, "float_division", FLOOR, "n = free_bytes // (kv_per_token * context_tokens)", "return an int"),
    Mutant(MB, "all_memory", FREE, "free_bytes = gpu.memory_bytes - shape.weight_bytes", "memory_fraction"),
    Mutant(MB, "weights_ignored", FREE, "free_bytes = memory_fraction * gpu.memory_bytes", "not subtracted"),
    Mutant(
        MB,
        "weights_one_byte_a_param",
        FREE,
        "free_bytes = memory_fraction * gpu.memory_bytes - shape.n_params",
        "one byte a parameter",
    ),
    Mutant(MB, "no_value_error", "    if n < 1:\n", "    if n < 0:\n", "expected ValueError"),
    # balanced_split: the balance equation, p per second, integer vs floor rounding, ties
    Mutant(BS, "p_and_c_swapped", STAR, "n_star = n_gpus * p / (p + c)", "p and c are swapped"),
    Mutant(BS, "no_trainer_share", STAR, "n_star = n_gpus * c / p", "N - N_s GPUs"),
    Mutant(
        BS,
        "p_per_step",
        "p = max_batch / (a_s + b_s * max_batch)",
        "p = 1 / (a_s + b_s * max_batch)",
        "p is per decode step",
    ),
    Mutant(BS, "round", PICK, "n_samplers = min(max(round(n_star), 1), n_gpus - 1)", "rounded to the nearest"),
    Mutant(BS, "floor", PICK, "n_samplers = min(max(int(n_star), 1), n_gpus - 1)", "rounded down"),
    Mutant(BS, "ceil", PICK, "n_samplers = min(max(math.ceil(n_star), 1), n_gpus - 1)", "rounded up"),
    Mutant(BS, "ties_to_more", "max(sorted(candidates),", "max(sorted(candidates, reverse=True),", "fewer samplers"),
    # max_lag_steps (08.13): the mean lag for the max, the FIFO value under a hard rule, the cap,
    # the straggler's lead, its units, the rounding; the admission names
    Mutant(MX, "mean_lag_rounded_up", CEIL, "lag = math.ceil(mean_lag - 1e-9)", "the mean sample's lag"),
    Mutant(MX, "mean_lag_returned", CEIL, "lag = mean_lag", "that is the mean lag"),
    Mutant(MX, "mean_length_for_longest", LEAD, LEAD.replace("lengths.max()", "lengths.mean()"), "mean sample's lag"),
    Mutant(MX, "fifo_under_hard_rule", CAPPED, "return lag", "FIFO"),
    Mutant(MX, "cap_under_fifo", 'if admission == "fifo":', "if False:", "'fifo' bounds nothing"),
    Mutant(MX, "cap_not_floored", CAPPED, "return min(lag, max_lag)", "caps them at floor(max_lag)"),
    Mutant(MX, "whole_longest_answer", LEAD, LEAD.replace(" - lengths.mean()", ""), "not max(L) l"),
    Mutant(MX, "seconds_not_steps", CEIL, CEIL.replace("lead_s / step_s", "lead_s"), "divide by step_s"),
    Mutant(MX, "round_not_ceil", CEIL, CEIL.replace("math.ceil(", "round("), "rounded to the nearest"),
    Mutant(MX, "rounded_down", CEIL, CEIL.replace("math.ceil(", "math.floor("), "rounded down"),
    Mutant(
        MX,
        "unknown_admission_accepted",
        'if admission not in ("fifo", "wait", "drop"):',
        "if False:",
        "expected ValueError",
    ),
    Mutant(
        MX,
        "unknown_admission_unnamed",
        "use 'fifo', 'wait' or 'drop'",
        "use a known rule",
        "name the accepted rules",
    ),
    # hard_bound_step_s (08.14), in the same cell: the sync, the floor, the straggler, the steps
    Mutant(MX, "sync_forgotten", HARD, "return longest * step_latency_s / steps", "weight sync is missing"),
    Mutant(
        MX, "max_lag_not_floored", "steps = math.floor(max_lag)", "steps = max_lag", "divide by floor(max_lag), not"
    ),
    Mutant(
        MX,
        "mean_length_for_straggler",
        "longest = max(lengths_tokens)",
        "longest = sum(lengths_tokens) / len(lengths_tokens)",
        "not the mean one",
    ),
    Mutant(MX, "hard_bound_not_divided", HARD, HARD.replace(" / steps", ""), "not one"),
    Mutant(MX, "sync_every_step", HARD, "return longest * step_latency_s / steps + weight_sync_s", "paid once"),
    Mutant(MX, "hard_bound_off_by_one", HARD, HARD.replace("/ steps", "/ (steps + 1)"), "off by one"),
    Mutant(MX, "hard_bound_no_value_error", "if steps < 1:", "if steps < 0:", "expected ValueError"),
    # engine_schedule: the slot refill rule
    Mutant(ES, "end_off_by_one", "return start, start + lengths", "return start, start + lengths - 1", "one short"),
    Mutant(ES, "slot_taken_late", REFILL, REFILL.replace("int(length))", "int(length) + 1)"), "one step late"),
    Mutant(
        ES,
        "static_batching",
        LOOP,
        "    for j, length in enumerate(lengths):  # a new group of max_batch once the last one is done\n"
        "        group = j // max_batch\n"
        "        start[j] = 0 if group == 0 else max(start[i] + lengths[i] for i in range((group - 1) * max_batch, j - j % max_batch))\n",
        "static batching",
    ),
    Mutant(
        ES,
        "shortest_first",
        LOOP,
        "    for j in np.argsort(lengths, kind='stable'):\n"
        "        start[j] = heapq.heappop(free_at)\n"
        "        heapq.heappush(free_at, int(start[j]) + int(lengths[j]))\n",
        "shortest first",
    ),
    Mutant(
        ES,
        "one_slot_too_many",
        "free_at = [0] * min(max_batch, lengths.size)",
        "free_at = [0] * min(max_batch + 1, lengths.size)",
        "more than max_batch",
    ),
    # wrong mechanism (issue 45): float noise above a whole number taken for one more step (no 1e-9)
    Mutant(MX, "no_float_guard", CEIL, CEIL.replace(" - 1e-9", ""), "float noise"),
    Mutant(
        MX, "lead_over_the_shortest", LEAD, LEAD.replace("lengths.mean()", "lengths.min()"), "not over the shortest"
    ),
    Mutant(
        MX,
        "hard_bound_lead_only",
        "longest = max(lengths_tokens)",
        "longest = max(lengths_tokens) - sum(lengths_tokens) / len(lengths_tokens)",
        "not only its lead",
    ),
    Mutant(
        MB,
        "fraction_of_what_is_left",
        FREE,
        "free_bytes = memory_fraction * (gpu.memory_bytes - shape.weight_bytes)",
        "f (M - W)",
    ),
    Mutant(
        BS,
        "smallest_imbalance",
        PICK,
        "n_samplers = min(sorted(candidates), key=lambda n: abs(n * p - (n_gpus - n) * c))",
        "production and consumption are closest",
    ),
    Mutant(
        ES,
        "round_robin_slots",
        LOOP,
        "    for j, length in enumerate(lengths):  # slot j % max_batch runs sequences j, j + B, j + 2B, ...\n"
        "        start[j] = start[j - max_batch] + lengths[j - max_batch] if j >= max_batch else 0\n",
        "fixed queue",
    ),
    # wrong mechanism (issue 45): a step-by-step countdown of the caller's own array (np.asarray returns it)
    Mutant(
        ES,
        "counts_down_the_input",
        "    free_at = [0] * min(max_batch, lengths.size)  # the step at which each slot is free, a min-heap\n"
        "    start = np.zeros(lengths.size, dtype=np.int64)\n" + LOOP + "    return start, start + lengths",
        "    remaining = lengths  # counted down as the engine decodes\n"
        "    start, end = np.zeros(lengths.size, dtype=np.int64), np.zeros(lengths.size, dtype=np.int64)\n"
        "    waiting, running, step = list(range(lengths.size)), [], 0\n"
        "    while waiting or running:\n"
        "        while waiting and len(running) < max_batch:  # freed slots are taken at once\n"
        "            j = waiting.pop(0)\n"
        "            start[j] = step\n"
        "            running.append(j)\n"
        "        step += 1\n"
        "        for j in list(running):\n"
        "            remaining[j] -= 1\n"
        "            if remaining[j] == 0:\n"
        "                running.remove(j)\n"
        "                end[j] = step\n"
        "    return start, end",
        "changed the lengths",
    ),
]
