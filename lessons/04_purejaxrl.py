# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · PureJaxRL: the whole loop on the accelerator
#
# The classic RL loop of lessons 01-03 alternates two worlds: the environment steps in
# Python/numpy on the CPU, the policy runs in a deep-learning framework, and every step
# copies observations in and actions out. On an accelerator that copy, and the Python
# between steps, dominate: the device waits for the host at every env step and every
# gradient step, about 150 times per PPO update here (counted in section 4).
# **When the environment itself is a pure JAX function, the whole training loop (acting,
# advantage estimation, every gradient step) compiles into one XLA program.** Nothing
# leaves the device until training ends, and because the program is a pure function of a
# random key and hyperparameters, `jax.vmap` runs it for many seeds, or many learning
# rates, *in the same program*: on an accelerator nearly for free, since one small run
# leaves most of the device idle (Lu et al. 2022, PureJaxRL; gymnax,
# Lange 2022).
#
# **Learning goals**
# 1. Write an environment in the functional style (`reset`, `step_env`, `step` with
#    auto-reset, immutable state) and check it against gymnasium step for step.
# 2. Use `jax.jit`, `jax.vmap` and `jax.lax.scan` for what they are for: compile once,
#    batch without loops, loop without Python.
# 3. Read PPO as equations (GAE 04.2-04.3, clipped loss 04.4-04.6) and find each in
#    `course_lib.ppo.jax_ppo`, an end-to-end jitted `make_train(config) -> train(key)`.
# 4. Measure, in one run, the speedup over the classic torch + gymnasium loop, with
#    compile time and run time apart.
# 5. Vmap a whole training run over seeds and over learning rates, and read the
#    learning curves and the sweep.
#
# Builds on lesson 01 (policy gradients, advantages) and lesson 03 (where the time of a
# classic loop goes).

# %%
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, describe, pick, progress, show_source
from course_lib.envs import cartpole
from course_lib.ppo.jax_ppo import PPOConfig, act_and_step, final_return, make_train, make_update_step
from course_lib.ppo.torch_ppo import train_torch

print(f"course_lib {course_lib.__version__} | scale: {current_scale()} | JAX backend: {jax.default_backend()}")

# %% [markdown]
# ## 1 · The functional environment API
#
# gymnasium's `CartPole-v1` is an object that mutates itself: `env.step(a)` changes
# `env.state`. A JAX environment is a set of **pure functions** of an immutable state
# (`course_lib.envs.cartpole`, in gymnax's layout):
#
# ```
# obs, state = reset(key, params)                                     # a new episode
# obs, state, reward, terminated, truncated = step_env(key, state, action, params)
# obs, state, reward, terminated, truncated, info = step(key, state, action, params)   # + auto-reset
# ```
#
# `EnvState` (cart position and velocity, pole angle and angular velocity, the step
# count) and `EnvParams` (gravity, masses, thresholds, the 500-step limit) are frozen
# dataclasses registered as pytrees, so they flow through `jit`, `vmap` and `scan`. One
# step is an explicit Euler step of the cart-pole equations (Florian 2007), exactly as
# gymnasium computes it, with the push $F = \pm 10$ N, the pole's mass $m$, the total
# mass $M$ of cart and pole, the pole's half-length $l$, gravity $g$ and the time step
# $\tau$ = 0.02 s:
#
# $$\text{temp} = \frac{F + m l \dot\theta^2 \sin\theta}{M},\quad
#   \ddot\theta = \frac{g\sin\theta - \cos\theta\,\text{temp}}{l\,(4/3 - m\cos^2\theta / M)},\quad
#   \ddot x = \text{temp} - \frac{m l \ddot\theta \cos\theta}{M}, \qquad
#   s' = s + \tau\,\dot s \qquad (04.1)$$
#
# **Terminated** ($|x| > 2.4$ or $|\theta| > 12°$: the pole fell, no future reward) and
# **truncated** (500 steps: a time limit, the state still has a value) come back apart.
# `step` resets in the same call when either happens, by computing both branches and
# selecting with `jnp.where` (no Python `if` on a traced value), and keeps the last
# observation in `info["final_obs"]`.
#
# **Parity with gymnasium.** Step gymnasium's env and ours from the same state with the
# same random actions. Random episodes end
# long before the time limit, so one more step starts from step 499 to see a truncation:

# %%
params = cartpole.DEFAULT_PARAMS
step_env = jax.jit(cartpole.step_env)
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=0)
rng = np.random.default_rng(0)
max_err, agree, n = 0.0, 0, 300
for _ in range(n):
    state = cartpole.state_from_array(jnp.asarray(env.unwrapped.state, jnp.float32), env._elapsed_steps)
    action = int(rng.integers(2))
    obs, reward, terminated, truncated, _ = env.step(action)
    j_obs, _, j_reward, j_term, j_trunc = step_env(None, state, action, params)
    max_err = max(max_err, float(np.abs(np.asarray(j_obs) - obs).max()))
    agree += (float(j_reward), bool(j_term), bool(j_trunc)) == (reward, terminated, truncated)
    if terminated or truncated:
        obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
env.reset(seed=1)
env._elapsed_steps = 499  # gymnasium's time-limit counter: the next step is the 500th
state = cartpole.state_from_array(jnp.asarray(env.unwrapped.state, jnp.float32), 499)
_, _, terminated, truncated, _ = env.step(1)
_, _, _, j_term, j_trunc = step_env(None, state, 1, params)
assert max_err < 1e-5 and agree == n and (bool(j_term), bool(j_trunc)) == (terminated, truncated) == (False, True)
print(f"{n} steps: observations agree to < 1e-5, rewards / terminated / truncated agree on {agree}/{n}")
print(f"the 500th step: gymnasium truncated={truncated}, ours truncated={bool(j_trunc)} (terminated: both False)")

# %% [markdown]
# ## 2 · jit, vmap and scan in three small examples
#
# * `jax.jit(f)` traces `f` once with abstract arrays and compiles the trace with XLA;
#   later calls with the same shapes run the compiled program.
# * `jax.vmap(f)` turns a function of one example into a function of a batch, by
#   rewriting the trace (no Python loop, no copies of `f`).
# * `jax.lax.scan(body, carry, xs)` is a loop *inside* the program: `body(carry, x) ->
#   (carry, y)` runs once per `x` and the `y`s are stacked. Python loops under `jit`
#   would be unrolled into one copy per iteration; `scan` compiles the body once.
#
# Here they are on the env: 3 envs stepped by one vmapped call, then a 200-step rollout
# of 3 envs with a fixed "push towards the pole" policy as a scan of the vmapped step.

# %%
k_reset, k_step = jax.random.split(jax.random.key(0))  # one split: a key is used once
obs3, states3 = jax.vmap(cartpole.reset, in_axes=(0, None))(jax.random.split(k_reset, 3), params)
v_step = jax.vmap(cartpole.step, in_axes=(0, 0, 0, None))
obs3_next, states3, rewards3, *_ = v_step(jax.random.split(k_step, 3), states3, jnp.array([0, 1, 1]), params)
print("one vmapped step of 3 envs: obs", obs3_next.shape, "rewards", rewards3)


@jax.jit
def fixed_policy_rollout(key):
    """200 steps of 3 envs: push the cart under the pole (action 1 if the pole leans right)."""
    k_reset, k_loop = jax.random.split(key)
    obs, state = jax.vmap(cartpole.reset, in_axes=(0, None))(jax.random.split(k_reset, 3), params)

    def body(carry, step_key):
        obs, state = carry
        action = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(jnp.int32)
        obs, state, reward, terminated, truncated, _ = v_step(jax.random.split(step_key, 3), state, action, params)
        return (obs, state), (reward, terminated | truncated)

    _, (rewards, dones) = jax.lax.scan(body, (obs, state), jax.random.split(k_loop, 200))
    return rewards, dones


rewards, dones = fixed_policy_rollout(jax.random.key(1))
print(f"scan of 200 steps x 3 envs: rewards {rewards.shape}, episodes ended: {int(dones.sum())}")

# %% [markdown]
# **Takeaway:** the same `cartpole.step` serves one env, a batch (`vmap`) and a rollout
# (`scan`); the rollout is one compiled program with no Python between steps.
#
# ## 3 · Vectorised env throughput: a random policy, JAX vs gymnasium
#
# Random-policy env steps per second: `N` envs stepped `T` times by a jitted, vmapped,
# scanned `step` (random actions drawn inside the program), against gymnasium's own
# numpy-vectorised CartPole (`gym.make_vec(..., vectorization_mode="vector_entry_point")`,
# gymnasium's fastest vector env: one numpy call steps every env; EnvPool's C++ envs are
# not measured here) and a `SyncVectorEnv` (one Python env object per env). Each
# measurement takes a few tens of milliseconds, so the three are interleaved five times
# and each reports its fastest.

# %%
N_ENVS, N_STEPS = pick(cpu=(256, 400), full=(65_536, 1000))


def jax_random_steps(n_envs, n_steps):
    @jax.jit
    def run(key):
        k_reset, k_loop = jax.random.split(key)
        _, state = jax.vmap(cartpole.reset, in_axes=(0, None))(jax.random.split(k_reset, n_envs), params)

        def body(state, k):
            k_act, k_step = jax.random.split(k)
            action = jax.random.bernoulli(k_act, 0.5, (n_envs,)).astype(jnp.int32)
            _, state, _, terminated, truncated, _ = v_step(jax.random.split(k_step, n_envs), state, action, params)
            return state, (terminated | truncated).sum()  # depends on the physics, so XLA cannot skip it

        return jax.lax.scan(body, state, jax.random.split(k_loop, n_steps))[1].sum()

    return run


def gym_random_steps(n_envs, n_steps, mode):
    envs = gym.make_vec("CartPole-v1", num_envs=n_envs, vectorization_mode=mode)
    envs.reset(seed=0)
    envs.action_space.seed(0)
    t0 = time.perf_counter()
    for _ in range(n_steps):
        envs.step(envs.action_space.sample())
    seconds = time.perf_counter() - t0
    envs.close()
    return n_envs * n_steps / seconds


run_random = jax_random_steps(N_ENVS, N_STEPS)
t0 = time.perf_counter()
jax.block_until_ready(run_random(jax.random.key(0)))  # the first call compiles
compile_s = time.perf_counter() - t0
jax_runs, numpy_runs, sync_runs = [], [], []
for r in range(5):  # interleaved; each arm's fastest of 5
    t0 = time.perf_counter()
    jax.block_until_ready(run_random(jax.random.key(1 + r)))
    jax_runs.append(N_ENVS * N_STEPS / (time.perf_counter() - t0))
    numpy_runs.append(gym_random_steps(N_ENVS, N_STEPS // 4, "vector_entry_point"))
    sync_runs.append(gym_random_steps(16, 200, "sync"))
jax_sps, numpy_sps, sync_sps = max(jax_runs), max(numpy_runs), max(sync_runs)

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'env':<48}{'steps/s':>14}   (each the fastest of 5 interleaved measurements)")
print(f"{f'JAX jit + vmap + scan, {N_ENVS} envs':<48}{jax_sps:>14,.0f}   (first call incl. compile: {compile_s:.1f} s)")
print(f"{f'gymnasium numpy vector env, {N_ENVS} envs':<48}{numpy_sps:>14,.0f}")
print(f"{'gymnasium SyncVectorEnv, 16 envs':<48}{sync_sps:>14,.0f}")
print(f"JAX / numpy vector env: {jax_sps / numpy_sps:.1f}x;  JAX / SyncVectorEnv: {jax_sps / sync_sps:.0f}x")

# %%
assert jax_sps > numpy_sps and jax_sps > 10 * sync_sps
print("The jitted, vmapped JAX env steps faster than gymnasium's numpy vector env, "
      "and more than an order of magnitude faster than a SyncVectorEnv.")

# %% [markdown]
# **Takeaway:** against gymnasium's fastest vector env (already one numpy call per step
# for all envs) the compiled env wins by the ratio printed above, a far smaller margin
# than against one Python object per env: the loop over steps and the random actions are
# inside the program too, but numpy was already stepping every env at once. The real prize
# is in the next section:
# the *policy* joins the env in the same program, so nothing crosses between host and
# device at all.
#
# ## 4 · PPO as one program
#
# **Key equations.** A rollout of $T$ steps of $B$ envs gives $(s_t, a_t, r_t,
# \text{term}_t, \text{trunc}_t, \log\pi_{\text{old}}(a_t|s_t), V_{\text{old}}(s_t))$, with
# $d_t = \text{term}_t \lor \text{trunc}_t$ where an episode ended at step $t$. Because
# `step` auto-resets, the observation after an ended step is the *next* episode's first
# one; the state the step reached is in `info["final_obs"]`, and its value
# $V(s^{\text{final}}_t)$ is what a truncated step bootstraps from (the time limit cut the
# episode; the pole had not fallen). Generalised advantage estimation (Schulman et al.
# 2016), with the bootstrap done right for both kinds of end:
#
# $$\delta_t = r_t + \gamma\,(1 - \text{term}_t)\,V'_t - V(s_t), \qquad
#   V'_t = \begin{cases} V(s^{\text{final}}_t) & \text{if } d_t \\ V(s_{t+1}) & \text{otherwise} \end{cases} \qquad (04.2)$$
# $$A_t = \delta_t + \gamma\lambda (1 - d_t) A_{t+1}, \qquad A_T = 0, \qquad R_t = A_t + V(s_t) \qquad (04.3)$$
#
# The trace stops at every episode end (the next step belongs to another episode); only a
# termination zeroes the bootstrap. (PureJaxRL's `ppo.py` uses $1 - d_t$ in both places,
# i.e. treats the 500-step limit as if the pole had fallen; here the critic learns that a
# balanced pole at step 500 is still worth about $1/(1-\gamma) = 100$.) In code
# `r + gamma * (1 - term) * V'` is `jax_ppo.td_targets`, the value of every final
# observation is one batched critic pass after the rollout's scan, and `jax_ppo.gae` is
# the reverse scan.
#
# PPO's loss on a minibatch (Schulman et al. 2017), with $\rho_t = \pi_\theta(a_t|s_t) /
# \pi_{\text{old}}(a_t|s_t)$ and advantages normalised over the minibatch:
#
# $$L^{\text{clip}} = -\mathbb{E}_t\big[\min\big(\rho_t A_t,\ \text{clip}(\rho_t, 1-\epsilon, 1+\epsilon) A_t\big)\big] \qquad (04.4)$$
# $$L^{V} = \tfrac12\mathbb{E}_t\big[\max\big((V_\theta - R_t)^2,\ (V_{\text{old}} + \text{clip}(V_\theta - V_{\text{old}}, -\epsilon, \epsilon) - R_t)^2\big)\big] \qquad (04.5)$$
# $$L = L^{\text{clip}} + c_V L^V - c_H\, \mathbb{E}_t\big[H[\pi_\theta(\cdot|s_t)]\big] \qquad (04.6)$$
#
# **Pseudocode of `train(key)`**, every loop a `lax.scan`:
#
# ```
# init params, Adam state, B envs (vmapped reset)
# scan over updates (num_updates = total_timesteps / (B T)):
#     scan over T steps:   logits, V = net(obs); a ~ softmax(logits); env step (vmapped, auto-reset)
#     V(final obs) of all T x B steps in one batched pass; GAE: reverse scan over T (04.2-04.3)
#     shuffle: one random permutation per epoch, all epochs by ONE sort of packed keys
#     scan over the update_epochs x num_minibatches minibatches:
#         grad of L (04.4-04.6), clip the global norm, Adam step (optax)
# return final params, one metric per update
# ```
#
# The rollout is one `lax.scan` whose body, `act_and_step`, puts the policy and the env
# in the same step: the network's forward pass, an action sampled by Gumbel-max, the
# vmapped env step and the auto-reset, for every env at once. This is the lesson's
# thesis in code: nothing in it returns to Python.

# %%
show_source(act_and_step)

# %% [markdown]
# One iteration of the outer scan, as `jax_ppo` writes it: the run's key split three
# ways, the rollout, its advantages, the minibatches, and the learning phase, one
# `lax.scan` of a gradient step over them. `make_train` wraps it in the outer
# `lax.scan` over all updates, which makes a whole run one program:

# %%
show_source(make_update_step)
show_source(make_train)

# %% [markdown]
# `shuffled_minibatches` flattens the rollout's `[T, B]` samples, shuffles them and cuts
# them into minibatches, for all `update_epochs` epochs at once (one permutation per
# epoch, all drawn by one sort), so the learning phase is one flat scan over all 16
# minibatches. Writing its one-epoch form is exercise 4 (`make_minibatches`).
#
# | equation | function in `course_lib` |
# |---|---|
# | 04.1 CartPole step, auto-reset | `envs.cartpole.step_env`, `envs.cartpole.step`, `envs.cartpole.auto_reset` |
# | rollout: policy and env in one scan | `jax_ppo.act_and_step`, `jax_ppo.collect_rollout` |
# | 04.2 TD target, bootstrap after truncation | `jax_ppo.td_targets` |
# | 04.3 GAE by a reverse scan | `jax_ppo.gae` (numpy loop twin: `torch_ppo.gae_numpy`) |
# | 04.4-04.6 PPO loss | `jax_ppo.ppo_loss` (torch twin: `torch_ppo.ppo_loss_torch`) |
# | shuffle: a permutation per epoch by one sort | `jax_ppo.shuffled_minibatches`, `jax_ppo.shuffle_order` |
# | optimiser (clip + Adam, annealed lr) | `jax_ppo.make_optimizer` (optax) |
# | the whole run | `jax_ppo.make_train(config) -> train(key, lr=None)` |
# | the classic loop, same hyperparameters | `torch_ppo.train_torch(config)` |
#
# The hyperparameters are PureJaxRL's CartPole defaults, unchanged, 500k env steps per run
# at both scales (the classic loop reads the same `PPOConfig`):

# %%
N_SEEDS = pick(cpu=4, full=256)
LRS = pick(cpu=(1e-4, 2.5e-4, 1e-3), full=(3e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2))
config = PPOConfig()
assert config.total_timesteps == 500_000 and config.lr == 2.5e-4
print(describe(config))
print(f"-> {config.num_updates} updates of {config.batch_size} env steps, "
      f"{config.update_epochs * config.num_minibatches} gradient steps each")
print(f"a classic loop passes between Python and the framework {config.num_steps} times per update to act "
      f"(one batched step of {config.num_envs} envs each) and {config.grad_steps_per_update} times to learn: "
      f"{config.num_steps + config.grad_steps_per_update} round trips per update")

# %% [markdown]
# ## 5 · Compile once, run a grid of seeds x learning rates
#
# `make_train(config)` returns `train(key, lr)`. One `vmap` over the runs makes it a grid,
# each (learning rate, seed) pair one run. The result is **one** program: it is
# traced and compiled once (`lower(...).compile()`, timed apart), then runs every
# (learning rate, seed) pair at once. Every update of every run reports its metrics, so
# the whole grid's learning curves come back as `[n_lrs, n_seeds, n_updates]` arrays.

# %%
train = make_train(config)
seed_keys = jax.random.split(jax.random.key(0), N_SEEDS)
run_keys = jnp.concatenate([seed_keys] * len(LRS))  # run i: seed i % N_SEEDS ...
run_lrs = jnp.repeat(jnp.asarray(LRS), N_SEEDS)  # ... at learning rate LRS[i // N_SEEDS]
grid = jax.jit(jax.vmap(train))
t0 = time.perf_counter()
grid_compiled = grid.lower(run_keys, run_lrs).compile()
grid_compile_s = time.perf_counter() - t0
t0 = time.perf_counter()
runs = jax.block_until_ready(grid_compiled(run_keys, run_lrs))
grid_run_s = time.perf_counter() - t0
grid_result = jax.tree.map(lambda x: x.reshape((len(LRS), N_SEEDS) + x.shape[1:]), runs)
grid_steps = len(LRS) * N_SEEDS * config.steps_per_run
returns = np.asarray(grid_result.metrics["charts/episode_return"])  # [n_lrs, n_seeds, n_updates]
finals = final_return(grid_result.metrics)  # [n_lrs, n_seeds]
print("metrics shape [lrs, seeds, updates]:", returns.shape)

# %%
# NBVAL_IGNORE_OUTPUT
print(f"compile: {grid_compile_s:.1f} s   run: {grid_run_s:.1f} s for {len(LRS)} x {N_SEEDS} runs of "
      f"{config.steps_per_run:,} steps = {grid_steps:,} env steps ({grid_steps / grid_run_s:,.0f} steps/s)")
for lr, row in zip(LRS, finals, strict=True):
    per_seed = (f"per seed: {np.round(row).astype(int).tolist()}" if N_SEEDS <= 16
                else f"min {row.min():.0f}, median {np.median(row):.0f}")  # 256 seeds at full scale: a summary
    print(f"lr {lr:<8g} final return {per_seed}   mean {row.mean():.0f} +- {row.std(ddof=1) / np.sqrt(N_SEEDS):.0f} "
          f"(s.e.), lowest {row.min():.0f}")

# %%
default = LRS.index(config.lr)
mean_default = finals[default].mean()
se_default = finals[default].std(ddof=1) / np.sqrt(N_SEEDS)
assert grid_compile_s > 0 and grid_run_s > 0
low = LRS.index(1e-4)
assert mean_default - 2 * se_default > 450 and np.mean(finals[default] > 300) >= 0.95, finals[default]
assert finals[low].mean() < mean_default, finals[low]
late = np.nanmean(returns[default, :, -100:], axis=1)  # each seed's last 100 updates (51k env steps)
assert np.mean(late > 475) >= 0.95, late
print(f"At PureJaxRL's defaults (lr {config.lr:g}, 500k steps) the mean final return over {N_SEEDS} seeds is "
      "above 450 by more than two standard errors (500 is the maximum; a random policy gets ~22), "
      f"{int((finals[default] > 300).sum())} of {N_SEEDS} seeds end above 300, {int((late > 475).sum())} of "
      f"{N_SEEDS} seeds average above 475 over their last 100 updates (solved, and it stays solved), and lr 1e-4 "
      "ends lower here (its mean and lowest seed are printed above).")

# %%
steps_axis = (np.arange(config.num_updates) + 1) * config.batch_size / 1e3
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
if N_SEEDS <= 8:  # a line per seed; at full scale (256 seeds) the mean and the 10-90% band
    for s in range(N_SEEDS):
        ax1.plot(steps_axis, returns[default, s], lw=1, label=f"seed {s}")
else:
    lo, hi = np.nanpercentile(returns[default], [10, 90], axis=0)
    ax1.fill_between(steps_axis, lo, hi, alpha=0.3, label="10-90% of seeds")
    ax1.plot(steps_axis, np.nanmean(returns[default], axis=0), "k-", lw=1, label=f"mean of {N_SEEDS} seeds")
ax1.set(xlabel="env steps (thousands)", ylabel="mean episodic return (per update)",
        title=f"PPO on the JAX CartPole: {N_SEEDS} vmapped seeds, lr {config.lr:g}")
ax1.legend(fontsize=8)
for i, lr in enumerate(LRS):
    ax2.scatter(np.full(N_SEEDS, lr), finals[i], alpha=0.6, label=f"lr {lr:g}")
ax2.errorbar(LRS, finals.mean(1), yerr=finals.std(1, ddof=1) / np.sqrt(N_SEEDS), fmt="k-", lw=1, capsize=3,
             label="mean over seeds +- s.e.")
ax2.set(xscale="log", xlabel="Adam learning rate (log scale)", ylabel="final return (last 10 updates)",
        title=f"learning-rate sweep: {len(LRS)} lrs x {N_SEEDS} seeds, one program")
ax2.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** one compiled program trained every seed at every learning rate. At the
# default rate the seeds climb to the 500-step cap and most hold it through the last 100
# updates (the count is printed above), each on its own path there (the spread a single
# run hides); the
# sweep compares learning rates on the mean over seeds with its standard error. With
# these few seeds, lr 1e-4 ends lower here; its lowest seed (printed above) shows how far.
#
# ## 6 · The speedup over the classic loop, measured side by side
#
# The classic loop (`course_lib.ppo.torch_ppo.train_torch`) runs the same PPO with the same
# hyperparameters, network and initialisation, and is written to be *fair*: gymnasium's
# numpy-vectorised CartPole, acting under `torch.no_grad()`, one torch thread,
# preallocated buffers and `torch.from_numpy` (no copies).
# It has no compile step, so its steady-state steps/s (after 2 warm-up updates) is also
# its end-to-end rate. It is timed twice **before** and twice **after** the JAX runs and
# the median of the four is the baseline, so that a change in machine load between them
# shows up as spread instead of as a speedup.
#
# The JAX side is timed two ways: **end-to-end** (a fresh `jax.jit(train)` called once:
# tracing + XLA compilation + the run, what a one-off run costs) and **steady state** (the
# compiled executable called again: the run alone).

# %%
# NBVAL_IGNORE_OUTPUT
TORCH_UPDATES = pick(cpu=24, full=100)


def time_classic(seed):
    """One classic-loop run of TORCH_UPDATES updates; its steady-state steps/s."""
    with progress(TORCH_UPDATES, f"classic loop, seed {seed}", unit="update") as bar:
        result = train_torch(config, seed=seed, n_updates=TORCH_UPDATES, progress=lambda _: bar.update())
    return result, result.steady_steps_per_second()


classic = [time_classic(seed) for seed in (0, 1)]  # before the JAX runs

single = jax.jit(train)
t0 = time.perf_counter()
single_result = jax.block_until_ready(single(jax.random.key(0)))  # first call: trace + compile + run
single_e2e_s = time.perf_counter() - t0
single_run_times = []
for _ in range(3):  # later calls reuse the compiled program: the run alone
    t0 = time.perf_counter()
    jax.block_until_ready(single(jax.random.key(0)))
    single_run_times.append(time.perf_counter() - t0)
single_run_s = float(np.median(single_run_times))
single_compile_s = single_e2e_s - single_run_s  # tracing + XLA compilation

classic += [time_classic(seed) for seed in (2, 3)]  # after the JAX runs
torch_all = [sps for _, sps in classic]
torch_sps = float(np.median(torch_all))
torch_result = classic[0][0]
jax_sps_1 = config.steps_per_run / single_run_s
jax_e2e_1 = config.steps_per_run / single_e2e_s
jax_sps_grid = grid_steps / grid_run_s
jax_e2e_grid = grid_steps / (grid_compile_s + grid_run_s)
grid_gain = jax_sps_grid / jax_sps_1

# %%
# NBVAL_IGNORE_OUTPUT
print(f"classic loop steps/s, before the JAX runs: {torch_all[0]:,.0f}, {torch_all[1]:,.0f}; after: "
      f"{torch_all[2]:,.0f}, {torch_all[3]:,.0f}  -> median {torch_sps:,.0f}, "
      f"spread {max(torch_all) / min(torch_all):.2f}x")
print(f"{'loop':<40}{'steady steps/s':>15}{'x classic':>10}{'end-to-end steps/s':>20}{'x classic':>10}"
      f"{'compile s':>10}{'run s':>8}")
print(f"{'classic: torch + gymnasium vector env':<40}{torch_sps:>15,.0f}{1:>10.1f}{torch_sps:>20,.0f}{1:>10.1f}"
      f"{'-':>10}{'-':>8}")
print(f"{'JAX, 1 seed':<40}{jax_sps_1:>15,.0f}{jax_sps_1 / torch_sps:>10.1f}{jax_e2e_1:>20,.0f}"
      f"{jax_e2e_1 / torch_sps:>10.1f}{single_compile_s:>10.1f}{single_run_s:>8.1f}")
print(f"{f'JAX jit + vmap, {len(LRS)} lrs x {N_SEEDS} seeds':<40}{jax_sps_grid:>15,.0f}"
      f"{jax_sps_grid / torch_sps:>10.1f}{jax_e2e_grid:>20,.0f}{jax_e2e_grid / torch_sps:>10.1f}"
      f"{grid_compile_s:>10.1f}{grid_run_s:>8.1f}")
break_even = single_compile_s / (1 / torch_sps - 1 / jax_sps_1)
print(f"1 seed: compilation is {single_compile_s / single_e2e_s:.0%} of the end-to-end time at "
      f"{config.steps_per_run:,} steps; it is more than half of it for runs shorter than "
      f"{single_compile_s * jax_sps_1:,.0f} steps, and the classic loop is faster end to end below "
      f"{break_even:,.0f} steps")
print(f"classic loop: {torch_result.rollout_seconds[2:].sum() / torch_result.update_seconds[2:].sum():.0%} of its "
      "time in the rollout (Python + env + per-step forward), the rest in minibatch updates")
print(f"per env step the vmapped grid runs at {grid_gain:.2f}x one seed's steady rate")

# %%
assert max(torch_all) < 3 * min(torch_all), torch_all  # the four baseline timings agree within 3x
assert jax_sps_1 > 5 * torch_sps and jax_sps_grid > 5 * torch_sps
assert 2 * torch_sps < jax_e2e_1 < jax_sps_1 and 0 < single_compile_s < single_e2e_s
assert break_even < config.steps_per_run
if jax.default_backend() == "cpu":
    assert 1 / 2 < grid_gain < 2, grid_gain  # on a CPU, vmap gives one program, not extra speed per env step
print("Measured in this run: the four classic timings agree within 3x; the jitted PPO's steady state is more "
      "than 5x the classic loop's median, for one seed and for the grid; end to end (compilation included) a "
      "500k-step run is still more than 2x faster, and the classic loop only wins runs shorter than the "
      "break-even printed above"
      + ("; per env step the vmapped grid's steady rate is within 2x of one seed's, either way." if
         jax.default_backend() == "cpu" else "."))

# %% [markdown]
# **Takeaway:** the same algorithm, nearly the same arithmetic (section 7 counts it), many
# times the throughput once compiled. The classic loop pays Python and framework overhead
# on every env step and on every minibatch; the compiled program pays it once.
# Compilation is a fixed cost that does not
# grow with the number of steps: for one 500k-step seed it is a large share of the
# end-to-end time (printed above), for shorter runs it dominates, and below the
# break-even the classic loop finishes first; a longer run, or many seeds in one program,
# spreads it thin. On a CPU the vmapped grid's steady rate per env step stays within
# 2x of one seed's (the ratio printed above): there vmap buys one compilation and one
# program for all runs, and little or no speed. The speed comes on an accelerator, where one 4-env
# run leaves most of the device idle (the full-scale section below). The ratios depend
# on the machine's load, which the spread of the four classic timings shows.
#
# ## 7 · Profiling: where the time goes
#
# Three places to look, from coarse to fine:
#
# 1. **Compile vs run.** `jax.jit(f).lower(args).compile()` does the tracing and the XLA
#    compilation; the returned executable only runs. A program is compiled per input
#    *shape*, so a notebook compiles once and reuses (here: one grid, one single seed).
#    Compile time does not grow with `total_timesteps` (the loop is a `scan`), but it does
#    with the program's size.
# 2. **Work per step.** Count the arithmetic: one forward pass of the actor and the
#    critic (4 -> 64 -> 64 -> 2 and 4 -> 64 -> 64 -> 1) is about 8,900 multiply-adds per
#    sample. Each env step is acted on once, then learned from `update_epochs` times
#    (forward + backward, about 3 forward passes). Divided by the run time this gives the
#    arithmetic rate the program achieves, and the classic loop's per-update split shows
#    where *its* time goes.
# 3. **A trace.** `jax.profiler.trace("/tmp/trace")` around a call records every XLA
#    operation for TensorBoard / Perfetto; on a GPU it shows whether kernels are back to
#    back or waiting on the host. One program does not mean no waiting: on a GPU, XLA
#    runs each iteration of a `scan` as kernels launched from the host, so one small run
#    is launch-bound (the H100 figure from `BENCHMARKS.md` is printed below beside this
#    run's), and the vmapped grid runs 2,048 runs in the same launches. That is why vmap
#    is nearly free on an accelerator.

# %%
h = config.hidden
critic_macs = 4 * h + h * h + h * 1
macs = (4 * h + h * h + h * 2) + critic_macs  # actor + critic, per sample
flops_per_step = 2 * macs * (1 + 3 * config.update_epochs)
jax_extra = 2 * critic_macs  # the JAX loop's critic pass over every final observation (the truncation bootstrap)
print(f"about {macs:,} multiply-adds per forward pass; {flops_per_step / 1e3:.0f} kFLOP of network arithmetic "
      "per env step (act once, then learn from it update_epochs times); the JAX loop adds "
      f"{jax_extra / 1e3:.1f} kFLOP ({jax_extra / flops_per_step:.0%}) for V(final obs) of every step")

# %%
# NBVAL_IGNORE_OUTPUT
print(f"single seed: compile {single_compile_s:.1f} s (end-to-end minus run), run {single_run_s:.2f} s "
      f"-> {(flops_per_step + jax_extra) * jax_sps_1 / 1e9:.1f} GFLOP/s of network arithmetic; "
      f"classic loop: {flops_per_step * torch_sps / 1e9:.2f} GFLOP/s")
print(f"classic loop per update: {1e3 * np.median(torch_result.update_seconds[2:]):.1f} ms "
      f"(rollout {1e3 * np.median(torch_result.rollout_seconds[2:]):.1f} ms); "
      f"JAX: {1e3 * single_run_s / config.num_updates:.2f} ms per update")
H100_SPS_1 = 97_631  # BENCHMARKS.md, "Full scale on a GPU": 1 seed of this config on an H100
iterations = 2 * config.num_steps + config.grad_steps_per_update  # rollout scan + GAE scan + learning scan
h100_update_s = config.batch_size / H100_SPS_1
print(f"1 seed on an H100 (BENCHMARKS.md): {H100_SPS_1:,} env steps/s, {H100_SPS_1 / jax_sps_1:.2f}x this "
      f"{jax.default_backend().upper()}'s {jax_sps_1:,.0f}: {1e3 * h100_update_s:.2f} ms per update over "
      f"{iterations} scan iterations, {1e6 * h100_update_s / iterations:.0f} us each, for a few small kernels on "
      f"{config.num_envs} envs or {config.minibatch_size} samples: kernel launches, not arithmetic, set the pace "
      "(launch-bound)")

# %% [markdown]
# **Takeaway:** compile once, reuse the executable (vmap instead of recompiling per
# seed). Per env step the two loops do nearly the same arithmetic (the JAX loop a few
# percent more); the classic loop reaches the small fraction of the compiled program's
# arithmetic rate printed above, the rest of its time going around tiny matrix products.
#
# ## Glossary of logged metrics
#
# `train` returns one value per update for each metric (CleanRL's namespaces):
#
# | metric | meaning |
# |---|---|
# | `charts/episode_return` | mean return of the episodes that ended in the update (NaN if none) |
# | `charts/episodes` | how many episodes ended in the update |
# | `losses/total` | $L$ (04.6), mean over the update's epochs and minibatches |
# | `losses/policy` | $L^{\text{clip}}$ (04.4) |
# | `losses/value` | $L^V$ (04.5) |
# | `losses/entropy` | mean policy entropy (nats) |
# | `losses/approx_kl` | $\mathbb{E}[(\rho - 1) - \log\rho]$, an estimate of KL(old ‖ new) |
# | `losses/clip_frac` | fraction of samples with $|\rho - 1| > \epsilon$ |
# | steady steps/s (here) | env steps of all runs together / wall-clock run time, compile excluded |
# | end-to-end steps/s (here) | the same / (compile + run time): what a one-off run costs |
#
# ## Full scale
#
# `COURSE_SCALE=full` runs the throughput section with 65,536 envs x 1000 steps, the grid
# with 8 learning rates x 256 seeds at 500k steps each (1B env steps in one program), and
# 4 x 100 classic updates (the cpu scale already runs PureJaxRL's defaults, 500k steps per
# run). It is a GPU job for one process on one device; on a multi-GPU host set
# `CUDA_VISIBLE_DEVICES=0`, since JAX preallocates 75% of the memory of every GPU it can
# see. Lesson 05 spreads the same program over several. `BENCHMARKS.md` ("Full scale on a GPU")
# records a run on an H100 with its command; its figures beside the published ones:
#
# | measurement | steps/s | ratio |
# |---|---|---|
# | grid of 2,048 runs vs one single-threaded classic process (5,343 steps/s) | 29.8M | about 5,600x steady, 4,100x end to end |
# | the same grid vs 16 classic processes, one per core of that host (16 x 5,343 = 85k, estimated) | 29.8M | about 350x |
# | the same grid vs 1 seed on the same GPU (launch-bound, section 7) | 29.8M vs 98k | about 300x |
# | PureJaxRL's published figures, vs standard PyTorch pipelines | - | "over 1000x" (README), "over 4000x" (blog) |
# | random-policy env steps, 65,536 envs (section 3) | 3.9B | gymnax publishes 0.05 s per 1M steps (20M/s) with 2,000 envs on an A100 |
#
# The headline ratio is PureJaxRL's own framing: many runs in one program on a GPU against
# **one** single-threaded classic process. A classic sweep runs one process per core, which
# divides the ratio by the cores used; it stays in the hundreds. gymnax's figure is for 33x
# fewer envs on another GPU, so it is not a like-for-like comparison. The 2-core CPU figures
# are in `BENCHMARKS.md` (`python bench/run.py purejaxrl`).
#
# ## References
#
# * C. Lu, J. Kuba, A. Letcher, L. Metz, C. Schroeder de Witt, J. Foerster (2022).
#   *Discovered Policy Optimisation.* NeurIPS. PureJaxRL: github.com/luchris429/purejaxrl.
# * R. T. Lange (2022). *gymnax: A JAX-based Reinforcement Learning Environment Library.*
# * J. Schulman, F. Wolski, P. Dhariwal, A. Radford, O. Klimov (2017). *Proximal Policy
#   Optimization Algorithms.* arXiv:1707.06347.
# * J. Schulman, P. Moritz, S. Levine, M. Jordan, P. Abbeel (2016). *High-Dimensional
#   Continuous Control Using Generalized Advantage Estimation.* ICLR. arXiv:1506.02438.
# * S. Huang et al. (2022). *The 37 Implementation Details of Proximal Policy
#   Optimization.* ICLR Blog Track (CleanRL's `ppo.py`).
# * R. V. Florian (2007). *Correct equations for the dynamics of the cart-pole system.*
#
# ## Exercises
#
# `exercises/04_purejaxrl.ipynb`: the pure env step (04.1), GAE by a reverse `lax.scan`
# (04.3), the TD targets of an auto-reset rollout (04.2: bootstrap from the final
# observation after a truncation, from 0 after a termination), and the minibatch shuffle
# of the update step (one permutation for every array of the rollout). Grade with
# `course grade exercises/04_purejaxrl.ipynb`.
