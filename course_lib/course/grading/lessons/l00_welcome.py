"""Lesson 00's graded exercises: ``discounted_returns`` (eq. 00.1-00.2) and
``finished_episode_returns`` (eq. 00.3).

The learner writes ``discounted_returns(rewards, dones, gamma, bootstrap=0.0) -> [T] float
array``, the return ``G_t`` of every step (the backward recursion, eq. 00.2, started from
``G_T = bootstrap``, the value after the buffer where its last episode is still running), and
``finished_episode_returns(rewards, dones) -> [n_finished] float array``, ``R_j`` of
every episode that ends (done = 1) in the buffer (eq. 00.3). The equations are stated in
lesson 00 (and copied, checked, in :mod:`course_lib.rl.pg`).

The checks never call ``course_lib.rl.pg``: they compare with
:func:`naive_discounted_returns`, an O(T^2) double loop that mirrors the closed form
``G_t = sum_{k=t}^{e(t)} gamma^(k-t) r_k`` (``e(t)`` = last step of t's episode), and
with :func:`naive_finished_episode_returns`, which reads ``R_j`` off that oracle at
gamma = 1 at each finished episode's first step; with hand-computed values; and with
properties (gamma = 0 and all-done give the rewards; two episodes computed together equal
the two computed apart; a time-limit truncation inside the buffer, passed as
``terminated | truncated``, cuts the return like a termination; the episode returns add up
to the rewards up to the last end).
A 200,000-step buffer is checked through the recursion's identity within the time limit,
which the O(T^2) sum does not meet. A function that is, wraps or calls the course's own
implementation is refused by the runner, as in every exercise (:mod:`course_lib.course.grading.guard`).

What each exercise teaches, and how the checks observe it (not only its values):

* discounted_returns, mechanism: one backward pass carrying ``G``, cut by ``(1 - d_t)`` at
  every episode end and started from ``bootstrap``; observed by a 200,000-step buffer within
  the time limit, gamma from 0 to 1, bootstrap used or dropped (and never at an episode end
  inside the buffer, whatever its cause), and a fresh array per call
  (a second call leaves the first result unchanged: no reused buffer).
* finished_episode_returns, mechanism: one forward running sum, recorded at each step with
  ``done = 1`` and restarted at 0 there; observed by episodes whose rewards add up to 0 (an
  end is found by the flag, never by the value) and by an episode after a large return (the
  sum restarts; it is not a difference of one running total, which carries its rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    Exercise,
    assert_allclose,
    assert_array,
    assert_finite,
    assert_float_dtype,
    assert_inputs_unchanged,
    check_case,
    fail,
    short_repr,
)
from course_lib.course.grading.helpers import call_on_copies

LESSON = "00_welcome"
NAME = "discounted_returns"


def episode_end(dones: Sequence[float], t: int) -> int:
    """``e(t)``: the last step of step ``t``'s episode (the first ``k >= t`` with ``done_k = 1``).

    If no later step ends an episode, the trajectory was cut off: ``e(t) = T - 1``.
    """
    for k in range(t, len(dones)):
        if dones[k]:
            return k
    return len(dones) - 1


def naive_discounted_returns(
    rewards: Iterable[float], dones: Iterable[float], gamma: float, bootstrap: float = 0.0
) -> NDArray[np.float64]:
    """Ground truth: ``G_t = sum_{k=t}^{e(t)} gamma^(k-t) r_k``, one sum per step (O(T^2)),
    plus ``gamma^(T-t) bootstrap`` for a step whose episode is still running after the last step.

    Deliberately naive: it mirrors the closed form, not the backward recursion the
    learner writes, so the two fail differently.

    Args:
        rewards: ``[T]`` rewards.
        dones: ``[T]``, 1 where an episode ended at that step.
        gamma: discount.
        bootstrap: the value of the state after the last step.

    Returns:
        ``[T]`` float64 returns.
    """
    r = [float(x) for x in rewards]
    d = [float(x) for x in dones]
    out = np.zeros(len(r), dtype=np.float64)
    for t in range(len(r)):
        end = episode_end(d, t)
        out[t] = sum(gamma ** (k - t) * r[k] for k in range(t, end + 1))
        if not d[end]:  # still running after the buffer: the state after it has a value
            out[t] += gamma ** (len(r) - t) * bootstrap
    return out


def random_trajectory(seed: int, length: int, p_done: float = 0.25) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Seeded ``(rewards, dones)`` of ``length`` steps; any step (the last too) is done with ``p_done``."""
    rng = np.random.default_rng(seed)
    rewards = np.round(rng.normal(size=length), 3)
    dones = (rng.random(length) < p_done).astype(np.float64)
    return rewards, dones


def _what(rewards: Any, dones: Any, gamma: float) -> str:
    return f"{NAME}({short_repr(rewards)}, {short_repr(dones)}, gamma={gamma:g})"


def _expect(fn: Callable[..., Any], rewards: Any, dones: Any, gamma: float, expected: Any) -> None:
    got = call_on_copies(fn, rewards, dones, gamma)
    assert_allclose(got, expected, what=_what(rewards, dones, gamma))


@check_case("returns a finite float numpy array of shape [T]")
def _returns_float_array(fn: Callable[..., Any]) -> None:
    rewards, dones = [1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 0.0]
    got = call_on_copies(fn, rewards, dones, 0.5)
    what = _what(rewards, dones, 0.5)
    arr = assert_array(got, what=what, shape=(4,))
    assert_float_dtype(arr, what=what)
    assert_finite(arr, what=what)


@check_case("each call returns a new array (a second call leaves the first result unchanged)")
def _fresh_result(fn: Callable[..., Any]) -> None:
    first_args = ([1.0, 2.0, 3.0], [0.0, 1.0, 0.0], 0.5)
    first = assert_array(call_on_copies(fn, *first_args), what=_what(*first_args), shape=(3,))
    kept = first.copy()
    call_on_copies(fn, [5.0, -1.0, 4.0, 2.0], [1.0, 0.0, 0.0, 1.0], 0.9)
    if not np.array_equal(first, kept, equal_nan=True):
        fail(
            f"the array {_what(*first_args)} returned changed when {NAME} was called again: return a new "
            "array from each call (np.zeros(T)), not a view of a buffer you reuse"
        )


@check_case("hand-computed values, one episode cut off after the last step")
def _known_values_one_episode(fn: Callable[..., Any]) -> None:
    # G_2 = 2, G_1 = 0 + 0.5 * 2 = 1, G_0 = 1 + 0.5 * 1 = 1.5
    _expect(fn, [1.0, 0.0, 2.0], [0.0, 0.0, 0.0], 0.5, [1.5, 1.0, 2.0])


@check_case("hand-computed values, an episode ends mid-trajectory (integer inputs)")
def _known_values_episode_end(fn: Callable[..., Any]) -> None:
    # episode 1 = steps 0-1 (done at 1), episode 2 = steps 2-3 (cut off):
    # G_1 = 1, G_0 = 1 + 0.9 * 1 = 1.9, G_3 = 1, G_2 = 1.9
    _expect(fn, [1, 1, 1, 1], [0, 1, 0, 0], 0.9, [1.9, 1.0, 1.9, 1.0])


@check_case("gamma = 0 gives the rewards")
def _gamma_zero(fn: Callable[..., Any]) -> None:
    rewards, dones = random_trajectory(seed=0, length=6)
    _expect(fn, rewards, dones, 0.0, rewards)


@check_case("every step done gives the rewards")
def _all_done(fn: Callable[..., Any]) -> None:
    rewards, _ = random_trajectory(seed=1, length=5)
    _expect(fn, rewards, np.ones(5), 0.9, rewards)


@check_case("two episodes computed together equal the two computed apart")
def _episodes_independent(fn: Callable[..., Any]) -> None:
    r1, d1 = np.array([1.0, -2.0, 0.5]), np.array([0.0, 0.0, 1.0])
    r2, d2 = np.array([3.0, 1.0, 2.0, -1.0]), np.array([0.0, 0.0, 0.0, 0.0])
    apart = [call_on_copies(fn, r, d, 0.9) for r, d in ((r1, d1), (r2, d2))]
    for part, (r, d) in zip(apart, ((r1, d1), (r2, d2)), strict=True):
        assert_array(part, what=_what(r, d, 0.9), shape=r.shape)
    together = call_on_copies(fn, np.concatenate([r1, r2]), np.concatenate([d1, d2]), 0.9)
    assert_allclose(
        together,
        np.concatenate(apart),
        what=f"{NAME} of both episodes together (compared with each computed apart)",
    )


@check_case("matches the naive sum over each episode on random trajectories")
def _matches_oracle(fn: Callable[..., Any]) -> None:
    for case, (seed, length, gamma) in enumerate([(10, 1, 0.9), (11, 7, 0.99), (12, 40, 0.9), (13, 25, 1.0)]):
        rewards, dones = random_trajectory(seed, length)
        got = call_on_copies(fn, rewards, dones, gamma)
        expected = naive_discounted_returns(rewards, dones, gamma)
        assert_allclose(got, expected, what=f"random case {case + 1} (T={length}, gamma={gamma:g})")


@check_case("a truncation inside the buffer cuts the return like a termination (dones = terminated | truncated)")
def _truncation_inside(fn: Callable[..., Any]) -> None:
    # a time limit ends episode 1 at step 1; episode 2 (steps 2-3) is still running after the buffer, V = 4:
    # G_1 = 1, G_0 = 1 + 0.5 * 1 = 1.5; G_3 = 1 + 0.5 * 4 = 3, G_2 = 1 + 0.5 * 3 = 2.5
    rewards = [1.0, 1.0, 1.0, 1.0]
    terminated = np.array([False, False, False, False])
    truncated = np.array([False, True, False, False])
    dones = terminated | truncated
    what = f"{NAME}([1, 1, 1, 1], terminated | truncated = [0, 1, 0, 0], gamma=0.5, bootstrap=4.0)"
    got = assert_array(call_on_copies(fn, rewards, dones, 0.5, bootstrap=4.0), what=what, shape=(4,))
    if np.allclose(got, [2.5, 3.0, 2.5, 3.0]):
        fail(
            f"{what} = {short_repr(got)}; expected [1.5, 1.0, 2.5, 3.0]: the truncation at step 1 ends its episode "
            "inside the buffer, so cut the return to 0 there. `bootstrap` is the value after the buffer's last step only"
        )
    assert_allclose(got, [1.5, 1.0, 2.5, 3.0], what=what)


@check_case("bootstrap: the value after the last step enters only an episode still running there (hand-computed)")
def _bootstrap_known_values(fn: Callable[..., Any]) -> None:
    # running at the end: G_1 = 1 + 0.5 * 4 = 3, G_0 = 1 + 0.5 * 3 = 2.5
    got = call_on_copies(fn, [1.0, 1.0], [0.0, 0.0], 0.5, bootstrap=4.0)
    assert_allclose(got, [2.5, 3.0], what=f"{NAME}([1, 1], [0, 0], gamma=0.5, bootstrap=4.0)")
    # the last step ends its episode: nothing follows it, the bootstrap is not used
    got = call_on_copies(fn, [1.0, 1.0], [0.0, 1.0], 0.5, bootstrap=4.0)
    assert_allclose(got, [1.5, 1.0], what=f"{NAME}([1, 1], [0, 1], gamma=0.5, bootstrap=4.0)")


@check_case("bootstrap: matches the naive sum plus gamma^(T-t) V on random trajectories")
def _bootstrap_matches_oracle(fn: Callable[..., Any]) -> None:
    for case, (seed, length, gamma, value) in enumerate([(40, 9, 0.9, 2.5), (41, 30, 0.99, -1.0), (42, 12, 1.0, 3.0)]):
        rewards, dones = random_trajectory(seed, length)
        dones[-1] = 0.0  # the last episode is still running
        got = call_on_copies(fn, rewards, dones, gamma, bootstrap=value)
        expected = naive_discounted_returns(rewards, dones, gamma, value)
        assert_allclose(
            got, expected, what=f"bootstrap case {case + 1} (T={length}, gamma={gamma:g}, bootstrap={value:g})"
        )


@check_case("one backward pass: a 200,000-step buffer within the time limit, each G_t = r_t + gamma (1 - d_t) G_t+1")
def _long_buffer(fn: Callable[..., Any]) -> None:
    # the per-step sum of eq. 00.1 is quadratic in an episode's length: ~10^10 terms here
    # and a closed form (a cumulative sum of gamma^k r_k divided by gamma^t) under/overflows at gamma = 0.9
    rewards, dones = random_trajectory(seed=30, length=200_000, p_done=1e-5)
    for gamma in (0.999, 0.9):
        got = assert_array(
            call_on_copies(fn, rewards, dones, gamma),
            what=f"{NAME} of a 200,000-step buffer, gamma={gamma:g}",
            shape=(200_000,),
        )
        assert_finite(got, what=f"{NAME} of a 200,000-step buffer, gamma={gamma:g}")
        carried = np.append(got[1:], 0.0)
        assert_allclose(
            got - gamma * (1.0 - dones) * carried,
            rewards,
            what=f"G_t - gamma (1 - d_t) G_t+1 on a 200,000-step buffer, gamma={gamma:g} (it must equal r_t)",
        )


@check_case("an empty trajectory (T = 0) gives an empty float array")
def _empty(fn: Callable[..., Any]) -> None:
    got = call_on_copies(fn, [], [], 0.9)
    what = f"{NAME}([], [], gamma=0.9)"
    arr = assert_array(got, what=what, shape=(0,))
    assert_float_dtype(arr, what=what)


@check_case("does not modify its inputs")
def _inputs_unchanged(fn: Callable[..., Any]) -> None:
    rewards, dones = random_trajectory(seed=20, length=8, p_done=0.4)
    assert_inputs_unchanged(fn, NAME, 0.9, rewards=rewards, dones=dones)


DISCOUNTED_RETURNS = Exercise(
    name=NAME,
    points=10,
    title="discounted return of every step, cut at episode ends (equation 00.1)",
    checks=(
        _returns_float_array,
        _fresh_result,
        _known_values_one_episode,
        _known_values_episode_end,
        _gamma_zero,
        _all_done,
        _episodes_independent,
        _matches_oracle,
        _truncation_inside,
        _bootstrap_known_values,
        _bootstrap_matches_oracle,
        _long_buffer,
        _empty,
        _inputs_unchanged,
    ),
    advice="one backward pass over the rewards (eq. 00.2)",
    hints=(
        "Equation 00.2 gives a step's return from the return of the step after it. Which step's return can you "
        "compute first, and what follows it?",
        "Walk the trajectory backwards, carrying one number: before the loop it is `bootstrap` (the value of what "
        "follows the last step). A step with `dones[t] = 1` ends its episode: nothing after it may reach it, so the "
        "carried number is cut to 0 there (multiplied by `1 - dones[t]`); then it is discounted by gamma and the "
        "step's own reward is added.",
        "Convert the inputs to float64 arrays (`np.asarray` with `dtype=np.float64`: integer rewards must give float "
        "returns), allocate the output with `np.zeros_like`, and loop `t` over `reversed(range(...))`. The trap is "
        "the order inside a step: update the carried return first, then store it at `t`.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: finished_episode_returns (equation 00.3)
# ---------------------------------------------------------------------------------------

FER = "finished_episode_returns"


def naive_finished_episode_returns(rewards: Iterable[float], dones: Iterable[float]) -> NDArray[np.float64]:
    """Ground truth: ``R_j = G_{s_j}`` with gamma = 1, read off :func:`naive_discounted_returns`.

    ``s_j`` is the first step of the j-th episode that ends in the buffer (step 0, or the
    step after the previous end). A different route from the learner's running sum.
    """
    r = [float(x) for x in rewards]
    d = [float(x) for x in dones]
    undiscounted = naive_discounted_returns(r, d, 1.0)
    ends = [t for t in range(len(d)) if d[t]]
    starts = [0] + [e + 1 for e in ends[:-1]]
    return np.array([undiscounted[s] for s in starts[: len(ends)]], dtype=np.float64)


def _fer_what(rewards: Any, dones: Any) -> str:
    return f"{FER}({short_repr(rewards)}, {short_repr(dones)})"


def _fer_array(fn: Callable[..., Any], rewards: Any, dones: Any, n_finished: int) -> NDArray[Any]:
    """The learner's answer as an array of ``n_finished`` values, naming the usual shape mistakes."""
    what = _fer_what(rewards, dones)
    arr = assert_array(call_on_copies(fn, rewards, dones), what=what)
    d = np.asarray(dones, dtype=np.float64)
    unfinished = d.size > 0 and not d[-1]
    if arr.shape == (n_finished + 1,) and unfinished:
        fail(
            f"{what} has {arr.size} values but only {n_finished} episode(s) ended: the episode still running after "
            "the last step has no return yet; leave it out"
        )
    if arr.shape == d.shape and d.size != n_finished:
        fail(f"{what} has one value per step (shape {arr.shape}); expected one per finished episode, ({n_finished},)")
    if arr.shape != (n_finished,):
        fail(f"{what} has shape {arr.shape}; expected ({n_finished},): one value per episode that ended (done = 1)")
    return arr


def _fer_expect(fn: Callable[..., Any], rewards: Any, dones: Any, expected: Any) -> None:
    """Compare with ``expected``, naming the mistake when the answer matches a known one."""
    exp = np.asarray(expected, dtype=np.float64)
    arr = _fer_array(fn, rewards, dones, exp.size)
    what = _fer_what(rewards, dones)
    if exp.size > 1 and np.allclose(arr, np.cumsum(exp)):
        fail(f"{what} = {short_repr(arr)}: the running sum was not restarted at 0 after an episode ended")
    assert_allclose(arr, exp, what=what)


@check_case("returns a float numpy array with one value per finished episode")
def _fer_returns_float_array(fn: Callable[..., Any]) -> None:
    rewards, dones = [1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 1.0, 0.0, 1.0, 0.0]
    arr = _fer_array(fn, rewards, dones, 2)
    what = _fer_what(rewards, dones)
    assert_float_dtype(arr, what=what)
    assert_finite(arr, what=what)


@check_case("hand-computed values: rewards 1..6, episodes end at steps 1 and 4, one still running")
def _fer_known_values(fn: Callable[..., Any]) -> None:
    # episode 1 = steps 0-1: 1 + 2 = 3; episode 2 = steps 2-4: 3 + 4 + 5 = 12; step 5 is unfinished
    rewards, dones = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0, 1, 0, 0, 1, 0]
    what = _fer_what(rewards, dones)
    arr = _fer_array(fn, rewards, dones, 2)
    if np.allclose(arr, [1.0, 9.0]):
        fail(
            f"{what} = {short_repr(arr)}; expected [3.0, 12.0]: the reward of the step that ends an episode "
            "belongs to that episode (add it before recording the sum)"
        )
    _fer_expect(fn, rewards, dones, [3.0, 12.0])


@check_case("an unfinished last episode is left out; no finished episode gives an empty array")
def _fer_unfinished(fn: Callable[..., Any]) -> None:
    _fer_expect(fn, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], [0, 0, 1, 0, 0, 0, 0, 1], [3.0, 3.0])
    _fer_expect(fn, [2.0, -1.0, 4.0], [1, 0, 0], [2.0])
    for rewards, dones in (([1.0, 2.0, 3.0], [0, 0, 0]), ([], [])):
        assert_float_dtype(_fer_array(fn, rewards, dones, 0), what=_fer_what(rewards, dones))


@check_case("an episode whose rewards add up to 0 still ended: its return is 0.0")
def _fer_zero_returns(fn: Callable[..., Any]) -> None:
    # episodes [1, -1], [0], [2, 0, 0], [3, -3] end; [1] is still running
    rewards, dones = [1.0, -1.0, 0.0, 2.0, 0.0, 0.0, 3.0, -3.0, 1.0], [0, 1, 1, 0, 0, 1, 0, 1, 0]
    expected = [0.0, 0.0, 2.0, 0.0]
    what = _fer_what(rewards, dones)
    got = call_on_copies(fn, rewards, dones)
    if isinstance(got, np.ndarray) and got.ndim == 1 and got.size < len(expected):
        nonzero = [x for x in expected if x != 0.0]
        if got.size == len(nonzero) and np.allclose(got, nonzero):
            fail(
                f"{what} = {short_repr(got)}; expected {expected}: the episodes whose rewards add up to 0 are missing. "
                "An episode ends where done = 1: record its sum there, even 0.0"
            )
    _fer_expect(fn, rewards, dones, expected)


@check_case("every step done gives the rewards")
def _fer_all_done(fn: Callable[..., Any]) -> None:
    rewards, _ = random_trajectory(seed=30, length=6)
    _fer_expect(fn, rewards, np.ones(6), rewards)


@check_case("the returns add up to the rewards up to the last episode end")
def _fer_conserves_reward(fn: Callable[..., Any]) -> None:
    rewards, dones = random_trajectory(seed=31, length=30, p_done=0.3)
    last_end = int(np.flatnonzero(dones)[-1])
    arr = _fer_array(fn, rewards, dones, int(np.count_nonzero(dones)))
    total, expected = float(np.sum(arr)), float(np.sum(rewards[: last_end + 1]))
    if not np.isclose(total, expected, rtol=1e-9, atol=1e-9):
        fail(
            f"the returns of {_fer_what(rewards, dones)} add up to {total:.4g}, but the rewards up to the last "
            f"episode end (step {last_end}) add up to {expected:.4g}: every reward belongs to exactly one episode"
        )


@check_case("each episode's sum restarts at 0: an episode after a large return gets what it gets alone")
def _fer_restarts(fn: Callable[..., Any]) -> None:
    # a first episode with a large return (a terminal bonus of 1e8), then two small ones
    first_r, first_d = [1e8, 0.1], [0, 1]
    rest_r, rest_d = [0.1, 0.2, 0.7, 0.1, 0.2], [0, 1, 0, 0, 1]
    alone = _fer_array(fn, rest_r, rest_d, 2)
    together = _fer_array(fn, first_r + rest_r, first_d + rest_d, 3)
    for j in range(2):
        if not np.isclose(together[j + 1], alone[j], rtol=1e-12, atol=0.0):
            fail(
                f"the return of an episode is {float(together[j + 1]):.12g} after an episode of return 1e+08 but "
                f"{float(alone[j]):.12g} alone: restart the sum at 0 at each episode end. A difference of one running "
                "total (np.cumsum) carries the rounding of every reward before it"
            )


@check_case("matches G at each finished episode's first step (gamma = 1) on random trajectories")
def _fer_matches_oracle(fn: Callable[..., Any]) -> None:
    for case, (seed, length, p_done) in enumerate([(40, 1, 0.5), (41, 9, 0.3), (42, 60, 0.2), (43, 200, 0.05)]):
        rewards, dones = random_trajectory(seed, length, p_done)
        expected = naive_finished_episode_returns(rewards, dones)
        got = call_on_copies(fn, rewards, dones)
        assert_allclose(got, expected, what=f"random case {case + 1} (T={length}, {expected.size} finished episodes)")


@check_case("accepts integer rewards and bool dones, and does not modify its inputs")
def _fer_inputs(fn: Callable[..., Any]) -> None:
    _fer_expect(fn, [1, 1, 1, 1], [False, True, False, True], [2.0, 2.0])
    _fer_expect(fn, np.array([3, 0, 2]), np.array([True, False, True]), [3.0, 2.0])
    rewards, dones = random_trajectory(seed=44, length=8, p_done=0.4)
    assert_inputs_unchanged(fn, FER, rewards=rewards, dones=dones)


FINISHED_EPISODE_RETURNS = Exercise(
    name=FER,
    points=10,
    title="the undiscounted return of every finished episode (equation 00.3)",
    checks=(
        _fer_returns_float_array,
        _fer_known_values,
        _fer_unfinished,
        _fer_zero_returns,
        _fer_all_done,
        _fer_conserves_reward,
        _fer_restarts,
        _fer_matches_oracle,
        _fer_inputs,
    ),
    advice="one forward pass summing rewards until each episode end (eq. 00.3)",
    hints=(
        "Walk the trajectory forwards, adding each reward to a running sum; an episode's return is the sum at the "
        "step where it ends.",
        "At a step with `dones[t] = 1`, add that step's reward first (it belongs to the episode that ends there), "
        "then record the sum and restart it at 0. What is left in the sum after the last step belongs to an "
        "unfinished episode: it is not returned.",
        "Keep the recorded sums in a Python list and turn it into an array only at the end, with `np.array` and "
        "`dtype=np.float64`, so that integer rewards and a trajectory with no finished episode both give a float "
        "array. Trap: recording the sum before adding the ending step's reward.",
    ),
)

EXERCISES: tuple[Exercise, ...] = (DISCOUNTED_RETURNS, FINISHED_EPISODE_RETURNS)
