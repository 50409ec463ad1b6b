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
# # Exercises 04 · PureJaxRL: the whole loop on the accelerator
#
# This notebook is generated from `exercises/src/04_purejaxrl.py`; the worked solutions
# are in `solutions/04_purejaxrl.ipynb`. Write the function bodies where they raise
# `NotImplementedError`, run the *check yourself* cell under each one, and when all pass
# grade the notebook from a terminal:
#
# ```
# course grade exercises/04_purejaxrl.ipynb
# ```
#
# The equations are numbered as in `lessons/04_purejaxrl.ipynb`. Write every function
# with `jax.numpy` and `jax.lax` only (no Python `if` on array values, no numpy): the
# checks call your functions under `jax.jit` and `jax.vmap`.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `cartpole_step`: the pure env step | 15 | ★★☆ | 20 min |
# | 2. `gae_scan`: GAE by a reverse `lax.scan` | 15 | ★★☆ | 20 min |
# | 3. `autoreset_td_targets`: bootstrapping after an auto-reset | 10 | ★★☆ | 20 min |
# | 4. `make_minibatches`: the minibatch shuffle of PPO's update | 10 | ★★☆ | 20 min |

# %%
import jax
import jax.numpy as jnp
import numpy as np

from course_lib.envs.cartpole import EnvParams
from course_lib.ppo.jax_ppo import use_reliable_xla_cpu_flags
from course_lib import check

use_reliable_xla_cpu_flags()  # before the first JAX computation: an XLA CPU setting that avoids a rare hang

# %% [markdown]
# ## Exercise 1 · The pure env step (★★☆, 20 min, 15 points)
#
# Write CartPole's transition as a pure function of arrays. With $F = +10$ for action 1
# and $-10$ for action 0, $m$ = `params.masspole`, $M$ = `params.masscart + params.masspole`,
# $l$ = `params.length` (half the pole), $g$ = `params.gravity`, $\tau$ = `params.tau`
# (Florian 2007; gymnasium's `CartPole-v1`):
#
# $$\text{temp} = \frac{F + m l \dot\theta^2 \sin\theta}{M},\quad
#   \ddot\theta = \frac{g\sin\theta - \cos\theta\,\text{temp}}{l\,(4/3 - m\cos^2\theta / M)},\quad
#   \ddot x = \text{temp} - \frac{m l \ddot\theta \cos\theta}{M} \qquad (04.1)$$
#
# then one **explicit Euler** step: every new position uses the *old* velocity,
# $x' = x + \tau\dot x$, $\dot x' = \dot x + \tau \ddot x$, $\theta' = \theta + \tau\dot\theta$,
# $\dot\theta' = \dot\theta + \tau\ddot\theta$. The episode terminates when
# $|x'| > $ `params.x_threshold` (2.4 m) or $|\theta'| > $ `params.theta_threshold_radians`
# (12 degrees, already in radians).
#
# `state` is a float32 array `[x, x_dot, theta, theta_dot]`; `action` is 0 or 1 (a Python
# int or an integer array). Return `(next_state [4], terminated)` with `terminated` a
# boolean scalar array.
#
# **How it is graded:** against gymnasium's own `CartPole-v1` (the env the course's JAX
# version must match), stepped from the same states, under `jax.jit` and `jax.vmap` over a
# batch of states and actions, including states on both sides of both thresholds, and
# with four other CartPoles (every constant of `EnvParams` changed) in one `jax.vmap` over
# `params`: read every constant from `params`, never write one in. The program itself is
# inspected (`jax.make_jaxpr` with abstract inputs): it must call nothing on the host
# (`jax.pure_callback`, `io_callback`, `jax.debug.print`). Common slips (semi-implicit
# Euler, the force's sign, a threshold in degrees, a Python `if` on a traced value,
# constants written in) are named in the message.

# %% tags=["exercise"]
def cartpole_step(state, action, params=EnvParams()):
    """One CartPole transition (eq. 04.1, explicit Euler), as a pure function.

    Args:
        state: float32 [4] array [x, x_dot, theta, theta_dot].
        action: 0 (push left) or 1 (push right).
        params: an EnvParams with gravity, masscart, masspole, length, force_mag, tau,
            theta_threshold_radians, x_threshold.

    Returns:
        (next_state [4] float32, terminated: bool scalar array).
    """
    ### BEGIN SOLUTION
    x, x_dot, theta, theta_dot = state
    total_mass = params.masscart + params.masspole
    polemass_length = params.masspole * params.length
    force = jnp.where(action == 1, params.force_mag, -params.force_mag)
    costheta, sintheta = jnp.cos(theta), jnp.sin(theta)
    temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
    theta_acc = (params.gravity * sintheta - costheta * temp) / (
        params.length * (4.0 / 3.0 - params.masspole * costheta**2 / total_mass))
    x_acc = temp - polemass_length * theta_acc * costheta / total_mass
    new_x = x + params.tau * x_dot
    new_x_dot = x_dot + params.tau * x_acc
    new_theta = theta + params.tau * theta_dot
    new_theta_dot = theta_dot + params.tau * theta_acc
    terminated = (jnp.abs(new_x) > params.x_threshold) | (jnp.abs(new_theta) > params.theta_threshold_radians)
    return jnp.stack([new_x, new_x_dot, new_theta, new_theta_dot]), terminated
    ### END SOLUTION


# %% tags=["raises-in-stub"]
state = jnp.array([0.0, 0.0, 0.05, 0.0], jnp.float32)
next_state, terminated = jax.jit(cartpole_step)(state, 1)
print("next state:", np.round(np.asarray(next_state), 4), " terminated:", bool(terminated))
batch = jax.vmap(cartpole_step)(jnp.tile(state, (3, 1)), jnp.array([0, 1, 0]))
print("a batch of 3:", batch[0].shape)

# %% tags=["exercise-check"]
check("04_purejaxrl", "cartpole_step", cartpole_step)

# %% [markdown]
# ## Exercise 2 · GAE by a reverse `lax.scan` (★★☆, 20 min, 15 points)
#
# Generalised advantage estimation (Schulman et al. 2016) from a rollout of `T` steps of
# `B` envs. With $d_t = 1$ where the episode ended at step $t$ and $V(s_T)$ = `last_value`:
#
# $$\delta_t = r_t + \gamma (1 - d_t) V(s_{t+1}) - V(s_t) \qquad \text{((04.2) with every end a termination)}$$
# $$A_t = \delta_t + \gamma\lambda (1 - d_t) A_{t+1}, \qquad A_T = 0 \qquad (04.3)$$
#
# Here every episode end is a termination (no future reward); exercise 3 adds truncation,
# after which the lesson's (04.2) bootstraps from the value of the final observation.
#
# The recursion runs backwards in time. Write it with `jax.lax.scan(..., reverse=True)`
# (a Python loop over `t` would be unrolled into `T` copies by `jit`). Inputs: `rewards`,
# `values` float32 `[T, B]`, `dones` bool `[T, B]`, `last_value` `[B]`. Return the
# advantages `[T, B]`.
#
# **How it is graded:** against a Python-loop oracle that sums
# $\sum_k (\gamma\lambda)^k \delta_{t+k}$ term by term up to the episode's end, on random
# rollouts with episode ends, under `jax.jit`; a hand-computed example; $\lambda = 0$ gives
# $\delta_t$; a forward scan, a missing $(1 - d_t)$, or $\gamma$ without $\lambda$ in the
# trace are named in the message. The program itself is inspected (`jax.make_jaxpr`): it
# must hold exactly one `lax.scan` over the `T` steps, whose carry holds the running
# advantage (shape `[B]`) and whose step works on no array with a time axis (a step that
# sums all the deltas ahead with vector ops gives the right numbers in $O(T^2)$), whose
# output is computed from the carry (not advantages computed before the scan and passed
# through it), must build no `[T, T]` array, must not grow with `T` (a Python loop over `t` fails even when its numbers are right), and must
# call nothing on the host
# (a `jax.debug.print` left in the scan is a device-to-host round trip every step).

# %% tags=["exercise"]
def gae_scan(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    """GAE advantages (eqs. 04.2-04.3) by a reverse lax.scan.

    Args:
        rewards, values: float32 [T, B].
        dones: bool [T, B], True where the episode ended at step t.
        last_value: [B], V(s_T).
        gamma, lam: discount and GAE lambda.

    Returns:
        advantages [T, B].
    """
    ### BEGIN SOLUTION
    not_done = 1.0 - dones.astype(values.dtype)

    def step(carry, x):
        next_adv, next_value = carry
        r, v, nd = x
        delta = r + gamma * nd * next_value - v
        adv = delta + gamma * lam * nd * next_adv
        return (adv, v), adv

    init = (jnp.zeros_like(last_value), last_value)
    _, advantages = jax.lax.scan(step, init, (rewards, values, not_done), reverse=True)
    return advantages
    ### END SOLUTION


# %% tags=["raises-in-stub"]
r = jnp.ones((3, 1))
v = jnp.zeros((3, 1))
d = jnp.array([[False], [True], [False]])
print("A =", np.round(np.asarray(gae_scan(r, v, d, jnp.array([5.0]), gamma=0.5, lam=1.0)).ravel(), 4),
      " (by hand: 1.5, 1, 3.5)")

# %% tags=["exercise-check"]
check("04_purejaxrl", "gae_scan", gae_scan)

# %% [markdown]
# ## Exercise 3 · Bootstrapping after an auto-reset (★★☆, 20 min, 10 points)
#
# A JAX env's `step` resets an env in the same call when its episode ends: the observation
# it returns is the *next* episode's first one, and the state the step actually reached
# comes back in `info["final_obs"]`. Two kinds of end need two different bootstraps:
#
# * **terminated** (the pole fell): no future reward, bootstrap from 0;
# * **truncated** (the 500-step time limit): the state reached still has a value, bootstrap
#   from $V(\text{final obs})$. Bootstrapping from the next step's value would use the next
#   episode's first state; bootstrapping from 0 teaches the critic that the world ends at
#   step 500.
#
# Write the one-step TD targets of a rollout of `T` steps of `B` auto-reset envs (eq. 04.2
# of the lesson):
#
# $$y_t = r_t + \gamma\,(1 - \text{term}_t)\,V'_t, \qquad
#   V'_t = \begin{cases} \texttt{final\_values}_t & \text{if } \text{term}_t \lor \text{trunc}_t \\
#   \texttt{values}_{t+1} & \text{otherwise } (\texttt{last\_value} \text{ at } t = T-1) \end{cases}$$
#
# Inputs: `rewards`, `values` float32 `[T, B]` (`values[t]` = V of the observation acted on
# at `t`), `terminated`, `truncated` bool `[T, B]`, `final_values` float32 `[T, B]`
# (V(`info["final_obs"]`), **defined only where an episode ended**: elsewhere it holds
# whatever an implementation left there, do not read it), `last_value` `[B]`. Return
# `[T, B]`. A step can be terminated and truncated at once: termination wins.
#
# **How it is graded:** against a case-by-case Python oracle on random auto-reset rollouts
# (both kinds of end, some steps both at once, garbage in `final_values` where no episode
# ended) under `jax.jit` and `jax.vmap`; a hand-computed four-step example; properties (no
# ends gives $r_t + \gamma V(s_{t+1})$; a step both terminated and truncated gives $r_t$;
# `final_values` where no episode ended do not matter, even when they are `nan` or `inf`,
# so select with `jnp.where`: a 0/1 mask multiplied in reads them, and `0 * nan` is `nan`);
# the program must call nothing on the host. A truncation treated as a termination, a
# bootstrap from the next episode's first state, `final_values` read everywhere or through
# a mask, or a bootstrapped termination are named in the message.

# %% tags=["exercise"]
def autoreset_td_targets(rewards, values, terminated, truncated, final_values, last_value, gamma=0.99):
    """One-step TD targets of an auto-reset rollout (eq. 04.2).

    Args:
        rewards, values: float32 [T, B]; values[t] = V(observation acted on at t).
        terminated, truncated: bool [T, B], as the env's step returned them.
        final_values: float32 [T, B], V(info["final_obs"]); only defined where
            terminated | truncated.
        last_value: [B], V(observation after the last step).
        gamma: discount.

    Returns:
        targets [T, B]: r_t + gamma * (1 - terminated_t) * V(state step t reached).
    """
    ### BEGIN SOLUTION
    done = terminated | truncated
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    next_values = jnp.where(done, final_values, next_values)
    return rewards + gamma * (1.0 - terminated.astype(values.dtype)) * next_values
    ### END SOLUTION


# %% tags=["raises-in-stub"]
y = autoreset_td_targets(
    rewards=jnp.ones((4, 1)),
    values=jnp.array([[1.0], [2.0], [3.0], [4.0]]),
    terminated=jnp.array([[False], [True], [False], [False]]),
    truncated=jnp.array([[False], [False], [True], [False]]),
    final_values=jnp.array([[99.0], [7.0], [8.0], [99.0]]),
    last_value=jnp.array([5.0]),
    gamma=0.5,
)
print("y =", np.round(np.asarray(y).ravel(), 4), " (by hand: 2, 1, 5, 3.5)")

# %% tags=["exercise-check"]
check("04_purejaxrl", "autoreset_td_targets", autoreset_td_targets)

# %% [markdown]
# ## Exercise 4 · The minibatch shuffle of PPO's update (★★☆, 20 min, 10 points)
#
# After a rollout and its advantages, PPO's update cuts the rollout into minibatches and
# takes one gradient step on each. The rollout is a pytree (a dict, tuple or NamedTuple)
# whose leaves are `[T, B, ...]` arrays: observations `[T, B, 4]`, actions `[T, B]`,
# advantages `[T, B]`, and so on. Consecutive steps of one env are strongly correlated, and
# so are the `B` envs at one time step early in training, so a minibatch must be a random
# sample of **all** `T * B` samples; and a sample's observation, action, advantage and
# target must stay together, or the gradient pairs one sample's action with another's
# advantage.
#
# Write `make_minibatches(key, batch, n_minibatches)`: flatten every leaf's two leading
# axes into one of length `T * B`, reorder it by **one** random permutation drawn from
# `key` and shared by every leaf, and reshape it to `[n_minibatches, T * B / n_minibatches, ...]`
# (the trailing axes unchanged). `n_minibatches` is a Python int; when `T * B` does not
# split into `n_minibatches` equal minibatches, raise a `ValueError` whose message names
# both numbers (silently dropping the remainder would train on a biased subset). The
# lesson's `shuffled_minibatches` does the same for every epoch at once.
#
# **How it is graded:** on rollouts whose every entry holds its sample's index, under
# `jax.jit` with `n_minibatches` static, for several `T`, `B` and `n_minibatches`: the
# output keeps the batch's pytree structure and shapes, every sample appears exactly once,
# every leaf is in the same order (pairs stay aligned), the same key gives the same order,
# different keys give different orders, and the order is neither the identity, nor a
# rotation, nor a shuffle of the time steps within each env (each env keeping its column)
# or of the envs only, and each minibatch mixes about as many time steps and envs as a
# uniform shuffle does (not a few whole time steps or whole envs). The program itself is inspected (`jax.make_jaxpr` with abstract
# inputs): it must hold no loop (`lax.scan`, `fori_loop`), must not grow with `T * B` (a
# Python loop over samples is unrolled into one copy per sample), and must call nothing
# on the host.

# %% tags=["exercise"]
def make_minibatches(key, batch, n_minibatches):
    """Shuffle a rollout's T * B samples and cut them into minibatches.

    Args:
        key: a jax.random key.
        batch: a pytree whose leaves are [T, B, ...] arrays (the same T and B for every leaf).
        n_minibatches: a Python int that divides T * B.

    Returns:
        the same pytree with leaves [n_minibatches, T * B // n_minibatches, ...], every leaf
        reordered by one shared random permutation of the T * B samples.

    Raises:
        ValueError: T * B is not divisible by n_minibatches.
    """
    ### BEGIN SOLUTION
    n_t, n_b = jax.tree.leaves(batch)[0].shape[:2]
    n = n_t * n_b
    if n % n_minibatches:
        raise ValueError(f"T * B = {n} samples do not split into {n_minibatches} equal minibatches")
    order = jax.random.permutation(key, n)

    def shuffle(x):
        flat = x.reshape((n,) + x.shape[2:])
        return jnp.take(flat, order, axis=0).reshape((n_minibatches, n // n_minibatches) + x.shape[2:])

    return jax.tree.map(shuffle, batch)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
ids = jnp.arange(12.0).reshape(4, 3)  # T = 4 steps of B = 3 envs; sample t * B + b holds the number t * B + b
rollout = {"obs": jnp.stack([ids, 100 + ids], axis=-1), "action": ids.astype(jnp.int32)}
mbs = jax.jit(make_minibatches, static_argnums=2)(jax.random.key(0), rollout, 3)
print("obs", mbs["obs"].shape, " action", mbs["action"].shape)
print("sample ids per minibatch:", np.asarray(mbs["action"]).tolist())
print("observations still match their actions:", bool((mbs["obs"][..., 0] == mbs["action"]).all()))

# %% tags=["exercise-check"]
check("04_purejaxrl", "make_minibatches", make_minibatches)

# %% [markdown]
# When every check passes, grade the whole notebook:
# `course grade exercises/04_purejaxrl.ipynb`.
