"""Planted bugs in lesson 06's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

BS, ST, IW, SB, SU = "bicycle_step", "sumtree_find", "importance_weights", "soft_bellman_target", "sumtree_update"

X_LINE = "    x_new = x + v * jnp.cos(psi + beta) * dt\n"
Y_LINE = "    y_new = y + v * jnp.sin(psi + beta) * dt\n"
PSI_LINE = "    psi_new = psi + v / l_r * jnp.sin(beta) * dt\n"
V_LINE = "    v_new = jnp.clip(v + accel * dt, 0.0, v_max)  # explicit Euler: the position above used the old v\n"
SOFT = "    soft_value = jnp.minimum(q1_next, q2_next) - alpha * logp_next  # the soft value of s'\n"
# the last line of a cell ends without a newline
TARGET = "    return reward + gamma * (1.0 - done) * soft_value  # a terminated s' has no future"
BETA = "    beta = jnp.arctan(l_r / (l_f + l_r) * jnp.tan(steer))  # slip angle at the centre of gravity\n"
WINNERS = "    winners = jnp.where(jnp.any(repeated_later, axis=1), tree.shape[0], capacity + indices)  # losers: out of range\n"
LEAF_WRITE = '    tree = tree.at[winners].set(values, mode="drop")  # each leaf written once, with its last value\n'
LEVELS = "    for _ in range(capacity.bit_length() - 1):  # log2(capacity) levels, bottom up\n"
PARENT = "        tree = tree.at[nodes].set(tree[2 * nodes] + tree[2 * nodes + 1])  # repeated parents: the same sum\n"
ROOT = "    i = 1  # the root\n"
RAW = "(n_stored * probabilities) ** (-beta)"

MUTANTS: list[Mutant] = [
    # bicycle_step: the slip angle, the direction of motion, the yaw rate, the order of the updates, the clip
    Mutant(
        BS,
        "beta_without_ratio",
        "jnp.arctan(l_r / (l_f + l_r) * jnp.tan(steer))",
        "jnp.arctan(jnp.tan(steer))",
        "l_r / (l_f + l_r)",
    ),
    Mutant(
        BS,
        "moves_along_psi",
        X_LINE + Y_LINE,
        X_LINE.replace("psi + beta", "psi") + Y_LINE.replace("psi + beta", "psi"),
        "not along psi",
    ),
    Mutant(
        BS,
        "sin_cos_swapped",
        X_LINE + Y_LINE,
        X_LINE.replace("cos", "sin") + Y_LINE.replace("sin", "cos"),
        "x uses cos and y uses sin",
    ),
    Mutant(
        BS, "divides_by_wheelbase", "v / l_r * jnp.sin(beta)", "v / (l_f + l_r) * jnp.sin(beta)", "not by the wheelbase"
    ),
    Mutant(BS, "rear_axle_yaw", "v / l_r * jnp.sin(beta)", "v * jnp.tan(steer) / (l_f + l_r)", "rear-axle"),
    Mutant(
        BS,
        "speed_before_position",
        X_LINE + Y_LINE + PSI_LINE + V_LINE,
        "    v = jnp.clip(v + accel * dt, 0.0, v_max)\n" + X_LINE + Y_LINE + PSI_LINE + "    v_new = v\n",
        "used the new speed",
    ),
    Mutant(
        BS,
        "heading_before_position",
        X_LINE + Y_LINE + PSI_LINE,
        PSI_LINE + X_LINE.replace("psi + beta", "psi_new + beta") + Y_LINE.replace("psi + beta", "psi_new + beta"),
        "the new heading",
    ),
    Mutant(
        BS,
        "no_clip_at_zero",
        "jnp.clip(v + accel * dt, 0.0, v_max)",
        "jnp.minimum(v + accel * dt, v_max)",
        "not clipped at 0",
    ),
    Mutant(
        BS,
        "no_clip_at_v_max",
        "jnp.clip(v + accel * dt, 0.0, v_max)",
        "jnp.maximum(v + accel * dt, 0.0)",
        "not clipped at v_max",
    ),
    Mutant(BS, "steer_in_degrees", "jnp.tan(steer)", "jnp.tan(jnp.radians(steer))", "already in radians"),
    Mutant(
        BS,
        "python_min_max",
        "jnp.clip(v + accel * dt, 0.0, v_max)",
        "max(0.0, min(v + accel * dt, v_max))",
        "elementwise",
    ),
    Mutant(
        BS,
        "speed_in_place",
        V_LINE,
        "    v += accel * dt  # in place: a numpy array given by the caller changes\n    v_new = jnp.clip(v, 0.0, v_max)\n",
        "changed the `v` array",
    ),
    Mutant(BS, "numpy_functions", "jnp.cos(psi + beta)", "np.cos(psi + beta)", "use jax.numpy (jnp)"),
    # sumtree_find: the index returned, the comparison, the subtraction, where the descent starts and stops
    Mutant(ST, "returns_tree_index", "    return i - capacity  #", "    return i  #", "return the item index"),
    Mutant(ST, "less_or_equal", "if u < tree[left]:", "if u <= tree[left]:", "go left only if u < tree[2i]"),
    Mutant(
        ST, "no_subtraction", "            u -= tree[left]  # skip the left subtree's mass\n", "", "forgot to subtract"
    ),
    Mutant(ST, "starts_at_index_0", "    i = 1  # the root\n", "    i = 0\n", "start the descent at the root, index 1"),
    Mutant(ST, "past_the_leaves", "while i < capacity:", "while i <= capacity:", "read past the end of the tree"),
    Mutant(
        ST,
        "leaf_off_by_one",
        "    return i - capacity  #",
        "    return i - capacity + 1  #",
        "off by one at the leaves",
    ),
    # sumtree_find: a linear scan instead of the descent (refused or over the read limit), a level short
    Mutant(
        ST,
        "searchsorted_scan",
        ROOT,
        '    return int(np.searchsorted(np.cumsum(tree[capacity:]), u, side="right"))\n' + ROOT,
        "linear scan",
    ),
    Mutant(
        ST,
        "asarray_scan",
        ROOT,
        "    leaves = np.asarray(tree)[capacity:]\n"
        '    return int(np.searchsorted(np.cumsum(leaves), u, side="right"))\n' + ROOT,
        "linear scan",
    ),
    Mutant(
        ST,
        "python_loop_scan",
        ROOT,
        "    total = 0.0\n"
        "    for j in range(capacity):  # a linear scan over the leaves\n"
        "        total += tree[capacity + j]\n"
        "        if u < total:\n"
        "            return j\n" + ROOT,
        "linear scan",
    ),
    Mutant(
        ST,
        "private_values_scan",
        ROOT,
        "    v = tree._values  # the tree's storage, past the one-node reads\n"
        "    c = len(v) // 2\n"
        '    return int(np.searchsorted(np.cumsum(v[c:]), u, side="right"))\n' + ROOT,
        "tree._values",
    ),
    Mutant(
        ST, "stops_one_level_early", "while i < capacity:", "while i < capacity // 2:", "one level above the leaves"
    ),
    # importance_weights: the normalisation, the sign of beta, N, the precedence of **
    Mutant(IW, "mean_normalisation", "w / jnp.max(w)", "w / jnp.mean(w)", "divided by their mean"),
    Mutant(IW, "sum_normalisation", "w / jnp.max(w)", "w / jnp.sum(w)", "divided by their sum"),
    Mutant(IW, "min_normalisation", "w / jnp.max(w)", "w / jnp.min(w)", "divided by the smallest"),
    Mutant(IW, "not_normalised", "w = w / jnp.max(w)", "w = w", "not normalised"),
    Mutant(IW, "always_normalised", "    if normalize:", "    if True:", "must return the raw weights"),
    Mutant(IW, "beta_sign", "** (-beta)", "** beta", "wrong sign"),
    Mutant(IW, "n_missing", RAW, "probabilities ** (-beta)", "N is missing"),
    Mutant(IW, "p_over_n", RAW, "(probabilities / n_stored) ** (-beta)", "P(i) / N"),
    Mutant(IW, "power_on_p_only", RAW, "n_stored * probabilities ** (-beta)", "as a whole"),
    Mutant(IW, "python_max", "jnp.max(w)", "max(w)", "fails under jax.jit"),
    # soft_bellman_target: the twin critics, the entropy term, the mask, the discount
    Mutant(
        SB, "max_of_critics", "jnp.minimum(q1_next, q2_next)", "jnp.maximum(q1_next, q2_next)", "maximum of the critics"
    ),
    Mutant(SB, "mean_of_critics", "jnp.minimum(q1_next, q2_next)", "(q1_next + q2_next) / 2", "mean of the critics"),
    Mutant(SB, "q1_only", "jnp.minimum(q1_next, q2_next)", "q1_next", "only q1_next"),
    Mutant(SB, "plus_alpha_logp", "- alpha * logp_next", "+ alpha * logp_next", "wrong sign"),
    Mutant(SB, "no_done_mask", "gamma * (1.0 - done) * soft_value", "gamma * soft_value", "done is ignored"),
    Mutant(
        SB,
        "mask_on_reward",
        "reward + gamma * (1.0 - done) * soft_value",
        "(1.0 - done) * (reward + gamma * soft_value)",
        "multiplies the reward too",
    ),
    Mutant(SB, "mask_inverted", "gamma * (1.0 - done) * soft_value", "gamma * done * soft_value", "inverted"),
    Mutant(
        SB,
        "entropy_outside",
        SOFT + TARGET,
        "    soft_value = jnp.minimum(q1_next, q2_next)\n"
        "    return reward + gamma * (1.0 - done) * soft_value - alpha * logp_next",
        "outside the discount",
    ),
    Mutant(SB, "no_gamma", "gamma * (1.0 - done) * soft_value", "(1.0 - done) * soft_value", "gamma is missing"),
    Mutant(SB, "python_min", "jnp.minimum(q1_next, q2_next)", "min(q1_next, q2_next)", "elementwise"),
    # wrong mechanism (issue 45): numpy on the host, called back from the jitted program
    Mutant(
        BS,
        "host_callback",
        BETA,
        "    def on_host(x, y, psi, v, accel, steer, l_f, l_r, dt, v_max):  # numpy, called back from the device\n"
        "        beta = np.arctan(l_r / (l_f + l_r) * np.tan(steer))\n"
        "        out = (x + v * np.cos(psi + beta) * dt, y + v * np.sin(psi + beta) * dt,\n"
        "               psi + v / l_r * np.sin(beta) * dt, np.clip(v + accel * dt, 0.0, v_max))\n"
        "        return tuple(np.asarray(o, dtype=np.float32) for o in out)\n\n"
        "    args = (x, y, psi, v, accel, steer, l_f, l_r, dt, v_max)\n"
        "    args = jnp.broadcast_arrays(*(jnp.asarray(a, dtype=jnp.float32) for a in args))\n"
        "    shape = jax.ShapeDtypeStruct(args[0].shape, jnp.float32)\n"
        "    return jax.pure_callback(on_host, (shape,) * 4, *args)\n" + BETA,
        "a host callback",
    ),
    # wrong mechanism (issue 45): numpy on the host, called back from the jitted program
    Mutant(
        IW,
        "host_callback",
        "    w = (n_stored * probabilities) ** (-beta)",
        "    def on_host(p, n, b):  # numpy on the host, called back from the device\n"
        "        w = (n * p.astype(np.float64)) ** (-b)\n"
        "        return (w / w.max() if normalize else w).astype(np.float32)\n\n"
        "    shape = jax.ShapeDtypeStruct(jnp.shape(probabilities), jnp.float32)\n"
        "    return jax.pure_callback(on_host, shape, probabilities, n_stored, beta)\n"
        "    w = (n_stored * probabilities) ** (-beta)",
        "a host callback",
    ),
    Mutant(IW, "n_is_batch_size", RAW, "(probabilities.shape[0] * probabilities) ** (-beta)", "not the batch size"),
    # sumtree_update: the winner of a repeated index, how parents are repaired, how many levels
    Mutant(
        SU, "first_write_wins", "(entry[None, :] > entry[:, None])", "(entry[None, :] < entry[:, None])", "first value"
    ),
    Mutant(SU, "no_ancestors", LEVELS + "        nodes = nodes // 2\n" + PARENT, "", "ancestors were not updated"),
    Mutant(
        SU, "one_level_short", "range(capacity.bit_length() - 1)", "range(capacity.bit_length() - 2)", "one level short"
    ),
    Mutant(SU, "level_past_root", "range(capacity.bit_length() - 1)", "range(capacity.bit_length())", "index 0"),
    # wrong mechanism (issue 45): a parent moved by its child's change; .set loses changes that share a parent
    Mutant(
        SU,
        "parent_delta_set",
        WINNERS + LEAF_WRITE + "    nodes = capacity + indices\n" + LEVELS + "        nodes = nodes // 2\n" + PARENT,
        "    nodes = capacity + indices\n"
        "    delta = values - tree[nodes]  # each leaf's change\n"
        "    tree = tree.at[nodes].set(values)\n" + LEVELS + "        nodes = nodes // 2\n"
        "        tree = tree.at[nodes].set(tree[nodes] + delta)\n",
        "one change survives",
    ),
    # wrong mechanism (issue 45): flashbax-style deltas added up the tree; a repeated index counts twice
    Mutant(
        SU,
        "parent_delta_add",
        WINNERS + LEAF_WRITE + "    nodes = capacity + indices\n" + LEVELS + "        nodes = nodes // 2\n" + PARENT,
        "    nodes = capacity + indices\n"
        "    delta = values - tree[nodes]  # each leaf's change\n"
        "    tree = tree.at[nodes].set(values)\n" + LEVELS + "        nodes = nodes // 2\n"
        "        tree = tree.at[nodes].add(delta)\n",
        "with .add",
    ),
    # wrong mechanism (issue 45): a repeated index left to the scatter (the last wins on a CPU, by chance)
    Mutant(
        SU, "scatter_decides_repeats", LEAF_WRITE, "    tree = tree.at[capacity + indices].set(values)\n", "unspecified"
    ),
    # wrong mechanism (issue 45): the CPU path, a loop over the K entries each walking up to the root
    Mutant(
        SU,
        "loop_over_entries",
        WINNERS + LEAF_WRITE + "    nodes = capacity + indices\n" + LEVELS + "        nodes = nodes // 2\n" + PARENT,
        "    for k in range(indices.shape[0]):  # one entry after another: later writes win by order\n"
        "        node = capacity + indices[k]\n"
        "        tree = tree.at[node].set(values[k])\n"
        "        for _ in range(capacity.bit_length() - 1):\n"
        "            node = node // 2\n"
        "            tree = tree.at[node].set(tree[2 * node] + tree[2 * node + 1])\n",
        "a loop over the K entries",
    ),
    # wrong mechanism (issue 45): every internal node rebuilt from the leaves, O(capacity) per update
    Mutant(
        SU,
        "rebuild_whole_tree",
        "    nodes = capacity + indices\n" + LEVELS + "        nodes = nodes // 2\n" + PARENT,
        "    level, width = tree[capacity:], capacity  # every leaf\n"
        "    while width > 1:\n"
        "        level, width = level[0::2] + level[1::2], width // 2\n"
        "        tree = tree.at[width : 2 * width].set(level)\n",
        "grows with the capacity",
    ),
    # wrong mechanism (issue 45): the first level of parents repaired sparsely, every level above it
    # (capacity / 4 nodes and fewer) rebuilt densely with small slices: few writes, no big array, O(capacity)
    Mutant(
        SU,
        "upper_levels_rebuilt",
        "    nodes = capacity + indices\n" + LEVELS + "        nodes = nodes // 2\n" + PARENT,
        "    if capacity > 1:\n"
        "        nodes = (capacity + indices) // 2  # the leaves' parents, sparsely\n"
        "        tree = tree.at[nodes].set(tree[2 * nodes] + tree[2 * nodes + 1])\n"
        "    width = capacity // 4\n"
        "    while width >= 1:  # every level above, whole, from strided slices of the level below\n"
        "        below = tree[2 * width : 4 * width : 2] + tree[2 * width + 1 : 4 * width : 2]\n"
        "        tree = tree.at[width : 2 * width].set(below)\n"
        "        width //= 2\n",
        "rebuilt densely with slices",
    ),
    # wrong mechanism (issue 45): the lowest 10 levels repaired sparsely, the levels of capacity / 2048 nodes
    # and fewer rebuilt whole: under the bound at one capacity, but the work grows with the capacity
    Mutant(
        SU,
        "top_fraction_rebuilt",
        "    nodes = capacity + indices\n" + LEVELS + "        nodes = nodes // 2\n" + PARENT,
        "    nodes = capacity + indices\n"
        "    for _ in range(min(10, capacity.bit_length() - 1)):  # the lowest levels, sparsely\n"
        "        nodes = nodes // 2\n"
        "        tree = tree.at[nodes].set(tree[2 * nodes] + tree[2 * nodes + 1])\n"
        "    width = capacity // 2048\n"
        "    while width >= 1:  # the small levels above, whole\n"
        "        below = tree[2 * width : 4 * width : 2] + tree[2 * width + 1 : 4 * width : 2]\n"
        "        tree = tree.at[width : 2 * width].set(below)\n"
        "        width //= 2\n",
        "fixed fraction of the capacity",
    ),
]
