"""Lesson 04's graded exercises: the pure CartPole step, GAE by a reverse ``lax.scan``,
PPO's clipped surrogate, and vmapping a training function over seeds and learning rates.

The learner writes:

* ``cartpole_step(state [4], action, params) -> (next_state [4], terminated)``  (04.1)
* ``gae_scan(rewards, values, dones, last_value, gamma, lam) -> advantages [T, B]``  (04.2-04.3)
* ``ppo_clip_loss(log_prob, old_log_prob, advantages, clip_eps) -> scalar``  (04.4)
* ``train_grid(train, key, n_seeds, lrs) -> pytree [len(lrs), n_seeds, ...]``

The checks never call ``course_lib.envs`` or ``course_lib.ppo_jax``: the env step is
compared with gymnasium's own ``CartPole-v1``, GAE with a Python loop that sums the
discounted deltas term by term, the loss with an element-by-element oracle, and the grid
with a Python loop over learning rates and seeds. Every learner function is also called
under ``jax.jit`` (and ``jax.vmap`` where it applies), as the lesson's training loop does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.grading.checks import Exercise, LearnerError, assert_allclose, assert_true, call, check_case, fail

LESSON = "04_purejaxrl"

# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def _np(x: Any, what: str) -> NDArray[Any]:
    """A learner's (JAX) array as numpy; a tuple/None fails with a message."""
    if x is None:
        fail(f"{what} is None; did you forget to `return` it?")
    try:
        return np.asarray(x)
    except Exception:
        fail(f"{what} is a {type(x).__name__}; expected a JAX array")
    raise AssertionError("unreachable")


def _jit_call(fn: Callable[..., Any], what: str, *args: Any, static: tuple[int, ...] = (), **kwargs: Any) -> Any:
    """Call ``jax.jit(fn)(*args)``; a Python ``if``/``bool()`` on a traced value is named."""
    import jax

    try:
        return call(jax.jit(fn, static_argnums=static), *args, **kwargs)
    except LearnerError as err:
        if isinstance(err.error, jax.errors.ConcretizationTypeError | jax.errors.TracerBoolConversionError):
            fail(
                f"{what} fails under jax.jit: a Python `if`, `and`/`or`, `abs`/`min` or float() on a traced "
                "array; use jnp.where, |, &, jnp.abs, jnp.minimum"
            )
        raise


# ---------------------------------------------------------------------------------------
# Exercise 1: cartpole_step, against gymnasium's CartPole-v1
# ---------------------------------------------------------------------------------------

CS = "cartpole_step"


def gym_step(
    state: NDArray[Any], action: int, semi_implicit: bool = False, force_sign: float = 1.0, theta_deg: bool = False
) -> tuple[NDArray[np.float64], bool]:
    """gymnasium's CartPole-v1 stepped once from ``state`` (float64); the keyword arguments
    reproduce common slips to name them (gymnasium's own semi-implicit integrator, the
    force's sign flipped, the angle threshold taken as 12 radians)."""
    import gymnasium as gym

    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    if semi_implicit:
        env.kinematics_integrator = "semi-implicit euler"
    if theta_deg:
        env.theta_threshold_radians = 12.0
    env.state = np.asarray(state, dtype=np.float64).copy()
    act = action if force_sign > 0 else 1 - action
    env.step(int(act))
    new = np.asarray(env.state, dtype=np.float64)
    terminated = bool(abs(new[0]) > env.x_threshold or abs(new[2]) > env.theta_threshold_radians)
    env.close()
    return new, terminated


def _cs_states(seed: int, n: int) -> tuple[NDArray[np.float32], NDArray[np.int32]]:
    """States from calm to about to fall, actions both ways."""
    rng = np.random.default_rng(seed)
    scale = np.array([2.0, 1.5, 0.2, 2.0])
    states = (rng.uniform(-1, 1, size=(n, 4)) * scale).astype(np.float32)
    return states, rng.integers(0, 2, size=n).astype(np.int32)


def _cs_unpack(out: Any, what: str) -> tuple[NDArray[Any], NDArray[Any]]:
    if not isinstance(out, tuple | list) or len(out) != 2:
        fail(f"{what} returned {type(out).__name__}; expected a pair (next_state, terminated)")
    return _np(out[0], f"{what}[0] (next_state)"), _np(out[1], f"{what}[1] (terminated)")


def _cs_known_bugs(states: NDArray[Any], actions: NDArray[Any]) -> dict[str, NDArray[np.float64]]:
    return {
        "the integrator is semi-implicit (a new velocity moved the position): explicit Euler updates x with the "
        "old x_dot and theta with the old theta_dot": np.stack(
            [gym_step(s, int(a), semi_implicit=True)[0] for s, a in zip(states, actions, strict=True)]
        ),
        "the force has the wrong sign: action 1 pushes right, F = +force_mag": np.stack(
            [gym_step(s, int(a), force_sign=-1.0)[0] for s, a in zip(states, actions, strict=True)]
        ),
    }


def _cs_compare(
    fn: Callable[..., Any], states: NDArray[Any], actions: NDArray[Any], batched: bool, name_degrees: bool = False
) -> None:
    import jax
    import jax.numpy as jnp

    from course_lib.envs.cartpole import EnvParams

    params = EnvParams()
    what = f"{CS} under jax.vmap(jax.jit)" if batched else f"{CS} under jax.jit"
    if batched:
        out = _jit_call(jax.vmap(fn, in_axes=(0, 0, None)), what, jnp.asarray(states), jnp.asarray(actions), params)
        got, term = _cs_unpack(out, what)
    else:
        pairs = [
            _cs_unpack(_jit_call(fn, what, jnp.asarray(s), int(a), params), what)
            for s, a in zip(states, actions, strict=True)
        ]
        got, term = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
    expected = np.stack([gym_step(s, int(a))[0] for s, a in zip(states, actions, strict=True)])
    if got.shape != expected.shape:
        fail(f"{what}: next_state has shape {got.shape[1:]} per state; expected (4,) = [x, x_dot, theta, theta_dot]")
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
        for message, wrong in _cs_known_bugs(states, actions).items():
            if np.allclose(got, wrong, rtol=1e-4, atol=1e-5):
                fail(message)
    assert_allclose(got.astype(np.float64), expected, what=f"{what}: next_state", rtol=1e-4, atol=1e-5)
    exp_term = np.array([gym_step(s, int(a))[1] for s, a in zip(states, actions, strict=True)])
    term = term.reshape(-1)
    if term.dtype != np.bool_:
        fail(f"{what}: terminated has dtype {term.dtype}; expected a boolean array")
    wrong = np.flatnonzero(term != exp_term)
    if len(wrong):
        i = int(wrong[0])
        deg = np.array([gym_step(s, int(a), theta_deg=True)[1] for s, a in zip(states, actions, strict=True)])
        if name_degrees and np.array_equal(term, deg):
            fail(
                f"{what}: terminated ignores the pole angle: theta_threshold_radians is already in radians "
                "(12 degrees = 0.2094)"
            )
        fail(
            f"{what}: terminated is {bool(term[i])} for state {np.round(states[i], 3).tolist()} and action "
            f"{int(actions[i])}; gymnasium says {bool(exp_term[i])} (|x'| > 2.4 or |theta'| > 0.2094)"
        )


@check_case("matches gymnasium's CartPole-v1 one step at a time under jax.jit", time_limit=30.0)
def _cs_single(fn: Callable[..., Any]) -> None:
    states, actions = _cs_states(0, 12)
    _cs_compare(fn, states, actions, batched=False)


@check_case("matches gymnasium under jax.vmap over 200 states and actions", time_limit=30.0)
def _cs_batch(fn: Callable[..., Any]) -> None:
    states, actions = _cs_states(1, 200)
    _cs_compare(fn, states, actions, batched=True)


@check_case("terminates on both sides of both thresholds, and not inside them", time_limit=30.0)
def _cs_thresholds(fn: Callable[..., Any]) -> None:
    states = np.array(
        [
            [2.39, 1.0, 0.0, 0.0],
            [-2.39, -1.0, 0.0, 0.0],
            [0.0, 0.0, 0.2, 1.0],
            [0.0, 0.0, -0.2, -1.0],
            [2.3, 0.0, 0.2, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ],
        np.float32,
    )
    _cs_compare(fn, states, np.array([1, 0, 1, 0, 1, 1]), batched=True, name_degrees=True)


@check_case("changes neither its input nor needs a Python int action", time_limit=30.0)
def _cs_inputs(fn: Callable[..., Any]) -> None:
    import jax.numpy as jnp

    from course_lib.envs.cartpole import EnvParams

    state = np.array([0.1, -0.2, 0.03, 0.4], np.float32)
    given = state.copy()
    out = _cs_unpack(call(fn, given, jnp.asarray(1), EnvParams()), CS)
    assert_true(np.array_equal(given, state), f"{CS} changed the `state` array it was given; return a new one")
    assert_allclose(
        out[0].astype(np.float64), gym_step(state, 1)[0], what=f"{CS}(state, jnp.asarray(1))", rtol=1e-4, atol=1e-5
    )


CARTPOLE_STEP = Exercise(
    name=CS,
    points=15,
    title="CartPole's transition as a pure JAX function (eq. 04.1)",
    checks=(_cs_thresholds, _cs_single, _cs_batch, _cs_inputs),
    hints=(
        "unpack x, x_dot, theta, theta_dot = state; force = jnp.where(action == 1, force_mag, -force_mag); then "
        "temp, theta_acc, x_acc in the order of (04.1)",
        "explicit Euler: new_x = x + tau * x_dot and new_theta = theta + tau * theta_dot use the OLD velocities",
        "terminated = (jnp.abs(new_x) > x_threshold) | (jnp.abs(new_theta) > theta_threshold_radians); return "
        "(jnp.stack([...]), terminated)",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: gae_scan
# ---------------------------------------------------------------------------------------

GS = "gae_scan"


def naive_gae(
    rewards: Any,
    values: Any,
    dones: Any,
    last_value: Any,
    gamma: float,
    lam: float,
    *,
    cut: bool = True,
    trace_lambda: bool = True,
) -> NDArray[np.float64]:
    """``A_t = sum_{k >= t} (gamma lam)^{k - t} delta_k``, stopping after the first episode end,
    with ``delta_k = r_k + gamma (1 - d_k) V(s_{k+1}) - V(s_k)``; one ``(t, b)`` at a time.
    ``cut=False`` ignores the episode ends and ``trace_lambda=False`` uses ``gamma^k``
    (no lambda), to name those slips."""
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    d = np.asarray(dones, np.float64)
    n_t, n_b = r.shape
    v_next = np.concatenate([v[1:], np.asarray(last_value, np.float64)[None]], 0)
    out = np.zeros((n_t, n_b))
    for b in range(n_b):
        for t in range(n_t):
            total, weight = 0.0, 1.0
            for k in range(t, n_t):
                not_done = 1.0 - d[k, b] if cut else 1.0
                total += weight * (r[k, b] + gamma * not_done * v_next[k, b] - v[k, b])
                if cut and d[k, b]:
                    break
                weight *= gamma * (lam if trace_lambda else 1.0)
            out[t, b] = total
    return out


def naive_forward_gae(
    rewards: Any, values: Any, dones: Any, last_value: Any, gamma: float, lam: float
) -> NDArray[np.float64]:
    """What the scan of (04.3) gives without ``reverse=True``: the same step function walked
    from t = 0 upwards, so the "next" value and advantage are those of step t - 1."""
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    nd = 1.0 - np.asarray(dones, np.float64)
    out = np.zeros_like(r)
    adv, v_carry = np.zeros(r.shape[1]), np.asarray(last_value, np.float64)
    for t in range(r.shape[0]):
        adv = r[t] + gamma * nd[t] * v_carry - v[t] + gamma * lam * nd[t] * adv
        v_carry = v[t]
        out[t] = adv
    return out


def _gs_data(seed: int, n_t: int, n_b: int, p_done: float = 0.15) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "rewards": rng.normal(size=(n_t, n_b)).astype(np.float32),
        "values": rng.normal(size=(n_t, n_b)).astype(np.float32),
        "dones": rng.random((n_t, n_b)) < p_done,
        "last_value": rng.normal(size=n_b).astype(np.float32),
    }


def _gs_run(fn: Callable[..., Any], data: dict[str, Any], gamma: float, lam: float) -> NDArray[Any]:
    import jax.numpy as jnp

    args = [jnp.asarray(data[k]) for k in ("rewards", "values", "dones", "last_value")]
    return _np(_jit_call(fn, GS, *args, gamma, lam, static=(4, 5)), f"{GS}(...)")


def _gs_compare(fn: Callable[..., Any], data: dict[str, Any], gamma: float, lam: float, what: str) -> None:
    got = _gs_run(fn, data, gamma, lam)
    args = [data[k] for k in ("rewards", "values", "dones", "last_value")]
    expected = naive_gae(*args, gamma, lam)
    if got.shape == expected.shape and not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
        bugs = {
            "the recursion runs forwards: A_t depends on A_{t+1}, so scan with reverse=True": naive_forward_gae(
                *args, gamma, lam
            ),
            "the trace crosses episode ends: multiply by (1 - d_t) both in delta_t and in the trace": naive_gae(
                *args, gamma, lam, cut=False
            ),
            "the trace decays by gamma only: it is gamma * lambda (04.3)": naive_gae(
                *args, gamma, lam, trace_lambda=False
            ),
        }
        for message, wrong in bugs.items():
            if np.allclose(got, wrong, rtol=1e-4, atol=1e-4):
                fail(message)
    assert_allclose(got.astype(np.float64), expected, what=what, rtol=1e-4, atol=1e-4)


@check_case("hand-computed three-step example with an episode end", time_limit=30.0)
def _gs_known(fn: Callable[..., Any]) -> None:
    # gamma 0.5, lambda 1: A_2 = 1 + 0.5 * 5 = 3.5; A_1 = 1 (episode ends); A_0 = 1 + 0.5 * 1 = 1.5
    data = {
        "rewards": np.ones((3, 1), np.float32),
        "values": np.zeros((3, 1), np.float32),
        "dones": np.array([[False], [True], [False]]),
        "last_value": np.array([5.0], np.float32),
    }
    _gs_compare(fn, data, 0.5, 1.0, what=f"{GS}(3 steps, done at t=1, gamma=0.5, lam=1)")
    assert_allclose(
        _gs_run(fn, data, 0.5, 1.0).astype(np.float64),
        [[1.5], [1.0], [3.5]],
        what=f"{GS}(3 steps, done at t=1, gamma=0.5, lam=1)",
        rtol=1e-5,
        atol=1e-5,
    )


@check_case("matches the sum of discounted deltas on random rollouts under jax.jit", time_limit=30.0)
def _gs_oracle(fn: Callable[..., Any]) -> None:
    for case, (n_t, n_b, gamma, lam) in enumerate([(16, 3, 0.99, 0.95), (9, 5, 0.9, 0.5), (30, 2, 0.97, 0.8)]):
        _gs_compare(
            fn,
            _gs_data(case, n_t, n_b),
            gamma,
            lam,
            what=f"random case {case + 1} (T={n_t}, B={n_b}, gamma={gamma:g}, lam={lam:g})",
        )


@check_case("lambda = 0 gives the one-step TD errors delta_t", time_limit=30.0)
def _gs_lambda0(fn: Callable[..., Any]) -> None:
    data = _gs_data(10, 8, 3)
    nd = 1.0 - data["dones"]
    v_next = np.concatenate([data["values"][1:], data["last_value"][None]], 0)
    delta = data["rewards"] + 0.9 * nd * v_next - data["values"]
    assert_allclose(
        _gs_run(fn, data, 0.9, 0.0).astype(np.float64),
        delta.astype(np.float64),
        what=f"{GS}(..., lam=0)",
        rtol=1e-4,
        atol=1e-4,
    )


@check_case("no episode ends and lambda = 1: the bootstrapped return minus V(s_t)", time_limit=30.0)
def _gs_no_ends(fn: Callable[..., Any]) -> None:
    data = _gs_data(20, 6, 2, p_done=0.0)
    g = np.zeros((6, 2))
    acc = data["last_value"].astype(np.float64)
    for t in reversed(range(6)):
        acc = data["rewards"][t] + 0.9 * acc
        g[t] = acc
    _gs_compare(fn, data, 0.9, 1.0, what=f"{GS}(no episode ends, lam=1)")
    assert_allclose(
        _gs_run(fn, data, 0.9, 1.0).astype(np.float64),
        g - data["values"],
        what=f"{GS}(no episode ends, lam=1) vs G_t - V(s_t)",
        rtol=1e-4,
        atol=1e-4,
    )


GAE_SCAN = Exercise(
    name=GS,
    points=15,
    title="GAE advantages by a reverse lax.scan (eqs. 04.2-04.3)",
    checks=(_gs_known, _gs_oracle, _gs_lambda0, _gs_no_ends),
    hints=(
        "scan backwards (reverse=True) with the carry (A_{t+1}, V(s_{t+1})) starting at (0, last_value)",
        "delta = r + gamma * (1 - d) * next_value - v; adv = delta + gamma * lam * (1 - d) * next_adv; "
        "return (adv, v), adv",
        "jax.lax.scan(step, (jnp.zeros_like(last_value), last_value), (rewards, values, 1.0 - dones), reverse=True)[1]",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: ppo_clip_loss
# ---------------------------------------------------------------------------------------

PL = "ppo_clip_loss"


def naive_clip_loss(log_prob: Any, old_log_prob: Any, advantages: Any, clip_eps: float) -> float:
    """``-(1/N) sum_t min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t)``, one sample at a time."""
    total = 0.0
    for lp, olp, a in zip(
        np.asarray(log_prob, np.float64),
        np.asarray(old_log_prob, np.float64),
        np.asarray(advantages, np.float64),
        strict=True,
    ):
        rho = math.exp(lp - olp)
        total += min(rho * a, min(max(rho, 1 - clip_eps), 1 + clip_eps) * a)
    return -total / len(np.asarray(advantages))


def _pl_data(seed: int, n: int = 40) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
    rng = np.random.default_rng(seed)
    old = rng.normal(-0.7, 0.3, size=n).astype(np.float32)
    new = (old + rng.normal(scale=0.4, size=n)).astype(np.float32)  # ratios from ~0.3 to ~3
    adv = rng.normal(size=n).astype(np.float32)
    return new, old, adv


def _pl_scalar(fn: Callable[..., Any], lp: Any, olp: Any, adv: Any, eps: float) -> float:
    import jax.numpy as jnp

    got = _np(_jit_call(fn, PL, jnp.asarray(lp), jnp.asarray(olp), jnp.asarray(adv), eps, static=(3,)), f"{PL}(...)")
    if got.shape != ():
        fail(f"{PL} returned shape {got.shape}; expected a scalar (take the mean over the samples)")
    return float(got)


@check_case("hand-computed values (ratios 1.5, 0.5, 1 with advantages 1, 1, -2)", time_limit=30.0)
def _pl_known(fn: Callable[..., Any]) -> None:
    got = _pl_scalar(fn, np.log([1.5, 0.5, 1.0]), np.zeros(3), np.array([1.0, 1.0, -2.0]), 0.2)
    if abs(got + 0.1) < 1e-5:
        fail(f"{PL} returned -0.1; the loss is the NEGATIVE mean of min(...) (we minimise it)")
    if abs(got - 0.1) > 1e-5 and abs(got - (-(1.5 + 0.8 - 2) / 3)) < 1e-5:
        fail(f"{PL} returned {got:.4g}: it takes the max of the two terms; PPO takes the min (a pessimistic bound)")
    assert_allclose(
        np.array(got), np.array(0.1), what=f"{PL}(log([1.5, 0.5, 1]), 0, [1, 1, -2], 0.2)", rtol=1e-4, atol=1e-6
    )


@check_case("matches the element-by-element formula on ratios crossing both clip edges", time_limit=30.0)
def _pl_oracle(fn: Callable[..., Any]) -> None:
    for case, eps in enumerate([0.2, 0.1, 0.3]):
        lp, olp, adv = _pl_data(case)
        ratio = np.exp(lp - olp)
        assert (ratio > 1 + eps).any() and (ratio < 1 - eps).any()
        got = _pl_scalar(fn, lp, olp, adv, eps)
        expected = naive_clip_loss(lp, olp, adv, eps)
        if not math.isclose(got, expected, rel_tol=1e-4, abs_tol=1e-5):
            clipped_adv = -np.mean(np.minimum(ratio * adv, ratio * np.clip(adv, 1 - eps, 1 + eps)))
            no_exp = -np.mean(np.minimum((lp - olp) * adv, np.clip(lp - olp, 1 - eps, 1 + eps) * adv))
            if math.isclose(got, -expected, rel_tol=1e-4, abs_tol=1e-5):
                fail(f"{PL} has the wrong sign: the loss is the NEGATIVE mean of min(...) (we minimise it)")
            if math.isclose(
                got,
                -np.mean(np.maximum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv)),
                rel_tol=1e-4,
                abs_tol=1e-5,
            ):
                fail(f"{PL} takes the max of the two terms; PPO takes the min (a pessimistic bound)")
            if math.isclose(got, clipped_adv, rel_tol=1e-4, abs_tol=1e-5):
                fail(f"{PL} clips the advantage; clip the ratio rho_t to [1 - eps, 1 + eps]")
            if math.isclose(got, no_exp, rel_tol=1e-4, abs_tol=1e-5):
                fail(f"{PL} uses log_prob - old_log_prob as the ratio; rho_t = exp(log_prob - old_log_prob)")
        assert_allclose(
            np.array(got),
            np.array(expected),
            what=f"{PL}(random case {case + 1}, clip_eps={eps:g})",
            rtol=1e-4,
            atol=1e-5,
        )


@check_case("its gradient is zero for samples clipped in the direction of their advantage", time_limit=30.0)
def _pl_grad(fn: Callable[..., Any]) -> None:
    import jax
    import jax.numpy as jnp

    lp = jnp.log(jnp.array([1.5, 0.5, 1.5, 0.5, 1.05]))
    adv = jnp.array([1.0, -1.0, -1.0, 1.0, 1.0])
    try:
        grad = np.asarray(jax.grad(lambda x: fn(x, jnp.zeros(5), adv, 0.2))(lp))
    except Exception as exc:
        fail(f"jax.grad of {PL} raised {type(exc).__name__}: {exc}")
    # samples 0 and 1 are clipped on the side their advantage pushes: no gradient
    # samples 2, 3, 4: unclipped term wins -> d/dlp (-rho A / N) = -rho A / N
    expected = np.array([0.0, 0.0, 1.5 / 5, -0.5 / 5, -1.05 / 5])
    assert_allclose(grad.astype(np.float64), expected, what=f"jax.grad({PL}) w.r.t. log_prob", rtol=1e-4, atol=1e-6)


PPO_CLIP_LOSS = Exercise(
    name=PL,
    points=10,
    title="PPO's clipped surrogate loss (eq. 04.4)",
    checks=(_pl_oracle, _pl_known, _pl_grad),
    hints=(
        "ratio = jnp.exp(log_prob - old_log_prob)",
        "the clipped term is jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * advantages; take the elementwise "
        "minimum with ratio * advantages",
        "return -jnp.minimum(ratio * advantages, clipped).mean()",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: train_grid
# ---------------------------------------------------------------------------------------

TG = "train_grid"


def _toy(counter: list[int]) -> Callable[..., Any]:
    """A pure 'training run' (key, lr) -> dict whose output depends on both; counts its traces."""
    import jax
    import jax.numpy as jnp

    def train(key: Any, lr: Any) -> dict[str, Any]:
        counter.append(1)
        w0 = jax.random.normal(key, (2,))

        def step(w: Any, _: None) -> tuple[Any, Any]:
            return w - lr * 2.0 * (w - jnp.array([1.0, -2.0])), jnp.sum((w - jnp.array([1.0, -2.0])) ** 2)

        w, losses = jax.lax.scan(step, w0, None, length=5)
        return {"w": w, "loss": losses}

    return train


def _tg_oracle(key: Any, n_seeds: int, lrs: Any) -> dict[str, NDArray[np.float64]]:
    import jax

    keys = jax.random.split(key, n_seeds)
    train = _toy([])
    rows = [[train(keys[s], float(lr)) for s in range(n_seeds)] for lr in lrs]
    return {k: np.array([[np.asarray(r[k]) for r in row] for row in rows]) for k in ("w", "loss")}


def _tg_run(fn: Callable[..., Any], n_seeds: int, lrs: list[float], seed: int = 0) -> tuple[dict[str, Any], int]:
    import jax
    import jax.numpy as jnp

    counter: list[int] = []
    out = call(fn, _toy(counter), jax.random.key(seed), n_seeds, jnp.asarray(lrs))
    if not isinstance(out, dict) or set(out) != {"w", "loss"}:
        fail(
            f"{TG} returned {type(out).__name__}; expected train's own pytree (here a dict with keys 'w', 'loss') "
            "with two leading axes"
        )
    return {k: _np(v, f"{TG}(...)['{k}']") for k, v in out.items()}, len(counter)


@check_case("matches a Python loop over learning rates and seeds", time_limit=30.0)
def _tg_oracle_check(fn: Callable[..., Any]) -> None:
    import jax

    lrs = [0.01, 0.1, 0.3]
    got, _ = _tg_run(fn, 4, lrs)
    expected = _tg_oracle(jax.random.key(0), 4, lrs)
    for k in ("w", "loss"):
        if got[k].shape != expected[k].shape:
            swapped = expected[k].shape[:2][::-1] + expected[k].shape[2:]
            if got[k].shape == swapped:
                fail(
                    f"{TG}(...)['{k}'] has shape {got[k].shape}: the axes are [n_seeds, len(lrs)]; put the "
                    f"learning rates first: [len(lrs), n_seeds] = {expected[k].shape}"
                )
            fail(f"{TG}(...)['{k}'] has shape {got[k].shape}; expected {expected[k].shape} = [len(lrs), n_seeds, ...]")
        if np.allclose(got[k], np.broadcast_to(got[k][:, :1], got[k].shape), rtol=1e-6, atol=1e-7):
            fail(f"{TG}: every seed gave the same run; map over keys = jax.random.split(key, n_seeds), not one key")
        assert_allclose(
            got[k].astype(np.float64), expected[k].astype(np.float64), what=f"{TG}(...)['{k}']", rtol=1e-5, atol=1e-6
        )


@check_case("traces the training function once (one vmapped program, no Python loop)", time_limit=30.0)
def _tg_traced_once(fn: Callable[..., Any]) -> None:
    _, traces = _tg_run(fn, 3, [0.05, 0.2])
    if traces != 1:
        fail(
            f"train was traced {traces} times for 3 seeds x 2 learning rates; a Python loop runs (and traces) it "
            "once per cell: use jax.vmap twice, which traces it once"
        )


@check_case("the same seeds for every learning rate, different seeds along the seed axis", time_limit=30.0)
def _tg_seeds(fn: Callable[..., Any]) -> None:
    got, _ = _tg_run(fn, 5, [0.0, 0.0], seed=3)  # lr = 0: w stays at its random start
    w = got["w"]
    if w.shape[:2] != (2, 5):
        fail(f"{TG}(...)['w'] has shape {w.shape}; expected (2, 5, 2) = [len(lrs), n_seeds, ...]")
    assert_true(
        np.allclose(w[0], w[1]),
        f"{TG}: two equal learning rates gave different runs; use the same keys "
        "for every learning rate (vmap the lrs with in_axes=(None, 0))",
    )
    assert_true(
        len({tuple(np.round(row, 6)) for row in w[0]}) == 5,
        f"{TG}: some seeds gave the same start; split the key into n_seeds different keys",
    )


TRAIN_GRID = Exercise(
    name=TG,
    points=10,
    title="vmap a training function over seeds and learning rates",
    checks=(_tg_oracle_check, _tg_traced_once, _tg_seeds),
    hints=(
        "keys = jax.random.split(key, n_seeds); jax.vmap(train, in_axes=(0, None)) runs all seeds with one lr",
        "vmap that again over the learning rates with in_axes=(None, 0): the outer axis is the lrs",
        "return jax.vmap(jax.vmap(train, in_axes=(0, None)), in_axes=(None, 0))(keys, jnp.asarray(lrs))",
    ),
)

EXERCISES: tuple[Exercise, ...] = (CARTPOLE_STEP, GAE_SCAN, PPO_CLIP_LOSS, TRAIN_GRID)
