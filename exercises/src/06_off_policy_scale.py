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
# the batched write of new priorities back into the sum tree, as an accelerator runs it.
# Each statement below is complete: you need no library code to write it. Exercises 1, 3,
# 4 and 5 run inside jitted programs in the lesson, so write them with `jax.numpy` (`jnp`)
# and no Python `if` on array values: the checks call them under `jax.jit` too, and refuse
# a host callback (`jax.pure_callback` into numpy), which leaves the program. Exercise 2
# is plain Python that reads the tree one node at a time.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `bicycle_step`: the kinematic bicycle model | 15 | ★★☆ | 20 min |
# | 2. `sumtree_find`: the sum-tree descent of prioritized replay | 15 | ★★☆ | 25 min |
# | 3. `importance_weights`: prioritized replay's bias correction | 10 | ★☆☆ | 15 min |
# | 4. `soft_bellman_target`: SAC's critic target | 10 | ★☆☆ | 10 min |
# | 5. `sumtree_update`: writing a batch of priorities back into the sum tree | 15 | ★★☆ | 25 min |

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
# missing $N$, the batch size $K$ taken for $N$, $P / N$ instead of $N P$, and
# $N P^{-\beta}$ instead of $(N P)^{-\beta}$ are named in the message.


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
# (updated by the Polyak average (06.6)). For a transition $(s, a, r, s', d)$ from the replay buffer it draws a
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
# ## Exercise 5 · Writing a batch of priorities back into the sum tree (★★☆, 25 min, 15 points)
#
# After every gradient step prioritized replay writes the batch's new priorities back
# (`per_update`): $K$ leaves of the sum tree of exercise 2 change, and so do all their
# ancestors. On a CPU the lesson loops over the $K$ leaves, each followed by its path to
# the root. On a GPU or TPU a loop of $K$ steps is $K$ kernel launches, so there the
# update is written for **all $K$ leaves at once**: write the leaves, then repair their
# parents **one level at a time**, bottom up: $\log_2(\text{capacity})$ steps, whatever $K$.
# Two things make this subtle.
#
# **Repeated indices.** A batch is drawn with replacement, so the same item often comes
# twice, with two different new priorities. The rule is that **the last write wins** (the
# later entry of `indices`). But one scatter, `tree.at[nodes].set(values)`, with a repeated
# node keeps *an unspecified one* of its values: XLA does not say which (on a CPU it
# happens to be the last; on a GPU it can change from run to run). So decide first which
# entries are the last of their index, and write only those (or give every entry of a
# repeated index the winning value).
#
# **Shared parents.** Two written leaves can share a parent, and the upper ancestors are
# shared by many. Moving a parent by the *change* of its child (its old value plus the
# delta) loses all but one of the changes where a parent repeats (`.add` keeps them all,
# but counts a repeated leaf's change twice, and the sums drift in float32 update after
# update). Instead set every parent to the **sum of its two children**, read once the
# level below is written: repeated parents then all write the same value, and
# `tree[i] == tree[2 * i] + tree[2 * i + 1]` holds exactly, update after update.
#
# ```
#   capacity 4, leaves [1, 0, 3, 4]; write indices [3, 0, 3] with values [1, 6, 2]:
#   item 3 gets 2 (its last write), item 0 gets 6      [1] 11.0
#                                               [2] 6.0         [3] 5.0
#                                          [4] 6.0  [5] 0.0  [6] 3.0  [7] 2.0
# ```
#
# Write `sumtree_update(tree, indices, values)`: `tree` is a float32 JAX array
# `[2 * capacity]` in the layout of exercise 2 (root at 1, node `i`'s children at `2i` and
# `2i + 1`, item `j`'s leaf at `capacity + j`, every internal node the sum of its
# children, index 0 unused); `indices` an int32 array `[K]` of item indices in
# `[0, capacity)`, which may repeat; `values` a float32 array `[K]` of new leaf values
# ($p^\alpha \ge 0$). Return the new tree: each written leaf holds the value of the last
# entry of its index, the other leaves are unchanged, every internal node is the float32
# sum of its two children, and index 0 is left as it was. Use `jnp` and `jax.lax`, with no
# Python `if` on array values (the checks call it under `jax.jit`). `K` and `capacity` are
# shapes, so a Python `for` over the $\log_2(\text{capacity})$ levels is fine; a loop over
# the $K$ entries is the CPU path, not this one. And build nothing the size of the tree
# besides the tree itself: no mask, count or copy of all its nodes, so that the work grows
# with $K \log(\text{capacity})$, not with the capacity.
#
# **How it is graded:** the tree above and its siblings (hand-computed); random trees of
# capacity 1 to 64 and batches full of repeated indices against an oracle that writes the
# entries one at a time and re-adds every node from its children; 200 batches of random
# float32 priorities in a row, after which every internal node must still equal the sum of
# its children exactly; and the program under `jax.jit` on trees of capacity 16384 and
# 1048576 with `K = 32`, run one operation at a time: at most $2(\log_2 \text{capacity} + 1)$
# writes into the tree (a loop over the entries makes $K$ times as many); at most
# $8K(\log_2 \text{capacity} + 1)$ elements of the tree read and written in all (3,840 and
# 5,376; a gather or slice counts what it returns, a write what it writes, any other
# operation on the tree all of it), and at most $6K$ more per extra level from the smaller
# tree to the larger (the two children and the parent of $K$ nodes are $3K$), so whole
# levels rebuilt with slices, whose size grows with the capacity, are refused; no operation on an array the
# size of the tree other than the writes into it; and no write that gives one node two
# different values. A repeated index whose first write wins, a parent moved by its child's
# change (with `.set` or `.add`), ancestors not repaired (or one level short, or a level
# past the root into index 0), a rebuild of the whole tree or of its upper levels, a loop
# over the entries, and a repeated index left to the scatter are named in the message.


# %% tags=["exercise"]
def sumtree_update(tree, indices, values):
    """Write ``values`` into the leaves ``indices`` (the last of a repeated index wins) and
    repair their ancestors, all K leaves at once, one level at a time.

    Args:
        tree: float32 [2 * capacity], the sum tree (root at 1, item j's leaf at capacity + j).
        indices: int32 [K] item indices, possibly repeated.
        values: float32 [K] the new leaf values.

    Returns:
        the new tree, float32 [2 * capacity]: every internal node the sum of its children.
    """
    ### BEGIN SOLUTION
    capacity = tree.shape[0] // 2
    entry = jnp.arange(indices.shape[0])
    repeated_later = (indices[:, None] == indices[None, :]) & (entry[None, :] > entry[:, None])
    winners = jnp.where(jnp.any(repeated_later, axis=1), tree.shape[0], capacity + indices)  # losers: out of range
    tree = tree.at[winners].set(values, mode="drop")  # each leaf written once, with its last value
    nodes = capacity + indices
    for _ in range(capacity.bit_length() - 1):  # log2(capacity) levels, bottom up
        nodes = nodes // 2
        tree = tree.at[nodes].set(tree[2 * nodes] + tree[2 * nodes + 1])  # repeated parents: the same sum
    return tree
    ### END SOLUTION


# %% tags=["raises-in-stub"]
leaves = jnp.array([1.0, 0.0, 3.0, 4.0])
drawn = jnp.zeros(8).at[4:].set(leaves).at[2].set(1.0).at[3].set(7.0).at[1].set(8.0)
after = sumtree_update(drawn, jnp.array([3, 0, 3], dtype=jnp.int32), jnp.array([1.0, 6.0, 2.0]))
print("after writing [3, 0, 3] <- [1, 6, 2]:", np.asarray(after)[1:].tolist(), "(by hand: [11, 6, 5, 6, 0, 3, 2])")
siblings = sumtree_update(drawn, jnp.array([0, 1], dtype=jnp.int32), jnp.array([2.0, 2.0]))
print("after writing two siblings [0, 1] <- [2, 2]:", np.asarray(siblings)[1:].tolist(), "(by hand: [11, 4, 7, 2, 2, 3, 4])")
internal = np.arange(1, 4)
print("every internal node the sum of its children:",
      bool(np.all(np.asarray(after)[internal] == np.asarray(after)[2 * internal] + np.asarray(after)[2 * internal + 1])))

# %% tags=["exercise-check"]
check("06_off_policy_scale", "sumtree_update", sumtree_update)
