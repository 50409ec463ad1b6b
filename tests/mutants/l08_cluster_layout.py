"""Planted bugs in lesson 08's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

MB, BS, ML, ES = "max_batch", "balanced_split", "mean_lag", "engine_schedule"
KV = "kv_per_token = 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * shape.kv_bytes_per_elem"
FLOOR = "n = math.floor(free_bytes / (kv_per_token * context_tokens))"
FREE = "free_bytes = memory_fraction * gpu.memory_bytes - shape.weight_bytes"
PICK = "n_samplers = max(sorted(candidates), key=lambda n: min(n * p, (n_gpus - n) * c))"
STAR = "n_star = n_gpus * c / (p + c)"
LITTLE = "little = (n_s * b_eff + spec.batch_samples / 2) / spec.batch_samples + spec.weight_sync_s / step_s"
CAPPED = "return min(float(spec.max_lag), little)"
TRAINER_BOUND = (
    "    if consumption <= production:  # the trainers are the bottleneck: the cap binds\n"
    "        return float(spec.max_lag)\n"
)
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
    # mean_lag: off-by-one in lag, the cap, the trainer-bound rule, the terms of Little's law
    Mutant(
        ML,
        "one_step_lag_0",
        'if layout == "one_step":\n        return 1.0',
        'if layout == "one_step":\n        return 0.0',
        "lag 1",
    ),
    Mutant(ML, "no_cap", CAPPED, "return little", "not capped"),
    Mutant(ML, "cap_off_by_one", CAPPED, "return min(float(spec.max_lag + 1), little)", "one is training"),
    Mutant(
        ML,
        "trainer_bound_off_by_one",
        "        return float(spec.max_lag)\n",
        "        return float(spec.max_lag + 1)\n",
        "one is training",
    ),
    Mutant(ML, "no_trainer_rule", TRAINER_BOUND, "", "the trainers are the bottleneck"),
    Mutant(ML, "no_queue", LITTLE, LITTLE.replace(" + spec.batch_samples / 2", ""), "half a batch"),
    Mutant(ML, "no_weight_sync", LITTLE, LITTLE.replace(" + spec.weight_sync_s / step_s", ""), "weight sync"),
    Mutant(ML, "counts_training_batch", LITTLE, LITTLE + " + 1", "do not add the batch in training"),
    Mutant(ML, "unknown_layout_accepted", 'if layout != "pipeline":', "if False:", "expected ValueError"),
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
]
