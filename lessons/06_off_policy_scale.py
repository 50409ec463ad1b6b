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
# compile into one program**, and nothing crosses to the host until training ends. This
# is how V-Max (Valeo AI, arXiv 2503.08388) trains SAC on the Waymax driving simulator:
# 25M steps in 36 hours on one L4 GPU, to 97.44% "accuracy" (episodes with no collision,
# no off-road and no red-light violation) and a 1.74% collision rate.
#
# Waymax and the Waymo Open Motion Dataset cannot be installed here, so this lesson builds
# a small driving simulator in the same style (scenarios generated from a random key
# instead of read from logs) and measures what V-Max measures.
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
#    losses, Polyak targets) and find each in `course_lib.offpolicy.sac`, an end-to-end jitted
#    learner with an update-to-data ratio knob.
# 5. Train it on the driving task over several seeds, and read
#    accuracy, collision and off-road rates against a random and a hand-written driver.
# 6. Find where the time goes (env, sampling, update) and what a small model-size x
#    data-size sweep shows at this scale.
#
# Builds on lesson 04 (a JAX environment, `make_train(config) -> train(key)`, vmap over
# seeds) and lesson 05 (devices, and why one program per device matters).

# %%
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, describe, pick, show_source
from course_lib.envs import driving

print(f"course_lib {course_lib.__version__} | scale: {current_scale()} | JAX backend: {jax.default_backend()}")

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
# **The whole loop, one program** (`sac.make_train`; every line runs on the device):
# ```
# state = init(key)                        # networks, optimizers, num_envs envs, empty buffer
# for chunk in 1..num_chunks:              # Python: a progress bar between chunks
#     state = run_chunk(state)             # jitted: lax.scan over steps_per_chunk steps
#         a ~ pi(.|s)   (uniform while env_steps < learning_starts)
#         s', r, terminated, truncated, info = vmap(env.step)(s, a)     # auto-reset
#         buffer <- (s, a, r, terminated, info["final_obs"])           # ring or sum-tree
#         repeat utd times:                                           # update-to-data ratio
#             batch (, indices, w) ~ buffer
#             critics   <- Adam(grad L_Q)        (06.2, 06.3)
#             actor     <- Adam(grad L_pi)       (06.4)
#             log alpha <- Adam(grad L_alpha)    (06.5)
#             targets   <- Polyak(critics)       (06.6)
#             priorities[indices] <- |TD error| + eps     (prioritized only)
# ```

# %% [markdown]
# | equation or step | function in `course_lib` |
# |---|---|
# | (06.1) the bicycle step | `envs.driving.bicycle_step` (and `envs.driving_numpy.DrivingNumpyEnv`, its numpy twin) |
# | IDM agents, box overlap, off-road, observation, reward | `envs.driving.idm_acceleration`, `boxes_overlap`, `is_offroad`, `get_obs`, `reward_fn` |
# | accuracy, collision, off-road, progress ratio | `envs.driving.episode_success`, `info` of `envs.driving.step` |
# | a uniform ring buffer on the device | `replay.uniform_init`, `uniform_add`, `uniform_sample` |
# | the sum-tree | `replay.sumtree_update`, `sumtree_find` |
# | (06.7), (06.8) prioritized sampling and weights | `replay.per_sample`, `per_probabilities`, `importance_weights`, `per_update` |
# | (06.2) soft Bellman target | `sac.soft_bellman_target` |
# | (06.3), (06.4), (06.5) the three losses | `sac.critic_loss`, `policy_loss`, `temperature_loss` |
# | (06.6) Polyak targets | `sac.polyak_update` |
# | the whole loop | `sac.make_train` (`init`, `run_chunk`), `train` (with a progress bar), `make_train_fn` |
# | evaluation, time breakdown | `sac.evaluate`, `time_breakdown` |

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

# %%
params = driving.DEFAULT_PARAMS
print(f"observation: {driving.OBS_DIM} numbers; action: {driving.ACTION_DIM} in [-1, 1]")
print(
    f"dt {params.dt} s, {params.max_steps} steps, {params.n_agents} agents, route {params.route_length:.0f} m, "
    f"v_max {params.v_max:.0f} m/s"
)
show_source(driving.bicycle_step)

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
# offset, follow the leader with IDM). Both read only the observation. 512 episodes each,
# as one vmapped program:

# %%
EVAL_EPISODES = pick(cpu=512, full=4096)


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
load = np.round(np.array(__import__("os").getloadavg()), 1)
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
# loop without Python. On 2 CPU cores the curve flattens after a few tens of envs: the
# cores are full. On an accelerator the same program keeps scaling into the thousands of envs
# (gymnax: CartPole at 2,000 envs, 1M steps in 0.05 s on an A100), which is where V-Max's
# throughput comes from: the simulator runs where the learner does.
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
# else subtract it and go right. `per_sample` draws one $u$ in each of `batch_size` equal
# strata of the total (stratified, as Schaul et al. do), so a batch covers the whole range.

# %%
show_source(replay.sumtree_find)

# %% [markdown]
# **Checked against (06.7) and (06.8).** Eight items with priorities 1..8 and
# $\alpha = 0.6$; 64,000 draws; the empirical frequencies against $P(i)$, and the importance
# weights of one batch against the formula:

# %%
per = replay.per_init({"item": jnp.int32(0)}, capacity=8, alpha=0.6)
per = replay.per_add(per, {"item": jnp.arange(8)})
priorities = jnp.arange(1.0, 9.0)
per = replay.per_update(per, jnp.arange(8), priorities)
p_alpha = np.asarray(priorities, dtype=np.float64) ** 0.6  # the formula in float64: its rounding is far below what is printed
expected = p_alpha / p_alpha.sum()  # (06.7)

draws = jax.jit(jax.vmap(lambda k: replay.per_sample(per, k, 64, 0.4)[1]))(jax.random.split(jax.random.key(4), 1000))
freq = np.bincount(np.asarray(draws).ravel(), minlength=8) / draws.size
se = np.sqrt(expected * (1 - expected) / draws.size)  # an upper bound: stratified draws vary less
items, idx, weights = replay.per_sample(per, jax.random.key(5), 16, 0.4)
w_formula = (8 * expected[np.asarray(idx)]) ** -0.4
w_formula /= w_formula.max()  # (06.8), normalised by the batch's largest weight
print("P(i) (06.7)  :", np.round(expected, 3))
print("frequency    :", np.round(freq, 3))
w_error = np.abs(np.asarray(weights) - w_formula).max()  # float32 rounding: its late digits vary with the CPU
print(f"largest gap: {np.abs(freq - expected).max():.4f} = {np.abs(freq - expected).max() / se.max():.1f} s.e.;  "
      f"weights vs (06.8): max |error| {'< 1e-6 (float32 rounding)' if w_error < 1e-6 else f'{w_error:.1e}'}")
assert np.all(np.abs(freq - expected) < 4 * se)
assert w_error < 1e-6

# %% [markdown]
# The frequencies match $P(i)$ within sampling noise, and the weights give the rarely drawn
# items (low priority) the largest say: without them the learner would fit the
# high-error transitions as if they were the common case.
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
# `lax.scan` over vectorised env steps, each followed by `utd` gradient updates in an
# inner scan (the pseudocode above); the env states, the replay buffer (65,536 transitions
# on a sum-tree here: `prioritized=True`), the networks and the optimizer states are all in the scanned carry.
# `train` calls the jitted chunk in a Python loop only to draw a progress bar. Several
# seeds can run as one `jax.vmap`-ed program (`make_train_fn`), but on this CPU the
# seeds run faster as threads, one compiled chunk each (in `bench/bench_sac.py` 3 vmapped
# seeds ran at 0.56x the rate of the same seeds one after another, 3 threads at 1.29x:
# each update's small products already fill a core; `BENCHMARKS.md`), so `train` runs
# them as threads. The target and the slow copy,
# as the library writes them:

# %%
from course_lib.offpolicy import sac

show_source(sac.soft_bellman_target)
show_source(sac.polyak_update)

# %% [markdown]
# The critic's target needs $\min(Q_1', Q_2')$: one critic alone overestimates, because
# the policy climbs wherever the critic's errors happen to be high (the twin minimum is
# TD3's fix, Fujimoto et al. 2018). The $-\alpha\log\pi$ term is the soft value's entropy
# bonus. The actor's action is squashed by `tanh` into $[-1, 1]$, and its log-probability
# carries the change of variables $-\sum\log(1 - \tanh^2 u)$.
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
load_before = np.round(np.array(__import__("os").getloadavg()), 1)
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
# buffer, drawing a batch and one gradient update (critics, actor, temperature, targets).

# %%
# NBVAL_IGNORE_OUTPUT
parts = sac.time_breakdown(config, repeats=3, chunks=1)
per_step = {
    "env step (all envs)": parts["env_step"],
    "actor sampling": parts["act"],
    "replay add": parts["replay_add"],
    f"replay sample x {config.updates_per_step}": config.updates_per_step * parts["replay_sample"],
    f"gradient update x {config.updates_per_step}": config.updates_per_step * parts["update"],
}
for name, s in per_step.items():
    print(f"{name:<22} {s * 1e3:7.3f} ms per vectorised step  ({s / parts['parts_sum']:5.1%} of the parts)")
print(f"whole training step    {parts['train_step'] * 1e3:7.3f} ms  -> {parts['env_steps_per_s']:,.0f} env steps/s, "
      f"{parts['updates_per_s']:,.0f} updates/s   (load average: {np.round(__import__('os').getloadavg(), 1)})")

# %%
update_share = config.updates_per_step * parts["update"] / parts["parts_sum"]
assert update_share > 0.4  # the learner, not the simulator, is the cost at this scale
assert parts["env_step"] < config.updates_per_step * parts["update"]
print("At this scale the gradient updates take more of a step than the simulator: the update-to-data "
      "ratio, not the env, sets the throughput.")

# %% [markdown]
# **Takeaway.** With small networks on a CPU, the gradient updates are the largest share
# and the simulator a smaller one, the opposite of the classic loop of lesson 03 where the
# environments were the bottleneck. This is why `utd` is the first knob of an off-policy
# system: more updates per transition learn more from each step but slow the data
# stream; more envs per update feed the buffer faster but each transition is replayed
# fewer times. (V-Max's repository defaults to 16 envs and 4 updates per env step.)
#
# ## 6 · Model size x data size
#
# V-Max reports that larger networks underperform on little data and overtake the small
# ones with more. Here is the same question in miniature: actors and critics of two widths,
# each evaluated after three amounts of experience (every (width, seed) trained in one
# vmapped program: the narrow networks are zero-padded into the wide shape, and padding
# leaves their function and gradients unchanged).

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.offpolicy.sweep import CPU_SWEEP, FULL_SWEEP, scaling_sweep, sweep_table

sweep = pick(cpu=CPU_SWEEP, full=FULL_SWEEP)
t0 = time.perf_counter()
grid = scaling_sweep(sweep, jax.random.key(11))
print(f"accuracy (mean [min-max] over {sweep.num_seeds} seeds, {sweep.num_episodes} episodes each), "
      f"{time.perf_counter() - t0:.0f} s")
print(sweep_table(grid))

# %%
acc_grid = grid.accuracy.mean(-1)  # [widths, budgets]
assert np.all(acc_grid[:, -1] > random_rates["accuracy"] + 0.2)  # every width learns with the most data
fig, ax = plt.subplots(figsize=(7, 4))
for i, w in enumerate(grid.widths):
    ax.errorbar(np.array(grid.budgets) / 1000, acc_grid[i], yerr=grid.accuracy[i].std(-1), marker="o", capsize=3,
                label=f"width {w}")
ax.axhline(random_rates["accuracy"], ls=":", c="r", label="random actions")
ax.set_xlabel("env steps of experience (thousands)")
ax.set_ylabel("accuracy (deterministic policy)")
ax.set_title("Model size x data size at the cpu scale")
ax.legend()
plt.show()

# %% [markdown]
# **What the grid shows, and what it does not.** Every width learns: with the most
# experience each is more than 20 points above the random driver (asserted). The rest is
# not settled at this scale. Each budget is a snapshot of one run, so more experience and
# more gradient updates move together; with two seeds per cell the differences between
# budgets and between widths are within the min-max ranges of the table, and a training run
# this short changes with the machine's arithmetic (its instruction set, its thread
# count). So read the table with its ranges and claim no ordering, of widths or of budgets. V-Max's
# pattern, larger models behind on little data and ahead with more, needs budgets the
# cpu scale cannot afford: the `full` sweep (widths 32-512, up to 16M env steps, 4
# seeds) is the one to run on a GPU.

# %% [markdown]
# ## 7 · Sidebar: Brax
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
# | UTD (update-to-data ratio) | gradient updates per environment transition: `utd / num_envs` here |
# | alpha | SAC's entropy temperature, learned by (06.5) |
# | entropy | $-E[\log\pi(\tilde a\mid s)]$ of the tanh-squashed Gaussian (nats) |
# | Q | the critics' estimate of the soft return of the replayed (s, a) |
# | P(i), w_i | prioritized replay's sampling probability (06.7) and importance weight (06.8) |
# | load average | the 1-minute average of runnable processes on this 2-core machine; above 2, timings drift |
#
# ## Summary
#
# - A simulator written as pure JAX functions runs inside the learner's program: on this
#   CPU one env already beats the classic numpy simulator several times over, and the
#   vmapped batch fills the cores; on an accelerator it keeps scaling with the batch.
# - The replay buffer is a pytree of device arrays: a ring for uniform replay, a sum-tree
#   for prioritized replay ($O(\log N)$ draws and updates, importance weights (06.8)).
#   Called one at a time from Python on a CPU, numpy is faster; inside the jitted step it
#   costs no call at all.
# - SAC is four small equations (06.2)-(06.6) around that buffer; with acting, storing,
#   sampling and learning in one program it learned the driving task on 2 CPU cores, three
#   seeds in the time printed in section 4 (compilation included), from the random
#   driver's accuracy to well above it.
# - Where the time goes decides the knobs: the update-to-data ratio trades learning per
#   transition for throughput, and at this scale the gradient updates, not the
#   simulator, are the larger cost.
#
# **Full scale.** `COURSE_SCALE=full` evaluates 4096 episodes per driver, measures the env
# at up to 32,768 envs, trains with `sac.FULL_CONFIG` (thousands of envs, wider
# networks, millions of steps) and runs the full sweep; V-Max's own run is 25M steps in
# 36 h on one L4. The side-by-side figures (env vs numpy, replay vs numpy and flashbax,
# SAC steps/s) are in `BENCHMARKS.md`: `python bench/run.py replay`, `python bench/run.py sac`.
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
#
# **Exercises:** `exercises/06_off_policy_scale.ipynb`: the bicycle step (06.1), the
# sum-tree descent, the soft Bellman target (06.2) and the Polyak update (06.6). Grade
# with `course grade exercises/06_off_policy_scale.ipynb`.
