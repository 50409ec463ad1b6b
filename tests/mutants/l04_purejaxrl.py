"""Planted bugs in lesson 04's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

CS, GS, TD, MB = "cartpole_step", "gae_scan", "autoreset_td_targets", "make_minibatches"
TERM = "terminated = (jnp.abs(new_x) > params.x_threshold) | (jnp.abs(new_theta) > params.theta_threshold_radians)"
ADV = "adv = delta + gamma * lam * nd * next_adv"
SCAN = "jax.lax.scan(step, init, (rewards, values, not_done), reverse=True)"
EULER = (
    "new_x = x + params.tau * x_dot\n    new_x_dot = x_dot + params.tau * x_acc\n"
    "    new_theta = theta + params.tau * theta_dot\n    new_theta_dot = theta_dot + params.tau * theta_acc"
)
INIT_SCAN = "    init = (jnp.zeros_like(last_value), last_value)\n    _, advantages = " + SCAN + "\n"
MATRIX = (
    "    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)\n"
    "    deltas = rewards + gamma * not_done * next_values - values\n"
    "    n_t = rewards.shape[0]\n"
    "    ahead = (jnp.arange(n_t)[None, :] >= jnp.arange(n_t)[:, None])[:, :, None]  # [T, T, 1]: i >= t\n"
    "    prods = jnp.cumprod(jnp.where(ahead, gamma * lam * not_done[None], 1.0), axis=1)  # [T, T, B]\n"
    "    weights = jnp.where(ahead, jnp.concatenate([jnp.ones_like(prods[:, :1]), prods[:, :-1]], axis=1), 0.0)\n"
    "    outside = jnp.einsum('tkb,kb->tb', weights, deltas)\n"
)
DUMMY_SCAN = (
    "    _, advantages = jax.lax.scan(lambda c, a: (a, a), jnp.zeros_like(last_value), outside, reverse=True)\n"
)
ORDER = "order = jax.random.permutation(key, n)"
TAKE = "jnp.take(flat, order, axis=0)"
CHECK = (
    "    if n % n_minibatches:\n"
    '        raise ValueError(f"T * B = {n} samples do not split into {n_minibatches} equal minibatches")\n'
)

MUTANTS: list[Mutant] = [
    # cartpole_step
    Mutant(
        CS,
        "semi_implicit_euler",
        EULER,
        EULER.replace("x + params.tau * x_dot", "x + params.tau * new_x_dot")
        .replace("theta + params.tau * theta_dot", "theta + params.tau * new_theta_dot")
        .replace(
            "new_x = x + params.tau * new_x_dot\n    new_x_dot = x_dot + params.tau * x_acc",
            "new_x_dot = x_dot + params.tau * x_acc\n    new_x = x + params.tau * new_x_dot",
        )
        .replace(
            "new_theta = theta + params.tau * new_theta_dot\n    new_theta_dot = theta_dot + params.tau * theta_acc",
            "new_theta_dot = theta_dot + params.tau * theta_acc\n    new_theta = theta + params.tau * new_theta_dot",
        ),
        "explicit Euler updates x with the old x_dot",
    ),
    Mutant(
        CS,
        "force_sign",
        "jnp.where(action == 1, params.force_mag, -params.force_mag)",
        "jnp.where(action == 1, -params.force_mag, params.force_mag)",
        "the force has the wrong sign",
    ),
    Mutant(
        CS,
        "degrees_threshold",
        TERM,
        "terminated = (jnp.abs(new_x) > params.x_threshold) | (jnp.abs(new_theta) > 12.0)",
        "theta_threshold_radians is already in radians",
    ),
    Mutant(
        CS,
        "python_if",
        TERM,
        "terminated = jnp.asarray(abs(float(new_x)) > params.x_threshold or abs(float(new_theta)) > "
        "params.theta_threshold_radians)",
        "fails under jax.jit",
    ),
    Mutant(
        CS,
        "old_state_terminates",
        TERM,
        "terminated = (jnp.abs(x) > params.x_threshold) | (jnp.abs(theta) > params.theta_threshold_radians)",
        "gymnasium says",
    ),
    Mutant(
        CS,
        "pole_mass_for_total",
        "total_mass = params.masscart + params.masspole",
        "total_mass = params.masscart",
        "is wrong at index",
    ),
    Mutant(
        CS,
        "no_sin_in_theta_acc",
        "(params.gravity * sintheta - costheta * temp)",
        "(params.gravity * theta - costheta * temp)",
        "is wrong at index",
    ),
    # gae_scan
    Mutant(
        GS, "forward_scan", SCAN, "jax.lax.scan(step, init, (rewards, values, not_done))", "the recursion runs forwards"
    ),
    Mutant(
        GS, "trace_crosses_episode_ends", ADV, "adv = delta + gamma * lam * next_adv", "the trace crosses episode ends"
    ),
    Mutant(GS, "no_lambda", ADV, "adv = delta + gamma * nd * next_adv", "the trace decays by gamma only"),
    Mutant(
        GS,
        "no_bootstrap",
        "init = (jnp.zeros_like(last_value), last_value)",
        "init = (jnp.zeros_like(last_value), jnp.zeros_like(last_value))",
        "is wrong at index",
    ),
    Mutant(
        GS,
        "python_loop",
        "_, advantages = jax.lax.scan(step, init, (rewards, values, not_done), reverse=True)",
        "carry, outs = init, []\n"
        "    for t in reversed(range(rewards.shape[0])):\n"
        "        carry, adv_t = step(carry, (rewards[t], values[t], not_done[t]))\n"
        "        outs.append(adv_t)\n"
        "    advantages = jnp.stack(outs[::-1])",
        "holds no lax.scan",
    ),
    Mutant(
        GS,
        "delta_ignores_done",
        "delta = r + gamma * nd * next_value - v",
        "delta = r + gamma * next_value - v",
        "is wrong at index",
    ),
    # autoreset_td_targets
    Mutant(
        TD,
        "truncation_as_termination",
        "(1.0 - terminated.astype(values.dtype))",
        "(1.0 - done.astype(values.dtype))",
        "a truncated step is treated as terminated",
    ),
    Mutant(
        TD,
        "bootstraps_from_the_reset_state",
        "next_values = jnp.where(done, final_values, next_values)",
        "next_values = next_values",
        "the NEXT episode's first observation",
    ),
    Mutant(
        TD,
        "final_values_everywhere",
        "next_values = jnp.where(done, final_values, next_values)",
        "next_values = final_values",
        "final_values is read where no episode ended",
    ),
    Mutant(
        TD,
        "termination_bootstraps",
        "rewards + gamma * (1.0 - terminated.astype(values.dtype)) * next_values",
        "rewards + gamma * next_values",
        "a terminated step bootstraps",
    ),
    Mutant(
        TD,
        "no_shift",
        "jnp.concatenate([values[1:], last_value[None]], axis=0)",
        "values",
        "is wrong at index",
    ),
    # make_minibatches
    Mutant(MB, "not_shuffled", ORDER, "order = jnp.arange(n)", "not shuffled"),
    Mutant(
        MB,
        "draws_with_replacement",
        ORDER,
        "order = jax.random.randint(key, (n,), 0, n)",
        "must appear exactly once",
    ),
    Mutant(MB, "no_divisibility_check", CHECK, "", "not a ValueError"),
    # wrong mechanism (issue 45): a permutation drawn per leaf (a key split per leaf): every leaf is a
    # permutation of the samples, but an observation is paired with another sample's action
    Mutant(
        MB,
        "permutation_per_leaf",
        "    def shuffle(x):\n        flat = x.reshape((n,) + x.shape[2:])\n        return " + TAKE,
        "    def shuffle(x):\n        flat = x.reshape((n,) + x.shape[2:])\n"
        "        return jnp.take(flat, jax.random.permutation(jax.random.fold_in(key, x.ndim * 7 + x.shape[-1]), n), "
        "axis=0)",
        "different permutations",
    ),
    # wrong mechanism (issue 45): the time steps shuffled within each env (one permutation of T), every env
    # keeping its column: each minibatch holds whole time steps of every env
    Mutant(
        MB,
        "shuffle_within_each_env",
        ORDER,
        "order = (jax.random.permutation(key, n_t)[:, None] * n_b + jnp.arange(n_b)).reshape(-1)",
        "only the time steps are shuffled",
    ),
    # wrong mechanism (issue 45): one permutation of the T axis times one of the B axis: every sample once,
    # aligned, key-dependent, envs and time steps both moved, yet each minibatch holds whole time steps of every env
    Mutant(
        MB,
        "product_of_time_and_env_permutations",
        ORDER,
        "order = (jax.random.permutation(jax.random.fold_in(key, 0), n_t)[:, None] * n_b\n"
        "             + jax.random.permutation(jax.random.fold_in(key, 1), n_b)[None, :]).ravel()",
        "holds 4.0 of the 16 time steps",
    ),
    # wrong mechanism (issue 45): a rotation by a random offset: every sample once, key-dependent, not a shuffle
    Mutant(
        MB,
        "random_rotation",
        ORDER,
        "order = (jnp.arange(n) + jax.random.randint(key, (), 0, n)) % n",
        "a rotation",
    ),
    # wrong mechanism (issue 45): a Python loop over samples, gathering one row per sample (right numbers;
    # the program grows with T * B)
    Mutant(
        MB,
        "python_loop_over_samples",
        "return " + TAKE,
        "return jnp.stack([flat[order[i]] for i in range(n)])",
        "grows with the batch",
    ),
    # wrong mechanism (issue 45): gymnasium's numbers written in, so only the default CartPole steps right
    Mutant(
        CS,
        "hardcoded_constants",
        "total_mass = params.masscart + params.masspole\n    polemass_length = params.masspole * params.length",
        "total_mass = 1.1  # masscart + masspole\n    polemass_length = 0.05  # masspole * length",
        "every constant must come from params",
    ),
    # wrong mechanism (issue 45): part of the step computed on the host by a callback (right numbers, two programs)
    Mutant(
        CS,
        "host_callback",
        "new_x = x + params.tau * x_dot\n",
        "new_x = jax.pure_callback(lambda a, b, c: np.asarray(a + c * b, np.float32), jax.ShapeDtypeStruct((), "
        "jnp.float32), x, x_dot, params.tau, vmap_method='broadcast_all')\n",
        "pure_callback",
    ),
    # wrong mechanism (issue 45): a debugging print left inside the scan: a host round trip every step
    Mutant(
        GS,
        "debug_print_in_scan",
        "        adv = delta + gamma * lam * nd * next_adv\n",
        '        adv = delta + gamma * lam * nd * next_adv\n        jax.debug.print("A_t = {a}", a=adv)\n',
        "debug_print",
    ),
    # wrong mechanism (issue 45): one length-T scan whose step sums the discounted future deltas with vector ops
    # over all T (a cumprod mask and a dot product): O(T^2), the carried [B] array only passed along
    Mutant(
        GS,
        "future_deltas_summed_in_step",
        "    def step(carry, x):\n"
        "        next_adv, next_value = carry\n"
        "        r, v, nd = x\n"
        "        delta = r + gamma * nd * next_value - v\n"
        "        adv = delta + gamma * lam * nd * next_adv\n"
        "        return (adv, v), adv\n"
        "\n"
        "    init = (jnp.zeros_like(last_value), last_value)\n"
        "    _, advantages = " + SCAN + "\n",
        "    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)\n"
        "    deltas = rewards + gamma * not_done * next_values - values  # [T, B]\n"
        "    steps = jnp.arange(rewards.shape[0])\n"
        "\n"
        "    def step(carry, t):  # A_t = sum_k (prod_{i=t}^{k-1} gamma lam (1 - d_i)) delta_k, over all T at once\n"
        "        ahead = (steps >= t)[:, None]\n"
        "        factors = jnp.where(ahead, gamma * lam * not_done, 1.0)\n"
        "        traces = jnp.concatenate([jnp.ones_like(factors[:1]), jnp.cumprod(factors, axis=0)[:-1]], axis=0)\n"
        "        adv = jnp.einsum('tb,tb->b', jnp.where(ahead, traces, 0.0), deltas)\n"
        "        return adv, adv\n"
        "\n"
        "    _, advantages = jax.lax.scan(step, jnp.zeros_like(last_value), steps, reverse=True)\n",
        "the scan's step works on an array with the time axis",
    ),
    # wrong mechanism (issue 45): the advantages computed outside the scan by an O(T^2) [T, T, B] matrix of
    # discounts, then a dummy reverse scan that passes them through, carrying a [B] array it never reads
    Mutant(GS, "matrix_outside_dummy_scan", INIT_SCAN, MATRIX + DUMMY_SCAN, "does not depend on its carry"),
    # ... and the same with a carry that formally feeds the output (a + 0 * carry): the [T, T] matrix is refused
    Mutant(
        GS,
        "matrix_outside_fed_carry",
        INIT_SCAN,
        MATRIX + DUMMY_SCAN.replace("(a, a)", "(a + 0.0 * c, a + 0.0 * c)"),
        "builds a [T, T] array",
    ),
    # wrong mechanism (issue 45, second review): the O(T^2) sum over the steps ahead in a while_loop outside the
    # scan (only [T, B] arrays, no [T, T] one), then a reverse scan whose carry formally feeds its output
    Mutant(
        GS,
        "while_loop_outside_fed_carry",
        INIT_SCAN,
        "    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)\n"
        "    deltas = rewards + gamma * not_done * next_values - values\n"
        "    n_t = rewards.shape[0]\n"
        "    steps = jnp.arange(n_t)\n"
        "\n"
        "    def row(c):\n"
        "        t, out = c\n"
        "        ahead = (steps >= t)[:, None]\n"
        "        factors = jnp.where(ahead, gamma * lam * not_done, 1.0)\n"
        "        traces = jnp.concatenate([jnp.ones_like(factors[:1]), jnp.cumprod(factors, axis=0)[:-1]], axis=0)\n"
        "        return t + 1, out.at[t].set(jnp.einsum('tb,tb->b', jnp.where(ahead, traces, 0.0), deltas))\n"
        "\n"
        "    _, outside = jax.lax.while_loop(lambda c: c[0] < n_t, row, (0, jnp.zeros_like(deltas)))\n"
        + DUMMY_SCAN.replace("(a, a)", "(a + 0.0 * c, a + 0.0 * c)"),
        "holds a while_loop",
    ),
    # wrong mechanism (issue 45): the bootstrap selected by multiplying with a 0/1 mask, which reads final_values
    # where they are undefined (0 * nan = nan)
    Mutant(
        TD,
        "mask_multiplication",
        "next_values = jnp.where(done, final_values, next_values)",
        "not_done = 1.0 - done.astype(values.dtype)\n    next_values = (1.0 - not_done) * final_values + not_done * next_values",
        "a nan there (an undefined entry may hold anything) reached the targets",
    ),
]
