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
# # Exercises 06 · Off-policy at scale: on-device replay and SAC
#
# This notebook is generated from `exercises/src/06_off_policy_scale.py`; the worked
# solutions are in `solutions/06_off_policy_scale.ipynb`. Write the function bodies where
# they raise `NotImplementedError`, run the *check yourself* cell under each one, and when
# all pass grade the notebook from a terminal:
#
# ```
# course grade exercises/06_off_policy_scale.ipynb
# ```
#
# The equations are numbered as in `lessons/06_off_policy_scale.ipynb`. These are the five
# pieces of the lesson's off-policy learner that are easiest to get subtly wrong: the
# driving simulator's step, the sum-tree descent behind prioritized replay and the
# importance weights that correct its bias, the target of Soft Actor-Critic's critics, and
# the slow copy that makes its target critics. Each statement below is complete: you need
# no library code to write it. Exercises 1, 3, 4 and 5 run inside jitted programs in the
# lesson, so write them with `jax.numpy` (`jnp`) and no Python `if` on array values: the
# checks call them under `jax.jit` too. Exercise 2 is plain Python that reads the tree one
# node at a time.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `bicycle_step`: the kinematic bicycle model | 15 | ★★☆ | 20 min |
# | 2. `sumtree_find`: the sum-tree descent of prioritized replay | 15 | ★★☆ | 25 min |
# | 3. `importance_weights`: prioritized replay's bias correction | 10 | ★☆☆ | 15 min |
# | 4. `soft_bellman_target`: SAC's critic target | 10 | ★☆☆ | 10 min |
# | 5. `polyak_update`: the target networks' slow copy | 10 | ★☆☆ | 10 min |

# %%
import jax
import jax.numpy as jnp
import numpy as np

from course_lib import check

# %% [markdown]
# ## Exercise 1 · The kinematic bicycle model (★★☆, 20 min, 15 points)
#
# The lesson's cars are kinematic bicycles (Rajamani 2012, §2.2; Kong et al. 2015): the two
# wheels of an axle are lumped into one, the wheels do not slip sideways, and the state is
# the position $(x, y)$ of the **centre of gravity** in metres, the heading $\psi$
# (radians, counter-clockwise from the $x$ axis) and the speed $v$ (m/s). The controls are
# the acceleration $a$ (m/s²) and the front wheels' steering angle $\delta$ (radians);
# $l_f$ and $l_r$ are the distances from the centre of gravity to the front and rear
# axles. The velocity at the centre of gravity points at the slip angle $\beta$ off the
# heading, and one **explicit Euler** step of $dt$ seconds, from the state $(x, y, \psi, v)$
# to the next one $(x', y', \psi', v')$, is
#
# $$\begin{gathered}
#   \beta = \arctan\Big(\frac{l_r}{l_f + l_r}\tan\delta\Big), \qquad
#   x' = x + v\cos(\psi + \beta)\,dt, \qquad
#   y' = y + v\sin(\psi + \beta)\,dt, \\
#   \psi' = \psi + \frac{v}{l_r}\sin\beta\,dt, \qquad
#   v' = \mathrm{clip}(v + a\,dt,\, 0,\, v_{max})
#   \end{gathered} \qquad (06.1)$$
#
# Every right-hand side uses the **old** state: the position moves with the old speed
# and the old heading. The speed is clipped to $[0, v_{max}]$: braking stops the car, it
# never reverses.
#
# Write `bicycle_step(x, y, psi, v, accel, steer, l_f, l_r, dt, v_max)` returning the
# tuple `(x', y', psi', v')`. It works **elementwise**: every argument is a Python float
# or an array, numpy or JAX, and they broadcast (a batch of cars of shape `[B]` with
# scalar parameters, or per-car `l_f` and `l_r`). Use `jnp` functions (`jnp.arctan`,
# `jnp.tan`, `jnp.cos`, `jnp.sin`, `jnp.clip`); never change the arrays you are given.
#
# **How it is graded:** hand-computed steps (a straight line; a turn with
# $\beta = 45°$; braking to a stop and the speed cap), 40 steps at constant steering that
# must close a circle (the yaw rate $v\sin\beta / l_r$), random cars against a naive
# element-by-element implementation of (06.1), shapes and broadcasting, inputs left
# unchanged, and a call under `jax.jit`. The slip angle without $l_r / (l_f + l_r)$,
# moving along $\psi$ instead of $\psi + \beta$, dividing by the wheelbase instead of
# $l_r$, moving with the new speed or the new heading, a missing clip at 0 or at
# $v_{\max}$, and a steering angle taken for degrees are named in the message.
#
# <details><summary>Hint 1</summary>
# Four lines after <code>beta</code>, one per row of (06.1); compute all of them from the
# arguments, never from a value you have just updated.
# </details>
# <details><summary>Hint 2</summary>
# <code>beta = jnp.arctan(l_r / (l_f + l_r) * jnp.tan(steer))</code>; the position moves along
# <code>psi + beta</code>, the heading turns by <code>v / l_r * jnp.sin(beta) * dt</code>.
# </details>
# <details><summary>Hint 3</summary>
# <code>v_new = jnp.clip(v + accel * dt, 0.0, v_max)</code>: an elementwise clip, where Python's
# <code>min</code>/<code>max</code> fail on arrays and under <code>jax.jit</code>.
# </details>


# %% tags=["exercise"]
def bicycle_step(x, y, psi, v, accel, steer, l_f, l_r, dt, v_max):
    """One explicit Euler step of the kinematic bicycle model (eq. 06.1), elementwise.

    Args:
        x, y: position of the centre of gravity, m.
        psi: heading, rad.
        v: speed, m/s.
        accel: acceleration, m/s^2.
        steer: front steering angle, rad.
        l_f, l_r: distances from the centre of gravity to the front and rear axles, m.
        dt: time step, s.
        v_max: top speed, m/s.

    Returns:
        (x', y', psi', v'), each shaped like the arguments broadcast together.
    """
    ### BEGIN SOLUTION
    beta = jnp.arctan(l_r / (l_f + l_r) * jnp.tan(steer))  # slip angle at the centre of gravity
    x_new = x + v * jnp.cos(psi + beta) * dt
    y_new = y + v * jnp.sin(psi + beta) * dt
    psi_new = psi + v / l_r * jnp.sin(beta) * dt
    v_new = jnp.clip(v + accel * dt, 0.0, v_max)  # explicit Euler: the position above used the old v
    return x_new, y_new, psi_new, v_new
    ### END SOLUTION


# %% tags=["raises-in-stub"]
turn = bicycle_step(0.0, 0.0, 0.0, 10.0, 0.0, np.arctan(2.0), 2.0, 2.0, 0.1, 30.0)
print("a turn with beta = 45 deg:", [round(float(s), 4) for s in turn])
print("(by hand: x' = y' = 10 cos(45 deg) 0.1 = 0.7071, psi' = 10 / 2 sin(45 deg) 0.1 = 0.3536, v' = 10)")
speeds, accels, steers = jnp.array([0.5, 10.0, 29.9]), jnp.array([-10.0, 0.0, 3.0]), jnp.array([0.0, 0.1, -0.1])
cars = bicycle_step(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), speeds, accels, steers, 1.2, 1.6, 0.1, 30.0)
print("three cars, new speeds:", np.round(np.asarray(cars[3]), 4), "(braked to a stop, unchanged, capped)")
state = (0.0, 0.0, 0.0, 10.0)
for _ in range(10):
    state = jax.jit(bicycle_step)(*state, 0.0, 0.3, 1.2, 1.6, 0.1, 30.0)
print("after 1 s at 0.3 rad of steering: x, y, psi =", np.round(np.asarray(state[:3]), 3))

# %% tags=["exercise-check"]
check("06_off_policy_scale", "bicycle_step", bicycle_step)

# %% [markdown]
# ## Exercise 2 · The sum-tree descent of prioritized replay (★★☆, 25 min, 15 points)
#
# Prioritized experience replay (Schaul et al. 2016) samples transition $i$ of the buffer
# with probability
#
# $$P(i) = \frac{p_i^\alpha}{\sum_k p_k^\alpha} \qquad (06.7)$$
#
# where $p_i$ is its priority (its last TD error, plus a small constant) and $\alpha$
# says how much prioritization is used ($\alpha = 0$: uniform). The sampling bias is
# corrected in the loss by importance weights (exercise 3). With a million transitions a
# cumulative sum per draw is too slow; a **sum tree** draws one in $O(\log N)$ and updates
# a priority in $O(\log N)$.
#
# The layout, an implicit binary heap in one array: `tree` is a float array of length
# `2 * capacity`, `capacity` a power of two. The **root is at index 1** and holds the
# total; node `i` has children `2 * i` and `2 * i + 1` and holds their sum; **item `j`'s
# leaf is at index `capacity + j`** and holds $p_j^\alpha$ (already exponentiated); index
# 0 is unused (it may hold anything).
#
# ```
#                  [1] 8.0                 capacity = 4: leaves [4] [5] [6] [7]
#          [2] 1.0         [3] 7.0         hold the items 0, 1, 2, 3
#     [4] 1.0  [5] 0.0  [6] 3.0  [7] 4.0
# ```
#
# To draw, take `u` uniform in `[0, total)` and walk down from the root: at node `i`, if
# `u < tree[2 * i]` go left; else subtract the left child's sum from `u` and go right.
# The leaf reached is the item `j` with
# `leaves[0] + ... + leaves[j - 1] <= u < leaves[0] + ... + leaves[j]`, so each item is
# drawn with probability proportional to its leaf, as (06.7) asks, and an item of priority
# zero never. In the tree above, `u = 0.5` gives item 0, `u = 1.0` item 2 (not the empty
# item 1), `u = 4.0` item 3.
#
# Write `sumtree_find(tree, u)` for one `u` (a Python float, `0 <= u < tree[1]`) with a
# plain Python loop; return the **item index** `j` (a Python int from `0` to
# `capacity - 1`), not the tree index.
#
# **Read the tree one node at a time.** The point of the tree is that a draw looks at
# one path from the root to a leaf, $\log_2(\text{capacity})$ levels, never at all the
# leaves. So the checks hand you the tree as a read-only object that counts the nodes you
# read: `len(tree)` (also `tree.shape`, `tree.size`) and `tree[i]` for an int `i` work as
# on a numpy array, and **one draw may read at most $2\log_2(\text{capacity}) + 1$
# different nodes** (both children at every level, plus the root). Slices (`tree[c:]`),
# iteration (`for`, `list`, `sum`), `np.asarray(tree)`, numpy or `jnp` functions of the
# whole tree (`np.cumsum`, `np.searchsorted`) and methods such as `tree.sum()` raise an
# error that the check reports. A cumulative sum of the leaves is exactly what the tree
# exists to avoid: a linear scan, $O(N)$ per draw. The demo cell below passes a numpy
# array, which allows everything; the check does not.
#
# **How it is graded:** the tree drawn above and trees of capacity 1 and 2; trees of
# capacity 1024 and 16384 whose draws must each read at most $2\log_2(\text{capacity}) + 1$
# nodes (21 and 29); random trees (capacity up to 64, with runs of zero leaves, garbage in
# index 0) against a cumulative-sum oracle at random `u`, at `u = 0`, at every boundary
# between items and just below the total; items of priority zero never drawn; stratified
# draws whose counts are proportional to the leaves (06.7). A linear scan (a cumulative
# sum or a loop over the leaves), returning the tree index, `<=` instead of `<`,
# forgetting to subtract the left sum, starting at index 0, stopping one level above the
# leaves and an off-by-one at the leaves are named in the message.
#
# <details><summary>Hint 1</summary>
# <code>capacity = len(tree) // 2</code>; start at <code>i = 1</code> and loop while
# <code>i &lt; capacity</code> (the nodes below <code>capacity</code> are the internal ones).
# </details>
# <details><summary>Hint 2</summary>
# In the loop: <code>left = 2 * i</code>; if <code>u &lt; tree[left]</code> then
# <code>i = left</code>, else <code>u -= tree[left]</code> and <code>i = left + 1</code>.
# </details>
# <details><summary>Hint 3</summary>
# The loop ends at a leaf index <code>i</code> in <code>[capacity, 2 * capacity)</code>: return
# <code>i - capacity</code>.
# </details>


# %% tags=["exercise"]
def sumtree_find(tree, u):
    """The item whose slice of [0, total) holds ``u``: the sum-tree descent (eq. 06.7).

    Args:
        tree: float array-like [2 * capacity]: root at 1, node i's children at 2i and 2i + 1,
            item j's leaf at capacity + j; index 0 unused. Read it node by node (tree[i]).
        u: a float with 0 <= u < tree[1].

    Returns:
        the item index j (an int in [0, capacity)).
    """
    ### BEGIN SOLUTION
    capacity = len(tree) // 2
    i = 1  # the root
    while i < capacity:  # an internal node: go down one level
        left = 2 * i
        if u < tree[left]:
            i = left
        else:
            u -= tree[left]  # skip the left subtree's mass
            i = left + 1
    return i - capacity  # the leaf's tree index -> the item index
    ### END SOLUTION


# %% tags=["raises-in-stub"]
drawn_tree = np.array([0.0, 8.0, 1.0, 7.0, 1.0, 0.0, 3.0, 4.0])
print("u = 0.5, 1.0, 4.0, 7.99 ->", [sumtree_find(drawn_tree, u) for u in (0.5, 1.0, 4.0, 7.99)])
counts = np.bincount([sumtree_find(drawn_tree, (k + 0.5) * 8.0 / 800) for k in range(800)], minlength=4)
print("800 stratified draws:", counts.tolist(), "for leaves", drawn_tree[4:].tolist())


class CountReads:  # records the nodes a draw reads, as the check's tree does (it also refuses slices)
    def __init__(self, values):
        self.values, self.read = values, set()

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        self.read.add(i)
        return self.values[i]


big = np.zeros(2 * 1024)
big[1024:] = 1.0  # 1024 items of equal priority
for node in range(1023, 0, -1):
    big[node] = big[2 * node] + big[2 * node + 1]
reads = CountReads(big)
item = sumtree_find(reads, 700.5)
print(f"capacity 1024, u = 700.5 -> item {item}, after reading {len(reads.read)} nodes (the check allows 21)")

# %% tags=["exercise-check"]
check("06_off_policy_scale", "sumtree_find", sumtree_find)

# %% [markdown]
# ## Exercise 3 · Prioritized replay's importance weights (★☆☆, 15 min, 10 points)
#
# Drawing item $i$ with probability $P(i)$ of (06.7) instead of uniformly changes what the
# learner averages: an item drawn twice as often as under uniform sampling counts twice in
# the expected update. Schaul et al. (2016) correct this by scaling item $i$'s loss with an
# importance weight, normalised by the largest weight in the sampled batch:
#
# $$w_i = \frac{(N\,P(i))^{-\beta}}{\max_j w_j} \qquad (06.8)$$
#
# where $N$ is the number of items stored and $N\,P(i)$ says how much more often than
# uniform ($1/N$) item $i$ is drawn. Before the normalisation, the **raw** weight
# $(N\,P(i))^{-\beta}$ is 1 for every item when sampling is uniform, below 1 for an item
# drawn more often than uniform and above 1 for one drawn less often. At $\beta = 1$ it is
# $1/(N\,P(i))$, which undoes the prioritization exactly: for any per-item quantity $f$,
# $\sum_i P(i)\,w_i f_i = \frac{1}{N}\sum_i f_i$, the uniform average. Smaller $\beta$
# corrects only part of the bias (training anneals $\beta$ from about 0.4 to 1). Dividing by
# the batch's largest weight keeps every weight in $(0, 1]$, so the weights only ever scale
# updates down; it also cancels $N$, which is why the checks look at the raw weights too.
#
# Write `importance_weights(probabilities, n_stored, beta, normalize=True)`:
# `probabilities` is a float array `[K]`, the $P(i)$ of the $K$ items of a sampled batch;
# `n_stored` is $N$ (an int, or an int32 array under `jax.jit`); `beta` a scalar. Return
# the float array `[K]` of weights: (06.8) when `normalize` is true, the raw weights
# $(N\,P(i))^{-\beta}$ when it is false. `normalize` is a Python bool, so an `if` on it is
# fine; use `jnp` for the arithmetic, and never change the array you are given.
#
# **How it is graded:** a hand-computed batch ($P = [1/2, 1/4, 1/8, 1/8]$, $N = 4$, at
# $\beta = 0.5$ and $1$, raw and normalised); uniform sampling and $\beta = 0$, which weigh
# every item 1; random batches against (06.8) written out one weight at a time, whose
# largest normalised weight is 1; at $\beta = 1$ the raw weights over all $N$ items turn
# the $P$-weighted average into the uniform one; a call under `jax.jit` with `beta` and
# `n_stored` traced. Dividing by the mean, the sum or the smallest weight instead of the
# largest, no normalisation, normalising the raw weights, the wrong sign of $\beta$, a
# missing $N$, $P / N$ instead of $N P$, and $N P^{-\beta}$ instead of $(N P)^{-\beta}$
# are named in the message.
#
# <details><summary>Hint 1</summary>
# First the raw weights, one line for all <code>K</code> items; then, only if
# <code>normalize</code>, divide them by their largest value.
# </details>
# <details><summary>Hint 2</summary>
# <code>w = (n_stored * probabilities) ** (-beta)</code>: the brackets matter, since
# <code>**</code> binds tighter than <code>*</code>.
# </details>
# <details><summary>Hint 3</summary>
# <code>if normalize: w = w / jnp.max(w)</code>, then <code>return w</code>. Python's
# <code>max</code> fails under <code>jax.jit</code>.
# </details>


# %% tags=["exercise"]
def importance_weights(probabilities, n_stored, beta, normalize=True):
    """Prioritized replay's importance weights (eq. 06.8) for a sampled batch.

    Args:
        probabilities: [K] the probability P(i) of each sampled item (eq. 06.7).
        n_stored: N, the number of items in the buffer (an int or an int32 array).
        beta: how much of the sampling bias to correct, 0 (none) to 1 (all).
        normalize: divide by the batch's largest weight (True) or return the raw weights.

    Returns:
        w: [K] float weights, (N P(i))^(-beta), divided by their max if normalize.
    """
    ### BEGIN SOLUTION
    w = (n_stored * probabilities) ** (-beta)  # raw: 1 for every item under uniform sampling
    if normalize:  # a Python bool, not an array: the `if` is fine under jax.jit
        w = w / jnp.max(w)  # the batch's largest weight becomes 1
    return w
    ### END SOLUTION


# %% tags=["raises-in-stub"]
batch_p = jnp.array([0.5, 0.25, 0.125, 0.125])
print("raw, beta = 1:         ", np.round(np.asarray(importance_weights(batch_p, 4, 1.0, normalize=False)), 4))
print("normalised, beta = 1:  ", np.round(np.asarray(importance_weights(batch_p, 4, 1.0)), 4))
print("normalised, beta = 0.5:", np.round(np.asarray(importance_weights(batch_p, 4, 0.5)), 4))
print("(by hand: N P = [2, 1, 0.5, 0.5]; raw [0.5, 1, 2, 2]; normalised [0.25, 0.5, 1, 1] and [0.5, 0.7071, 1, 1])")
all_p = jnp.array([0.4, 0.3, 0.2, 0.1])  # every item of a buffer of N = 4
f = jnp.array([1.0, -2.0, 3.0, 5.0])
w_all = importance_weights(all_p, 4, 1.0, normalize=False)
print(f"beta = 1: sum_i P(i) w_i f_i = {float(jnp.sum(all_p * w_all * f)):.4f}, the uniform mean {float(f.mean()):.4f}")

# %% tags=["exercise-check"]
check("06_off_policy_scale", "importance_weights", importance_weights)

# %% [markdown]
# ## Exercise 4 · SAC's critic target (★☆☆, 10 min, 10 points)
#
# Soft Actor-Critic (Haarnoja et al. 2018) learns two critics $Q_{\theta_1}, Q_{\theta_2}$
# and keeps a slow copy of each, the target critics $Q_{\bar\theta_1}, Q_{\bar\theta_2}$
# (exercise 5). For a transition $(s, a, r, s', d)$ from the replay buffer it draws a
# fresh action $a' \sim \pi(\cdot\mid s')$ from the current policy and regresses both
# critics on the soft Bellman target
#
# $$y = r + \gamma\,(1 - d)\,\big(\min(Q_1', Q_2') - \alpha\log\pi(a'\mid s')\big) \qquad (06.2)$$
#
# where $Q_j' = Q_{\bar\theta_j}(s', a')$ is target critic $j$ at the next state and the
# fresh action.
#
# The **minimum** of the two target critics fights the overestimation a single maximised
# critic builds up (the clipped double-Q of TD3, Fujimoto et al. 2018); the entropy bonus
# $-\alpha\log\pi$ is part of the value of $s'$, so it is discounted and masked with it;
# $\alpha$ is the temperature. The critics' loss is the squared error to $y$ (eq. 06.3),
# with $y$ held constant; the policy and the temperature have their own losses (eq. 06.4,
# eq. 06.5).
#
# Write `soft_bellman_target(reward, done, q1_next, q2_next, logp_next, alpha, gamma)`:
# every array is `[B]` (`done` holds 0.0 and 1.0), `alpha` and `gamma` are scalars;
# return `y`, a float array `[B]`. Here `done` means **terminated**: the episode really
# ended, there is no future to bootstrap. A time-limit truncation is not `done`: the
# caller passes `done = terminated` only, and the truncated transition bootstraps from its
# last observation like any other. Return plain values: whether you wrap them in
# `jax.lax.stop_gradient` does not matter here (the critic loss stops the gradient).
#
# **How it is graded:** hand-computed targets; random batches against (06.2) written out;
# a terminated transition whose target is its reward whatever the critics say; the twin
# minimum (swapping the critics changes nothing, raising the larger changes nothing,
# lowering the smaller lowers `y` by `gamma` times as much); the entropy term's sign and
# discount; a float `[B]` result, inputs unchanged, and a call under `jax.jit`. A maximum,
# a mean or one critic instead of the minimum, `+ alpha logp`, no done mask, the mask
# applied to the reward too, the entropy term outside the discount, and a missing `gamma`
# are named in the message.
#
# <details><summary>Hint 1</summary>
# Build the soft value of <code>s'</code> first: the smaller critic minus
# <code>alpha * logp_next</code>; then discount and mask it.
# </details>
# <details><summary>Hint 2</summary>
# <code>jnp.minimum(q1_next, q2_next)</code> is elementwise; Python's <code>min</code> is not.
# </details>
# <details><summary>Hint 3</summary>
# <code>return reward + gamma * (1.0 - done) * (jnp.minimum(q1_next, q2_next) - alpha * logp_next)</code>
# </details>


# %% tags=["exercise"]
def soft_bellman_target(reward, done, q1_next, q2_next, logp_next, alpha, gamma):
    """SAC's soft Bellman target (eq. 06.2), elementwise over a batch.

    Args:
        reward: [B] rewards r.
        done: [B] 1.0 where the episode terminated at s' (truncation is not done).
        q1_next, q2_next: [B] the two target critics at (s', a'), a' ~ pi(.|s').
        logp_next: [B] log pi(a'|s').
        alpha: the temperature (a scalar).
        gamma: the discount (a scalar).

    Returns:
        y: [B] float targets.
    """
    ### BEGIN SOLUTION
    soft_value = jnp.minimum(q1_next, q2_next) - alpha * logp_next  # the soft value of s'
    return reward + gamma * (1.0 - done) * soft_value  # a terminated s' has no future
    ### END SOLUTION


# %% tags=["raises-in-stub"]
y = soft_bellman_target(
    reward=jnp.array([1.0, 0.0, -1.0, 2.0]),
    done=jnp.array([0.0, 0.0, 1.0, 0.0]),
    q1_next=jnp.array([2.0, 5.0, 9.0, -1.0]),
    q2_next=jnp.array([3.0, 4.0, 9.0, -2.0]),
    logp_next=jnp.array([-1.0, 0.5, 3.0, -0.2]),
    alpha=0.2,
    gamma=0.9,
)
print("y =", np.round(np.asarray(y), 4), "(by hand: 2.98, 3.51, -1.0, 0.236)")

# %% tags=["exercise-check"]
check("06_off_policy_scale", "soft_bellman_target", soft_bellman_target)

# %% [markdown]
# ## Exercise 5 · The target networks' slow copy (★☆☆, 10 min, 10 points)
#
# The target critics of (06.2) trail the online critics: after every gradient step
# each parameter moves a small fraction $\tau$ of the way to the online one (Polyak
# averaging, Lillicrap et al. 2016; SAC uses $\tau = 0.005$):
#
# $$\bar\theta_j \leftarrow \tau\,\theta_j + (1 - \tau)\,\bar\theta_j \qquad (06.6)$$
#
# So the target stays within a slowly moving average of the last $1/\tau$ or so online
# networks, and the regression target $y$ does not chase the critic it trains. After $n$
# updates toward a fixed online network, the gap has shrunk by $(1 - \tau)^n$.
#
# The parameters are a **pytree**: nested dicts, lists and tuples whose leaves are arrays
# (the lesson's critics are `{"q1": {"dense_0": {"w": ..., "b": ...}, ...}, "q2": ...}`).
# Write `polyak_update(target, online, tau)`: `target` and `online` have the same
# structure; return a **new** pytree of that structure holding (06.6) leaf by leaf, and
# leave both inputs unchanged. `jax.tree.map(f, target, online)` calls `f(t, o)` on each
# pair of leaves and rebuilds the structure.
#
# **How it is graded:** hand-computed values; `tau = 0` returns the target, `tau = 1` the
# online parameters; random nested pytrees (dicts of lists of dicts, tuples, 0-d leaves)
# against a recursive oracle, with the same structure; numpy leaves left unchanged; 60
# updates under `jax.jit` that close the gap by exactly $(1 - \tau)^{60}$. `tau` and
# `1 - tau` swapped (or the target and the online network), a hard copy, a target not
# scaled by `1 - tau`, updating only the first leaf or only a flat dict, and an update in
# place are named in the message.
#
# <details><summary>Hint 1</summary>
# One line: <code>jax.tree.map</code> with a function of two leaves.
# </details>
# <details><summary>Hint 2</summary>
# The function is <code>lambda t, o: tau * o + (1 - tau) * t</code>: <code>t</code> from
# <code>target</code>, <code>o</code> from <code>online</code>, in the order you pass the trees.
# </details>
# <details><summary>Hint 3</summary>
# <code>return jax.tree.map(lambda t, o: tau * o + (1 - tau) * t, target, online)</code>; no
# <code>*=</code> or <code>+=</code>, which change a numpy leaf in place.
# </details>


# %% tags=["exercise"]
def polyak_update(target, online, tau):
    """The Polyak (soft) update of target parameters (eq. 06.6), leaf by leaf.

    Args:
        target: a pytree of arrays, the target parameters.
        online: a pytree of the same structure, the online parameters.
        tau: the step toward online, 0 <= tau <= 1.

    Returns:
        a new pytree: tau * online + (1 - tau) * target at every leaf.
    """
    ### BEGIN SOLUTION
    return jax.tree.map(lambda t, o: tau * o + (1.0 - tau) * t, target, online)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
target = {"q1": {"w": jnp.zeros(2), "b": jnp.array(4.0)}, "q2": [jnp.array([10.0, 0.0])]}
online = {"q1": {"w": jnp.ones(2), "b": jnp.array(2.0)}, "q2": [jnp.array([0.0, 10.0])]}
once = polyak_update(target, online, 0.1)
print("one update, tau = 0.1:", jax.tree.map(lambda a: np.asarray(a, dtype=np.float64).round(4).tolist(), once))
for _ in range(20):
    target = polyak_update(target, online, 0.1)
gap = float(target["q1"]["b"] - online["q1"]["b"])
print(f"the gap in q1.b after 20 updates: {gap:.4f} = 2 * 0.9^20 = {2 * 0.9**20:.4f}")

# %% tags=["exercise-check"]
check("06_off_policy_scale", "polyak_update", polyak_update)
