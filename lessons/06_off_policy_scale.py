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
# # 06 · Off-policy at scale: on-device replay and SAC on a JAX driving simulator
#
# On-policy methods (lessons 01-05) use each transition for one update and throw it away.
# **Off-policy methods reuse experience**: every transition goes into a replay buffer and
# is sampled for many updates, long after the policy that produced it has changed. That
# makes the replay buffer infrastructure: millions of transitions written by the actors,
# sampled by the learner, and (for prioritized replay) re-weighted after every update. **Kept on the
# accelerator beside a JAX-native simulator, acting, storing, sampling and learning
# compile into one program**; only each chunk's metrics cross to the host. The same
# program, written once per device, scales over the devices of one machine with one
# all-reduce per parameter set per update. V-Max (Valeo AI, arXiv 2503.08388) trains SAC
# in this one-program style on one GPU, beside the Waymax driving simulator, whose scenes
# are replayed from the Waymo Open Motion Dataset (25M steps in 36 hours on one L4, in the
# figures this course was seeded with: orders of magnitude, not targets).
#
# Waymax and its dataset cannot be installed here, so this lesson builds a small driving
# simulator in the same style (scenarios generated from a random key), measures what
# V-Max measures, shards the learner over a device mesh, and sweeps model size against
# the number of distinct scenarios trained on.
#
# **Learning goals**
# 1. Write a driving environment as pure JAX functions (a kinematic bicycle, IDM agents,
#    box collisions), check it against a numpy twin, and measure its throughput under
#    `jit` + `vmap` against the classic one-env-per-object simulator.
# 2. Build replay buffers that live on the device: a uniform ring and prioritized replay
#    on a sum-tree ($O(\log N)$ draws and updates), with importance weights.
# 3. Read SAC as equations, find each in `course_lib.offpolicy.sac`, train it on the
#    driving task over several seeds, and read its rates against a random and a
#    hand-written driver.
# 4. Find where the time goes and what the update-to-data ratio (UTD) trades; shard the
#    learner over a mesh (1 and 4 devices learn the same parameters) and compute how much
#    replay fits on an accelerator.
# 5. Separate model size from scenario diversity: a width x distinct-scenarios sweep at a
#    fixed budget, evaluated on held-out scenarios over several seeds.
#
# Builds on lesson 04 (a JAX environment, `make_train(config) -> train(key)`, vmap over
# seeds) and lesson 05 (devices, and why one program per device matters).

# %%
from course_lib.scaling.devices import data_mesh, use_cpu_devices

use_cpu_devices(4)  # section 6 compares 1 and 4 devices; on a CPU the count is fixed before JAX starts

import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, describe, pick, show_source
from course_lib.envs import driving

print(f"course_lib {course_lib.__version__} | scale: {current_scale()} | JAX backend: {jax.default_backend()}, "
      f"{jax.device_count()} device(s)")

# %% [markdown]
# ## Key equations
#
# **The ego car** is a kinematic bicycle (Kong et al. 2015; Rajamani 2012, §2.2): the two
# wheels of an axle lumped into one, no sideways slip, state $(x, y, \psi, v)$ at the
# centre of gravity, controls $a$ (m/s²) and steering $\delta$ (rad), $l_f$ and $l_r$
# the distances to the front and rear axles. One explicit Euler step of $dt$ seconds:
#
# $$\begin{gathered}
#   \beta = \arctan\Big(\frac{l_r}{l_f + l_r}\tan\delta\Big), \qquad
#   x' = x + v\cos(\psi + \beta)\,dt, \qquad
#   y' = y + v\sin(\psi + \beta)\,dt, \\
#   \psi' = \psi + \frac{v}{l_r}\sin\beta\,dt, \qquad
#   v' = \mathrm{clip}(v + a\,dt,\, 0,\, v_{max})
#   \end{gathered} \qquad (06.1)$$
#
# **Soft Actor-Critic** (Haarnoja et al. 2018) maximises reward plus the policy's entropy,
# weighted by a temperature $\alpha$. Two critics $Q_1, Q_2$ with slow target copies
# $\bar Q_1, \bar Q_2$ learn the soft Bellman target, bootstrapping from an action
# $a' \sim \pi(\cdot\mid s')$ drawn fresh from the current policy (so the replayed action's
# policy never matters: that is what makes SAC off-policy), with $d = 1$ only when the
# episode *terminated* (a time-limit truncation still bootstraps):
#
# $$y = r + \gamma\,(1 - d)\,\big(\min(Q_1', Q_2') - \alpha\log\pi(a'\mid s')\big) \qquad (06.2)$$
#
# where $Q_i' = \bar Q_i(s', a')$. The critic loss, over a batch $\mathcal B$ from the buffer
# (with importance weights $w$ under prioritized replay, else $w = 1$), and the policy loss,
# with $\tilde a \sim \pi(\cdot\mid s)$ reparameterised through the tanh-squashed Gaussian:
#
# $$L_Q = \frac{1}{2|\mathcal B|}\sum_{\mathcal B} w\,\big[(Q_1(s,a) - y)^2 + (Q_2(s,a) - y)^2\big] \qquad (06.3)$$
#
# $$L_\pi = \frac{1}{|\mathcal B|}\sum_{\mathcal B} \big(\alpha\log\pi(\tilde a\mid s) - \min_i Q_i(s, \tilde a)\big) \qquad (06.4)$$
#
# The temperature is learned so that the policy's entropy stays near a target
# $\bar{\mathcal H}$ ($-\dim a = -2$ here), and the target critics trail the critics:
#
# $$L_\alpha = \frac{1}{|\mathcal B|}\sum_{\mathcal B} -\log\alpha\,\big(\log\pi(\tilde a\mid s) + \bar{\mathcal H}\big) \qquad (06.5)$$
#
# $$\bar\theta_j \leftarrow \tau\,\theta_j + (1 - \tau)\,\bar\theta_j \qquad (06.6)$$
#
# **Prioritized replay** (Schaul et al. 2016) draws transition $i$ with a probability that
# grows with its last TD error $p_i = |y_i - Q(s_i, a_i)| + \epsilon$, and corrects the bias
# this puts into the expected update with importance weights ($N$ items stored, weights
# normalised by their largest value in the batch):
#
# $$P(i) = \frac{p_i^\alpha}{\sum_k p_k^\alpha} \qquad (06.7)$$
#
# $$w_i = \frac{(N\,P(i))^{-\beta}}{\max_j w_j} \qquad (06.8)$$
#
# ($\alpha$ in (06.7) is the priority exponent, not SAC's temperature.) A **sum-tree** keeps
# the $p_i^\alpha$ at its leaves and the sum of its children at every node, so drawing from
# $P$ and changing one $p_i$ both take $O(\log N)$.
#
# **The whole loop, one program** (`offpolicy.sac.make_train`; every line runs on the device):
# ```
# state = init(key)                        # networks, optimizers, num_envs envs, empty buffer
# for chunk in 1..num_chunks:              # Python: a progress bar between chunks
#     state = run_chunk(state)             # jitted: lax.scan over steps_per_chunk steps
#         a ~ pi(.|s)   (uniform while env_steps < learning_starts)
#         s', r, terminated, truncated, info = vmap(env.step)(s, a)     # auto-reset
#         buffer <- (s, a, r, terminated, info["final_obs"])           # ring or sum-tree
#         repeat updates_per_step times:
#             batch (, indices, w) ~ buffer
#             critics   <- Adam(grad L_Q)        (06.2, 06.3)
#             actor     <- Adam(grad L_pi)       (06.4)
#             log alpha <- Adam(grad L_alpha)    (06.5)
#             targets   <- Polyak(critics)       (06.6)
#             priorities[indices] <- |TD error| + eps     (prioritized only)
# ```
#
# The **update-to-data ratio** is the number of gradient updates per environment
# transition stored: with `num_envs` envs stepped together and `updates_per_step` updates
# after each vectorised step,
#
# $$\mathrm{UTD} = \frac{\texttt{updates\_per\_step}}{\texttt{num\_envs}} \qquad (06.9)$$
#
# (this lesson's cpu run: 1 update per step of 8 envs, UTD = 1/8; V-Max's repository
# defaults to 16 envs and 4 updates per step, UTD = 1/4; sample-efficient SAC variants go
# above 1).

# %% [markdown]
# | equation or step | function in `course_lib` |
# |---|---|
# | (06.1) the bicycle step | `envs.driving.bicycle_step` (and `envs.driving_numpy.DrivingNumpyEnv`, its numpy twin) |
# | IDM agents, box overlap, off-road, observation, reward | `envs.driving.idm_acceleration`, `boxes_overlap`, `is_offroad`, `get_obs`, `reward_fn` |
# | accuracy, collision, off-road, progress ratio | `envs.driving.episode_success`, `info` of `envs.driving.step` |
# | a uniform ring buffer on the device | `offpolicy.replay.uniform_init`, `uniform_add`, `uniform_sample` |
# | the sum-tree | `offpolicy.replay.sumtree_update`, `sumtree_find` |
# | (06.7), (06.8) prioritized sampling and weights, the priority update | `offpolicy.replay.per_sample`, `per_probabilities`, `importance_weights`, `per_update` |
# | (06.2) soft Bellman target | `offpolicy.sac.soft_bellman_target` |
# | (06.3), (06.4), (06.5) the three losses | `sac.critic_loss`, `policy_loss`, `temperature_loss` |
# | (06.6) Polyak targets | `sac.polyak_update` |
# | (06.9) the update-to-data ratio | `SACConfig.utd`; rates against it: `sac.training_rates` |
# | the whole loop | `sac.make_train` (`init`, `run_chunk`), `learn_step`, `train` (with a progress bar), `make_train_fn` |
# | evaluation, time breakdown | `sac.evaluate`, `time_breakdown` |
# | the learner sharded over a mesh, replay per device | `offpolicy.sharded` |
# | width x distinct scenarios | `offpolicy.sweep` |

# %% [markdown]
# ## 1 · A driving simulator as pure JAX functions
#
# `course_lib.envs.driving` follows the course's environment interface (lesson 04's
# `reset`, `step_env`, `step` with auto-reset, frozen `EnvState` / `EnvParams`
# pytrees), with a continuous action in $[-1, 1]^2$: (acceleration, steering), scaled to
# ±4 m/s² and ±0.4 rad. A **scenario** is drawn from a key:
#
# a curved road with 2 or 3 lanes; 6 other vehicles driven by Treiber's Intelligent Driver
# Model (IDM: accelerate towards a desired speed, brake to keep a time headway behind the
# leader in the lane), which never change lanes; and the ego, driven by (06.1), with a
# route target 120 m along its lane. An episode **terminates** on a collision (oriented
# boxes overlap), when a corner of the ego leaves the road, or at the target; it is
# **truncated** after 160 steps (16 s). The observation (64 numbers in
# the ego's frame) holds the ego's own state, its place in the lane, the 4 nearest agents,
# the lane ahead and the target. The reward is progress along the route minus a small
# lane-centring term, and -10 for a collision or leaving the road.
#
# **V-Max's metrics, per episode**: *collision*, *off-road*, *progress ratio* (distance
# covered / route length) and **accuracy** = the share of episodes with none of the
# failures (here a stalled ego, progress ratio below 0.5, is a failure too).
#
# The ego's step (06.1) is exercise 1; the other cars' Intelligent Driver Model, as the
# simulator writes it:

# %%
params = driving.DEFAULT_PARAMS
print(f"observation: {driving.OBS_DIM} numbers; action: {driving.ACTION_DIM} in [-1, 1]")
print(
    f"dt {params.dt} s, {params.max_steps} steps, {params.n_agents} agents, route {params.route_length:.0f} m, "
    f"v_max {params.v_max:.0f} m/s"
)
show_source(driving.idm_acceleration)

# %% [markdown]
# **Checked against an independent implementation.** `envs.driving_numpy.DrivingNumpyEnv`
# is the same simulator written as a classic gymnasium environment: one object per env,
# numpy in float64, no JAX in its `step`. Load a JAX scenario into it and step both with the
# same actions (the test suite also checks the box overlap against shapely's polygons on
# 500 random pairs and the bicycle step against a naive integration):

# %%
from course_lib.envs.driving_numpy import DrivingNumpyEnv

step_env = jax.jit(driving.step_env)
obs, state = jax.jit(driving.reset)(jax.random.key(1), params)
np_env = DrivingNumpyEnv(params)
np_obs, _ = np_env.reset(options={"state": state})
rng = np.random.default_rng(0)
max_err, steps_compared = float(np.abs(np.asarray(obs) - np_obs).max()), 0
for t in range(params.max_steps):
    action = np.asarray(driving.heuristic_policy(obs, params)) + rng.normal(0, 0.2, 2).astype(np.float32)
    obs, state, reward, terminated, truncated = step_env(None, state, jnp.asarray(action), params)
    np_obs, np_reward, np_terminated, np_truncated, _ = np_env.step(action)
    max_err = max(max_err, float(np.abs(np.asarray(obs) - np_obs).max()), abs(float(reward) - np_reward))
    assert (bool(terminated), bool(truncated)) == (np_terminated, np_truncated)
    steps_compared += 1
    if terminated or truncated:
        break
assert max_err < 1e-3
print(f"{steps_compared} steps of a noisy driver: JAX (float32) and numpy (float64) agree to < 1e-3 "
      "in every observation and reward, and on when the episode ends")

# %% [markdown]
# **Two reference drivers.** Uniformly random actions, and a hand-written controller
# (`driving.heuristic_policy`: steer with a P controller on the heading error and the lane
# offset, follow the leader with IDM). Both read only the observation. 256 episodes each,
# as one vmapped program:

# %%
EVAL_EPISODES = pick(cpu=256, full=4096)


@jax.jit
def reference_drivers(key):
    heuristic = lambda k, o: driving.heuristic_policy(o, params)  # noqa: E731
    return [driving.evaluate_policy(pi, key, EVAL_EPISODES, params) for pi in (driving.random_policy, heuristic)]


def rates(m):
    """Per-episode metrics -> the rates V-Max reports."""
    return {
        "accuracy": float(m["success"].mean()),
        "collision": float(m["collision"].mean()),
        "offroad": float(m["offroad"].mean()),
        "progress": float(m["progress_ratio"].mean()),
    }


random_rates, heuristic_rates = (rates(m) for m in reference_drivers(jax.random.key(2)))
for name, r in (("random actions", random_rates), ("hand-written driver", heuristic_rates)):
    print(f"{name:<20} accuracy {r['accuracy']:6.1%}  collision {r['collision']:6.1%}  "
          f"off-road {r['offroad']:6.1%}  progress ratio {r['progress']:.2f}")
assert random_rates["accuracy"] < 0.1 < 0.9 < heuristic_rates["accuracy"]

# %% [markdown]
# Random actions leave the road within a few seconds in most episodes; the hand-written
# driver shows the task is solvable from the observation alone. These two lines frame the
# learning curves of section 4. Four scenarios, with the hand-written driver's path:

# %%
from course_lib.envs.driving_render import draw_episodes

heuristic = lambda k, o: driving.heuristic_policy(o, params)  # noqa: E731
fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
draw_episodes(axes, heuristic, jax.random.key(3), params)
fig.suptitle("Generated scenarios (top-down, metres): road, lanes, agents (IDM), ego path of the hand-written driver")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2 · Throughput: one program for thousands of cars
#
# A classic simulator steps one environment per object, and a vector of them is a Python
# loop (`gymnasium.vector.SyncVectorEnv`). The JAX env is one function: `jax.vmap` makes it
# a function of a batch, and `lax.scan` loops it inside the compiled program, so Python
# and dispatch are paid once per *rollout*. Env steps/s of random driving (compilation
# not timed):

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.envs.driving_bench import measure_env_throughput, measure_numpy_throughput

ENV_COUNTS = pick(cpu=(1, 16, 256), full=(1, 64, 1024, 8192, 32768))
jax_rates = measure_env_throughput(ENV_COUNTS, steps=32, params=params)
numpy_rates = measure_numpy_throughput((1, 16), steps=pick(cpu=40, full=200), params=params)
load = np.round(np.array(os.getloadavg()), 1)
for n, r in jax_rates.items():
    print(f"JAX   jit(scan(vmap(step))) {n:>6} envs: {r:>10,.0f} env steps/s")
for n, r in numpy_rates.items():
    print(f"numpy SyncVectorEnv         {n:>6} envs: {r:>10,.0f} env steps/s")
best_jax, best_numpy = max(jax_rates.values()), max(numpy_rates.values())
print(f"best JAX / best numpy: {best_jax / best_numpy:.0f}x   (load average 1/5/15 min: {load})")

# %%
assert best_jax > 5 * best_numpy  # the ratio is printed above
assert best_jax > 1.5 * jax_rates[1]  # batching pays until the cores are full
fig, ax = plt.subplots(figsize=(7, 4))
ax.loglog(list(jax_rates), list(jax_rates.values()), "o-", label="JAX: jit + vmap + scan")
ax.loglog(list(numpy_rates), list(numpy_rates.values()), "s--", label="numpy: gymnasium SyncVectorEnv")
ax.set_xlabel("environments stepped together")
ax.set_ylabel("env steps / s")
ax.set_title("Driving env throughput on this CPU")
ax.legend()
plt.show()
print("The JAX env is more than 5x the classic simulator at its best, and batching raises its rate by more than "
      "1.5x until the cores are busy.")

# %% [markdown]
# **Takeaway.** `scan` runs the loop without Python, and on 2 CPU cores the gain from
# batching ends within the counts measured (where the rate peaks moves with the machine
# and its load): the cores are full. On an accelerator the same program keeps scaling
# into the thousands of envs (gymnax: CartPole at 2,000 envs, 1M steps in 0.05 s on an
# A100). V-Max's 25M steps in 36 hours are about 190 env steps per second, far below this
# lesson's 2-core SAC, because each of its steps runs a logged Waymo scene of hundreds of
# objects through a transformer encoder (with a quarter of a gradient update per env
# step, UTD 1/4): a step is only comparable to a step of the same simulator and network.
#
# Isaac Gym and Isaac Lab (NVIDIA) do the same for rigid-body robots, physics on the GPU
# for thousands of envs handed to a PyTorch learner without host copies; they need an
# NVIDIA GPU, so they do not run here.
#
# ## 3 · Replay buffers that live on the device
#
# A replay buffer here is a pytree of device arrays, `[capacity, ...]` per field, plus an
# insert position and a size; adding and sampling are pure functions, so they sit inside
# the jitted training step like the env states and the parameters (flashbax's design). A
# ring buffer of capacity 8 after three adds of 3 transitions: the third add wraps around
# and overwrites the oldest item.

# %%
from course_lib.offpolicy import replay

buf = replay.uniform_init({"step": jnp.int32(0)}, capacity=8)
for first_step in (0, 3, 6):
    buf = replay.uniform_add(buf, {"step": jnp.arange(first_step, first_step + 3)})
    print(f"after adding steps {first_step}..{first_step + 2}: slots {np.asarray(buf.data['step'])}, "
          f"insert at {int(buf.insert)}, size {int(buf.size)}")
sample = replay.uniform_sample(buf, jax.random.key(0), batch_size=6)
print("6 uniform draws:", np.asarray(sample["step"]))

# %% [markdown]
# **The sum-tree.** Prioritized replay needs to draw item $i$ with probability (06.7) and
# to change one priority after every update. A sum-tree does both in $O(\log N)$: leaf $j$
# (at index `capacity + j` of one flat array) holds $p_j^\alpha$, node $i$ holds the sum of
# its children $2i$ and $2i+1$, the root (index 1) the total. To draw, pick
# $u \in [0, \text{total})$ and walk down: go left if $u$ is below the left child's sum,
# else subtract it and go right (exercise 2). `per_sample` draws one $u$ in each of
# `batch_size` equal strata of the total, so a batch covers the whole range. After each
# gradient update, `per_update` writes the batch's new priorities $|y - Q| + \epsilon$
# back and re-adds every ancestor of a written leaf from its two children (one level of
# all leaves at a time on an accelerator: exercise 5).

# %%
show_source(replay.per_sample)
show_source(replay.per_update)

# %% [markdown]
# **Checked against (06.7) and (06.8).** Eight items with priorities 1..8 and
# $\alpha = 0.6$; 64,000 draws; the empirical frequencies against $P(i)$, and what the
# importance weights are for: the average of a quantity over prioritized draws (here
# each item's own value 0..7) leans towards the high-priority items; weighted by (06.8)
# with $\beta = 1$ it is the uniform average again (computing the weights is exercise 3):

# %%
per = replay.per_init({"item": jnp.int32(0)}, capacity=8, alpha=0.6)
per = replay.per_add(per, {"item": jnp.arange(8)})
priorities = jnp.arange(1.0, 9.0)
per = replay.per_update(per, jnp.arange(8), priorities)
p_alpha = np.asarray(priorities, dtype=np.float64) ** 0.6  # the formula in float64: its rounding is far below what is printed
expected = p_alpha / p_alpha.sum()  # (06.7)

batches = jax.jit(jax.vmap(lambda k: replay.per_sample(per, k, 64, 1.0)))(jax.random.split(jax.random.key(4), 1000))
drawn, w = np.asarray(batches[0]["item"]).ravel(), np.asarray(batches[2]).ravel()  # items and their weights (beta 1)
freq = np.bincount(drawn, minlength=8) / drawn.size
se = np.sqrt(expected * (1 - expected) / drawn.size)  # an upper bound: stratified draws vary less
plain, weighted = drawn.mean(), (w * drawn).sum() / w.sum()  # the item's value as the quantity averaged
print("P(i) (06.7)  :", np.round(expected, 3))
print("frequency    :", np.round(freq, 3))
print(f"largest gap: {np.abs(freq - expected).max():.4f} = {np.abs(freq - expected).max() / se.max():.1f} s.e.")
print(f"mean item value over the draws: {plain:.2f} unweighted, {weighted:.2f} weighted by (06.8) with beta = 1; "
      "under uniform replay it would be 3.50")
assert np.all(np.abs(freq - expected) < 4 * se)
assert plain > 3.5 + 0.5 and abs(weighted - 3.5) < 0.05  # the weights undo the bias towards high priorities

# %% [markdown]
# The frequencies match $P(i)$ within sampling noise, and the weights give the rarely drawn
# items the largest say, so the weighted average is the uniform one.
#
# With $\beta < 1$ the weights cancel part of the bias; Schaul et al. anneal $\beta$ from
# 0.4 or 0.5 to 1 over training, and this lesson keeps $\beta = 0.4$ for its short runs
# (`SACConfig.per_beta`). The weights apply to the critics' loss only: the actor trains on
# the prioritized states unweighted.
#
# Called one operation at a time from Python, a numpy ring buffer beats these jitted
# buffers on this CPU (each jitted call pays a dispatch cost; `BENCHMARKS.md` times numpy
# and flashbax too); **inside one jitted program the buffer is not a separate call at
# all**: the next section never calls it from Python.

# %% [markdown]
# ## 4 · SAC, the whole loop one program
#
# `course_lib.offpolicy.sac` follows lesson 04's shape: `make_train(config, env, env_params)`
# returns `init(key)` and `run_chunk(state)`, pure functions of arrays. One chunk is a
# `lax.scan` over vectorised env steps, each followed by `updates_per_step` gradient
# updates in an inner scan (the pseudocode above); the env states, the replay buffer (a
# sum-tree here), the networks and the optimizer states are all in the scanned carry.
# `train` calls the jitted chunk in a Python loop, fetching each chunk's metrics for a
# progress bar, and runs the seeds as threads (`make_train_fn` vmaps them instead). The
# training scan:

# %%
from course_lib.offpolicy import sac

show_source(sac.make_train)
show_source(sac.learn_step)

# %% [markdown]
# **The three losses** (06.3)-(06.5), and the actor's log-density with the `tanh` change
# of variables. The actor outputs a Gaussian over $u$ and acts with $a = \tanh u$; the
# density of $a$ is the density of $u$ divided by $|da/du| = 1 - \tanh^2 u$ per
# dimension, so $\log\pi(a\mid s) = \log\mathcal N(u) - \sum\log(1 - \tanh^2 u)$,
# written in the numerically stable form $2(\log 2 - u - \mathrm{softplus}(-2u))$.
# (The target (06.2) is exercise 4.)

# %%
show_source(sac.critic_loss)
show_source(sac.policy_loss)
show_source(sac.temperature_loss)
show_source(sac.tanh_gaussian_log_prob)
show_source(sac.critic_step)

# %% [markdown]
# The twin minimum (TD3's fix, Fujimoto et al. 2018) counters one critic's
# overestimation, which the policy would climb. The policy loss is differentiated through
# $\tilde a$ with the critics held fixed; the temperature loss raises $\alpha$ when the
# entropy falls below its target.
#
# **The run.** The configuration of this scale, every field with its meaning:

# %%
config = pick(cpu=sac.CPU_CONFIG, full=sac.FULL_CONFIG)
SEEDS = pick(cpu=3, full=4)
print(describe(config))
print(f"\n{SEEDS} seeds: {config.env_steps_per_run:,} env steps and "
      f"{config.updates_per_run:,} gradient updates per seed, in {config.num_chunks} chunks")

# %%
# NBVAL_IGNORE_OUTPUT
load_before = np.round(np.array(os.getloadavg()), 1)
t0 = time.perf_counter()
result = sac.train(config, jax.random.split(jax.random.key(0), SEEDS))
train_s = time.perf_counter() - t0
paired = sac.compare_policies(result.state.learner.actor, jax.random.key(7), params, EVAL_EPISODES)
learned, random_same = paired["sac"], paired["random"]  # every driver on the same episodes
print(f"trained {SEEDS} seeds in {train_s:.0f} s (compilation included; load average before: {load_before})")
for s in range(SEEDS):
    print(f"seed {s}: accuracy {float(learned.accuracy[s]):6.1%}  collision {float(learned.collision_rate[s]):6.1%}  "
          f"off-road {float(learned.offroad_rate[s]):6.1%}  progress ratio {float(learned.progress_ratio[s]):.2f}")


def mean_se(x):
    x = np.asarray(x, float)
    return x.mean(), x.std(ddof=1) / np.sqrt(len(x))


acc_m, acc_se = mean_se(learned.accuracy)
col_m, col_se = mean_se(learned.collision_rate)
off_m, off_se = mean_se(learned.offroad_rate)
print(f"SAC (mean ± s.e.)    accuracy {acc_m:.1%} ± {acc_se:.1%}  collision {col_m:.1%} ± {col_se:.1%}  "
      f"off-road {off_m:.1%} ± {off_se:.1%}")
for name, r in (("random actions", paired["random"]), ("hand-written driver", paired["heuristic"])):
    print(f"{name:<20} accuracy {float(r.accuracy):6.1%}  collision {float(r.collision_rate):6.1%}  "
          f"off-road {float(r.offroad_rate):6.1%}   (the same episodes)")

# %%
accuracy, collision = np.asarray(learned.accuracy), np.asarray(learned.collision_rate)
rand_acc, rand_col, rand_off = (float(x) for x in random_same[:3])
assert np.all(accuracy > rand_acc + 0.4)  # every seed: far above the random driver
assert acc_m - 2 * acc_se > rand_acc + 0.5  # the mean, clear of its spread
assert np.all(np.asarray(learned.offroad_rate) < rand_off / 4)  # every seed stays on the road
assert col_m + off_m < (rand_col + rand_off) / 3  # failures fall
fewer = [s for s in range(SEEDS) if collision[s] < rand_col]
print(f"On the same episodes every seed's accuracy is more than 40 points above the random driver's and every seed "
      f"leaves the road less than a quarter as often; collisions fall below the random driver's {rand_col:.1%} in "
      f"{len(fewer)} of {SEEDS} seeds (the highest: seed {int(collision.argmax())}, {collision.max():.1%}).")

# %% [markdown]
# **Learning curves.** Each chunk's metrics come from the training episodes that ended in
# it (the policy samples its actions, and the first chunks are the random warm-up):

# %%
steps = result.metrics["charts/env_steps"][0] / 1000
fig, axes = plt.subplots(1, 3, figsize=(15, 4))
curves = (
    ("charts/accuracy", "accuracy", heuristic_rates["accuracy"], random_rates["accuracy"]),
    ("charts/collision_rate", "collision rate", heuristic_rates["collision"], random_rates["collision"]),
    ("charts/offroad_rate", "off-road rate", heuristic_rates["offroad"], random_rates["offroad"]),
)
for ax, (key, label, hand, rand) in zip(axes, curves):
    values = np.nan_to_num(result.metrics[key])  # [seeds, chunks]
    mean, spread = values.mean(0), values.std(0)
    ax.plot(steps, mean, label=f"SAC, mean of {SEEDS} seeds")
    ax.fill_between(steps, mean - spread, mean + spread, alpha=0.25, label="± 1 std over seeds")
    ax.axhline(hand, ls="--", c="g", label="hand-written driver")
    ax.axhline(rand, ls=":", c="r", label="random actions")
    ax.set_xlabel("env steps (thousands, all envs)")
    ax.set_ylabel(f"{label} of training episodes")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(label.capitalize())
axes[0].legend(fontsize=8)
fig.suptitle("SAC on the driving task: training episodes per chunk")
fig.tight_layout()
plt.show()
col_curve = np.nan_to_num(result.metrics["charts/collision_rate"]).mean(0)
learning = steps * 1000 > config.learning_starts
over = np.flatnonzero(learning & (col_curve > random_rates["collision"]))
assert over.size  # the collision rate rises above the random driver's once the policy stays on the road
print(f"training collision rate, mean of the seeds: {col_curve[learning].max():.2f} at its highest after the "
      f"warm-up; above the random driver's {random_rates['collision']:.2f} until "
      f"{steps[over[-1]]:.0f}k env steps")

# %% [markdown]
# **Takeaway.** Within the first learning chunks the policy stops leaving the road (the
# large, cheap lesson: progress reward and the off-road penalty). Collisions are the slow
# part: once the policy drives instead of leaving the road, it meets the slower leaders,
# and the training collision rate rises above the random driver's (printed under the
# curves) before braking in time is learned; the evaluation line above says in how many
# seeds collisions ended below the random driver's. The evaluation uses the
# deterministic policy (`tanh` of the mean), the curves the training episodes with
# sampled actions, so the two need not agree. The hand-written driver's line, on the
# same episodes, shows how far this budget leaves the learned one.
#
# **The learned driver, on the same four scenarios as section 1** (seed 0's actor):

# %%
actor0 = jax.tree.map(lambda a: a[0], result.state.learner.actor)
sac_driver = lambda k, o: sac.deterministic_action(actor0, o)  # noqa: E731
fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
draw_episodes(axes, sac_driver, jax.random.key(3), params)
fig.suptitle("The learned SAC driver (seed 0, deterministic) on the scenarios of section 1")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 5 · Where the time goes
#
# `sac.time_breakdown` times one training step of the run above, then each of its parts
# jitted on its own (rounds interleaved); `sac.sampling_seconds` draws batches from full
# prioritized and uniform buffers of the same size, in turn.

# %%
# NBVAL_IGNORE_OUTPUT
import dataclasses

parts = sac.time_breakdown(config, repeats=3, chunks=1)
draw = sac.sampling_seconds(config)
u_step = config.updates_per_step
step_parts = {
    "env step (all envs)": parts["env_step"],
    "actor sampling": parts["act"],
    "replay add": parts["replay_add"],
    f"replay sample x {u_step}": u_step * parts["replay_sample"],
    f"gradient update x {u_step}": u_step * parts["update"],
    f"priority update x {u_step}": u_step * parts["priority_update"],
}
remainder = parts["train_step"] - parts["parts_sum"]
for name, sec in step_parts.items():
    print(f"{name:<24} {sec * 1e3:7.3f} ms per vectorised step")
print(f"{'remainder':<24} {remainder * 1e3:7.3f} ms  (the whole step minus the parts)")
print(f"{'whole training step':<24} {parts['train_step'] * 1e3:7.3f} ms  -> {parts['env_steps_per_s']:,.0f} env "
      f"steps/s, {parts['updates_per_s']:,.0f} updates/s")
print(f"one batch of {config.batch_size} from {config.buffer_capacity:,} transitions: prioritized "
      f"{draw['prioritized'] * 1e3:.3f} ms, uniform {draw['uniform'] * 1e3:.3f} ms   (load average: "
      f"{np.round(os.getloadavg(), 1)})")

# %%
largest = max(step_parts, key=step_parts.get)
assert draw["prioritized"] > 1.5 * draw["uniform"]  # the descent costs more than random slots
if current_scale() == "cpu":  # small networks on CPU cores; on a GPU the sum-tree takes over (see below)
    assert largest.startswith("gradient update") and u_step * parts["update"] > parts["env_step"]
print(f"The largest measured part: {largest.split(' x ')[0]}"
      f"{' (it costs more than stepping the envs)' if largest.startswith('gradient') else ''}; a prioritized "
      "batch costs more than 1.5x a uniform one (drawn in turn from full buffers).")

# %% [markdown]
# **What the table says.** At this scale the gradient update, not the simulator, is the
# largest measured cost. Prioritized replay adds costs a uniform buffer does not have: a
# draw walks 16 levels of the sum-tree per item (a chain of dependent gathers; compare the
# last line), and every update writes the batch's priorities back.
#
# **The answer depends on the machine and the implementation.** On one H200 at the full
# scale (`BENCHMARKS.md`), this implementation's breakdown came out the other way round:
# the 256 x 3 networks' update on a batch of 1,024 is a handful of well-fed kernels, while
# its sum-tree descent (22 levels of dependent gathers in a `fori_loop`) and write-back
# are chains of tiny ones, so prioritized sampling and the priority write-back were the
# largest parts. That measures this sum-tree, not prioritized replay on GPUs in general.
#
# **The remainder** is the whole step minus its parts timed alone: costs that exist only in
# the assembled program (the sum-tree passing through the warm-up's `lax.cond` and the
# scan's carry, where XLA may copy it), or, when negative, overlap that only the fused
# program gets. A breakdown is checked against the whole step for that reason.
#
# **The update-to-data ratio (06.9), swept.** Two training programs, one chunk of each in
# turn (3 rounds, medians): this run's (1 update per vectorised step of the 8 envs: UTD
# 1/8) and the same with 4 updates per step (UTD 1/2; at the full scale, 1/256 and
# 1/64). More updates per env step learn
# more from each transition but slow the data stream:

# %%
# NBVAL_IGNORE_OUTPUT
high_utd_config = dataclasses.replace(config, updates_per_step=4 * config.updates_per_step)
side_by_side = {"prioritized": config, "prioritized, 4x updates": high_utd_config}
rates = dict(zip(side_by_side, sac.training_rates(list(side_by_side.values()))))
for name, r in rates.items():
    print(f"{name:<24} UTD {r['utd']:.3f}  {r['step_ms']:6.3f} ms per step  {r['env_steps_per_s']:>8,.0f} env steps/s"
          f"  {r['updates_per_s']:>6,.0f} updates/s")
print(f"(load average: {np.round(os.getloadavg(), 1)})")

# %%
base, high = rates["prioritized"], rates["prioritized, 4x updates"]
assert base["env_steps_per_s"] > 2 * high["env_steps_per_s"]  # 4x the updates per step: env steps/s fall by half+
assert high["updates_per_s"] > base["updates_per_s"] / 1.5  # while the learner's rate changes far less
utd_label = {name: f"1/{round(1 / r['utd'])}" for name, r in rates.items()}
print(f"From UTD {utd_label['prioritized']} to {utd_label['prioritized, 4x updates']}, env steps/s fall by more "
      "than half while gradient updates/s fall by less than a third or rise (the per-step work is shared by more "
      "updates): the update's cost sets the learner's rate, and the UTD decides how much data feeds it.")

# %% [markdown]
# **Takeaway.** Prioritized replay buys sample efficiency (Schaul et al.), not speed, and
# this lesson does not measure whether it pays. The learner's update rate moves much less
# than the env rate, so the UTD decides how many environment steps the learner's rate
# buys: at the higher UTD the same cores collect far fewer transitions per second, each
# replayed more often. Whether the trade learns faster per second is a property of the
# task (more replay of the same data can overfit the critics); these tables measure its
# cost.
#
# ## 6 · The learner across devices
#
# Off-policy systems have scaled out in three shapes:
#
# * **Ape-X** (Horgan et al. 2018): hundreds of CPU actors send transitions, with initial
#   priorities, to **one central prioritized replay**; one GPU learner samples from it and
#   publishes weights. Replay is a service, and its bandwidth is the system's.
# * **Reverb** (Cassirer et al. 2021) made that service a library: replay tables on a
#   server, and **rate limiters** that hold the samples-per-insert ratio (the UTD of (06.9)
#   times the batch size, since each update samples a batch) across processes.
# * **Data parallel on the devices** (Brax's SAC and PPO trainers): every device steps its
#   own environments, keeps **its own replay shard**, and the devices exchange nothing but
#   gradients, **one all-reduce per parameter update**; each shard replays only its own
#   devices' experience.
#
# `course_lib.offpolicy.sharded` is the third shape on lesson 05's 1-D mesh (axis `data`),
# the whole training chunk one `jax.jit(jax.shard_map(...))` program with the `lax.scan`
# inside. To make **1, 2 and 4 devices compute the same run**, the work is cut into a fixed
# number $S$ of *logical shards* (here 4), whatever the device count $D$: shard $g$ owns
# $N/S$ environments, a replay buffer of $C/S$ transitions and $B/S$ of every batch, and
# draws its randomness from `fold_in(fold_in(key, step), g)`, never from $D$. Device $d$
# holds $S/D$ shards and `vmap`s over them; the gradients are averaged over the shards and
# the devices (`lax.pmean` over both axes, an optax transformation in front of each
# optimizer, so sac.py's update runs unchanged). So $D = 1, 2, 4$ differ only in the
# order of floating-point additions. With prioritized replay each shard keeps its own
# sum-tree and normalises its own weights, unlike one global buffer. The program is single-host: one process
# drives the devices of one machine (a multi-node run would add `jax.distributed` and a
# mesh over every host's devices, which this lesson does not do). One device's step, its
# updates, and the averaging:

# %%
from course_lib.offpolicy import sharded

show_source(sharded.device_step)
show_source(sharded.learn_on_my_shards)
show_source(sharded.average_gradients)

# %% [markdown]
# **The same run on 1 and 4 CPU devices** (the 4 host devices the first cell asked for),
# with 16 envs, batches of 64 and uniform replay for 3 chunks of 100 steps, same seed; then
# the learned parameters are compared (the tests also compare 2 devices):

# %%
# NBVAL_IGNORE_OUTPUT
# full scale: sac.FULL_CONFIG's envs and batch, 8 logical shards, 3 chunks, on the device counts this host has
SHARD_CONFIG = pick(cpu=sharded.CPU_SHARDED_CONFIG, full=sharded.FULL_SHARDED_CONFIG)
SHARDS = pick(cpu=sharded.NUM_SHARDS, full=sharded.FULL_NUM_SHARDS)
SHARD_CHUNKS = pick(cpu=SHARD_CONFIG.num_chunks, full=2)  # full: the warm-up, then 288 updates
DEVICES = tuple(d for d in pick(cpu=(1, 4), full=(1, 2, 4, 8)) if d <= min(jax.device_count(), SHARDS))
t0 = time.perf_counter()
start = sharded.make_sharded_train(SHARD_CONFIG, SHARDS, data_mesh(1), None, None, None).init(jax.random.key(0))
start = start.learner
runs = sharded.run_on_device_counts(SHARD_CONFIG, SHARDS, DEVICES, seed=0, num_chunks=SHARD_CHUNKS)
print(f"{len(DEVICES)} device count(s) {DEVICES} compiled and run in {time.perf_counter() - t0:.0f} s "
      f"(load average: {np.round(os.getloadavg(), 1)})")
moved = sharded.max_param_difference(start, runs[1].state.learner)
differences = {d: sharded.max_param_difference(runs[1].state.learner, r.state.learner) for d, r in runs.items()}
for d, diff in differences.items():
    print(f"{d} device(s): max |parameter - 1 device's| = {diff:.1e}; episodes ended: "
          f"{int(runs[d].metrics['charts/episodes'].sum())}")
print(f"the parameters moved by up to {moved:.2f} from their initial values")

# %%
# on a GPU XLA's autotuning and atomic reductions can change the order of additions: a looser bound there
SHARD_TOL = pick(cpu=1e-5, full=1e-3)
MOVED_MIN = 0.01  # far above either tolerance, and well below what a few hundred Adam steps move
episodes = {d: runs[d].metrics["charts/episodes"].tolist() for d in runs}
updates = (SHARD_CHUNKS * SHARD_CONFIG.steps_per_chunk - SHARD_CONFIG.warmup_steps) * SHARD_CONFIG.updates_per_step
assert all(diff < SHARD_TOL for diff in differences.values()), differences
assert moved > MOVED_MIN  # they learned: equal because the same maths ran, not because nothing moved
assert all(e == episodes[1] for e in episodes.values())  # the same episodes ended in every chunk
if len(DEVICES) > 1:
    print(f"After {updates} updates the {' and '.join(map(str, DEVICES[1:]))}-device runs' parameters are within "
          f"{SHARD_TOL:.0e} of the 1-device run's, whose parameters moved by more than {MOVED_MIN}; every chunk "
          f"ended the same number of episodes on {' and '.join(map(str, DEVICES))} devices.")
else:
    print(f"One device on this host: the single-device path ran ({updates} updates); there is no other device "
          "count to compare with here.")

# %% [markdown]
# The agreement holds over a fixed horizon, not forever: RL feeds the parameters back into
# the data, so a last-bit difference in one action can, hundreds of updates later, end an
# episode differently, and the runs then drift apart like two seeds.
#
# **Throughput against devices.** The same programs, timed after compilation and the
# warm-up, one chunk of each in turn (3 rounds, medians):

# %%
# NBVAL_IGNORE_OUTPUT
scaling = sharded.measure_sharded_throughput(DEVICES, SHARD_CONFIG, SHARDS, repeats=3)
print(scaling.table())
print(f"(load average before / after: {scaling.load_before:.1f} / {scaling.load_after:.1f})")

# %% [markdown]
# On this machine more devices are expected to be *slower*: the 4 "devices" are threads on
# 2 cores, so the no-communication ceiling (lesson 05) is below 2x for 2 devices and no
# higher for 4, and every update adds three all-reduces (the critics', the actor's and the
# temperature's gradients; the actor's loss uses the critics after their step, so those
# two are sequential, while the temperature's could ride with the actor's, which this
# implementation does not do), each a rendezvous of the device threads.
# The point is the program: on $D$ accelerators with their own silicon each device steps
# $N/D$ envs and computes $B/D$ of every batch, and the only traffic is $3$ all-reduces of
# the gradients' size per update (about 1.8 MB in all at the full scale's 256 x 3 networks).
#
# **How much replay fits on an accelerator.** A stored transition is two observations,
# an action, a reward and a flag; `sharded.transition_nbytes` counts them from the env's
# shapes, checked here against a real buffer's arrays:

# %%
small = replay.per_init(sac.Transition(*(jnp.zeros(x.shape, x.dtype) for x in sharded.example_transition())),
                        capacity=1024, alpha=0.6)
real_bytes = sum(x.nbytes for x in jax.tree.leaves((small.data, small.tree))) / 1024
assert real_bytes == sharded.transition_nbytes(prioritized=True)  # bytes per slot, data and sum-tree
print(f"one transition: {sharded.transition_nbytes(prioritized=False)} bytes in a uniform buffer, "
      f"{sharded.transition_nbytes(prioritized=True)} with the sum-tree (a real 1,024-slot buffer: "
      f"{real_bytes:.0f} bytes per slot)")
print(f"the full-scale learner (actor, twin critics, targets, Adam moments): "
      f"{sharded.learner_nbytes() / 2**20:.1f} MiB")
for device, memory in sharded.DEVICE_MEMORY.items():
    cap = sharded.replay_capacity(memory)
    print(f"{device}: {cap.transitions / 1e6:,.0f} M transitions fit beside it (10% kept free); "
          f"a sum-tree's power of two: 2^{cap.power_of_two.bit_length() - 1} = {cap.power_of_two / 1e6:,.0f} M")

# %% [markdown]
# **A float32 sum-tree has a size limit.** A draw picks $u$ in $[0, \text{total})$ in
# float32, whose 24-bit mantissa offers about $2^{24}$ distinct values across that range;
# with $N$ leaves of similar priority each leaf's interval holds about $2^{24}/N$ of them.
# At $2^{22}$ leaves (the full scale's single tree) that is 4, so draws near the top of
# the range are quantised; at $2^{27}$ most leaves could never be drawn. Replay this large
# keeps its sums in float64, or splits the tree: the sharded program's logical shards each
# keep their own. The capacity above also assumes the buffer is updated in place: one
# copy by XLA (section 5) of a buffer that fills 90% of the device is an out-of-memory
# error.
#
# Replay, not the networks, owns an accelerator's memory at this observation size: the
# learner is a few MiB, while 100+ million transitions fit in the rest, more than V-Max's
# whole run of 25M steps. JAX preallocates 75% of a GPU by default, so a buffer this large
# needs `XLA_PYTHON_CLIENT_MEM_FRACTION=0.95`.
#
# ## 7 · Model size x scenario diversity
#
# The claim this course was seeded with, from V-Max's scaling table, is that **larger
# networks do worse than small ones on little data and overtake them with more**, where
# "data" means *distinct* driving scenes. To test it, the env steps and updates must be
# the same in every cell (only the width and the number of **distinct scenarios** change),
# and the policy must be evaluated on scenarios it never trained on.
#
# The driving simulator makes the second axis a knob: a scenario is drawn from a key, so
# a pool of $K$ keys is a dataset of $K$ scenes (`envs.scenarios.ScenarioPool`: every
# reset draws one of the pool's keys; $K = \infty$ is a fresh scene at every reset).
# Held-out scenes use keys no pool contains. A pool of 4, and the held-out scenes, as the
# wrapper draws them:

# %%
from course_lib.envs import scenarios

pool_env = scenarios.ScenarioPool(driving)
pool_key = jax.random.key(21)
reset_many = jax.jit(jax.vmap(pool_env.reset, in_axes=(0, None)))
reset_keys = jax.random.split(jax.random.key(22), 1000)
pool_starts = reset_many(reset_keys, scenarios.pool_params(params, pool_key, 4))[0]
held_starts = reset_many(reset_keys, scenarios.held_out_params(params, pool_key))[0]
distinct_pool = np.unique(np.round(np.asarray(pool_starts), 4), axis=0)
distinct_held = np.unique(np.round(np.asarray(held_starts), 4), axis=0)
shared = {tuple(r) for r in distinct_pool} & {tuple(r) for r in distinct_held}
assert len(distinct_pool) == 4 and len(distinct_held) == 1000 and not shared
print(f"1,000 resets from a pool of K = 4: {len(distinct_pool)} distinct first observations; "
      f"1,000 held-out resets: {len(distinct_held)} distinct, {len(shared)} of them in the pool")

# %% [markdown]
# **The sweep** (`offpolicy.sweep.scaling_sweep`): widths 32 and 256 (3 hidden layers;
# the narrow nets zero-padded into the wide shape, so one program runs every cell), pools of
# $K = 1, 8, 64, \infty$ scenarios, 3 seeds: 24 runs, **every one 4,096,000 env steps and
# 62,976 gradient updates** (256 envs, 4 updates per step, batch 256, uniform replay),
# evaluated with the deterministic policy on 1,024 held-out scenarios and on 1,024
# episodes of its own training pool. That is hours on two CPU cores, so it ran on one
# GPU, with the command in the file's record, and the lesson loads the result;
# `COURSE_SCALE=full` runs it again live.

# %%
# NBVAL_IGNORE_OUTPUT
from pathlib import Path

from course_lib.offpolicy import sweep as sweeps

RECORDED = Path(sweeps.__file__).parent / "recorded" / "sweep_full_h200.json"
if current_scale() == "full":
    t0 = time.perf_counter()
    grid = sweeps.scaling_sweep(sweeps.FULL_SWEEP, jax.random.key(11))
    print(f"ran live in {time.perf_counter() - t0:.0f} s on {jax.devices()[0].device_kind}")
    recorded_grid, grid_meta = sweeps.load_result(RECORDED)
else:
    grid, grid_meta = sweeps.load_result(RECORDED)
    print(f"recorded {grid_meta['date_utc'][:10]} on one {grid_meta['device_kind']} (jax {grid_meta['jax_version']}), "
          f"{grid_meta['num_runs']} runs as one vmapped program, {grid.seconds['total']:.0f} s in all: "
          f"`{grid_meta['command']}`")
print(sweeps.sweep_table(grid))

# %%
acc = grid.held_out.accuracy  # [widths, pool sizes, seeds]
pool_acc = grid.train_pool.accuracy
diversity = acc[:, -1] - acc[:, 0]  # K = inf minus K = 1, per (width, seed): the seeds share keys across cells
memorised = pool_acc[:, 0] - acc[:, 0]  # K = 1: its own training scene minus held-out scenes
wide_at_1 = acc[-1, 0] - acc[0, 0]  # K = 1: widest minus narrowest, per seed
found = sweeps.sweep_findings(grid)
assert np.all(grid.env_steps == grid.env_steps.flat[0]) and np.all(grid.updates == grid.updates.flat[0])
assert np.all(diversity.mean(-1) > 0.2) and np.all(memorised.mean(-1) > 0.4)  # per width, means over the seeds
if current_scale() == "cpu":  # the recorded grid, per (width, seed) pair; a live re-run is held to the means above
    assert np.all(diversity > 0.1) and np.all(memorised > 0.3)
    assert np.all(wide_at_1 > 0) and not found.crossover
print(f"Every cell: {int(grid.env_steps.flat[0]):,} env steps and {int(grid.updates.flat[0]):,} updates (read "
      "from each run's final state).")
print(f"K = inf minus K = 1 on held-out scenes, per (width, seed): {diversity.min():+.2f} at least, "
      f"{diversity.mean():+.2f} on average; K = 1, training scene minus held-out scenes: {memorised.min():+.2f} at least.")
ahead = (acc[-1] > acc[0]).sum(-1)  # per K: the seeds in which the widest net is ahead
print(f"Width {grid.widths[-1]} against width {grid.widths[0]} on held-out scenes, per K: the seeds in which it is "
      "ahead, and the order at 2 s.e.: "
      + ", ".join(f"{sweeps.pool_label(k)} {n} of {acc.shape[-1]} ({o})"
                  for k, n, o in zip(grid.pool_sizes, ahead, found.width_order)))
narrow_ahead = [sweeps.pool_label(k) for k, o in zip(grid.pool_sizes, found.width_order) if o == "narrow"]
print(f"The narrow net is ahead beyond 2 s.e. at {', '.join(narrow_ahead) if narrow_ahead else 'no K'}; "
      f"{'a crossover' if found.crossover else 'no crossover'} (the claimed pattern needs the narrow net ahead at "
      f"{sweeps.pool_label(grid.pool_sizes[0])} and the wide one at {sweeps.pool_label(grid.pool_sizes[-1])}).")

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
labels = [sweeps.pool_label(k) for k in grid.pool_sizes]
x = np.arange(len(labels))
for i, w in enumerate(grid.widths):
    for ax, rates, name in ((axes[0], acc, "held-out scenarios"), (axes[1], pool_acc, "its own training pool")):
        m, se = sweeps.mean_se(rates[i])
        ax.errorbar(x + 0.05 * (i - 0.5), m, yerr=se, marker="o", capsize=3, label=f"width {w}")
        ax.set_title(f"Accuracy on {name}")
for ax in axes:
    ax.set_xticks(x, labels)
    ax.set_xlabel("distinct training scenarios K (same env steps and updates in every cell)")
    ax.set_ylabel("accuracy (deterministic policy)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
device_kind = grid_meta["device_kind"] if current_scale() == "cpu" else jax.devices()[0].device_kind
fig.suptitle(f"Width x scenario diversity: mean ± s.e. over {acc.shape[-1]} seeds ({device_kind})")
fig.tight_layout()
plt.show()

# %% [markdown]
# **What the sweep shows.** Distinct data is the axis that matters: at the same number of
# env steps and updates, a fresh scene at every reset beats a single training scene on
# held-out scenes (the gaps printed above). The right panel says why small pools fail:
# with $K = 1$ the policy drives its training scene almost perfectly and held-out ones
# badly: it has memorised a scene, not learned to drive. How the two widths compare, per
# $K$, is printed above; with 3 seeds, 2 s.e. is a weak test (a t-test with 2 degrees of
# freedom needs 4.3), so read the width order as a direction, not a result. V-Max's best
# networks are transformer encoders over hundreds of objects, where capacity may matter
# more than for a 64-number observation; one grid, 3 seeds and one simulator cannot
# settle that, and more seeds would be the first thing to buy with more GPU time.

# %% [markdown]
# ## 8 · Sidebar: Brax
#
# Brax (Google) simulates rigid-body robots in JAX (its physics now in MuJoCo MJX), and the
# same `jit(scan(vmap(step)))` measurement of section 2 applies to `brax.envs` unchanged;
# the course does not install it, since the driving env already makes the point.
#
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | accuracy | share of episodes with no collision, no off-road and progress ratio ≥ 0.5 (V-Max counts red-light violations instead of stalls) |
# | collision rate | share of episodes that ended with the ego's box overlapping another vehicle's |
# | off-road rate | share of episodes that ended with a corner of the ego off the road |
# | progress ratio | distance covered along the route / route length (120 m), clipped to [0, 1] |
# | UTD (update-to-data ratio) | gradient updates per environment transition (06.9): `updates_per_step / num_envs` (`SACConfig.utd`) |
# | P(i), w_i | prioritized replay's sampling probability (06.7) and importance weight (06.8) |
# | logical shard | one of $S$ fixed slices of the sharded run (its envs, its replay, its part of every batch, its keys), whatever the device count |
# | K, distinct scenarios | the size of the pool of scenario keys a training run may reset into ($\infty$: a fresh scenario at every reset) |
# | held-out scenarios | scenarios from keys no training pool contains, for evaluation |
# | remainder | the whole training step's time minus the sum of its parts timed alone |
# | load average | the 1-minute average of runnable processes on this 2-core machine; above 2, timings drift |
#
# ## Summary
#
# - A simulator written as pure JAX functions runs inside the learner's program and fills
#   the cores with one vmapped batch; on an accelerator it keeps scaling with the batch.
# - Replay is a pytree of device arrays: a ring, or a sum-tree for prioritized replay
#   ($O(\log N)$ draws and updates, importance weights (06.8)).
# - SAC (06.2)-(06.6), with acting, storing, sampling and learning in one program, learned
#   the driving task on 2 CPU cores, far above the random driver.
# - Where the time goes depends on the machine and the implementation; the UTD (06.9)
#   trades env steps/s for replay per transition.
# - One `jit(shard_map)` program scales the learner over one host's devices with one
#   all-reduce per parameter set per update; replay, not the networks, owns the memory.
# - At a fixed budget, distinct data is what generalises: one training scene is memorised.
#
# `COURSE_SCALE=full` runs every section at GPU sizes; `BENCHMARKS.md` has what it measured.
#
# **References.** V. Charraut et al. (Valeo AI), *V-Max: Making RL practical for
# Autonomous Driving*, arXiv 2503.08388, 2025. C. Gulino et al., *Waymax: An Accelerated,
# Data-Driven Simulator for Large-Scale Autonomous Driving Research*, NeurIPS 2023 Datasets
# and Benchmarks. T. Haarnoja et al., *Soft Actor-Critic Algorithms and Applications*,
# arXiv 1812.05905, 2018. T. Schaul et al., *Prioritized Experience Replay*, ICLR 2016.
# M. Treiber, A. Hennecke, D. Helbing, *Congested traffic states in empirical observations
# and microscopic simulations*, Phys. Rev. E 62, 2000 (IDM). J. Kong et al., *Kinematic and
# dynamic vehicle models for autonomous driving control design*, IEEE IV 2015. E. Toledo et
# al., *Flashbax: Streamlining Experience Replay Buffers for Reinforcement Learning with
# JAX*, 2023 (instadeepai/flashbax). C. Lu et al., PureJaxRL, 2022; R. T. Lange, gymnax, 2022.
# D. Horgan et al., *Distributed Prioritized Experience Replay* (Ape-X), ICLR 2018.
# A. Cassirer et al., *Reverb: A Framework for Experience Replay*, arXiv 2102.04736, 2021.
# V. Makoviychuk et al., *Isaac Gym: High Performance GPU-Based Physics Simulation for Robot
# Learning*, NeurIPS 2021 Datasets and Benchmarks; M. Mittal et al., *Orbit* (now Isaac Lab),
# IEEE RA-L 2023. S. Fujimoto et al., *Addressing Function Approximation Error in Actor-Critic
# Methods* (TD3), ICML 2018.
#
# **Exercises:** `exercises/06_off_policy_scale.ipynb`: the bicycle step (06.1), the
# sum-tree descent, prioritized replay's importance weights (06.8), the soft Bellman target
# (06.2) and a batch of priorities written back into the sum-tree. Grade with
# `course grade exercises/06_off_policy_scale.ipynb`.
