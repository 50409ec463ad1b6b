"""Lesson 04's graded exercises: the pure CartPole step, GAE by a reverse ``lax.scan``,
the TD targets of an auto-reset rollout (truncation vs termination), and the minibatch
shuffle of PPO's update step.

The learner writes:

* ``cartpole_step(state [4], action, params) -> (next_state [4], terminated)``  (04.1)
* ``gae_scan(rewards, values, dones, last_value, gamma, lam) -> advantages [T, B]``  (04.2-04.3)
* ``autoreset_td_targets(rewards, values, terminated, truncated, final_values, last_value, gamma)
  -> targets [T, B]``  (04.2)
* ``make_minibatches(key, batch, n_minibatches) -> pytree [n_minibatches, T * B / n_minibatches, ...]``

What each exercise teaches, and how its checks observe it:

* ``cartpole_step``, mechanism: a pure function of arrays (state, action, params) -> next state, explicit Euler,
  termination on the new state, every constant read from ``params``, one program with nothing on the host;
  observed: gymnasium's step under jit and vmap, four CartPoles with other constants in one vmap over
  ``EnvParams``, the jaxpr traced from abstract inputs holds no host callback.
* ``gae_scan``, mechanism: the backward recursion (04.3) as one reverse ``lax.scan`` carried in the program;
  observed: a term-by-term oracle over several gamma and lambda, the jaxpr holds one scan of length T, whose
  carry holds the running advantage [B] and whose step works on no array with a time axis (a step summing every
  later delta is O(T^2)), whose output depends on its carry (not advantages computed before the scan and passed
  through it), no [T, T] array anywhere, a program that does not grow with T, and no host callback.
* ``autoreset_td_targets``, mechanism: after an auto-reset the bootstrap is selected per step (final obs after
  an end, the next obs otherwise, 0 after a termination) without reading the undefined entries; observed: a
  case-by-case oracle over several gamma, NaN and inf where ``final_values`` is undefined, no host callback.
* ``make_minibatches``, mechanism: a pytree rollout [T, B, ...] flattened to [T * B, ...], one permutation drawn
  from the key and applied to every leaf, cut into equal minibatches; observed: every sample exactly once in
  every leaf, the leaves aligned (one permutation), the order repeatable for a key, different across keys, not the
  identity, a rotation, a shuffle of the time axis within each env or of the envs only, each minibatch mixing about as
  many time steps and envs as a uniform shuffle (not whole time steps or whole envs); a ValueError naming the
  numbers when T * B does not split; the jaxpr holds no loop, does not grow with T * B, and no host callback.

The checks never call ``course_lib.envs`` or ``course_lib.ppo.jax_ppo``: the env step is
compared with gymnasium's own ``CartPole-v1``, GAE with a Python loop that sums the
discounted deltas term by term, the TD targets with a case-by-case loop, and the
minibatches with sample ids written into every leaf. Every learner function is also called
under ``jax.jit`` (and ``jax.vmap`` where it applies), as the lesson's training loop does;
``gae_scan`` and ``make_minibatches`` are also checked for their structure (the jaxpr: one
reverse scan over time; no loop over samples), and every exercise's program
for host callbacks (:func:`refuse_host_callbacks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    Exercise,
    LearnerError,
    assert_allclose,
    assert_true,
    call,
    check_case,
    fail,
)
from course_lib.course.grading.helpers import fail_if_known_mistake
from course_lib.course.grading.programs import all_eqns, refuse_host_callbacks

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


def _program(fn: Callable[..., Any], *args: Any) -> Any:
    """The closed jaxpr of ``fn(*args)`` (``args`` may be ``jax.ShapeDtypeStruct``: abstract
    inputs, no values); a failure to trace is the learner's, a traced ``if`` is named."""
    import jax

    try:
        return jax.make_jaxpr(fn)(*args)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError):
        fail(
            "the function cannot be traced with abstract inputs (jax.make_jaxpr): a Python `if`, `and`/`or`, "
            "`abs`/`min` or float() on a traced array; use jnp.where, |, &, jnp.abs, jnp.minimum"
        )
    except Exception as exc:
        fail(f"jax.make_jaxpr could not trace the function: {type(exc).__name__}: {exc}")
    raise AssertionError("unreachable")


def _scan_eqns(fn: Callable[..., Any], *args: Any, what: str) -> tuple[list[Any], int]:
    """The ``scan`` equations anywhere in the jaxpr of ``fn(*args)`` (inside nested jits and
    loops too), and the number of top-level equations. A Python loop leaves no ``scan`` (it
    is unrolled: the jaxpr grows with the loop's length); a loop of calls to a jitted
    function leaves one nested program per call. A host callback anywhere fails (``what``
    names the program in the message)."""
    closed = _program(fn, *args)
    refuse_host_callbacks(closed.jaxpr, what)
    return [e for e in all_eqns(closed.jaxpr) if e.primitive.name == "scan"], len(closed.jaxpr.eqns)


# ---------------------------------------------------------------------------------------
# Exercise 1: cartpole_step, against gymnasium's CartPole-v1
# ---------------------------------------------------------------------------------------

CS = "cartpole_step"


#: The physical constants of ``EnvParams`` that the step reads (gymnasium's attribute names).
PHYSICS = ("gravity", "masscart", "masspole", "length", "force_mag", "tau", "theta_threshold_radians", "x_threshold")


def gym_step(
    state: NDArray[Any],
    action: int,
    semi_implicit: bool = False,
    force_sign: float = 1.0,
    theta_deg: bool = False,
    physics: dict[str, float] | None = None,
) -> tuple[NDArray[np.float64], bool]:
    """gymnasium's CartPole-v1 stepped once from ``state`` (float64), with gymnasium's
    constants or those of ``physics`` (``{name: value}`` for names in :data:`PHYSICS`); the
    keyword arguments reproduce common slips to name them (gymnasium's own semi-implicit
    integrator, the force's sign flipped, the angle threshold taken as 12 radians)."""
    import gymnasium as gym

    env: Any = gym.make("CartPole-v1").unwrapped  # CartPoleEnv: its physics attributes are set below
    env.reset(seed=0)
    for name, value in (physics or {}).items():
        setattr(env, name, float(value))
    env.total_mass = env.masspole + env.masscart  # gymnasium caches these two at construction
    env.polemass_length = env.masspole * env.length
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
        fail_if_known_mistake(got, _cs_known_bugs(states, actions), rtol=1e-4, atol=1e-5)
    assert_allclose(got.astype(np.float64), expected, what=f"{what}: next_state", rtol=1e-4, atol=1e-5)
    exp_term = np.array([gym_step(s, int(a))[1] for s, a in zip(states, actions, strict=True)])
    term = term.reshape(-1)
    if term.dtype != np.bool_:
        fail(f"{what}: terminated has dtype {term.dtype}; expected a boolean array")
    mismatch = np.flatnonzero(term != exp_term)
    if len(mismatch):
        i = int(mismatch[0])
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
    assert_true(
        out[1].shape == () and out[1].dtype == np.bool_,
        f"{CS}(state, action) returned terminated of shape {out[1].shape} and dtype {out[1].dtype}; expected a "
        "boolean scalar array (shape ()), one flag per state",
    )


#: Four CartPoles unlike gymnasium's (every constant of :data:`PHYSICS` changed, in its order), stepped in
#: one vmap over ``EnvParams``.
OTHER_PHYSICS: tuple[dict[str, Any], ...] = tuple(
    dict(zip(PHYSICS, values, strict=True))
    for values in (
        (3.7, 2.0, 0.3, 0.8, 6.0, 0.05, 0.3, 1.5),
        (24.8, 0.5, 0.05, 0.25, 15.0, 0.01, 0.1, 3.0),
        (9.8, 1.5, 0.5, 1.2, 4.0, 0.04, 0.25, 2.0),
        (1.6, 0.8, 0.2, 0.4, 20.0, 0.03, 0.15, 1.0),
    )
)


@check_case(
    "follows params: four other CartPoles (gravity, masses, length, force, tau, thresholds) in one vmap",
    time_limit=30.0,
)
def _cs_params(fn: Callable[..., Any]) -> None:
    import jax
    import jax.numpy as jnp

    from course_lib.envs.cartpole import EnvParams

    states = np.array(
        [[0.1, -0.3, 0.05, 0.4], [1.2, 0.5, -0.095, -1.0], [-0.9, 0.2, 0.24, 0.5], [0.99, 1.0, -0.1, -1.5]], np.float32
    )
    actions = np.array([1, 0, 1, 0], np.int32)
    stacked = jax.tree.map(lambda *xs: jnp.asarray(xs, jnp.float32), *[EnvParams(**p) for p in OTHER_PHYSICS])
    what = f"{CS} under jax.jit(jax.vmap) over 4 EnvParams unlike gymnasium's defaults"
    got, term = _cs_unpack(_jit_call(jax.vmap(fn), what, jnp.asarray(states), jnp.asarray(actions), stacked), what)
    pairs = [gym_step(s, int(a), physics=p) for s, a, p in zip(states, actions, OTHER_PHYSICS, strict=True)]
    expected = np.stack([p[0] for p in pairs])
    if got.shape != expected.shape:
        fail(f"{what}: next_state has shape {got.shape}; expected {expected.shape}")
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
        defaults = np.stack([gym_step(s, int(a))[0] for s, a in zip(states, actions, strict=True)])
        i = int(np.argmax(np.abs(got - expected).max(axis=1)))
        fail(
            f"{CS} does not follow params: every constant must come from params (gravity, masscart, masspole, "
            "length, force_mag, tau), never a number written in"
            + (" (yours gives gymnasium's defaults)" if np.allclose(got, defaults, rtol=1e-4, atol=1e-5) else "")
            + f"; {what}, state {i}: next_state {np.round(got[i].astype(np.float64), 4).tolist()}, gymnasium with "
            f"the same constants {np.round(expected[i], 4).tolist()}"
        )
    exp_term = np.array([p[1] for p in pairs])
    if not np.array_equal(np.asarray(term).reshape(-1), exp_term):
        fail(
            f"{what}: terminated is {np.asarray(term).reshape(-1).tolist()}, gymnasium with the same constants says "
            f"{exp_term.tolist()}: the thresholds are params.x_threshold and params.theta_threshold_radians"
        )


@check_case("one compiled program: traces with abstract inputs and calls nothing on the host", time_limit=30.0)
def _cs_program(fn: Callable[..., Any]) -> None:
    import jax
    import jax.numpy as jnp

    from course_lib.envs.cartpole import EnvParams

    closed = _program(fn, jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32), EnvParams())
    refuse_host_callbacks(closed.jaxpr, CS)


CARTPOLE_STEP = Exercise(
    name=CS,
    compiled=True,
    points=15,
    title="CartPole's transition as a pure JAX function (eq. 04.1)",
    checks=(_cs_thresholds, _cs_single, _cs_batch, _cs_inputs, _cs_params, _cs_program),
    hints=(
        "Follow (04.1) literally: the force from the action, the two accelerations from the current state, one "
        "explicit Euler step of length `tau` for the four state variables, then the termination test on the new "
        "state.",
        "Order matters: the temporary term first, then the angular acceleration, then the linear one (it uses the "
        "angular one). In the Euler step the positions move with the OLD velocities, and the velocities with the new "
        "accelerations.",
        "Stay traceable under `jax.jit`: unpacking the state array into four names works, the force is a `jnp.where` "
        "on the action, the new state is a `jnp.stack` of four values, and termination combines two `jnp.abs(...) > "
        "threshold` tests with `|` (not `or`, not an `if`). Read every constant from `params`.",
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
    r, v, d, last = (data[k] for k in ("rewards", "values", "dones", "last_value"))
    expected = naive_gae(r, v, d, last, gamma, lam)
    if got.shape == expected.shape and not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
        bugs = {
            "the recursion runs forwards: A_t depends on A_{t+1}, so scan with reverse=True": naive_forward_gae(
                r, v, d, last, gamma, lam
            ),
            "the trace crosses episode ends: multiply by (1 - d_t) both in delta_t and in the trace": naive_gae(
                r, v, d, last, gamma, lam, cut=False
            ),
            "the trace decays by gamma only: it is gamma * lambda (04.3)": naive_gae(
                r, v, d, last, gamma, lam, trace_lambda=False
            ),
        }
        fail_if_known_mistake(got, bugs, rtol=1e-4, atol=1e-4)
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


#: Primitives that read or write one step of an array by index: inside the scan's step they may take a
#: ``[T, B]`` operand (``rewards[t]`` with a traced ``t``) and still do O(B) work.
INDEXING = ("dynamic_slice", "dynamic_update_slice", "gather", "scatter")


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(getattr(getattr(var, "aval", None), "shape", ()) or ())


def _holds_program(eqn: Any) -> bool:
    """Whether ``eqn`` is a container (jit, cond, custom derivative, loop) whose program is among its params."""
    from jax.extend import core as jcore

    for param in eqn.params.values():
        for sub in param if isinstance(param, list | tuple) else (param,):
            if isinstance(sub, jcore.ClosedJaxpr | jcore.Jaxpr):
                return True
    return False


def _gae_step_problem(scan: Any, n_t: int, n_b: int) -> str | None:
    """Why the step of GAE's scan over ``n_t`` steps (rollouts of ``n_b`` envs) is not the recursion (04.3), or
    None: its carry must hold the running advantage, an array of shape ``[B]``, and no operation in its body
    may work on an array with a time axis (a step that sums every later delta with vector ops over all T is
    a length-T scan of O(T) steps, O(T^2) in all, carrying nothing)."""
    body = scan.params["jaxpr"].jaxpr
    n_consts, n_carry = int(scan.params["num_consts"]), int(scan.params["num_carry"])
    carry = [_shape(v) for v in body.invars[n_consts : n_consts + n_carry]]
    if (n_b,) not in carry:
        held = ", ".join(str(s) for s in carry) or "nothing"
        return (
            f"the scan's carry holds {held}, no running advantage of shape [B] = ({n_b},): the recursion (04.3) "
            "carries A_t+1 from each step to the one before it (with the next value); each step computes A_t from "
            "it, not from the whole rollout"
        )
    for eqn in all_eqns(body):
        name = eqn.primitive.name
        if name == "while":
            return (
                "the scan's step holds a loop (a while_loop or fori_loop), a sum over the steps ahead at every step; "
                "A_t comes from the carried A_t+1 in O(1) operations (04.3)"
            )
        if _holds_program(eqn):
            continue  # a nested program (jit, cond, custom derivative): all_eqns walks its own equations
        operands = [] if name in INDEXING else list(eqn.invars)
        operands += [] if name in ("dynamic_update_slice", "scatter") else list(eqn.outvars)
        timed = next((s for s in map(_shape, operands) if n_t in s), None)
        if timed is not None:
            return (
                f"the scan's step works on an array with the time axis (shape {timed}, in {name}): each step sums the "
                "deltas of every later step with vector ops over all T, O(T^2) work in a scan that carries nothing "
                "it needs; carry A_t+1 (shape [B]) and compute A_t = delta_t + gamma lambda (1 - d_t) A_t+1 from "
                "this step's (r_t, V(s_t), d_t) alone (04.3)"
            )
    carried = _reached(body, set(body.invars[n_consts : n_consts + n_carry]))
    if not any(v in carried for v in body.outvars[n_carry:]):
        return (
            "the scan's output does not depend on its carry: the advantages were computed outside the scan (the "
            "scan only passes them through), so nothing runs the recursion; each step must compute "
            "A_t = delta_t + gamma lambda (1 - d_t) A_t+1 from the carried A_t+1 and output it (04.3)"
        )
    return None


def _reached(jaxpr: Any, start: set[Any]) -> set[Any]:
    """The variables of ``jaxpr`` computed from any of ``start`` (a nested program's outputs all count as
    computed from its inputs when one of them is)."""
    reached = set(start)
    for eqn in jaxpr.eqns:
        if any(not hasattr(v, "val") and v in reached for v in eqn.invars):
            reached.update(eqn.outvars)
    return reached


def _square_in_time(closed: Any, n_t: int) -> tuple[str, tuple[int, ...]] | None:
    """The first operation of the program with a [T, T] result (two axes of length ``n_t``), or None."""
    for eqn in all_eqns(closed.jaxpr):
        for var in eqn.outvars:
            shape = _shape(var)
            if sum(d == n_t for d in shape) >= 2:
                return eqn.primitive.name, shape
    return None


@check_case(
    "is one reverse lax.scan over time carrying A_t+1 of shape [B] (no Python loop unrolled, no time axis in its step)",
    time_limit=30.0,
)
def _gs_structure(fn: Callable[..., Any]) -> None:
    import jax.numpy as jnp

    sizes: dict[int, int] = {}
    for n_t in (8, 32):
        data = _gs_data(30 + n_t, n_t, 3)
        args = [jnp.asarray(data[k]) for k in ("rewards", "values", "dones", "last_value")]
        scans, sizes[n_t] = _scan_eqns(lambda r, v, d, lv: call(fn, r, v, d, lv, 0.9, 0.8), *args, what=GS)
        if not scans:
            fail(
                f"{GS}'s program holds no lax.scan (a Python loop over t would be unrolled into {n_t} copies of the "
                "step, and the program would grow with T); write the recursion as jax.lax.scan(step, init, xs, "
                "reverse=True)"
            )
        over_time = [e for e in scans if e.params.get("length") == n_t]
        if len(over_time) != 1 or len(scans) != 1:
            fail(
                f"{GS}'s program holds {len(scans)} lax.scan loops ({len(over_time)} over the {n_t} time steps); "
                "GAE is one reverse scan over time"
            )
        problem = _gae_step_problem(over_time[0], n_t, 3)
        if problem is not None:
            fail(f"{GS}: {problem}")
        program = _program(lambda r, v, d, lv: call(fn, r, v, d, lv, 0.9, 0.8), *args)
        if any(e.primitive.name == "while" for e in all_eqns(program.jaxpr)):
            fail(
                f"{GS}'s program holds a while_loop (or fori_loop) besides its scan: a loop over the steps ahead "
                "computes the advantages outside the recursion, O(T^2) work; the reverse scan is the only loop GAE "
                "needs (04.3)"
            )
        square = _square_in_time(program, n_t)
        if square is not None:
            fail(
                f"{GS}'s program builds a [T, T] array (shape {square[1]}, in {square[0]}): a matrix of discounts "
                "from every step to every later one is O(T^2) memory and work; the reverse scan needs O(T B) (04.3)"
            )
    if sizes[32] > sizes[8] + 4:
        fail(
            f"{GS}'s program grows with T ({sizes[8]} operations for T = 8, {sizes[32]} for T = 32): part of it is "
            "a Python loop over time; keep the whole recursion inside the scan"
        )


GAE_SCAN = Exercise(
    name=GS,
    compiled=True,
    points=15,
    title="GAE advantages by a reverse lax.scan (eqs. 04.2-04.3)",
    checks=(_gs_known, _gs_oracle, _gs_lambda0, _gs_no_ends, _gs_structure),
    hints=(
        "GAE is a backward recursion: each step's advantage is its TD error plus gamma * lambda times the next step's "
        "advantage, both cut where an episode ended. `jax.lax.scan` with `reverse=True` runs it without a Python "
        "loop.",
        "The carry holds what a step needs from the step after it, (next advantage, next value), and starts at "
        "(zeros, `last_value`); each step receives the (reward, value, not-done) of its time t and returns the new "
        "carry and its advantage as the output.",
        "Turn the dones into a float not-done mask once, before the scan (cast to the values' dtype). Inside the step "
        "the TD error uses the next value and the advantage the next advantage, each multiplied by not-done; the new "
        "carry is this step's (advantage, value). The scan's second result is the stacked advantages. Trap: leaving "
        "out `reverse=True`, which runs time forwards.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: autoreset_td_targets
# ---------------------------------------------------------------------------------------

TD = "autoreset_td_targets"


def naive_td_targets(
    rewards: Any,
    values: Any,
    terminated: Any,
    truncated: Any,
    final_values: Any,
    last_value: Any,
    gamma: float,
    *,
    truncation_ends: bool = False,
    reset_bootstrap: bool = False,
    final_everywhere: bool = False,
    terminal_bootstrap: bool = False,
) -> NDArray[np.float64]:
    """``y_t = r_t + gamma * (value of the state step t reached, 0 if it terminated)``, one ``(t, b)``
    at a time, with an ``if`` per case. The keyword arguments reproduce slips to name them:
    a truncation treated as a termination, a bootstrap from the next episode's first state,
    ``final_values`` read where no episode ended, a terminated step bootstrapped."""
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    term, trunc = np.asarray(terminated, bool), np.asarray(truncated, bool)
    fv = np.asarray(final_values, np.float64)
    lv = np.asarray(last_value, np.float64)
    n_t, n_b = r.shape
    out = np.zeros((n_t, n_b))
    for b in range(n_b):
        for t in range(n_t):
            following = v[t + 1, b] if t + 1 < n_t else lv[b]  # the obs acted on next (after any reset)
            ended = term[t, b] or trunc[t, b]
            if term[t, b] and not terminal_bootstrap:
                reached = 0.0  # the pole fell: no future reward
            elif truncation_ends and trunc[t, b]:
                reached = 0.0
            elif (ended and not reset_bootstrap) or final_everywhere:
                reached = fv[t, b]  # the state the step reached, before the auto-reset
            else:
                reached = following
            out[t, b] = r[t, b] + gamma * reached
    return out


def _td_data(seed: int, n_t: int, n_b: int, p_term: float = 0.12, p_trunc: float = 0.12) -> dict[str, Any]:
    """A random auto-reset rollout: both kinds of episode end (some steps both at once), and
    ``final_values`` that are garbage (large) where no episode ended, as an implementation
    that evaluates V(final obs) only for the envs that ended leaves them."""
    rng = np.random.default_rng(seed)
    terminated = rng.random((n_t, n_b)) < p_term
    truncated = rng.random((n_t, n_b)) < p_trunc
    ended = terminated | truncated
    final_values = np.where(ended, rng.normal(size=(n_t, n_b)), rng.uniform(50, 100, size=(n_t, n_b)))
    return {
        "rewards": rng.normal(size=(n_t, n_b)).astype(np.float32),
        "values": rng.normal(size=(n_t, n_b)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "final_values": final_values.astype(np.float32),
        "last_value": rng.normal(size=n_b).astype(np.float32),
    }


_TD_KEYS = ("rewards", "values", "terminated", "truncated", "final_values", "last_value")


def _td_args(data: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any, Any]:
    """``data``'s six arrays in the function's argument order."""
    r, v, term, trunc, fv, lv = (data[k] for k in _TD_KEYS)
    return r, v, term, trunc, fv, lv


def _td_run(fn: Callable[..., Any], data: dict[str, Any], gamma: float) -> NDArray[Any]:
    import jax.numpy as jnp

    args = [jnp.asarray(data[k]) for k in _TD_KEYS]
    return _np(_jit_call(fn, TD, *args, gamma, static=(6,)), f"{TD}(...)")


def _td_compare(fn: Callable[..., Any], data: dict[str, Any], gamma: float, what: str) -> None:
    got = _td_run(fn, data, gamma)
    args = _td_args(data)
    expected = naive_td_targets(*args, gamma)
    if got.shape != expected.shape:
        fail(f"{what}: the targets have shape {got.shape}; expected {expected.shape} = [T, B], one per step")
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
        bugs = {
            "a truncated step is treated as terminated: a time limit cut the episode, the state it reached still "
            "has a value; bootstrap from final_values there (only termination bootstraps from 0)": {
                "truncation_ends": True
            },
            "after an episode end you bootstrap from the next step's value, which is V of the NEXT episode's first "
            "observation (the auto-reset put it there); use final_values[t], V(info['final_obs'])": {
                "reset_bootstrap": True
            },
            "final_values is read where no episode ended: it is only defined where terminated | truncated; "
            "elsewhere the state the step reached is the one acted on next (values[t + 1], last_value at the "
            "end)": {"final_everywhere": True},
            "a terminated step bootstraps: the pole fell, there is no future reward; multiply the bootstrap by "
            "(1 - terminated)": {"terminal_bootstrap": True},
        }
        fail_if_known_mistake(
            got,
            {message: lambda slip=slip: naive_td_targets(*args, gamma, **slip) for message, slip in bugs.items()},
            rtol=1e-4,
            atol=1e-4,
        )
    assert_allclose(got.astype(np.float64), expected, what=what, rtol=1e-4, atol=1e-4)


@check_case("hand-computed four steps: a termination, a truncation, and the rollout's end", time_limit=30.0)
def _td_known(fn: Callable[..., Any]) -> None:
    # gamma 0.5, r = 1, V = [1, 2, 3, 4], final values [99, 7, 8, 99] (99: no episode ended), last value 5:
    # y_0 = 1 + 0.5 * 2 = 2; y_1 = 1 (terminated); y_2 = 1 + 0.5 * 8 = 5 (truncated); y_3 = 1 + 0.5 * 5 = 3.5
    data = {
        "rewards": np.ones((4, 1), np.float32),
        "values": np.array([[1.0], [2.0], [3.0], [4.0]], np.float32),
        "terminated": np.array([[False], [True], [False], [False]]),
        "truncated": np.array([[False], [False], [True], [False]]),
        "final_values": np.array([[99.0], [7.0], [8.0], [99.0]], np.float32),
        "last_value": np.array([5.0], np.float32),
    }
    what = f"{TD}(r = 1, V = [1, 2, 3, 4], terminated at t=1, truncated at t=2, gamma=0.5)"
    _td_compare(fn, data, 0.5, what)
    assert_allclose(_td_run(fn, data, 0.5).astype(np.float64), [[2.0], [1.0], [5.0], [3.5]], what=what, rtol=1e-5)


@check_case("matches a case-by-case oracle on random auto-reset rollouts under jax.jit and jax.vmap", time_limit=30.0)
def _td_oracle(fn: Callable[..., Any]) -> None:
    import jax
    import jax.numpy as jnp

    for case, (n_t, n_b, gamma) in enumerate([(16, 4, 0.99), (9, 6, 0.9), (25, 3, 0.5)]):
        data = _td_data(case, n_t, n_b)
        assert (data["terminated"] & data["truncated"]).any() or case > 0
        _td_compare(fn, data, gamma, what=f"random case {case + 1} (T={n_t}, B={n_b}, gamma={gamma:g})")
    # a batch of rollouts: vmap over a leading axis gives each rollout's own targets
    batch = [_td_data(10 + i, 7, 2) for i in range(3)]
    stacked = [jnp.asarray(np.stack([d[k] for d in batch])) for k in _TD_KEYS]
    out = call(jax.jit(jax.vmap(lambda *a: fn(*a, 0.9))), *stacked)
    expected = np.stack([naive_td_targets(*_td_args(d), 0.9) for d in batch])
    assert_allclose(
        _np(out, f"jax.vmap({TD})").astype(np.float64), expected, what=f"jax.vmap({TD}) over 3 rollouts", rtol=1e-4
    )


@check_case("properties: no episode ends gives r + gamma V(s_t+1); termination wins over truncation", time_limit=30.0)
def _td_properties(fn: Callable[..., Any]) -> None:
    data = _td_data(40, 12, 3, p_term=0.0, p_trunc=0.0)
    v_next = np.concatenate([data["values"][1:], data["last_value"][None]], 0).astype(np.float64)
    assert_allclose(
        _td_run(fn, data, 0.9).astype(np.float64),
        data["rewards"] + 0.9 * v_next,
        what=f"{TD}(no episode ends) vs r_t + gamma V(s_t+1)",
        rtol=1e-4,
        atol=1e-4,
    )
    both = dict(data, terminated=np.ones((12, 3), bool), truncated=np.ones((12, 3), bool))
    assert_allclose(
        _td_run(fn, both, 0.9).astype(np.float64),
        data["rewards"].astype(np.float64),
        what=f"{TD}(every step terminated AND truncated) vs r_t (a step that terminates has no future)",
        rtol=1e-5,
        atol=1e-6,
    )
    ended = _td_data(41, 12, 3)
    defined = ended["terminated"] | ended["truncated"]
    moved = dict(ended, final_values=np.where(defined, ended["final_values"], -7.0))
    assert_true(
        np.allclose(_td_run(fn, ended, 0.9), _td_run(fn, moved, 0.9), rtol=1e-5, atol=1e-5),
        f"{TD}: changing final_values where no episode ended changed the targets; those entries are undefined "
        "(V(final obs) is only needed where terminated | truncated)",
    )
    for garbage in (np.nan, np.inf):
        undefined = dict(ended, final_values=np.where(defined, ended["final_values"], garbage).astype(np.float32))
        got = _td_run(fn, undefined, 0.9)
        assert_true(
            bool(np.isfinite(got).all()),
            f"{TD}: final_values is read where no episode ended: a {garbage} there (an undefined entry may hold "
            f"anything) reached the targets at {int((~np.isfinite(got)).sum())} steps; select with "
            "jnp.where(terminated | truncated, final_values, next_values), which never reads the other branch, "
            "instead of multiplying by a 0/1 mask (0 * nan = nan)",
        )


@check_case("one compiled program: traces with abstract inputs and calls nothing on the host", time_limit=30.0)
def _td_program(fn: Callable[..., Any]) -> None:
    import jax
    import jax.numpy as jnp

    f32, b = jax.ShapeDtypeStruct((9, 4), jnp.float32), jax.ShapeDtypeStruct((9, 4), jnp.bool_)
    closed = _program(lambda *a: fn(*a, 0.99), f32, f32, b, b, f32, jax.ShapeDtypeStruct((4,), jnp.float32))
    refuse_host_callbacks(closed.jaxpr, TD)


AUTORESET_TD_TARGETS = Exercise(
    name=TD,
    compiled=True,
    points=10,
    title="TD targets of an auto-reset rollout: bootstrap after truncation, not after termination (eq. 04.2)",
    checks=(_td_known, _td_oracle, _td_properties, _td_program),
    hints=(
        "The TD target is the reward plus the discounted value of the state step t reached. With auto-reset, at an "
        "episode's end the next observation is already the new episode's first: the state actually reached is "
        "elsewhere, and its value is in `final_values`.",
        "Build the next-state values in two moves: `values` shifted by one step with `last_value` appended, then "
        "replaced by `final_values[t]` wherever an episode ended at t (terminated or truncated).",
        "`jnp.concatenate` shifts and `jnp.where` replaces. Then discount, masking by `terminated` only, cast to the "
        "values' dtype: a truncated episode still has a future worth bootstrapping. Trap: masking by terminated or "
        "truncated, which zeroes the value of every time-out.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: make_minibatches
# ---------------------------------------------------------------------------------------

MB = "make_minibatches"


def _mb_batch(n_t: int, n_b: int) -> dict[str, Any]:
    """A rollout pytree ``[T, B, ...]`` whose every entry says which sample it belongs to: sample
    ``i = t * B + b`` has ``obs = [i, 1000 + i, 2000 + i]``, ``action = i`` and ``(adv, target) = (i, -i)``."""
    import jax.numpy as jnp

    ids = np.arange(n_t * n_b, dtype=np.float32).reshape(n_t, n_b)
    obs = np.stack([ids, 1000.0 + ids, 2000.0 + ids], axis=-1)
    return {
        "obs": jnp.asarray(obs),
        "action": jnp.asarray(ids.astype(np.int32)),
        "extra": (jnp.asarray(ids), jnp.asarray(-ids)),
    }


def _mb_run(fn: Callable[..., Any], key: Any, n_t: int, n_b: int, n_mb: int) -> NDArray[np.int64]:
    """The learner's minibatches of :func:`_mb_batch` under ``jax.jit`` (``n_minibatches``
    static), checked for structure, shapes and alignment; returns the sample order ``[M, N/M]``."""
    import jax

    n = n_t * n_b
    batch = _mb_batch(n_t, n_b)
    out = _jit_call(fn, MB, key, batch, n_mb, static=(2,))  # one compilation per shape and n_mb
    if out is None:
        fail(f"{MB} returned None; did you forget to `return` the minibatches?")
    got_tree, want_tree = str(jax.tree.structure(out)), str(jax.tree.structure(batch))
    if got_tree != want_tree:
        fail(
            f"{MB} returned a {got_tree}; expected the batch's own pytree structure {want_tree} "
            "(map every leaf with jax.tree.map)"
        )
    obs, action = _np(out["obs"], f"{MB}(...)['obs']"), _np(out["action"], f"{MB}(...)['action']")
    adv, target = (_np(x, f"{MB}(...)['extra']") for x in out["extra"])
    shape = (n_mb, n // n_mb)
    for what, got, want in (
        ("['obs']", obs.shape, shape + (3,)),
        ("['action']", action.shape, shape),
        ("['extra'][0]", adv.shape, shape),
    ):
        if got != want:
            fail(
                f"{MB}(...){what} has shape {got} for T = {n_t}, B = {n_b}, n_minibatches = {n_mb}; expected {want} "
                "= [n_minibatches, T * B / n_minibatches, ...] (flatten T and B into one axis, then cut it)"
            )
    order = obs[..., 0].astype(np.int64)
    counts = np.bincount(order.ravel(), minlength=n)
    if len(counts) != n or (counts != 1).any():
        i = int(np.argmax(counts != 1)) if len(counts) == n else int(order.max())
        fail(
            f"{MB}: sample {i} appears {int(counts[i]) if i < len(counts) else 0} times among the minibatches of "
            f"T * B = {n} samples; every sample must appear exactly once (a permutation, not draws with replacement)"
        )
    if not np.array_equal(obs[..., 1], 1000.0 + obs[..., 0]) or not np.array_equal(obs[..., 2], 2000.0 + obs[..., 0]):
        fail(
            f"{MB}: the features of one observation were shuffled apart; permute whole samples (axis 0 after flattening)"
        )
    for what, leaf, sign in (("['action']", action, 1.0), ("['extra'][0]", adv, 1.0), ("['extra'][1]", target, -1.0)):
        if not np.array_equal(sign * leaf.astype(np.float64), order.astype(np.float64)):
            fail(
                f"{MB}: {what} is not in the same order as ['obs']: the leaves were shuffled by different "
                "permutations, so an observation is paired with another sample's action; draw ONE permutation "
                "and apply it to every leaf"
            )
    return order


@check_case(
    "every sample exactly once, in minibatches of [n_minibatches, T*B/n_minibatches], leaves aligned", time_limit=60.0
)
def _mb_shapes(fn: Callable[..., Any]) -> None:
    import jax

    for n_t, n_b, n_mb in ((8, 4, 4), (6, 5, 3), (8, 4, 1), (4, 3, 12)):
        _mb_run(fn, jax.random.key(n_t * n_b), n_t, n_b, n_mb)


@check_case(
    "a random shuffle of the whole batch: key-dependent, repeatable, mixing envs and time steps", time_limit=60.0
)
def _mb_shuffle(fn: Callable[..., Any]) -> None:
    import jax

    n_t, n_b, n_mb = 16, 8, 4
    n = n_t * n_b
    orders = [_mb_run(fn, jax.random.key(s), n_t, n_b, n_mb).ravel() for s in range(6)]
    again = _mb_run(fn, jax.random.key(0), n_t, n_b, n_mb).ravel()
    assert_true(
        np.array_equal(orders[0], again),
        f"{MB}: the same key gave two different orders; draw the permutation from `key` only",
    )
    if all(np.array_equal(o, np.arange(n)) for o in orders):
        fail(f"{MB}: the samples come out in their original order: the batch is not shuffled")
    if len({tuple(o) for o in orders}) < len(orders):
        fail(f"{MB}: different keys gave the same order; draw the permutation from `key` (jax.random.permutation)")
    position = np.arange(n)
    env_kept = np.mean([np.mean(o % n_b == position % n_b) for o in orders])
    if env_kept > 0.9:
        fail(
            f"{MB}: every sample stays in its env's column ({env_kept:.0%} of positions keep their env): only the "
            "time steps are shuffled, within each env, so each minibatch holds whole time steps of every env. "
            "Flatten [T, B] to [T * B] first and permute all T * B samples"
        )
    time_kept = np.mean([np.mean(o // n_b == position // n_b) for o in orders])
    if time_kept > 0.9:
        fail(
            f"{MB}: every sample keeps its time step ({time_kept:.0%} of positions): only the envs are shuffled, "
            "so each minibatch holds a few consecutive time steps. Flatten [T, B] to [T * B] and permute all samples"
        )
    runs = np.mean([np.mean(np.diff(o) % n == 1) for o in orders])
    if runs > 0.5:
        fail(
            f"{MB}: {runs:.0%} of neighbouring samples are still neighbours after the shuffle (a rotation or a "
            "block shuffle, not a permutation of every sample); use jax.random.permutation over T * B"
        )
    # A uniform shuffle of these 128 samples puts about 14.5 of the 16 time steps and 7.9 of the 8 envs in a
    # minibatch of 32; a minibatch with at most half of either has probability below 2e-8 (exact hypergeometric
    # count), so a mean over the 24 minibatches at or below half refuses a right answer with probability < 4e-7.
    # Whole time steps of every env (a permutation of T times one of B) give 4 time steps; whole envs give 2 envs.
    for axis, n_groups, group in (("time steps", n_t, lambda o: o // n_b), ("envs", n_b, lambda o: o % n_b)):
        distinct = np.mean([len(np.unique(group(mb))) for o in orders for mb in o.reshape(n_mb, -1)])
        uniform = n_groups * (1 - math.comb(n - n // n_groups, n // n_mb) / math.comb(n, n // n_mb))
        if distinct <= n_groups / 2:
            fail(
                f"{MB}: a minibatch holds {distinct:.1f} of the {n_groups} {axis} on average (a uniform shuffle gives "
                f"about {uniform:.1f}): the shuffle moves whole blocks (e.g. one "
                "permutation of the T axis combined with one of the B axis), so each minibatch holds a few whole "
                f"{axis}; draw one permutation of all T * B samples"
            )


@check_case("a clear ValueError when T*B does not split into n_minibatches equal minibatches", time_limit=30.0)
def _mb_divisible(fn: Callable[..., Any]) -> None:
    import jax

    n_t, n_b, n_mb = 4, 3, 5
    try:
        fn(jax.random.key(0), _mb_batch(n_t, n_b), n_mb)
    except ValueError as err:
        text = str(err)
        assert_true(
            "12" in text and "5" in text,
            f"{MB} raised ValueError({text!r}) for T * B = 12 and n_minibatches = 5; say both numbers in the message",
        )
        return
    except Exception as err:
        fail(
            f"{MB} raised {type(err).__name__} for T * B = 12 samples and n_minibatches = 5, not a ValueError "
            "that says why; check T * B % n_minibatches before reshaping"
        )
    fail(
        f"{MB} returned minibatches for T * B = 12 samples and n_minibatches = 5 (12 does not split into 5 equal "
        "minibatches: some samples were dropped or repeated); raise a ValueError naming both numbers"
    )


@check_case("one gather in one compiled program: no loop over samples, nothing on the host", time_limit=60.0)
def _mb_program(fn: Callable[..., Any]) -> None:
    import jax
    import jax.numpy as jnp

    sizes: dict[int, int] = {}
    for n_t in (6, 48):
        batch = {
            "obs": jax.ShapeDtypeStruct((n_t, 4, 3), jnp.float32),
            "action": jax.ShapeDtypeStruct((n_t, 4), jnp.int32),
            "extra": (jax.ShapeDtypeStruct((n_t, 4), jnp.float32), jax.ShapeDtypeStruct((n_t, 4), jnp.float32)),
        }
        closed = _program(lambda k, bt: fn(k, bt, 4), jax.random.key(0), batch)
        refuse_host_callbacks(closed.jaxpr, MB)
        eqns = list(all_eqns(closed.jaxpr))
        loops = sorted({e.primitive.name for e in eqns if e.primitive.name in ("scan", "while")})
        if loops:
            fail(
                f"the program of {MB} holds a {loops[0]} loop: a loop over samples runs T * B steps one after "
                "another; permute every sample at once (one permutation, one gather per leaf)"
            )
        sizes[n_t * 4] = len(eqns)
    (n_small, e_small), (n_big, e_big) = sorted(sizes.items())
    assert_true(
        e_big <= e_small + 4,
        f"the program of {MB} grows with the batch ({e_small} operations for {n_small} samples, {e_big} for "
        f"{n_big}): a Python loop over samples is unrolled into one copy per sample; use one gather per leaf",
    )


MAKE_MINIBATCHES = Exercise(
    name=MB,
    compiled=True,
    points=10,
    title="the minibatch shuffle of PPO's update: one permutation for every leaf of the rollout",
    checks=(_mb_shapes, _mb_program, _mb_shuffle, _mb_divisible),
    hints=(
        "A minibatch must mix samples from every env and every time step, and a sample's observation, action, "
        "advantage and target must stay together: the shuffle is one random order of the T * B samples, used for "
        "every array of the batch.",
        "Three moves per leaf: merge the two leading axes into one of length T * B, reorder that axis by one random "
        "permutation drawn once from `key`, then split it into n_minibatches rows. `jax.tree.map` applies the moves "
        "to every leaf of the pytree.",
        "`jax.random.permutation(key, T * B)` gives the order and `jnp.take(flat, order, axis=0)` applies it; "
        "check T * B % n_minibatches in Python before any reshape. Traps: a key split per leaf (a different order "
        "per leaf) and permuting the T axis only (each env keeps its column).",
    ),
)

EXERCISES: tuple[Exercise, ...] = (CARTPOLE_STEP, GAE_SCAN, AUTORESET_TD_TARGETS, MAKE_MINIBATCHES)
