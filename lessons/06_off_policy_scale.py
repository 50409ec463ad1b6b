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
# makes them far more sample-efficient, and it turns the replay buffer into
# infrastructure: millions of transitions that must be written by the actors, sampled by
# the learner, and (for prioritized replay) re-weighted after every update. **Kept on the
# accelerator beside a JAX-native simulator, acting, storing, sampling and learning
# compile into one program**, and nothing crosses to the host until training ends; and
# the same program, written once per device, scales over many devices with one
# all-reduce per parameter set per update. This is how V-Max (Valeo AI, arXiv 2503.08388) trains SAC on the Waymax
# driving simulator, whose scenes are replayed from the Waymo Open Motion Dataset. The
# figures this course was first written with (25M steps in 36 hours on one L4 GPU, 97.44%
# "accuracy": episodes with no collision, no off-road and no red-light violation, and a
# 1.74% collision rate) are *the seed's*: the paper's versions report different tables
# (its v3 is retitled *V-Max: A Reinforcement Learning Framework for Autonomous Driving*),
# and this course could not check them against a named version, so read them as orders
# of magnitude, not as targets.
#
# Waymax and the Waymo Open Motion Dataset cannot be installed here, so this lesson builds
# a small driving simulator in the same style (scenarios generated from a random key
# instead of read from logs), measures what V-Max measures, and then does what the lesson's
# title promises on the devices this machine has: the whole learner sharded over a mesh,
# and a sweep of model size against the number of distinct scenarios trained on.
#
# **Learning goals**
# 1. Write a driving environment as pure JAX functions: a kinematic bicycle model for the
#    ego car, car-following (IDM) agents, oriented-box collisions, off-road checks and
#    vectorised observations; check it against an independent numpy twin and shapely.
# 2. Measure how env throughput scales with the number of environments under `jit` +
#    `vmap`, against the classic one-env-per-object numpy simulator.
# 3. Build replay buffers that live on the device: a uniform ring buffer and prioritized
#    replay on a sum-tree (O(log N) sampling and updates), with importance weights.
# 4. Read SAC as equations (soft Bellman target, twin critics, policy and temperature
#    losses, Polyak targets) and find each in `course_lib.offpolicy.sac`, an end-to-end
#    jitted learner whose update-to-data ratio (UTD: gradient updates per environment
#    transition) is a knob.
# 5. Train it on the driving task over several seeds, and read
#    accuracy, collision and off-road rates against a random and a hand-written driver.
# 6. Find where the time goes (env, sampling, update, priorities), uniform against
#    prioritized sampling, and what the UTD knob trades.
# 7. Shard the whole learner over a device mesh (envs and replay along `data`, one
#    gradient all-reduce per parameter set per update), check that 1 and 4 devices learn the same
#    parameters (1, 2 and 4 in the tests), and compute how much replay fits on an accelerator.
# 8. Separate model size from scenario diversity: a width x distinct-scenarios sweep at a
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
# * a road of 64 points 6 m apart, its curvature piecewise linear between random knots,
#   with 2 or 3 lanes 3.5 m wide;
# * 6 other vehicles in random lane slots around the ego, driven by Treiber's Intelligent
#   Driver Model (IDM: accelerate towards a desired speed, brake to keep a time headway
#   behind the leader in the lane, the ego included); they never change lanes;
# * the ego at 4-10 m/s, driven by (06.1), and a route target 120 m along its lane.
#
# An episode **terminates** on a collision (the ego's box overlaps another's: the
# separating-axis test on oriented boxes), when a corner of the ego leaves the road, or at
# the target; it is **truncated** after 160 steps (16 s). The observation (64 numbers, in
# the ego's frame, in V-Max's spirit) holds the ego's speed and last action, its heading
# error and offset in the lane, the distances to the road edges, the 4 nearest agents
# (position, velocity, heading, lane), 8 points of the lane centre ahead and the target.
# The reward is progress along the route (1 per step at top speed) minus a small
# lane-centring term, and -10 for a collision or leaving the road.
#
# **V-Max's metrics, per episode**: *collision*, *off-road*, *progress ratio* (distance
# covered along the route / route length) and **accuracy** = the share of episodes with
# none of the failures. V-Max counts collisions, off-road and red-light running; here a
# stalled ego counts as a failure too (progress ratio below 0.5), so that standing still
# is not "accurate".
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
# A classic simulator steps one environment per object, in Python, and a vector of them
# is a Python loop (`gymnasium.vector.SyncVectorEnv`). The JAX env is one function:
# `jax.vmap` makes it a function of a batch, and `lax.scan` loops it inside the compiled
# program, so the per-step Python and dispatch cost is paid once per *rollout*, not once
# per env and step. Env steps/s of uniformly random driving, for growing numbers of envs
# (each count compiles its own program first, not timed):

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
print("The JAX env is more than 5x the classic simulator at its best (already at 1 env: no Python per step); "
      "batching raises its rate by more than 1.5x until the cores are busy; the numpy loop's rate does not grow "
      "with more envs.")

# %% [markdown]
# **Takeaway.** Even one JAX env is several times the numpy env, because `scan` runs the
# loop without Python. On 2 CPU cores the gain from batching ends within the counts
# measured (where the rate peaks moves with the machine and its load, and past the peak it
# can fall as the envs' arrays outgrow the caches): the cores are full.
# On an accelerator the same program keeps scaling into the thousands of envs (gymnax:
# CartPole at 2,000 envs, 1M steps in 0.05 s on an A100). That is the idea behind V-Max's
# design, the simulator running where the learner does, but not a statement about its
# rate: 25M steps in 36 hours (the seed's figures) is about 190 env steps per second, far
# below this lesson's 2-core SAC, because each of V-Max's steps replays a logged Waymo scene
# with up to hundreds of objects and roadgraph points through a transformer encoder, and
# then takes several gradient updates of it. A step is only comparable to a step of the
# same simulator and network.
#
# **GPU physics at scale: Isaac Gym and Isaac Lab.** NVIDIA's Isaac Gym (Makoviychuk et al.
# 2021) put the same idea to rigid-body robots: physics simulated on the GPU for thousands
# of environments at once, observations, rewards and resets as GPU tensors handed to a
# PyTorch learner without copies to the host; its successor Isaac Lab (on Isaac Sim and
# PhysX) trains legged-robot policies in minutes. Brax, MuJoCo MJX (section 8's sidebar)
# and this lesson's simulator share that idea, written in JAX instead of CUDA kernels. They
# do not run here: Isaac Gym and Isaac Lab need an NVIDIA GPU and its drivers (Isaac Lab
# also Isaac Sim, a multi-gigabyte install), and this course's default run has no GPU.
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
# else subtract it and go right (writing that descent is exercise 2). `per_sample` draws
# one $u$ in each of `batch_size` equal strata of the total (stratified, as Schaul et al.
# do), so a batch covers the whole range. After each gradient update, `per_update` writes
# the batch's new priorities $|y - Q| + \epsilon$ back: `sumtree_update` sets each leaf and
# walks up to the root, re-adding the two children of every node on the way (as a loop over
# the leaves on a CPU, where XLA pays per operation; one level of all leaves at a time on an
# accelerator, where a loop would be one kernel launch per leaf: exercise 5).

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
# items (low priority) the largest say, so the weighted average is the uniform one:
# without them the learner would fit the high-error transitions as if they were the
# common case.
#
# **$\beta$, fixed here, annealed in the paper.** With $\beta = 1$ the weights cancel the
# sampling bias (exactly before the division by the batch's largest weight, which only
# rescales each batch's step); with $\beta < 1$ they cancel part of it. Schaul et al. start at
# $\beta_0$ (0.4 or 0.5) and raise it linearly to 1 by the end of training, because an
# unbiased update matters most near convergence, while early on the bias is harmless next
# to the policy's own drift and a small $\beta$ keeps the steps from being dominated by a
# few rare, heavily weighted items. This lesson keeps $\beta = 0.4$ for its short runs
# (`SACConfig.per_beta`), as many SAC+PER implementations do; annealing is one line, a
# $\beta$ computed from `env_steps` inside the scanned step.
#
# **Against numpy and flashbax.** `bench/bench_replay.py` times adding and sampling SAC-sized
# transitions in our jitted buffers, in a numpy ring buffer and sum-tree written as a good
# numpy author would, and in flashbax (InstaDeep's JAX replay library; `tests/test_replay.py`
# checks that both hold the same items after the same adds). On this CPU, numpy's ring
# buffer wins every uniform operation called one at a time (each jitted call pays a
# dispatch cost, and numpy's random integers are cheaper than JAX's counter-based ones);
# our prioritized add and update are on par with numpy's and faster than flashbax's. The
# figures and their spread are in `BENCHMARKS.md`. On the host the buffer is a cost to
# minimise; **inside one jitted program on an accelerator it is not a separate call at
# all**: the next section never calls the buffer from Python.

# %% [markdown]
# ## 4 · SAC, the whole loop one program
#
# `course_lib.offpolicy.sac` follows lesson 04's shape: `make_train(config, env, env_params)`
# returns `init(key)` and `run_chunk(state)`, pure functions of arrays. One chunk is a
# `lax.scan` over vectorised env steps, each followed by `updates_per_step` gradient
# updates in an inner scan (the pseudocode above); the env states, the replay buffer
# (65,536 transitions on a sum-tree here: `prioritized=True`), the networks and the
# optimizer states are all in the scanned carry. `train` calls the jitted chunk in a
# Python loop only to draw a progress bar. Several seeds can run as one `jax.vmap`-ed
# program (`make_train_fn`), but on this CPU the seeds run faster as threads, one compiled
# chunk each: in `bench/bench_sac.py` (`BENCHMARKS.md`) 3 seeds vmapped with prioritized
# replay ran at 0.56x the rate of the same seeds one after another (the sum-tree's
# scatters batch badly), with uniform replay at 1.25x, and as 3 threads at 1.29x, so
# `train` runs them as threads. The training scan:

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
# The critic's target needs $\min(Q_1', Q_2')$: one critic alone overestimates, because
# the policy climbs wherever the critic's errors happen to be high (the twin minimum is
# TD3's fix, Fujimoto et al. 2018). The $-\alpha\log\pi$ term is the soft value's entropy
# bonus. The policy loss is differentiated through $\tilde a$ (the reparameterisation),
# with the critics held fixed; the temperature loss raises $\alpha$ when the entropy
# falls below its target and lowers it above.
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
learned = sac.evaluate(result.state.learner.actor, jax.random.key(7), params, EVAL_EPISODES)
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
for name, r in (("random actions", random_rates), ("hand-written driver", heuristic_rates)):
    print(f"{name:<20} accuracy {r['accuracy']:6.1%}  collision {r['collision']:6.1%}  off-road {r['offroad']:6.1%}")

# %%
accuracy = np.asarray(learned.accuracy)
assert np.all(accuracy > random_rates["accuracy"] + 0.4)  # every seed: far above the random driver
assert acc_m - 2 * acc_se > random_rates["accuracy"] + 0.5  # the mean, clear of its spread
assert np.all(np.asarray(learned.offroad_rate) < random_rates["offroad"] / 4)  # it stays on the road
assert col_m + off_m < (random_rates["collision"] + random_rates["offroad"]) / 3  # failures fall
print("Asserted: every seed's accuracy is more than 40 points above the random driver's, the mean more than 50 "
      "points above it beyond 2 s.e.; every seed leaves the road less than a quarter as often as the random "
      "driver, and collisions plus off-road fall below a third of the random driver's.")

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

# %% [markdown]
# **Takeaway.** Within the first learning chunks the policy stops leaving the road (the
# large, cheap lesson: progress reward and the off-road penalty); collisions are the slow
# part, because avoiding a slower leader needs the policy to brake in time, a rarer and
# later-paid lesson. The evaluation above uses the deterministic policy (`tanh` of the
# mean) on fresh episodes, while the curves count the training episodes, driven by
# sampled actions, so the two need not agree. The learned driver stays below the hand-written one at this budget: V-Max trains for 25M
# steps, this run for the number printed in the training cell.
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
# `sac.time_breakdown` times one training step of the run above, and then each of its
# parts jitted on its own in a scan: stepping the envs, the actor's sampling, adding to the
# buffer, drawing a batch, one gradient update (critics, actor, temperature, targets) and
# writing the batch's new priorities into the sum-tree (rounds interleaved). What the
# parts do not add up to is named as the remainder: the training program's own work
# around them, which no part measures alone. Beside it, `sac.sampling_seconds` draws
# batches from a full buffer of the same size, prioritized and uniform, in turn.

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
# **What the table says.** At this scale the learner, not the simulator, is the largest
# measured cost: the gradient update. Prioritized replay adds costs a uniform buffer does
# not have: drawing a batch walks 16 levels of the sum-tree per item (a chain of dependent
# gathers, where uniform replay draws 64 random slots at once: compare the last line), and
# every update writes the batch's priorities back (cheap here: a loop over 64 leaves of
# 16 parents each).
#
# **The answer depends on the machine.** At the full scale on one H200 (`BENCHMARKS.md`,
# lesson 06 at full scale) the same breakdown comes out the other way round: the 256 x 3
# networks' update on a batch of 1,024 is a handful of well-fed kernels, while the
# sum-tree's 22 levels of dependent gathers for 1,024 draws, and its write-back, are long
# chains of tiny ones: prioritized sampling and the priority write-back become the largest
# parts, and a prioritized batch costs tens of times a uniform one. (Timed alone on a GPU
# the parts also add up to *more* than the whole step: each part's program pays its own
# launches and synchronisation, which the fused training program overlaps.) This is why
# GPU systems favour uniform replay or batch their priority updates.
#
# **The remainder is not noise.** Timed alone, each part gets its inputs in place (the
# buffer donated); inside the training program the 512 KB sum-tree passes through the
# warm-up switch (`lax.cond`) and the scan's carry, where XLA can copy it instead of
# updating it in place (search the text of
# `sac.jitted_programs(config, driving, params)[1].lower(state).compile()` for
# `f32[131072]` copies to see where), and its gathers and writes compete with the batch
# and the networks for the caches. These are candidates, not a measured split of the
# remainder: costs that exist only in the assembled program. That is why a breakdown must
# be checked against the whole step, and why "prioritized sampling is cheap" measured in
# isolation is not the same claim as "prioritized replay is cheap".
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
assert high["updates_per_s"] > 0.8 * base["updates_per_s"]  # while the learner's rate changes far less
utd_label = {name: f"1/{round(1 / r['utd'])}" for name, r in rates.items()}
print(f"From UTD {utd_label['prioritized']} to {utd_label['prioritized, 4x updates']}, env steps/s fall by more "
      "than half while gradient updates/s stay within 20% or rise (the per-step work is shared by more updates): the "
      "update's cost sets the learner's rate, and the UTD decides how much data feeds it.")

# %% [markdown]
# **Takeaway.** What prioritized replay buys for its price is sample efficiency (Schaul
# et al.), not speed; whether it pays at a given budget is an experiment of its own, which
# this lesson does not run. The learner's update rate moves much less than the env rate
# (it even rises a little as the per-step work is shared by more updates), so the UTD knob
# decides how many environment steps the learner's rate buys: at the higher UTD the same
# cores collect far fewer transitions per second, each replayed more often.
# Whether the trade learns faster per second is a property of the task (more replay of the same data
# can overfit the critics; high-UTD methods such as REDQ and DroQ add ensembles or dropout
# to make UTD above 1 pay); the cost side is what these tables measure. On a GPU the trade
# moves: thousands of envs step in the time of one update, so a system there chooses
# `num_envs` and `updates_per_step` together (V-Max's defaults: 16 envs, 4 updates per
# step).
#
# ## 6 · The learner across devices
#
# Everything so far ran on one device. Off-policy systems have scaled out in three shapes:
#
# * **Ape-X** (Horgan et al. 2018): hundreds of CPU actors, each with its own environment
#   copies and a slightly stale copy of the policy, send transitions (with initial
#   priorities they compute themselves) to **one central prioritized replay**; one GPU
#   learner samples from it, sends back new priorities and publishes weights. Replay is a
#   service in the middle, and its bandwidth is the system's.
# * **Reverb** (Cassirer et al. 2021, DeepMind) made that service a library: replay
#   *tables* on a server with pluggable samplers and removers (uniform, prioritized, FIFO),
#   **rate limiters** that hold the samples-per-insert ratio (the UTD of (06.9), enforced
#   across processes: a learner that runs ahead blocks), and gRPC clients for actors and
#   learners; a large system shards the tables over several servers.
# * **Data parallel on the devices** (Brax's SAC and PPO trainers, V-Max):
#   every device steps its own environments, keeps **its own replay shard**, samples its
#   part of the batch locally, and the devices exchange nothing but gradients, **one
#   all-reduce per parameter update**. No transition ever crosses a network; the price is
#   that each shard only replays its own devices' experience.
#
# `course_lib.offpolicy.sharded` is the third shape on lesson 05's 1-D mesh (axis `data`),
# the whole training chunk one `jax.jit(jax.shard_map(...))` program with the `lax.scan`
# inside. To make **1, 2 and 4 devices compute the same run**, the work is cut into a fixed
# number $S$ of *logical shards* (here 4), whatever the device count $D$: shard $g$ owns
# $N/S$ environments, a replay buffer of $C/S$ transitions and $B/S$ of every batch, and
# draws its randomness from `fold_in(fold_in(key, step), g)`, never from $D$. Device $d$
# holds $S/D$ shards and `vmap`s over them; the gradients are averaged over the shards and
# the devices (`lax.pmean` over both axes), which with equal shards is the gradient of the
# mean loss over the whole batch. So $D = 1, 2, 4$ differ only in the order of
# floating-point additions. sac.py's update runs unchanged: the averaging is an optax
# transformation put in front of each optimizer (so each local shard applies the same
# averaged Adam step to its copy and one copy is kept: $S/D$ times the optimizer's
# arithmetic, simple rather than optimal). With prioritized replay each logical shard
# keeps its own sum-tree: it draws by priority among its own transitions and normalises
# its importance weights by its own batch's largest weight, so the averaged gradient
# weights the shards slightly unequally, unlike one global buffer (Ape-X's); the tests
# check the equivalence with uniform replay. One device's step, its updates, and the
# averaging:

# %%
from course_lib.offpolicy import sharded

show_source(sharded.device_step)
show_source(sharded.learn_on_my_shards)
show_source(sharded.average_gradients)

# %% [markdown]
# **The same run on 1 and 4 CPU devices.** The lesson asked XLA for 4 CPU host devices in
# its first cell (lesson 05's `use_cpu_devices`); meshes of the first device and of all 4
# run the driving task with 16 envs, batches of 64 and uniform replay for 3 chunks of 100
# steps (296 updates after the warm-up), same seed. The programs compile side by side (on
# this CPU, about 10 s each: the lesson compares two device counts to stay within its time;
# `tests/test_offpolicy_sharded.py` asserts 1, 2 and 4, and one SGD update against
# per-shard updates computed on one device), and run under the course's watchdog; then the
# learned parameters are compared:

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
# GPUs' reductions are not deterministic and RL amplifies differences: a looser bound there (never run on >1 GPU)
SHARD_TOL = pick(cpu=1e-5, full=1e-3)
episodes = {d: runs[d].metrics["charts/episodes"].tolist() for d in runs}
updates = (SHARD_CHUNKS * SHARD_CONFIG.steps_per_chunk - SHARD_CONFIG.warmup_steps) * SHARD_CONFIG.updates_per_step
assert all(diff < SHARD_TOL for diff in differences.values()), differences
assert moved > 1000 * SHARD_TOL  # they learned: equal because the same maths ran, not because nothing moved
assert all(e == episodes[1] for e in episodes.values())  # the same episodes ended in every chunk
if len(DEVICES) > 1:
    print(f"Asserted: after {updates} updates the {' and '.join(map(str, DEVICES[1:]))}-device runs' parameters "
          f"are within {SHARD_TOL:.0e} of the 1-device run's, which moved by more than 1000x that; every chunk "
          f"ended the same number of episodes on {' and '.join(map(str, DEVICES))} devices.")
else:
    print(f"One device on this host: the single-device path ran ({updates} updates); there is no other device "
          "count to compare with here.")

# %% [markdown]
# The agreement is that of floating-point reduction order, and it holds over a fixed
# horizon, not forever: RL feeds the parameters back into the data, so a difference in the
# last bit of one action can, hundreds of updates later, end an episode differently (a
# collision just avoided), and from then on the runs drift apart like two seeds
# (`sharded`'s docstring measures it). On one device count the run is bitwise
# reproducible.
#
# **Throughput against devices.** The same programs, timed after compilation and the
# warm-up, one chunk of each in turn (3 rounds, medians):

# %%
# NBVAL_IGNORE_OUTPUT
scaling = sharded.measure_sharded_throughput(DEVICES, SHARD_CONFIG, SHARDS, repeats=3)
print(scaling.table())
print(f"(load average before / after: {scaling.load_before:.1f} / {scaling.load_after:.1f})")

# %% [markdown]
# On this machine more devices are *slower*, and must be: the 4 "devices" are threads on
# 2 cores, so the no-communication ceiling (lesson 05: the same work split with no
# all-reduce, timed on this machine type) is below 2x for 2 devices and no higher for 4,
# and every update adds three all-reduces (the critics', the actor's and the
# temperature's gradients: SAC's actor loss uses the critics after their step, so the
# first two cannot be merged), each a rendezvous of the device threads, 300 per chunk.
# The point is the program: on $D$ accelerators with their own silicon each device steps
# $N/D$ envs and computes $B/D$ of every batch, and the only traffic is $3$ all-reduces of
# the gradients' size per update (about 1.8 MB in all at the full scale's 256 x 3 networks),
# the pattern Brax and V-Max use.
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
# keeps its sums in float64 (Reverb does), or splits the tree: the sharded program's
# logical shards each keep their own (8 trees of $2^{24}$ hold $2^{27}$). The capacity
# above also assumes the buffer is updated in place; section 5 showed that XLA can copy
# what passes through a `lax.cond` or a scan's carry, and one copy of a buffer that fills
# 90% of the device is an out-of-memory error: check the compiled program's copies first.
#
# Replay, not the networks, owns an accelerator's memory at this observation size: the
# learner is a few MiB, while 100+ million transitions fit in the rest: thousands of
# hours of driving at 10 steps per second, more than V-Max's whole run (25M steps, the seed's
# figure) by a factor of 5-10. JAX preallocates 75% of a GPU by default, so a buffer this
# large needs `XLA_PYTHON_CLIENT_MEM_FRACTION=0.95`. With images instead of 64 numbers (an
# 84 x 84 x 3 camera frame is 21 KB) the same memory holds a few million, which is why
# pixel-based systems store frames once (not as obs and next_obs), compress them, or keep
# replay on the host or in a Reverb server.
#
# ## 7 · Model size x scenario diversity
#
# The claim this course was seeded with, from V-Max's scaling table (*the seed's* reading:
# not checked against a named version of the paper), is that **larger networks do worse
# than small ones on little data and overtake them with more**, where "data" means hours
# of *distinct* driving: scenes from the Waymo Open Motion Dataset. Two things must be
# held apart to test it. The amount of experience a run *sees* (env steps) and the
# number of updates it makes must be the same in every cell; only the model's width and
# the number of **distinct scenarios** it may train on change. And the policy must be
# evaluated on scenarios it never trained on, or memorising a few scenes looks like
# skill.
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
# **The sweep** (`offpolicy.sweep.scaling_sweep`): widths 32 and 256 (actor and critics,
# 3 hidden layers; the narrow nets zero-padded into the wide shape, which leaves their
# function and gradients unchanged, so one compiled program runs every cell), pools of
# $K = 1, 8, 64, \infty$ scenarios, 3 seeds: 24 runs, **every one 4,096,000 env steps and
# 62,976 gradient updates** (256 envs, 4 updates per step, batch 256, uniform replay),
# evaluated with the deterministic policy on 1,024 held-out scenarios and on 1,024
# episodes of its own training pool. That is far beyond two CPU cores (at the rate of
# section 5 it would take hours), so it ran on one GPU, with the command in the file's
# record, and the lesson loads the result; `COURSE_SCALE=full` runs it again live. At the
# cpu scale the same code shows nothing: with 1,744 updates per run every cell is still
# mostly crashing and seed noise swamps the cells (`offpolicy.sweep.CPU_SWEEP`'s comment).

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
assert np.all(diversity > 0.1)  # every (width, seed) pair: fresh scenarios beat one scenario on held-out scenes
assert np.all(memorised > 0.3)  # every pair: the one training scene memorised
print(f"Every cell: {int(grid.env_steps.flat[0]):,} env steps and {int(grid.updates.flat[0]):,} updates (read "
      "from each run's final state).")
print(f"Asserted: in all {diversity.size} (width, seed) pairs, K = inf beats K = 1 on held-out scenes by more than "
      f"0.1, and with K = 1 accuracy on the training scene exceeds held-out accuracy by more than 0.3.")
print("Width order per K at 2 s.e. (a weak test with 3 seeds): "
      + ", ".join(f"{sweeps.pool_label(k)} {o}" for k, o in zip(grid.pool_sizes, found.width_order)))
if current_scale() == "cpu":  # the recorded grid; a live re-run can order the widths differently
    assert np.all(wide_at_1 > 0) and not found.crossover
    print(f"Asserted: with one training scene the wide net is ahead in all {wide_at_1.size} seeds, the opposite of "
          "the seed's 'larger models behind on little data'; no crossover.")

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
# **What the sweep shows.** Distinct data is the axis that matters here: at the same
# number of env steps and updates, a fresh scene at every reset beats a single training
# scene on held-out scenes in every (width, seed) pair, by about half of the accuracy scale
# on average. The effect is not monotone in between (at width 256, $K = 8$ did no better
# than $K = 1$), and with 3 seeds the standard errors are wide: the robust statement is the
# sign and rough size of the $K = 1$ against $K = \infty$ gap, not the shape of the curve.
# The right panel says why small pools fail: with $K = 1$ (and, for the wide net, $K = 8$)
# the policy drives its training scenes almost perfectly and held-out ones badly: it has
# memorised scenes, not learned to drive. The wide net memorises more (its training-pool
# accuracy stays higher as $K$ grows). On held-out scenes the widths are close: with one
# training scene the wide net was ahead in all 3 seeds, elsewhere the seeds disagree in
# sign (a tie at 2 s.e., itself a weak test with 3 seeds: a t-test with 2 degrees of
# freedom needs 4.3). So this sweep shows **no crossover**: the seed's pattern (larger
# models behind on little data) does not appear at these sizes, budgets and this
# simulator; only its other half, more distinct data helping every size, does. The live
# re-run at full scale (same seed, `BENCHMARKS.md`) reproduced the diversity and
# memorisation effects but ordered the widths differently at $K = 64$ and $K = \infty$:
# GPU reductions are not deterministic, RL amplifies the difference, and that ordering is
# within the noise. Two reasons the picture may differ from V-Max's: its best networks
# are transformer encoders over hundreds of objects (it compares several encoders, MLPs
# among them), where capacity matters more than for a 64-number observation, and "little
# data" there means thousands of logged scenes, not one. One grid, 3 seeds, one simulator:
# more seeds would be the first thing to buy with more GPU time.

# %% [markdown]
# ## 8 · Sidebar: Brax
#
# Brax (Google) simulates rigid-body robots in JAX, and its maintained part is now its
# training code (`brax/training`), with the physics moved to MuJoCo MJX and MuJoCo
# Playground; its authors report millions of simulation steps per second on one
# accelerator. `brax 0.14.2` resolves beside this course's pinned JAX (a `pip install
# --dry-run` adds `mujoco 4.0.0`, `mujoco-mjx 3.17.0`, a Flask web viewer and OpenGL
# bindings), but the course does not install it: this lesson's point, a simulator written
# as pure JAX functions and run inside the learner's program, is made by the driving env
# above, and a robot simulator's contact physics would spend the CPU budget of the
# notebook on compiling. On a GPU, the same `jit(scan(vmap(step)))` measurement applies to
# `brax.envs` unchanged; expect the curve of section 2 to keep climbing into the
# thousands of envs instead of flattening at the core count.
#
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | accuracy | share of episodes with no collision, no off-road and progress ratio ≥ 0.5 (V-Max counts red-light violations instead of stalls) |
# | collision rate | share of episodes that ended with the ego's box overlapping another vehicle's |
# | off-road rate | share of episodes that ended with a corner of the ego off the road |
# | progress ratio | distance covered along the route / route length (120 m), clipped to [0, 1] |
# | env steps/s | environment transitions per second, all envs together |
# | updates/s | SAC gradient updates (critics, actor, temperature, targets) per second |
# | UTD (update-to-data ratio) | gradient updates per environment transition (06.9): `updates_per_step / num_envs` (`SACConfig.utd`) |
# | alpha | SAC's entropy temperature, learned by (06.5) |
# | entropy | $-E[\log\pi(\tilde a\mid s)]$ of the tanh-squashed Gaussian (nats) |
# | Q | the critics' estimate of the soft return of the replayed (s, a) |
# | P(i), w_i | prioritized replay's sampling probability (06.7) and importance weight (06.8) |
# | logical shard | one of $S$ fixed slices of the sharded run (its envs, its replay, its part of every batch, its keys), whatever the device count |
# | K, distinct scenarios | the size of the pool of scenario keys a training run may reset into ($\infty$: a fresh scenario at every reset) |
# | held-out scenarios | scenarios from keys no training pool contains, for evaluation |
# | remainder | the whole training step's time minus the sum of its parts timed alone |
# | load average | the 1-minute average of runnable processes on this 2-core machine; above 2, timings drift |
#
# ## Summary
#
# - A simulator written as pure JAX functions runs inside the learner's program: on this
#   CPU one env already beats the classic numpy simulator several times over, and the
#   vmapped batch fills the cores; on an accelerator it keeps scaling with the batch
#   (Isaac Gym and Isaac Lab do the same for robots in CUDA).
# - The replay buffer is a pytree of device arrays: a ring for uniform replay, a sum-tree
#   for prioritized replay ($O(\log N)$ draws and updates, importance weights (06.8)).
# - SAC is four small equations (06.2)-(06.6) around that buffer; with acting, storing,
#   sampling and learning in one program it learned the driving task on 2 CPU cores, three
#   seeds in the time printed in section 4, from the random driver's accuracy to well
#   above it.
# - Where the time goes decides the knobs: the gradient update is the largest measured
#   part on this CPU (the sum-tree's on a GPU), a prioritized batch costs more than 1.5x a
#   uniform one, and on this CPU the assembled step costs more than its parts (the
#   remainder, named in section 5). The UTD (06.9) trades env steps/s for replay per
#   transition while the update rate changes far less.
# - The learner scales out as one `jit(shard_map)` program: envs and replay sharded along
#   `data`, one gradient all-reduce per parameter set per update; with logical shards, 1 and
#   4 devices computed the same parameters to within the tolerance printed in section 6
#   (the tests: 1, 2 and 4). On an accelerator, replay, not the networks, owns the memory:
#   over 100 million transitions fit beside a few MiB of networks.
# - Separated from the number of updates, distinct data is what generalises: in the
#   recorded GPU sweep a fresh scene at every reset beat a single training scene on
#   held-out scenes in every (width, seed) pair, single scenes were memorised, and the
#   widths stayed close (no crossover at these sizes; 3 seeds, one grid).
#
# **Full scale.** `COURSE_SCALE=full` (`python -m course_lib run 06 --scale full
# --no-kernel` on a GPU) evaluates 4096 episodes per driver, measures the env at up to
# 32,768 envs, trains with `sac.FULL_CONFIG` (1,024 envs, 256 x 3 networks, 4 updates per
# step, 2^22 transitions of prioritized replay, 10M env steps, 4 seeds), breaks down its
# step, runs the sharded program on the devices the host has (one GPU: the single-device
# path, $D = 1$, 8 logical shards), and re-runs the sweep live. The measured figures, with
# date and device, are in `BENCHMARKS.md` (`python bench/run.py replay`,
# `python bench/run.py sac`).
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
# sum-tree descent (graded on a tree that counts the nodes each draw reads: a scan of the
# leaves fails), prioritized replay's importance weights (06.8), the soft Bellman target
# (06.2) and a batch of priorities written back into the sum-tree. Grade with
# `course grade exercises/06_off_policy_scale.ipynb`.
