"""Lesson 06's graded exercises: the kinematic bicycle step of the driving simulator, the
sum-tree descent of prioritized replay, prioritized replay's importance weights, SAC's soft
Bellman target, and the batched write of new priorities back into the sum tree.

The learner writes:

* ``bicycle_step(x, y, psi, v, accel, steer, l_f, l_r, dt, v_max) -> (x', y', psi', v')``  (eq. 06.1)
* ``sumtree_find(tree, u) -> j``  (the descent that samples eq. 06.7)
* ``importance_weights(probabilities, n_stored, beta, normalize=True) -> w [K]``  (eq. 06.8)
* ``soft_bellman_target(reward, done, q1_next, q2_next, logp_next, alpha, gamma) -> y [B]``  (eq. 06.2)
* ``sumtree_update(tree, indices, values) -> tree``  (the write-back behind ``per_update``)

What each exercise teaches, and how its checks observe it:

* bicycle_step: mechanism: one explicit Euler step of (06.1) from the old state (slip angle
  from the rear share of the wheelbase, motion along psi + beta, yaw rate v sin(beta) / l_r,
  the speed clipped to [0, v_max]), elementwise over broadcast arrays inside one XLA program;
  observed by hand steps, a circle closed by the yaw rate alone, random cars (dt, v_max,
  l_f, l_r varied), broadcasting, unchanged inputs and a call under ``jax.jit``.
* sumtree_find: mechanism: one root-to-leaf descent, O(log capacity) node reads, comparing u
  with the left child's sum and subtracting it on the way right; observed by a read-counting
  tree that refuses bulk reads and caps the distinct nodes a draw reads, boundaries hit
  exactly, empty items never drawn, stratified counts.
* importance_weights: mechanism: the raw weight (N P(i))^(-beta) with N the items stored (not
  the batch), divided by the batch's largest when asked; observed by hand batches, random
  batches whose batch size differs from N, beta = 0 and 1, the unbiasedness at beta = 1, and
  a call under ``jax.jit`` with traced beta and N.
* soft_bellman_target: mechanism: r + gamma (1 - d) (min of the twin target critics - alpha
  log pi), the whole soft value discounted and masked; observed by random batches and by
  moving one input at a time (swapping, raising the larger, lowering the smaller critic,
  raising log pi) with gamma, alpha and done varied, and a call under ``jax.jit``.
* sumtree_update: mechanism: all K leaves written at once with the last write of a repeated
  index winning (decided by the program, not left to a scatter's unspecified order), then
  log2(capacity) levels of parents, each set to the sum of its children; observed by the
  values (hand trees, repeated indices and siblings, against writes done one at a time),
  exact sums after 200 float32 updates, and the program itself run one primitive at a time
  (:func:`run_jaxpr`): the writes into the tree are counted (a loop over the K entries writes
  K times as often), work on arrays the size of the tree is refused, the elements of the tree
  read and written are counted and bounded by O(K log capacity) (levels rebuilt densely with
  slices, each slice small, touch O(capacity)), and every scatter into the tree is read for a
  node written twice with two values.

The checks never call ``course_lib.envs``, ``course_lib.offpolicy.replay`` or ``course_lib.offpolicy.sac``.
The oracles: (06.1) evaluated one car at a time with ``math`` in float64, and a circle whose
closure depends only on the yaw rate; a cumulative sum and ``np.searchsorted`` for the
sum tree (its leaves are multiples of 1/8, so every sum is exact and boundaries can be hit
exactly), and stratified draws whose counts are known in advance; (06.8) one weight at a
time in float64, and the unbiasedness it buys at beta = 1; (06.2) written out one
transition at a time; for the tree's write-back, the entries written one at a time in
float32 and every node re-added from its children. Each oracle takes keyword switches that
compute a known slip, so a wrong answer that matches one is named.

The sum tree reaches ``sumtree_find`` as a :class:`ReadCountingTree`: a read-only object
read one node at a time (``tree[i]``, ``len(tree)``), which refuses slices, iteration and
whole-array numpy, and counts the distinct nodes a draw reads. A draw may read at most
``2 log2(capacity) + 1`` of them (both children at each level of the descent, and the root),
so a linear scan over the leaves (``np.searchsorted`` of their cumulative sum, or a Python
loop) fails on large trees, where it reads hundreds. The node values live in a closure, not
in an attribute: ``tree._values`` (any private name, ``__dict__``, ``vars``, copying,
pickling) raises the same "read one node at a time" refusal.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    Exercise,
    LearnerError,
    call,
    check_case,
    copy_input,
    describe_type,
    fail,
    fmt_number,
)
from course_lib.course.grading.helpers import fail_if_known_mistake

LESSON = "06_off_policy_scale"

# ---------------------------------------------------------------------------------------
# Shared: calling the learner's elementwise functions, with the array slips named
# ---------------------------------------------------------------------------------------

ELEMENTWISE = (
    "a Python `if`, `and`/`or`, `min`/`max` or `float()` on an array: use the elementwise jnp.clip, "
    "jnp.minimum, jnp.maximum, jnp.where"
)


def _named_call(fn: Callable[..., Any], what: str, *args: Any, jit: bool = False) -> Any:
    """``fn(*args)`` (under ``jax.jit`` if ``jit``), naming the usual array slips when it raises."""
    import jax

    try:
        return call(jax.jit(fn) if jit else fn, *args)
    except LearnerError as exc:
        err, text = exc.error, str(exc.error)
        if isinstance(err, jax.errors.TracerArrayConversionError):
            fail(f"{what}: numpy (np.cos, np.minimum, ...) on a traced array fails under jax.jit; use jax.numpy (jnp)")
        if isinstance(err, jax.errors.ConcretizationTypeError | jax.errors.TracerIntegerConversionError):
            fail(f"{what} fails under jax.jit: {ELEMENTWISE}")
        if isinstance(err, ValueError) and "truth value of an array" in text:
            fail(f"{what}: {ELEMENTWISE}")
        if isinstance(err, TypeError) and "can be converted to Python scalars" in text:
            fail(f"{what}: math.cos, math.tan, ... take one number; use jnp.cos, jnp.tan, ... (elementwise)")
        raise


def _as_float_array(value: Any, what: str) -> NDArray[Any]:
    """A learner's result as a numpy array of floats."""
    if value is None:
        fail(f"{what} is None; did you forget to `return` it?")
    if isinstance(value, dict | list | tuple | str):
        fail(f"{what} is {describe_type(value)}; expected an array")
    try:
        arr = np.asarray(value)
    except Exception:
        fail(f"{what} is {describe_type(value)}; expected an array")
        raise AssertionError("unreachable") from None
    if arr.dtype.kind != "f":
        fail(f"{what} has dtype {arr.dtype}; expected a float array")
    return arr


def _first_difference(got: NDArray[Any], want: NDArray[Any], rtol: float, atol: float) -> tuple[int, ...] | None:
    close = np.isclose(got.astype(np.float64), want, rtol=rtol, atol=atol)
    if close.all():
        return None
    return tuple(int(i) for i in np.argwhere(~close)[0])


def _where(index: tuple[int, ...]) -> str:
    return "" if not index else f" at index {index[0] if len(index) == 1 else list(index)}"


def _assert_unchanged(name: str, given: dict[str, Any], before: dict[str, Any], advice: str) -> None:
    """Fail naming the first numpy input the learner's call changed."""
    for arg, value in given.items():
        if isinstance(value, np.ndarray) and not np.array_equal(value, before[arg], equal_nan=True):
            fail(f"{name} changed the `{arg}` array it was given; {advice}")


# ---------------------------------------------------------------------------------------
# Exercise 1: bicycle_step, eq. 06.1
# ---------------------------------------------------------------------------------------

BS = "bicycle_step"
BS_ARGS = ("x", "y", "psi", "v", "accel", "steer", "l_f", "l_r", "dt", "v_max")
BS_OUT = ("x'", "y'", "psi'", "v'")
BS_RTOL, BS_ATOL = 1e-5, 1e-4  # float32 (the learner's jnp) against float64


def naive_bicycle(
    *args: Any,
    ratio: bool = True,
    slip: bool = True,
    yaw: str = "cg",
    new_speed: bool = False,
    new_heading: bool = False,
    clip_low: bool = True,
    clip_high: bool = True,
    degrees: bool = False,
    swap_trig: bool = False,
) -> NDArray[np.float64]:
    """(06.1) one car at a time, in float64 with ``math``: ``[4, *shape]`` = x', y', psi', v'.

    ``args`` are ``bicycle_step``'s ten arguments (broadcast together). The switches compute
    known slips: ``ratio=False`` drops l_r / (l_f + l_r) from the slip angle, ``slip=False``
    moves along psi, ``yaw`` is ``"cg"``, ``"wheelbase"`` (v / (l_f + l_r) sin beta) or
    ``"rear_axle"`` (v tan(delta) / (l_f + l_r)), ``new_speed`` / ``new_heading`` update v / psi
    first and use the new value, ``clip_low`` / ``clip_high`` clip the speed at 0 / v_max,
    ``degrees`` reads the steering angle as degrees, ``swap_trig`` swaps cos and sin.
    """
    arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in args))
    shape = arrays[0].shape
    out = np.zeros((4, *shape))
    for idx in np.ndindex(*shape):
        x, y, psi, v, a, delta, l_f, l_r, dt, v_max = (float(arr[idx]) for arr in arrays)
        if degrees:
            delta = math.radians(delta)
        beta = math.atan((l_r / (l_f + l_r) if ratio else 1.0) * math.tan(delta))
        v_next = v + a * dt
        if clip_low:
            v_next = max(v_next, 0.0)
        if clip_high:
            v_next = min(v_next, v_max)
        speed = v_next if new_speed else v
        if yaw == "cg":
            rate = speed / l_r * math.sin(beta)
        elif yaw == "wheelbase":
            rate = speed / (l_f + l_r) * math.sin(beta)
        else:
            rate = speed * math.tan(delta) / (l_f + l_r)
        psi_next = psi + rate * dt
        heading = (psi_next if new_heading else psi) + (beta if slip else 0.0)
        cos, sin = math.cos(heading), math.sin(heading)
        if swap_trig:
            cos, sin = sin, cos
        out[(slice(None), *idx)] = (x + speed * cos * dt, y + speed * sin * dt, psi_next, v_next)
    return out


BS_SLIPS: dict[str, dict[str, Any]] = {
    "the slip angle is beta = arctan(l_r / (l_f + l_r) * tan(steer)): the factor l_r / (l_f + l_r) is "
    "missing (06.1)": dict(ratio=False),
    "the car moves along psi + beta (the velocity's direction at the centre of gravity), not along psi (06.1)": dict(
        slip=False
    ),
    "x uses cos and y uses sin of psi + beta (heading 0 drives along +x)": dict(swap_trig=True),
    "the yaw rate is v / l_r * sin(beta): divide by l_r, not by the wheelbase l_f + l_r (06.1)": dict(yaw="wheelbase"),
    "the yaw rate is v / l_r * sin(beta) at the centre of gravity; v tan(steer) / (l_f + l_r) is the "
    "rear-axle model's (06.1)": dict(yaw="rear_axle"),
    "the step used the new speed: explicit Euler moves the car with the old v and updates v last": dict(new_speed=True),
    "the position moved along the new heading: explicit Euler uses the old psi": dict(new_heading=True),
    "the speed is not clipped at 0: clip(v + a dt, 0, v_max) (braking stops the car, it never reverses)": dict(
        clip_low=False
    ),
    "the speed is not clipped at v_max: clip(v + a dt, 0, v_max)": dict(clip_high=False),
    "steer is already in radians: no conversion from degrees": dict(degrees=True),
}


def _bs_text(args: tuple[Any, ...]) -> str:
    parts = []
    for name, a in zip(BS_ARGS, args):
        arr = np.asarray(a)
        parts.append(fmt_number(arr.item()) if arr.ndim == 0 else f"{name} of shape {arr.shape}")
    return f"{BS}({', '.join(parts)})"


def _bs_unpack(out: Any, what: str, shape: tuple[int, ...]) -> NDArray[np.float64]:
    """The learner's (x', y', psi', v') as one float64 array ``[4, *shape]``."""
    if not isinstance(out, tuple | list) or len(out) != 4:
        fail(f"{what} returned {describe_type(out)}; expected a tuple (x', y', psi', v')")
    arrays = []
    for name, value in zip(BS_OUT, out):
        arr = _as_float_array(value, f"{what}: {name}")
        if arr.shape != shape:
            fail(f"{what}: {name} has shape {arr.shape}; expected {shape}, the arguments' broadcast shape")
        arrays.append(arr.astype(np.float64))
    return np.stack(arrays)


def _bs_compare(fn: Callable[..., Any], args: tuple[Any, ...], what: str = "", *, jit: bool = False) -> None:
    """Call the learner on ``args`` (numpy inputs copied, then checked unchanged) and compare with (06.1)."""
    what = what or _bs_text(args)
    given = tuple(copy_input(a) for a in args)
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    out = _named_call(fn, what, *given, jit=jit)
    _assert_unchanged(
        BS, dict(zip(BS_ARGS, given)), dict(zip(BS_ARGS, args)), "compute new arrays (no +=, *= on an argument)"
    )
    got = _bs_unpack(out, what, shape)
    want = naive_bicycle(*args)
    if _first_difference(got, want, BS_RTOL, BS_ATOL) is None:
        return
    mistakes = {message: (lambda s=slip: naive_bicycle(*args, **s)) for message, slip in BS_SLIPS.items()}
    fail_if_known_mistake(got, mistakes, expected=want, what=what, rtol=BS_RTOL, atol=BS_ATOL)
    for k, name in enumerate(BS_OUT):
        index = _first_difference(got[k], want[k], BS_RTOL, BS_ATOL)
        if index is not None:
            fail(
                f"{what}: {name} = {fmt_number(got[k][index])}{_where(index)}; (06.1) gives "
                f"{fmt_number(want[k][index])}"
            )


#: (description, arguments, (x', y', psi', v') worked out by hand)
BS_KNOWN: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = (
    ("a straight line", (1.0, 2.0, math.pi / 6, 20.0, 2.0, 0.0, 1.2, 1.6, 0.05, 30.0), (1.866025, 2.5, 0.523599, 20.1)),
    (
        "a turn with beta = 45 deg",
        (0.0, 0.0, 0.0, 10.0, 0.0, math.atan(2.0), 2.0, 2.0, 0.1, 30.0),
        (0.707107, 0.707107, 0.353553, 10.0),
    ),
    ("braking to a stop", (0.0, 0.0, 0.0, 0.5, -10.0, 0.0, 1.2, 1.6, 0.1, 30.0), (0.05, 0.0, 0.0, 0.0)),
    ("the speed cap", (0.0, 0.0, math.pi / 2, 29.9, 3.0, 0.0, 1.2, 1.6, 0.1, 30.0), (0.0, 2.99, 1.570796, 30.0)),
)


@check_case(
    "hand-computed steps: a straight line, a turn with beta = 45 deg, braking to a stop, the speed cap", time_limit=30.0
)
def _bs_known(fn: Callable[..., Any]) -> None:
    for label, args, by_hand in BS_KNOWN:
        assert np.allclose(naive_bicycle(*args), by_hand, atol=1e-6), label  # the statement's numbers
        _bs_compare(fn, args, f"{_bs_text(args)} ({label})")


#: A circle of 40 steps: l_f = l_r = 2 and tan(steer) = 2 give beta = 45 deg; at this speed the yaw
#: rate v sin(beta) / l_r turns the car by 2 pi / 40 a step (radius l_r / sin(beta) = 2.83 m).
CIRCLE_STEPS, CIRCLE_DT, CIRCLE_LR = 40, 0.1, 2.0
CIRCLE_V = 2 * math.pi / CIRCLE_STEPS / CIRCLE_DT / (math.sin(math.pi / 4) / CIRCLE_LR)


@check_case("40 steps at constant steering close a circle: the yaw rate is v sin(beta) / l_r", time_limit=30.0)
def _bs_circle(fn: Callable[..., Any]) -> None:
    """Explicit Euler at constant speed and steering moves by equal chords turning by equal angles:
    the positions are the corners of a regular polygon, back at the start after a full turn."""
    state: tuple[float, ...] = (0.0, 0.0, 0.0, CIRCLE_V)
    points = []
    for _ in range(CIRCLE_STEPS):
        args = (*state, 0.0, math.atan(2.0), 2.0, CIRCLE_LR, CIRCLE_DT, 30.0)
        got = _bs_unpack(_named_call(fn, _bs_text(args), *args), _bs_text(args), ())
        state = tuple(float(s) for s in got)
        points.append(state[:2])
    x, y, psi, _ = state
    what = (
        f"{CIRCLE_STEPS} steps of {BS}(..., v={fmt_number(CIRCLE_V)}, accel=0, steer=arctan(2), l_f=2, l_r=2, "
        f"dt={CIRCLE_DT})"
    )
    turn = "a full turn, 2 pi = 6.28319 rad: the yaw rate v sin(beta) / l_r with beta = 45 deg"
    if not math.isclose(psi, 2 * math.pi, abs_tol=1e-3):
        fail(f"{what} turn the car by psi = {fmt_number(psi)} rad; expected {turn}")
    if math.hypot(x, y) > 1e-3:
        fail(f"{what} end at ({fmt_number(x)}, {fmt_number(y)}); after {turn} the car is back at (0, 0)")
    centre = np.mean(points, axis=0)
    radius = CIRCLE_V * CIRCLE_DT / (2 * math.sin(math.pi / CIRCLE_STEPS))  # of the polygon
    distances = np.hypot(*(np.asarray(points) - centre).T)
    if not np.allclose(distances, radius, atol=1e-3):
        fail(f"{what}: the positions are not on a circle of radius {fmt_number(radius)} m around their centre")


def bicycle_cars(seed: int, n: int) -> tuple[Any, ...]:
    """Random cars (float32, like the simulator's) with dt = 0.1 and v_max = 25; the first four
    sit on the speed clip's edges (braking below 0, accelerating past v_max, at rest, at v_max)."""
    rng = np.random.default_rng(seed)
    cars = [
        rng.uniform(-50, 50, n),
        rng.uniform(-50, 50, n),
        rng.uniform(-math.pi, math.pi, n),
        rng.uniform(0, 25, n),
        rng.uniform(-8, 6, n),
        rng.uniform(-0.6, 0.6, n),
        rng.uniform(0.8, 2.0, n),
        rng.uniform(0.8, 2.0, n),
    ]
    cars[3][:4] = (0.3, 24.8, 0.0, 25.0)
    cars[4][:4] = (-8.0, 5.0, -1.0, 0.0)
    return (*(c.astype(np.float32) for c in cars), np.float32(0.1), np.float32(25.0))


@check_case("random cars against (06.1) one car at a time; the arguments left unchanged", time_limit=30.0)
def _bs_oracle(fn: Callable[..., Any]) -> None:
    for seed, n in ((0, 64), (1, 7)):
        _bs_compare(fn, bicycle_cars(seed, n), f"{BS} on {n} random cars (numpy float32 arrays)")


@check_case("shapes broadcast (a grid of cars, per-car l_f and l_r); the same under jax.jit", time_limit=30.0)
def _bs_shapes(fn: Callable[..., Any]) -> None:
    import jax.numpy as jnp

    cars = bicycle_cars(2, 15)
    grid = tuple(c.reshape(5, 3) for c in cars[:6])
    per_car = (cars[6][:3], cars[7][:3], 0.1, 25.0)  # l_f, l_r of shape [3]; dt, v_max Python floats
    _bs_compare(fn, (*grid, *per_car), f"{BS} on a [5, 3] grid of cars with l_f, l_r of shape [3]")
    cars = bicycle_cars(3, 6)
    jax_cars = tuple(jnp.asarray(c) for c in cars)
    out = _named_call(fn, f"{BS} under jax.jit", *jax_cars, jit=True)
    got = _bs_unpack(out, f"{BS} under jax.jit", (6,))
    want = naive_bicycle(*cars)
    index = _first_difference(got, want, BS_RTOL, BS_ATOL)
    if index is not None:
        fail(f"{BS} under jax.jit: {BS_OUT[index[0]]} differs from (06.1) at car {index[1]} (eager calls agree?)")


BICYCLE_STEP = Exercise(
    name=BS,
    compiled=True,
    points=15,
    title="one explicit Euler step of the kinematic bicycle model, elementwise (eq. 06.1)",
    checks=(_bs_known, _bs_circle, _bs_oracle, _bs_shapes),
    hints=(
        "beta first, then one line per row of (06.1), each computed from the arguments (the old state), never from a "
        "value just updated.",
        "beta, the slip angle, is the arctangent of the rear share of the wheelbase, l_r / (l_f + l_r), times the "
        "tangent of the steering angle. The position moves along the heading plus beta; the heading turns at the rate "
        "v / l_r times the sine of beta; the speed changes by accel * dt.",
        "Use `jnp` functions throughout (`jnp.arctan`, `jnp.tan`, `jnp.cos`, `jnp.sin`) so that arrays and `jax.jit` "
        "work, and keep the speed in [0, v_max] with `jnp.clip`, elementwise, where Python's `min` and `max` fail on "
        "arrays. Return the four new values as a tuple, in the order of the arguments.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: sumtree_find, the descent behind eq. 06.7
# ---------------------------------------------------------------------------------------

ST = "sumtree_find"


class TreeRefusal(Exception):
    """The grader's tree refused an access that reads more than one node (or writes)."""


class TreeReadError(TreeRefusal, TypeError):
    """A slice, an index array, iteration, ``np.asarray`` or a write on the grader's tree."""


class TreeAttributeError(TreeRefusal, AttributeError):
    """An array method (``.sum()``, ``.cumsum()``, ``.tolist()``, ...) or a private attribute
    (``tree._values``, ``tree.__dict__``) on the grader's tree.

    An ``AttributeError`` too, so that numpy's and JAX's probing (``hasattr``) moves on to
    ``__array__``, which refuses with the same explanation."""


BULK = "the tree is read one node at a time, tree[i] with an int i"

#: The attributes a learner's code may read on the tree: the public ones, and the protocol
#: methods it defines or inherits harmlessly (``__class__`` is ``type(tree)``; ``isinstance``
#: against an ABC reads it). Every other name raises :class:`TreeAttributeError`.
TREE_PUBLIC = frozenset({"shape", "size", "ndim", "dtype", "nodes_read"})
TREE_PROTOCOL = frozenset(
    {
        "__class__",
        "__doc__",
        "__len__",
        "__getitem__",
        "__setitem__",
        "__iter__",
        "__contains__",
        "__array__",
        "__repr__",
        "__str__",
        "__format__",
        "__eq__",
        "__ne__",
        "__hash__",
    }
)


def _tree_reader(values: Any) -> tuple[Callable[[int], np.float64], Callable[[], frozenset[int]]]:
    """Two closures over a private copy of ``values``: ``read(k)`` (one node, recorded) and
    ``reads()`` (the nodes read so far). Neither the copy nor the record is an attribute of
    anything a learner's code is handed."""
    copy = np.array(values, dtype=np.float64)
    copy.setflags(write=False)
    record: set[int] = set()

    def read(k: int) -> np.float64:
        record.add(k)
        return np.float64(copy[k])

    def reads() -> frozenset[int]:
        return frozenset(record)

    return read, reads


def _slot(tree: ReadCountingTree, name: str) -> Any:
    """The tree's own slots, read past its refusing ``__getattribute__``."""
    return object.__getattribute__(tree, name)


class ReadCountingTree:
    """The sum tree the checks hand to ``sumtree_find``: read-only, one node at a time, counted.

    It supports what a descent uses, ``len(tree)``, ``tree.shape``, ``tree.size``,
    ``tree.ndim``, ``tree.dtype`` and ``tree[i]`` for one int ``i`` (a numpy float64 back,
    negative ``i`` as numpy reads it), and reports the set of nodes read in ``nodes_read``
    (a frozenset: a copy the learner's code cannot clear).
    Everything that would read many nodes in one go raises :class:`TreeRefusal`: a slice, an
    index array, iteration (``for``, ``list``, ``sum``, ``in``), ``np.asarray`` and every
    numpy or jnp function of the whole tree (``np.cumsum``, ``np.searchsorted``, ...), array
    methods (``.sum()``, ``.cumsum()``); writes raise too. So a draw's reads are exactly the
    nodes it looked at, and a linear scan over the leaves shows up as ``capacity`` reads.

    The node values are held in a closure (:func:`_tree_reader`), never in an attribute: the
    object's only slots hold the length and two functions, and every attribute outside
    :data:`TREE_PUBLIC` and :data:`TREE_PROTOCOL` (``tree._values``, ``tree._read``,
    ``tree.__dict__``, ``tree.__slots__``, ``tree.__reduce_ex__``, ...) raises
    :class:`TreeAttributeError`, as do ``vars(tree)``, copying, pickling and attribute writes
    (``tree.__class__ = ...`` included).
    """

    __slots__ = ("_n", "_read", "_reads")

    def __init__(self, values: NDArray[np.float64]) -> None:
        read, reads = _tree_reader(values)
        object.__setattr__(self, "_n", len(values))
        object.__setattr__(self, "_read", read)
        object.__setattr__(self, "_reads", reads)

    def __getattribute__(self, name: str) -> Any:
        if name in TREE_PUBLIC or name in TREE_PROTOCOL:
            return object.__getattribute__(self, name)
        if name.startswith("_"):
            raise TreeAttributeError(f"tree.{name}, the tree's inside, not a node")
        raise TreeAttributeError(f"tree.{name} (or np.{name}(tree)): the whole tree at once")

    def __setattr__(self, name: str, value: Any) -> None:
        raise TreeReadError(f"a write to tree.{name}: the tree is read-only, a draw only reads it")

    def __delattr__(self, name: str) -> None:
        raise TreeReadError(f"del tree.{name}: the tree is read-only, a draw only reads it")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TreeReadError("a copy or pickle of the tree, which reads every node")

    def __reduce__(self) -> Any:
        raise TreeReadError("a copy or pickle of the tree, which reads every node")

    def __getstate__(self) -> Any:
        raise TreeReadError("a copy or pickle of the tree, which reads every node")

    def __len__(self) -> int:
        return int(_slot(self, "_n"))

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self),)

    @property
    def size(self) -> int:
        return len(self)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.float64)

    @property
    def nodes_read(self) -> frozenset[int]:
        reads: Callable[[], frozenset[int]] = _slot(self, "_reads")
        return reads()

    def __getitem__(self, key: Any) -> np.float64:
        if isinstance(key, slice):
            start = "" if key.start is None else key.start
            stop = "" if key.stop is None else key.stop
            raise TreeReadError(f"a slice of the tree, tree[{start}:{stop}]")
        if isinstance(key, float | np.floating):
            raise TreeReadError(f"tree[{fmt_number(key)}]: a node index is an int (use // to halve it)")
        try:
            k = operator.index(key)
        except TypeError:
            raise TreeReadError(f"tree[...] with {describe_type(key)}, many nodes at once") from None
        n = len(self)
        if not -n <= k < n:
            raise IndexError(f"index {k} is out of bounds for the tree of length {n}")
        read: Callable[[int], np.float64] = _slot(self, "_read")
        return read(k % n)

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TreeReadError("a write to the tree: it is read-only, a draw only reads it")

    def __iter__(self) -> Any:
        raise TreeReadError("iterating over the tree (a for loop, list, sum, in)")

    def __contains__(self, value: Any) -> bool:
        raise TreeReadError("`in` on the tree, which reads every node")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TreeReadError("np.asarray or a numpy/jnp function of the whole tree")

    def __repr__(self) -> str:
        return f"<sum tree of capacity {len(self) // 2}, read node by node>"


def read_limit(capacity: int) -> int:
    """The most distinct nodes one draw may read: both children at each of the log2(capacity)
    levels of the descent, plus the root."""
    return 2 * (capacity.bit_length() - 1) + 1


SCAN = "a linear scan; the descent reads one path from the root"


def build_tree(leaves: Any, garbage: float = math.nan) -> NDArray[np.float64]:
    """The layout of the exercise: root at 1, children 2i and 2i + 1, item j at capacity + j;
    index 0 holds ``garbage`` (NaN: a descent that reads it goes wrong visibly, and never loops)."""
    leaf = np.asarray(leaves, dtype=np.float64)
    capacity = len(leaf)
    assert capacity >= 1 and capacity & (capacity - 1) == 0, capacity
    tree = np.zeros(2 * capacity)
    tree[capacity:] = leaf
    for i in range(capacity - 1, 0, -1):
        tree[i] = tree[2 * i] + tree[2 * i + 1]
    tree[0] = garbage
    return tree


def naive_find(leaves: Any, u: float) -> int:
    """The oracle: the first item whose cumulative sum exceeds ``u`` (no tree involved)."""
    return int(np.searchsorted(np.cumsum(np.asarray(leaves, dtype=np.float64)), u, side="right"))


def slipped_descent(
    tree: NDArray[np.float64],
    u: float,
    *,
    start: int = 1,
    left_if_equal: bool = False,
    subtract: bool = True,
    offset: int = 0,
    tree_index: bool = False,
    levels_short: int = 0,
) -> int:
    """The descent with a known slip switched on (used only to name a wrong answer)."""
    capacity = len(tree) // 2
    i = start
    while i < capacity >> levels_short:
        left = 2 * i
        if u < tree[left] or (left_if_equal and u == tree[left]):
            i = left
        else:
            u = u - tree[left] if subtract else u
            i = left + 1
    return i if tree_index else i - capacity + offset


ST_SLIPS: dict[str, dict[str, Any]] = {
    "returned the tree index capacity + j; return the item index j = i - capacity": dict(tree_index=True),
    "a u equal to the left child's sum went left: go left only if u < tree[2i] (with <= a boundary draws the "
    "item before it, even one of priority zero)": dict(left_if_equal=True),
    "forgot to subtract the left child's sum when going right: u must be measured from the start of the right "
    "subtree": dict(subtract=False),
    "start the descent at the root, index 1 (index 0 is unused)": dict(start=0),
    "off by one at the leaves (one item too far): item j's leaf is at capacity + j, so return i - capacity": dict(
        offset=1
    ),
    "off by one at the leaves (one item too early): item j's leaf is at capacity + j, so return i - capacity": dict(
        offset=-1
    ),
    "the descent stopped one level above the leaves: loop while i < capacity, down to a leaf index i >= capacity": (
        dict(levels_short=1)
    ),
}


def _st_item(got: Any, what: str) -> int:
    if isinstance(got, bool | np.bool_) or got is None:
        fail(f"{what} returned {describe_type(got)}; expected an int item index")
    try:
        return operator.index(got)
    except TypeError:
        fail(f"{what} returned {describe_type(got)}; expected an int item index (not a float)")
        raise AssertionError("unreachable") from None


def _st_draw(fn: Callable[..., Any], tree: NDArray[np.float64], u: float) -> int:
    """The learner's item for one ``u``, read through a :class:`ReadCountingTree` and held to the
    read limit."""
    capacity = len(tree) // 2
    given = ReadCountingTree(tree)
    what = f"{ST}(tree of capacity {capacity}, u={fmt_number(u)})"
    limit = f"at most 2 log2({capacity}) + 1 = {read_limit(capacity)} nodes"
    try:
        got = call(fn, given, u)
    except LearnerError as exc:
        err = exc.error
        if isinstance(err, TreeRefusal):
            fail(f"{what} read {err}: {BULK}. A cumsum or searchsorted over the leaves is {SCAN}, {limit}")
        if isinstance(err, TypeError) and type(given).__name__ in str(err):
            fail(f"{what} passed the whole tree to a jnp function: {BULK}; the descent reads {limit}")
        if isinstance(err, IndexError):
            fail(
                f"{what} raised IndexError: the descent read past the end of the tree; stop at the leaves, "
                "i >= capacity = len(tree) // 2 (item j's leaf is at capacity + j)"
            )
        raise
    read = given.nodes_read
    if len(read) > read_limit(capacity):
        leaves = sum(k >= capacity for k in read)
        fail(
            f"{what} read {len(read)} different nodes ({leaves} of them leaves): {SCAN} to a leaf, {limit} "
            "(the left child, maybe the right, at each level)"
        )
    return _st_item(got, what)


def _st_answers(fn: Callable[..., Any], tree: NDArray[np.float64], us: list[float]) -> list[int]:
    """The learner's item for each u, each draw on a fresh read-counting copy of the tree."""
    return [_st_draw(fn, tree, u) for u in us]


def _st_compare(fn: Callable[..., Any], leaves: Any, us: list[float], label: str) -> None:
    tree = build_tree(leaves)
    capacity = len(tree) // 2
    got = _st_answers(fn, tree, us)
    want = [naive_find(leaves, u) for u in us]
    if got == want:
        return
    for message, slip in ST_SLIPS.items():
        wrong = [slipped_descent(tree, u, **slip) for u in us]
        if wrong != want and got == wrong:
            fail(f"{label}: {message}")
    k = next(k for k, (g, w) in enumerate(zip(got, want)) if g != w)
    what = f"{ST}({label}, u={fmt_number(us[k])})"
    if not 0 <= got[k] < capacity:
        fail(f"{what} = {got[k]}, not an item index in 0..{capacity - 1}; expected {want[k]}")
    zero = " (an item of priority zero: never drawn)" if float(np.asarray(leaves)[got[k]]) == 0.0 else ""
    fail(f"{what} = {got[k]}{zero}; expected item {want[k]}: leaves before it sum to <= u < that sum + its leaf")


DRAWN = [1.0, 0.0, 3.0, 4.0]  # the statement's tree


@check_case("the tree drawn in the statement and trees of capacity 1 and 2: hand-computed items")
def _st_known(fn: Callable[..., Any]) -> None:
    cases = (
        (DRAWN, [0.0, 0.5, 0.999, 1.0, 3.999, 4.0, 7.99], [0, 0, 0, 2, 2, 3, 3], "the drawn tree [1, 0, 3, 4]"),
        ([2.5], [0.0, 1.2, 2.49], [0, 0, 0], "a tree of capacity 1"),
        ([0.0, 3.0], [0.0, 2.9], [1, 1], "leaves [0, 3]"),
        ([3.0, 0.0], [0.0, 2.99], [0, 0], "leaves [3, 0]"),
        ([1.0, 1.0], [0.5, 1.0, 1.5], [0, 1, 1], "leaves [1, 1]"),
    )
    for leaves, us, by_hand, label in cases:
        assert [naive_find(leaves, u) for u in us] == by_hand, label  # the statement's items
        _st_compare(fn, leaves, us, label)


def random_leaves(rng: np.random.Generator, capacity: int) -> NDArray[np.float64]:
    """Multiples of 1/8 (every sum exact in float64), with runs of zeros; a positive total."""
    leaves = rng.integers(0, 40, size=capacity) / 8.0
    leaves[rng.random(capacity) < 0.3] = 0.0
    if capacity >= 4:
        start = int(rng.integers(0, capacity - 2))
        leaves[start : start + 3] = 0.0  # a run of empty items
    if leaves.sum() == 0:
        leaves[int(rng.integers(0, capacity))] = 1.0
    return leaves


def _probe_points(leaves: NDArray[np.float64], rng: np.random.Generator, n_random: int) -> list[float]:
    """u = 0, random u, every boundary between items (each prefix sum), and just below the total."""
    total = float(leaves.sum())
    bounds = sorted({float(c) for c in np.cumsum(leaves) if c < total})
    return [0.0, *(float(u) for u in rng.uniform(0, total, n_random)), *bounds, float(np.nextafter(total, 0.0))]


#: Large trees for the read count: a scan over their leaves reads hundreds of nodes per draw.
READ_CAPACITIES = (1024, 16384)


@check_case(
    "a draw reads the tree node by node, at most 2 log2(capacity) + 1 nodes (capacity 1024 and 16384): "
    "a linear scan over the leaves fails",
    time_limit=30.0,
)
def _st_reads(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(2)
    for capacity in READ_CAPACITIES:
        leaves = random_leaves(rng, capacity)
        total = float(leaves.sum())
        us = [float(np.nextafter(total, 0.0)), total / 2, *(float(u) for u in rng.uniform(0, total, 6)), 0.0]
        _st_compare(fn, leaves, us, f"a random tree of capacity {capacity}")


@check_case("random trees up to capacity 64 against np.searchsorted(np.cumsum(leaves), u): random u, every boundary")
def _st_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for trial in range(28):
        capacity = 2 ** (trial % 7)
        leaves = random_leaves(rng, capacity)
        label = f"random tree {trial} of capacity {capacity}"
        _st_compare(fn, leaves, _probe_points(leaves, rng, 12), label)


@check_case("items of priority zero are never drawn, at any boundary or edge")
def _st_zeros(fn: Callable[..., Any]) -> None:
    cases = (
        [0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        [0.0] * 15 + [2.0],
        [3.0] + [0.0] * 7,
        [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
    )
    rng = np.random.default_rng(1)
    for k, leaves in enumerate(cases):
        _st_compare(fn, leaves, _probe_points(np.asarray(leaves), rng, 6), f"sparse tree {k} of capacity {len(leaves)}")


#: (06.7) with alpha = 1/2: the leaves hold p^alpha; 1000 stratified draws u_k = (k + 1/2) total / 1000
#: fall in each item's slice exactly N p^alpha / sum p^alpha times.
PRIORITIES = [4.0, 1.0, 0.0, 9.0, 2.25, 0.0, 16.0, 1.0]
ALPHA, DRAWS = 0.5, 1000


@check_case("stratified draws: each item's count is proportional to its leaf p_i^alpha (06.7)")
def _st_frequencies(fn: Callable[..., Any]) -> None:
    leaves = np.asarray(PRIORITIES) ** ALPHA
    tree, total = build_tree(leaves), float(leaves.sum())
    us = [(k + 0.5) * total / DRAWS for k in range(DRAWS)]
    drawn = _st_answers(fn, tree, us)
    counts = np.bincount([j for j in drawn if 0 <= j < len(leaves)], minlength=len(leaves))
    expected = DRAWS * leaves / total  # exactly [160, 80, 0, 240, 120, 0, 320, 80]
    for j in range(len(leaves)):
        if abs(counts[j] - expected[j]) > 1:
            fail(
                f"{DRAWS} stratified draws from leaves p^alpha = {leaves.tolist()} drew item {j} {counts[j]} times; "
                f"(06.7) gives N P({j}) = {fmt_number(expected[j])}"
            )


SUMTREE_FIND = Exercise(
    name=ST,
    points=15,
    title="the sum-tree descent that samples prioritized replay in O(log N) reads (eq. 06.7)",
    checks=(_st_known, _st_reads, _st_oracle, _st_zeros, _st_frequencies),
    hints=(
        "Descend from the root: at each internal node go left if u falls within the left child's total, otherwise go "
        "right with u reduced by the total you skipped.",
        "In the array layout node i's children are 2i and 2i + 1, the root is 1, and the leaves fill the upper half "
        "of the array (from index `len(tree) // 2` on). Loop while the node is internal; once it is a leaf, convert "
        "its tree index to a data index.",
        "Compare `u` strictly with the left child's sum (with `<`, a u equal to it goes right, past an empty left "
        "subtree), subtract that sum before moving right, and return the leaf's position among the leaves (its tree "
        "index minus the number of leaves). Traps: comparing with the node's own sum, and moving right without "
        "subtracting.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: importance_weights, eq. 06.8
# ---------------------------------------------------------------------------------------

IW = "importance_weights"
IW_ARGS = ("probabilities", "n_stored", "beta")
IW_RTOL, IW_ATOL = 1e-5, 1e-6  # float32 (the learner's jnp) against float64


def naive_weights(
    probabilities: Any,
    n_stored: Any,
    beta: Any,
    normalize: bool = True,
    *,
    n_factor: str = "times",
    sign: float = -1.0,
    whole: bool = True,
    norm: str = "max",
) -> NDArray[np.float64]:
    """(06.8) in float64, one weight at a time: ``w_i = (N P(i))^(-beta)``, divided by the
    batch's largest ``w_j`` when ``normalize``. Switches for known slips: ``n_factor`` is
    ``"times"`` (N P), ``"none"`` (P alone), ``"divide"`` (P / N) or ``"batch"`` (K P, the batch size for N); ``sign=+1`` raises to
    ``+beta``; ``whole=False`` applies the power to P only (``N * P ** -beta``); ``norm`` is
    ``"max"``, ``"mean"``, ``"sum"``, ``"min"``, ``"none"`` (normalize ignored) or ``"always"``
    (divided by the max even when ``normalize`` is False)."""
    p = np.asarray(probabilities, dtype=np.float64)
    n, b = float(np.asarray(n_stored)), float(np.asarray(beta))
    factor = {"times": n, "none": 1.0, "divide": 1.0 / n, "batch": float(p.size)}[n_factor]
    w = np.array([factor * q ** (sign * b) if not whole else (factor * q) ** (sign * b) for q in p.ravel()])
    w = w.reshape(p.shape)
    if norm == "always" or (normalize and norm == "max"):
        return w / w.max()
    if not normalize or norm == "none":
        return w
    return w / {"mean": w.mean(), "sum": w.sum(), "min": w.min()}[norm]


LARGEST = "(06.8) divides by the batch's largest weight, max_j w_j, so the largest is 1 and all are <= 1"
IW_SLIPS: dict[str, dict[str, Any]] = {
    "N is missing: the raw weight is (N P(i))^(-beta), which is 1 for every item under uniform sampling "
    "(P(i) = 1/N)": dict(n_factor="none"),
    "P(i) / N instead of N P(i): the raw weight is (N P(i))^(-beta), 1 under uniform sampling": dict(n_factor="divide"),
    "N is n_stored, the number of items in the buffer, not the batch size K: the raw weight (N P(i))^(-beta) "
    "compares P(i) with uniform sampling over the stored items": dict(n_factor="batch"),
    "beta has the wrong sign: w = (N P(i))^(-beta), so a likely item (large P) gets a small weight": dict(sign=1.0),
    "the power -beta applies to N P(i) as a whole: (N * P) ** -beta, not N * P ** -beta": dict(whole=False),
    f"the weights are divided by their mean; {LARGEST}": dict(norm="mean"),
    f"the weights are divided by their sum; {LARGEST}": dict(norm="sum"),
    f"the weights are divided by the smallest one; {LARGEST}": dict(norm="min"),
    f"the weights are not normalised: with normalize=True, {LARGEST}": dict(norm="none"),
    "normalize=False must return the raw weights (N P(i))^(-beta), not divided by their maximum": dict(norm="always"),
}


def _iw_text(args: tuple[Any, ...], normalize: bool) -> str:
    p, n, beta = args
    return f"{IW}(probabilities [{np.shape(p)[0]}], n_stored={n}, beta={fmt_number(np.asarray(beta).item())}, " + (
        "normalize=True)" if normalize else "normalize=False)"
    )


def _iw_call(
    fn: Callable[..., Any], args: tuple[Any, ...], normalize: bool, what: str = "", *, jit: bool = False
) -> NDArray[np.float64]:
    """The learner's weights (numpy inputs copied and checked unchanged) as float64 ``[K]``."""
    what = what or _iw_text(args, normalize)
    given = tuple(copy_input(a) for a in args)

    def weights(p: Any, n: Any, beta: Any) -> Any:
        return fn(p, n, beta) if normalize else fn(p, n, beta, normalize=False)

    weights.__name__ = IW
    out = _named_call(weights, what, *given, jit=jit)
    _assert_unchanged(IW, dict(zip(IW_ARGS, given)), dict(zip(IW_ARGS, args)), "compute a new array")
    arr = _as_float_array(out, what)
    k = int(np.shape(args[0])[0])
    if arr.shape != (k,):
        fail(f"{what} has shape {arr.shape}; expected ({k},), one weight per sampled item")
    return arr.astype(np.float64)


def _iw_compare(fn: Callable[..., Any], args: tuple[Any, ...], normalize: bool, what: str = "") -> None:
    what = what or _iw_text(args, normalize)
    got = _iw_call(fn, args, normalize, what)
    p, n, beta = args
    want = naive_weights(p, n, beta, normalize)
    index = _first_difference(got, want, IW_RTOL, IW_ATOL)
    if index is None:
        return
    mistakes = {
        message: (lambda s=slip: naive_weights(p, n, beta, normalize, **s)) for message, slip in IW_SLIPS.items()
    }
    fail_if_known_mistake(got, mistakes, expected=want, what=what, rtol=IW_RTOL, atol=IW_ATOL)
    fail(f"{what}: w = {fmt_number(got[index])}{_where(index)}; (06.8) gives {fmt_number(want[index])}")


#: The statement's batch: P = [1/2, 1/4, 1/8, 1/8] from N = 4 items, so N P = [2, 1, 1/2, 1/2].
IW_HAND = (np.array([0.5, 0.25, 0.125, 0.125]), 4)
#: (beta, raw weights, normalised weights), by hand
IW_HAND_WEIGHTS = (
    (0.5, [2**-0.5, 1.0, 2**0.5, 2**0.5], [0.5, 2**-0.5, 1.0, 1.0]),
    (1.0, [0.5, 1.0, 2.0, 2.0], [0.25, 0.5, 1.0, 1.0]),
)


@check_case(
    "hand-computed: P = [1/2, 1/4, 1/8, 1/8] of N = 4 at beta = 0.5 and 1, raw and normalised; uniform "
    "sampling weighs every item 1",
    time_limit=30.0,
)
def _iw_known(fn: Callable[..., Any]) -> None:
    p, n = IW_HAND
    for beta, raw, normalised in IW_HAND_WEIGHTS:
        for normalize, by_hand in ((False, raw), (True, normalised)):
            assert np.allclose(naive_weights(p, n, beta, normalize), by_hand)  # the statement's numbers
            _iw_compare(fn, (p, n, beta), normalize)
    uniform = (np.full(5, 1 / 8), 8, 0.7)
    for normalize in (False, True):
        got = _iw_call(fn, uniform, normalize)
        if not np.allclose(got, 1.0, rtol=IW_RTOL, atol=IW_ATOL):
            _iw_compare(fn, uniform, normalize)  # names a known slip
            fail(
                f"{_iw_text(uniform, normalize)} = {got.tolist()}: uniform sampling (P = 1/N) needs no correction, w = 1"
            )


def iw_batch(seed: int, n_items: int, k: int) -> tuple[NDArray[np.float64], int, float]:
    """The probabilities of ``k`` items drawn from a random prioritized buffer of ``n_items``, and a beta."""
    rng = np.random.default_rng(seed)
    p_alpha = rng.uniform(0.05, 3.0, n_items) ** 0.6
    probabilities = p_alpha / p_alpha.sum()
    drawn = rng.choice(n_items, size=k, p=probabilities)
    return probabilities[drawn], n_items, float(rng.uniform(0.4, 1.0))


@check_case("random batches against (06.8), raw and normalised: a float [K] result, inputs unchanged", time_limit=30.0)
def _iw_oracle(fn: Callable[..., Any]) -> None:
    for seed, n_items, k in ((0, 64, 32), (1, 1000, 256), (2, 5, 1), (3, 3, 7)):
        batch = iw_batch(seed, n_items, k)
        for normalize in (True, False):
            _iw_compare(fn, batch, normalize)
        got = _iw_call(fn, batch, True)
        if not math.isclose(float(got.max()), 1.0, rel_tol=1e-5) or (got > 1.0 + 1e-5).any():
            fail(f"{_iw_text(batch, True)}: the largest weight is {fmt_number(got.max())}; {LARGEST}")


@check_case(
    "beta = 1 undoes the sampling bias: sum_i P(i) w_i f_i over all N items equals their plain mean (raw weights)",
    time_limit=30.0,
)
def _iw_unbiased(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(4)
    n_items = 40
    p_alpha = rng.uniform(0.05, 3.0, n_items) ** 0.6
    probabilities = p_alpha / p_alpha.sum()
    values = rng.normal(size=n_items)  # any per-item quantity: a loss, a gradient entry
    args = (probabilities, n_items, 1.0)
    what = f"{IW}(the P(i) of all {n_items} items, n_stored={n_items}, beta=1, normalize=False)"
    w = _iw_call(fn, args, False, what)
    corrected, uniform = float(np.sum(probabilities * w * values)), float(values.mean())
    if not math.isclose(corrected, uniform, rel_tol=1e-4, abs_tol=1e-5):
        _iw_compare(fn, args, False, what)  # names a known slip
        fail(
            f"{what}: the expectation under P of w f is {fmt_number(corrected)}, not the uniform mean "
            f"{fmt_number(uniform)}: with beta = 1, w_i = 1 / (N P(i)) cancels P(i)"
        )
    beta0 = _iw_call(fn, (probabilities, n_items, 0.0), False)
    if not np.allclose(beta0, 1.0, rtol=IW_RTOL, atol=IW_ATOL):
        fail(f"{_iw_text((probabilities, n_items, 0.0), False)}: beta = 0 corrects nothing, every w = 1")


@check_case(
    "under jax.jit with a traced beta and a traced int32 n_stored (the buffer's size): the same weights",
    time_limit=30.0,
)
def _iw_jit(fn: Callable[..., Any]) -> None:
    import jax.numpy as jnp

    p, n, beta = iw_batch(5, 200, 64)
    jax_args = (jnp.asarray(p, dtype=jnp.float32), jnp.int32(n), jnp.float32(beta))
    for normalize in (True, False):
        what = f"{IW} under jax.jit (normalize={normalize})"
        got = _iw_call(fn, jax_args, normalize, what, jit=True)
        want = naive_weights(np.asarray(jax_args[0], dtype=np.float64), n, float(jax_args[2]), normalize)
        index = _first_difference(got, want, 1e-4, IW_ATOL)
        if index is not None:
            fail(f"{what}: w = {fmt_number(got[index])}{_where(index)}; (06.8) gives {fmt_number(want[index])}")


IMPORTANCE_WEIGHTS = Exercise(
    name=IW,
    compiled=True,
    points=10,
    title="prioritized replay's importance weights, raw and normalised by the batch's largest (eq. 06.8)",
    checks=(_iw_known, _iw_oracle, _iw_unbiased, _iw_jit),
    hints=(
        "The raw weight is (N P(i))^(-beta): 1 when P(i) = 1/N, larger for items drawn less often than uniform.",
        "First the raw weights of all K sampled items, in one array expression; then, only if `normalize`, divide "
        "them all by the largest of them, so that the biggest weight is 1.",
        "Bracket the product before the power (`**` binds tighter than `*` and than a unary minus), and take the "
        "largest weight with `jnp.max`, which works under `jax.jit` where Python's `max` does not.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: soft_bellman_target, eq. 06.2
# ---------------------------------------------------------------------------------------

SB = "soft_bellman_target"
SB_ARGS = ("reward", "done", "q1_next", "q2_next", "logp_next", "alpha", "gamma")
SB_RTOL, SB_ATOL = 1e-5, 1e-4


def naive_target(
    reward: Any,
    done: Any,
    q1_next: Any,
    q2_next: Any,
    logp_next: Any,
    alpha: float,
    gamma: float,
    *,
    twin: str = "min",
    entropy_sign: float = -1.0,
    mask: str = "future",
    entropy_inside: bool = True,
    discount: bool = True,
) -> NDArray[np.float64]:
    """(06.2) one transition at a time. Switches for known slips: ``twin`` is ``"min"``,
    ``"max"``, ``"mean"``, ``"q1"`` or ``"q2"``; ``entropy_sign=+1``; ``mask`` is ``"future"``,
    ``"none"``, ``"all"`` (reward masked too) or ``"inverted"`` (``d`` for ``1 - d``);
    ``entropy_inside=False`` adds ``- alpha logp`` outside the discount and the mask;
    ``discount=False`` drops gamma."""
    cols = [np.asarray(a, dtype=np.float64) for a in (reward, done, q1_next, q2_next, logp_next)]
    n = len(cols[0])
    out = np.zeros(n)
    pick: dict[str, Callable[[float, float], float]] = {
        "min": min,
        "max": max,
        "mean": lambda a, b: (a + b) / 2,
        "q1": lambda a, b: a,
        "q2": lambda a, b: b,
    }
    g = gamma if discount else 1.0
    for b in range(n):
        r, d, q1, q2, logp = (float(c[b]) for c in cols)
        q = pick[twin](q1, q2)
        keep = {"future": 1.0 - d, "all": 1.0 - d, "none": 1.0, "inverted": d}[mask]
        entropy = entropy_sign * alpha * logp
        y = r + g * keep * (q + entropy) if entropy_inside else r + g * keep * q + entropy
        out[b] = (1.0 - d) * (r + g * (q + entropy)) if mask == "all" else y
    return out


MIN = "(06.2) takes the minimum of the two target critics (it fights overestimation)"
SB_SLIPS: dict[str, dict[str, Any]] = {
    f"the twin target is the maximum of the critics; {MIN}": dict(twin="max"),
    f"the twin target is the mean of the critics; {MIN}": dict(twin="mean"),
    f"only q1_next is used; {MIN}": dict(twin="q1"),
    f"only q2_next is used; {MIN}": dict(twin="q2"),
    "the entropy term has the wrong sign: - alpha * logp_next (a likely action, high log-probability, lowers the "
    "target)": dict(entropy_sign=1.0),
    "done is ignored: a terminated transition has no future to bootstrap, its target is r": dict(mask="none"),
    "(1 - done) multiplies the reward too: a terminated transition's target is its reward r": dict(mask="all"),
    "the mask is inverted: multiply the future by (1 - done), not by done": dict(mask="inverted"),
    "the entropy term sits outside the discount and the mask: it is part of the soft value of s', "
    "r + gamma (1 - d) (min Q - alpha logp)": dict(entropy_inside=False),
    "gamma is missing: the future is discounted, r + gamma (1 - d) (min Q - alpha logp)": dict(discount=False),
}


def _sb_text(args: tuple[Any, ...]) -> str:
    parts = []
    for name, a in zip(SB_ARGS, args):
        arr = np.asarray(a)
        parts.append(fmt_number(arr.item()) if arr.ndim == 0 else f"{name} [{arr.shape[0]}]")
    return f"{SB}({', '.join(parts)})"


def _sb_result(out: Any, what: str, n: int) -> NDArray[np.float64]:
    arr = _as_float_array(out, what)
    if arr.shape != (n,):
        fail(f"{what} has shape {arr.shape}; expected ({n},), one target per transition")
    return arr.astype(np.float64)


def _sb_call(fn: Callable[..., Any], args: tuple[Any, ...], what: str = "", *, jit: bool = False) -> NDArray[Any]:
    what = what or _sb_text(args)
    given = tuple(copy_input(a) for a in args)
    out = _named_call(fn, what, *given, jit=jit)
    _assert_unchanged(SB, dict(zip(SB_ARGS, given)), dict(zip(SB_ARGS, args)), "compute a new array")
    return _sb_result(out, what, int(np.shape(args[0])[0]))


def _sb_compare(fn: Callable[..., Any], args: tuple[Any, ...], what: str = "", *, jit: bool = False) -> None:
    what = what or _sb_text(args)
    got = _sb_call(fn, args, what, jit=jit)
    want = naive_target(*args)
    index = _first_difference(got, want, SB_RTOL, SB_ATOL)
    if index is None:
        return
    mistakes = {message: (lambda s=slip: naive_target(*args, **s)) for message, slip in SB_SLIPS.items()}
    fail_if_known_mistake(got, mistakes, expected=want, what=what, rtol=SB_RTOL, atol=SB_ATOL)
    fail(f"{what}: y = {fmt_number(got[index])}{_where(index)}; (06.2) gives {fmt_number(want[index])}")


def sb_batch(seed: int, n: int, p_done: float = 0.3) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return (
        rng.normal(0, 1, n),
        (rng.random(n) < p_done).astype(np.float64),
        rng.normal(0, 10, n),
        rng.normal(0, 10, n),
        rng.normal(-1, 2, n),
        float(rng.uniform(0.01, 1.0)),
        float(rng.choice([0.9, 0.99])),
    )


SB_HAND = (
    np.array([1.0, 0.0, -1.0, 2.0]),
    np.array([0.0, 0.0, 1.0, 0.0]),
    np.array([2.0, 5.0, 9.0, -1.0]),
    np.array([3.0, 4.0, 9.0, -2.0]),
    np.array([-1.0, 0.5, 3.0, -0.2]),
    0.2,
    0.9,
)


@check_case("hand-computed targets: 2.98, 3.51, -1.0 (terminated), 0.236", time_limit=30.0)
def _sb_known(fn: Callable[..., Any]) -> None:
    assert np.allclose(naive_target(*SB_HAND), [2.98, 3.51, -1.0, 0.236])  # the statement's numbers
    _sb_compare(fn, SB_HAND)
    _sb_compare(fn, (np.array([0.5]), np.array([0.0]), np.array([4.0]), np.array([6.0]), np.array([-2.0]), 0.0, 0.5))


@check_case(
    "random batches against (06.2) one transition at a time: a float [B] result, inputs unchanged", time_limit=30.0
)
def _sb_oracle(fn: Callable[..., Any]) -> None:
    for seed, n in ((0, 64), (1, 1), (2, 9)):
        _sb_compare(fn, sb_batch(seed, n))


@check_case("a terminated transition's target is its reward, whatever the critics and the policy say", time_limit=30.0)
def _sb_terminal(fn: Callable[..., Any]) -> None:
    r, _, q1, q2, logp, alpha, gamma = sb_batch(3, 8)
    q1, q2 = q1 * 100, q2 * 100  # large, so a leak of the future shows
    got = _sb_call(fn, (r, np.ones(8), q1, q2, logp, alpha, gamma), f"{SB} with done = 1 everywhere")
    index = _first_difference(got, r, SB_RTOL, SB_ATOL)
    if index is not None:
        fail(
            f"{SB} with done = 1: y = {fmt_number(got[index])}{_where(index)}, not the reward "
            f"{fmt_number(r[index])}: a terminated transition has no future to bootstrap"
        )
    _sb_compare(fn, (r, (np.arange(8) % 2).astype(np.float64), q1, q2, logp, alpha, gamma))


@check_case("the twin minimum and the entropy term move y as (06.2) says", time_limit=30.0)
def _sb_properties(fn: Callable[..., Any]) -> None:
    r, _, q1, q2, logp, alpha, gamma = sb_batch(4, 16)
    done = np.zeros(16)
    base = _sb_call(fn, (r, done, q1, q2, logp, alpha, gamma))
    what = f"{SB} on 16 live transitions"
    swapped = _sb_call(fn, (r, done, q2, q1, logp, alpha, gamma))
    if not np.allclose(swapped, base, rtol=SB_RTOL, atol=SB_ATOL):
        fail(f"{what}: swapping q1_next and q2_next changed y; {MIN}, which is symmetric")
    hi, lo = np.maximum(q1, q2), np.minimum(q1, q2)
    raised = _sb_call(fn, (r, done, lo, hi + 5.0, logp, alpha, gamma))
    if not np.allclose(raised, base, rtol=SB_RTOL, atol=SB_ATOL):
        fail(f"{what}: raising the larger critic by 5 changed y; {MIN}: only the smaller one counts")
    lowered = _sb_call(fn, (r, done, lo - 5.0, hi, logp, alpha, gamma))
    if not np.allclose(base - lowered, 5.0 * gamma, rtol=1e-4, atol=1e-3):
        fail(f"{what}: lowering the smaller critic by 5 should lower y by gamma * 5 = {fmt_number(5 * gamma)}")
    likelier = _sb_call(fn, (r, done, q1, q2, logp + 1.0, alpha, gamma))
    if not np.allclose(base - likelier, gamma * alpha, rtol=1e-4, atol=1e-3):
        fail(
            f"{what}: raising log pi(a'|s') by 1 should lower y by gamma * alpha = {fmt_number(gamma * alpha)} "
            "(the entropy bonus - alpha logp, discounted with the value of s')"
        )


@check_case("under jax.jit with JAX arrays and a traced alpha: the same float targets", time_limit=30.0)
def _sb_jit(fn: Callable[..., Any]) -> None:
    import jax.numpy as jnp

    batch = sb_batch(5, 12)
    jax_batch = (*(jnp.asarray(a, dtype=jnp.float32) for a in batch[:5]), jnp.float32(batch[5]), batch[6])
    got = _sb_call(fn, jax_batch, f"{SB} under jax.jit", jit=True)
    r, d, q1, q2, logp, alpha = (np.asarray(a, dtype=np.float64) for a in jax_batch[:6])
    want = naive_target(r, d, q1, q2, logp, float(alpha), batch[6])
    index = _first_difference(got, want, SB_RTOL, SB_ATOL)
    if index is not None:
        fail(f"{SB} under jax.jit: y = {fmt_number(got[index])}{_where(index)}; (06.2) gives {fmt_number(want[index])}")


SOFT_BELLMAN_TARGET = Exercise(
    name=SB,
    compiled=True,
    points=10,
    title="SAC's soft Bellman target with twin target critics (eq. 06.2)",
    checks=(_sb_known, _sb_oracle, _sb_terminal, _sb_properties, _sb_jit),
    hints=(
        "Build the soft value of s' first, the smaller critic minus alpha * logp_next; then discount and mask it.",
        "jnp.minimum(q1_next, q2_next) is elementwise; Python's min is not.",
        "Mask the future with `1 - done`: a terminal transition's target is its reward alone. Traps: discounting or "
        "masking only the Q term and not the entropy term (the whole soft value is discounted), and adding alpha "
        "times the log-probability where the soft value subtracts it.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 5: sumtree_update, the batched write-back of priorities
# ---------------------------------------------------------------------------------------

SU = "sumtree_update"
#: Index 0 of the trees the checks pass: unused, so any value; a level past the root changes it.
SU_GARBAGE = -3.0


def float32_tree(leaves: Any, garbage: float = SU_GARBAGE) -> NDArray[np.float32]:
    """The layout of exercise 2 in float32, every internal node the float32 sum of its children."""
    leaf = np.asarray(leaves, dtype=np.float32)
    capacity = len(leaf)
    tree = np.zeros(2 * capacity, dtype=np.float32)
    tree[capacity:] = leaf
    _resum(tree)
    tree[0] = garbage
    return tree


def _resum(tree: NDArray[np.float32]) -> None:
    """Every internal node of ``tree`` set, in place, to the float32 sum of its two children,
    one level at a time from the leaves' parents up (the same sums as node by node)."""
    width = len(tree) // 4
    while width >= 1:
        tree[width : 2 * width] = tree[2 * width : 4 * width : 2] + tree[2 * width + 1 : 4 * width : 2]
        width //= 2


def naive_update(
    tree: Any, indices: Any, values: Any, *, winner: str = "last", parents: str = "sum", levels: int | None = None
) -> NDArray[np.float32]:
    """The oracle: the entries written one at a time (so the last of a repeated index wins),
    then every internal node re-added from its children, bottom up, in float32.

    The switches compute known slips, as a CPU runs them (a scatter's repeated index keeps
    its last value there): ``winner="first"``; ``parents="delta_set"`` (each entry sets its
    ancestors to their old value plus its leaf's change) or ``"delta_add"`` (adds the change:
    every entry's, repeated ones too); ``levels``, the number of levels repaired above the
    leaves (``None``: all; one more than the depth writes index 0)."""
    out = np.array(tree, dtype=np.float32)
    idx = np.asarray(indices, dtype=np.int64)
    val = np.asarray(values, dtype=np.float32)
    capacity = len(out) // 2
    depth = capacity.bit_length() - 1
    nodes = capacity + idx
    delta = (val - out[nodes]).astype(np.float32)  # each entry's change, from the tree it was given
    order = range(len(idx) - 1, -1, -1) if winner == "first" else range(len(idx))
    for k in order:
        out[nodes[k]] = val[k]
    if parents == "sum" and levels is None:
        _resum(out)  # the whole tree: untouched nodes come out as they were
        return out
    for _ in range(depth if levels is None else levels):
        nodes = nodes // 2
        if parents == "delta_set":
            moved = out[nodes] + delta  # all from the tree before this level's write
            for k in range(len(idx)):
                out[nodes[k]] = moved[k]
        elif parents == "delta_add":
            np.add.at(out, nodes, delta)
        else:
            out[nodes] = out[2 * nodes] + out[2 * nodes + 1]
    return out


SUM_OF_CHILDREN = "set every parent to the sum of its two children, read after the level below is written"
SU_SLIPS: dict[str, dict[str, Any]] = {
    "a repeated index kept its first value; the last write wins (the later entry of indices)": dict(winner="first"),
    "a parent moved by its child's change: where two written leaves share a parent (and all share the root) only "
    f"one change survives the .set; {SUM_OF_CHILDREN}": dict(parents="delta_set"),
    "the ancestors were moved by the leaves' changes with .add: a repeated index adds its change twice (and the "
    f"sums drift in float32); {SUM_OF_CHILDREN}": dict(parents="delta_add"),
    f"the ancestors were not updated: after writing the leaves, {SUM_OF_CHILDREN}, up to the root": dict(levels=0),
}


def _su_level_slips(capacity: int) -> dict[str, dict[str, Any]]:
    depth = capacity.bit_length() - 1
    slips = dict(SU_SLIPS)
    if depth >= 2:
        slips[
            f"the repair stopped one level short of the root: a tree of capacity {capacity} has log2(capacity) = "
            f"{depth} levels above the leaves"
        ] = dict(levels=depth - 1)
    return slips


def _su_text(capacity: int, k: int) -> str:
    return f"{SU}(a tree of capacity {capacity}, {k} indices)"


def _su_jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``jax.jit`` of the learner's function, made once per check (one compile per shape)."""
    import jax

    return jax.jit(fn)


def _su_call(update: Callable[..., Any], tree: Any, indices: Any, values: Any, what: str) -> NDArray[np.float32]:
    """The new tree from ``update`` (the learner's function under ``jax.jit``), as a float32
    numpy array of the tree's shape."""
    import jax.numpy as jnp

    out = _named_call(
        update,
        what,
        jnp.asarray(tree, dtype=jnp.float32),
        jnp.asarray(indices, dtype=jnp.int32),
        jnp.asarray(values, dtype=jnp.float32),
    )
    arr = _as_float_array(out, what)
    if arr.shape != np.shape(tree):
        fail(f"{what} returned shape {arr.shape}; expected the tree's {np.shape(tree)}, a new tree")
    return arr.astype(np.float32)


def _su_compare(update: Callable[..., Any], tree: Any, indices: Any, values: Any, label: str = "") -> None:
    """``update`` (the learner's function under ``jax.jit``) against the oracle, slips named."""
    what = label or _su_text(len(tree) // 2, len(indices))
    _su_judge(_su_call(update, tree, indices, values, what), tree, indices, values, what)


def _su_judge(got: NDArray[np.float32], tree: Any, indices: Any, values: Any, what: str) -> None:
    """The learner's new tree ``got`` against the oracle; a known slip is named."""
    capacity = len(tree) // 2
    want = naive_update(tree, indices, values)
    if got[0] != np.float32(tree[0]):
        fail(
            f"{what} changed index 0 (from {fmt_number(tree[0])} to {fmt_number(got[0])}): the repair went one "
            f"level past the root; a tree of capacity {capacity} has log2(capacity) = {capacity.bit_length() - 1} "
            "levels above the leaves, and index 0 is unused"
        )
    if np.allclose(got, want, rtol=1e-6, atol=1e-6):
        return
    mistakes = {
        m: (lambda s=slip: naive_update(tree, indices, values, **s)) for m, slip in _su_level_slips(capacity).items()
    }
    fail_if_known_mistake(got, mistakes, expected=want, what=what, rtol=1e-6, atol=1e-6)
    bad = int(np.flatnonzero(~np.isclose(got, want, rtol=1e-6, atol=1e-6))[0])
    where = f"leaf {bad} (item {bad - capacity})" if bad >= capacity else f"internal node {bad}"
    fail(
        f"{what}: {where} holds {fmt_number(got[bad])}; expected {fmt_number(want[bad])} (leaves: the last write "
        "of each index; internal nodes: the sum of their children)"
    )


#: The tree drawn in the statement: leaves [1, 0, 3, 4]; (indices, values, the new tree [1:] by hand),
#: three entries each (one compiled program)
SU_HAND: tuple[tuple[list[int], list[float], list[float]], ...] = (
    ([3, 0, 3], [1.0, 6.0, 2.0], [11.0, 6.0, 5.0, 6.0, 0.0, 3.0, 2.0]),  # item 3: its last write, 2
    ([0, 1, 2], [2.0, 2.0, 3.0], [11.0, 4.0, 7.0, 2.0, 2.0, 3.0, 4.0]),  # siblings: their parent sums both
    ([2, 2, 2], [5.0, 7.0, 0.0], [5.0, 1.0, 4.0, 1.0, 0.0, 0.0, 4.0]),  # a leaf written three times, to zero last
    ([1, 1, 1], [5.0, 0.5, 9.0], [17.0, 10.0, 7.0, 1.0, 9.0, 3.0, 4.0]),  # an empty leaf written three times
)


@check_case(
    "hand-computed: the statement's tree [1, 0, 3, 4] with a repeated index, two siblings, three writes of one item",
    time_limit=60.0,
)
def _su_known(fn: Callable[..., Any]) -> None:
    tree, update = float32_tree(DRAWN), _su_jit(fn)
    for indices, values, by_hand in SU_HAND:
        assert naive_update(tree, indices, values)[1:].tolist() == by_hand, indices  # the statement's numbers
        _su_compare(update, tree, indices, values, f"{SU}(the tree [1, 0, 3, 4], {indices}, {values})")


def su_batch(rng: np.random.Generator, capacity: int, k: int) -> tuple[NDArray[np.int32], NDArray[np.float32]]:
    """``k`` indices drawn with replacement from a few items (so they repeat), values in eighths."""
    pool = rng.choice(capacity, size=min(capacity, max(1, k // 2)), replace=False)
    indices = rng.choice(pool, size=k).astype(np.int32)
    return indices, (rng.integers(0, 40, size=k) / 8.0).astype(np.float32)


#: (capacity, K) of the random checks: few shapes, few compiles
SU_SHAPES = ((1, 3), (2, 5), (8, 12), (64, 24))


@check_case(
    "random trees of capacity 1 to 64, batches full of repeated indices, against the writes done one at a time",
    time_limit=60.0,
)
def _su_oracle(fn: Callable[..., Any]) -> None:
    rng, update = np.random.default_rng(0), _su_jit(fn)
    for trial in range(12):
        capacity, k = SU_SHAPES[trial % len(SU_SHAPES)]
        tree = float32_tree(random_leaves(rng, capacity))
        _su_compare(update, tree, *su_batch(rng, capacity, k), f"{_su_text(capacity, k)} (random tree {trial})")


@check_case(
    "200 batches of float32 priorities in a row: every internal node still exactly the sum of its children",
    time_limit=60.0,
)
def _su_exact(fn: Callable[..., Any]) -> None:
    import jax.numpy as jnp

    capacity, k, rounds = 128, 16, 200
    rng = np.random.default_rng(1)
    tree = jnp.asarray(float32_tree(rng.uniform(0.1, 2.0, capacity)))
    what = f"200 calls of jax.jit({SU}) on a tree of capacity {capacity}, {k} random priorities each"
    update = _su_jit(fn)
    internal = np.arange(1, capacity)
    for r in range(rounds):
        indices = jnp.asarray(rng.integers(0, capacity, size=k), dtype=jnp.int32)
        values = jnp.asarray(rng.uniform(0.01, 3.0, size=k), dtype=jnp.float32)
        tree = _named_call(update, what, tree, indices, values)
        if r % 20 == 19 or r == rounds - 1:
            got = _as_float_array(tree, what).astype(np.float32)
            sums = got[2 * internal] + got[2 * internal + 1]
            off = np.flatnonzero(got[internal] != sums)
            if off.size:
                i = int(internal[off[0]])
                fail(
                    f"{what}: after {r + 1} calls node {i} holds {fmt_number(got[i])}, not the float32 sum of its "
                    f"children, {fmt_number(sums[off[0]])}; {SUM_OF_CHILDREN} (a change added to the old sum drifts)"
                )


# The program, run one operation at a time -----------------------------------------------

#: Primitives that write into an array (the tree's writes are counted, the scatters inspected).
WRITES = frozenset({"scatter", "scatter-add", "scatter-mul", "scatter-min", "scatter-max", "dynamic_update_slice"})
#: Primitives that only move or relabel an array: never "work on the whole tree".
MOVES = frozenset({"copy", "copy_p", "device_put", "convert_element_type", "optimization_barrier"})
#: Primitives that read only the elements they select from the tree (as many as they return).
SELECTS = frozenset({"gather", "slice", "dynamic_slice"})


class TreeProgramProbe:
    """What one call of the learner's program does to a tree of ``size`` nodes, seen one
    primitive at a time: the writes into arrays of the tree's shape, the elements of the tree
    read and written (``touched``: a gather or slice of the tree reads what it returns, any
    other primitive given the tree reads all of it, a write writes its update), the other
    primitives whose result has at least ``whole`` elements (work that grows with the
    capacity), and the first scatter that gives one node two different values."""

    def __init__(self, size: int, whole: int) -> None:
        self.size, self.whole = size, whole
        self.writes = 0
        self.touched = 0
        self.big: list[str] = []
        self.conflict: tuple[int, float, float] | None = None

    def observe(self, eqn: Any, invals: list[Any]) -> None:
        name = eqn.primitive.name
        if name in WRITES:
            if np.shape(invals[0]) == (self.size,):
                self.writes += 1
                self.touched += int(np.size(invals[1 if name == "dynamic_update_slice" else 2]))
                if name == "scatter" and self.conflict is None:
                    self.conflict = _scatter_conflict(eqn, invals, self.size)
            return
        if name in MOVES:
            return
        if any(np.shape(v) == (self.size,) for v in invals):
            if name in SELECTS and np.shape(invals[0]) == (self.size,):
                self.touched += sum(math.prod(getattr(var.aval, "shape", ())) for var in eqn.outvars)
            else:
                self.touched += self.size
        for var in eqn.outvars:
            if math.prod(getattr(var.aval, "shape", ())) >= self.whole and name not in self.big:
                self.big.append(name)


def _scatter_conflict(eqn: Any, invals: list[Any], size: int) -> tuple[int, float, float] | None:
    """The first node that a 1-d scatter writes twice with different values (out-of-range
    indices are dropped, as ``mode="drop"`` does), or None."""
    indices, updates = np.asarray(invals[1]), np.asarray(invals[2], dtype=np.float64)
    if indices.ndim < 1 or indices.shape[-1] != 1 or updates.shape != indices.shape[:-1]:
        return None
    nodes = indices[..., 0].ravel()
    if "CLIP" in str(eqn.params.get("mode", "")):
        nodes = np.clip(nodes, 0, size - 1)
    seen: dict[int, float] = {}
    for node, value in zip(nodes.tolist(), updates.ravel().tolist()):
        if 0 <= node < size:
            if node in seen and seen[node] != value:
                return node, seen[node], value
            seen[node] = value
    return None


def _closed(sub: Any) -> tuple[Any, list[Any]]:
    from jax.extend import core as jcore

    return (sub.jaxpr, list(sub.consts)) if isinstance(sub, jcore.ClosedJaxpr) else (sub, [])


def run_jaxpr(jaxpr: Any, consts: list[Any], args: list[Any], probe: TreeProgramProbe) -> list[Any]:
    """Evaluate ``jaxpr`` one primitive at a time (loops and nested programs entered, so every
    write of every iteration is seen), reporting each primitive to ``probe``."""
    from jax.extend import core as jcore

    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return var.val if isinstance(var, jcore.Literal) else env[var]

    for var, value in (*zip(jaxpr.constvars, consts), *zip(jaxpr.invars, args)):
        env[var] = value
    for eqn in jaxpr.eqns:
        for var, value in zip(eqn.outvars, _run_eqn(eqn, [read(v) for v in eqn.invars], probe)):
            env[var] = value
    return [read(var) for var in jaxpr.outvars]


def _run_eqn(eqn: Any, invals: list[Any], probe: TreeProgramProbe) -> list[Any]:
    import jax.numpy as jnp
    from jax.extend import core as jcore

    name, params = eqn.primitive.name, eqn.params
    if name == "scan":
        body, consts = _closed(params["jaxpr"])
        n_consts, n_carry, length = params["num_consts"], params["num_carry"], params["length"]
        fixed, carry, xs = invals[:n_consts], invals[n_consts : n_consts + n_carry], invals[n_consts + n_carry :]
        ys: dict[int, list[Any]] = {}
        for i in range(length - 1, -1, -1) if params["reverse"] else range(length):
            out = run_jaxpr(body, consts, [*fixed, *carry, *(x[i] for x in xs)], probe)
            carry, ys[i] = out[:n_carry], out[n_carry:]
        stacked = [
            jnp.stack([ys[i][j] for i in range(length)]) if length else jnp.zeros(var.aval.shape, var.aval.dtype)
            for j, var in enumerate(eqn.outvars[n_carry:])
        ]
        return [*carry, *stacked]
    if name == "while":
        cond, cond_consts = _closed(params["cond_jaxpr"])
        body, body_consts = _closed(params["body_jaxpr"])
        nc, nb = params["cond_nconsts"], params["body_nconsts"]
        cc, bc, carry = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]
        while bool(run_jaxpr(cond, cond_consts, [*cc, *carry], probe)[0]):
            carry = run_jaxpr(body, body_consts, [*bc, *carry], probe)
        return list(carry)
    if name == "cond":
        branches = params["branches"]
        sub, consts = _closed(branches[min(max(int(invals[0]), 0), len(branches) - 1)])
        return run_jaxpr(sub, consts, invals[1:], probe)
    for key in ("jaxpr", "call_jaxpr"):  # jit, custom_jvp_call, checkpoint, ...
        inner = params.get(key)
        if isinstance(inner, jcore.ClosedJaxpr | jcore.Jaxpr):
            sub, consts = _closed(inner)
            return run_jaxpr(sub, consts, invals, probe)
    probe.observe(eqn, invals)
    out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


#: The program's probes: trees of 16384 and 1048576 leaves, K = 32 written indices (two repeated).
PROBE_CAPACITY, PROBE_WIDE, PROBE_K = 16384, 1 << 20, 32
#: The elements of the tree one call may read and write, per entry and level: the write-back
#: touches about 3 (two children read, one parent written), K (log2(capacity) + 1) in all.
SU_TOUCH_FACTOR = 8
#: The elements one more level above the leaves may add (about 3 K: the probes' growth per level).
SU_GROWTH_FACTOR = 6


def _su_probe(fn: Callable[..., Any], capacity: int) -> tuple[TreeProgramProbe, str]:
    """One call of ``fn`` on a random tree of ``capacity`` leaves, traced as ``jax.jit`` traces
    it and run op by op (its answer judged), and what the probe saw."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(2)
    k = PROBE_K
    tree = float32_tree(random_leaves(rng, capacity))
    indices = rng.choice(capacity, size=k, replace=False).astype(np.int32)
    indices[[7, 19]] = indices[[3, 11]]  # two repeated indices, with different values
    values = (rng.integers(1, 40, size=k) / 8.0).astype(np.float32)
    values[[7, 19]] = values[[3, 11]] + 1.0
    what = f"{SU}(capacity {capacity}, K = {k})"
    args = (jnp.asarray(tree), jnp.asarray(indices), jnp.asarray(values))
    closed = _named_call(jax.make_jaxpr(fn), what, *args)  # traced as jax.jit traces it, then run op by op
    probe = TreeProgramProbe(2 * capacity, whole=capacity // 2)
    outs = run_jaxpr(closed.jaxpr, list(closed.consts), list(args), probe)
    if len(outs) != 1:
        fail(f"{what} returned {len(outs)} arrays; expected one, the new tree")
    got = _as_float_array(outs[0], what)
    if got.shape != tree.shape:
        fail(f"{what} returned shape {got.shape}; expected the tree's {tree.shape}, a new tree")
    _su_judge(got.astype(np.float32), tree, indices, values, what)
    return probe, what


def _su_touch_limit(capacity: int, k: int = PROBE_K) -> int:
    """The most elements of the tree one call may read and write: 8 K (log2(capacity) + 1)."""
    return SU_TOUCH_FACTOR * k * capacity.bit_length()


@check_case(
    "the program, run op by op (capacity 16384 and 1048576, K = 32): log2(capacity) + 1 writes into the tree "
    "whatever K, at most 8 K (log2(capacity) + 1) elements of the tree read and written, at most 6 K more "
    "per level between the two (not growing with the capacity), no other work the size of the tree, no node given two values at once",
    time_limit=120.0,
)
def _su_program(fn: Callable[..., Any]) -> None:
    probe, what = _su_probe(fn, PROBE_CAPACITY)
    _su_program_limits(probe, what, PROBE_CAPACITY)
    wide, wide_what = _su_probe(fn, PROBE_WIDE)
    _su_program_limits(wide, wide_what, PROBE_WIDE)
    k, levels = PROBE_K, PROBE_WIDE.bit_length() - PROBE_CAPACITY.bit_length()
    growth = SU_GROWTH_FACTOR * k * levels
    if wide.touched - probe.touched > growth:
        fail(
            f"{SU} reads and writes {probe.touched} elements of a tree of capacity {PROBE_CAPACITY} and "
            f"{wide.touched} of one of capacity {PROBE_WIDE} (K = {k} both times): the work grows with the capacity "
            f"(the levels of a fixed fraction of the capacity rebuilt densely); {levels} more levels should add "
            f"about 3 K = {3 * k} elements each, as the K leaves' ancestors do (at most {SU_GROWTH_FACTOR} K each, "
            f"{growth} in all)"
        )


def _su_program_limits(probe: TreeProgramProbe, what: str, capacity: int) -> None:
    """The writes, the elements touched, the work the size of the tree and the conflicting
    writes that ``probe`` saw in one call on a tree of ``capacity`` leaves."""
    k, depth = PROBE_K, capacity.bit_length() - 1
    limit = 2 * (depth + 1)
    if probe.writes > limit:
        fail(
            f"{what} writes into the tree {probe.writes} times: a loop over the K entries, the CPU path "
            f"(K (log2 capacity + 1) = {k * (depth + 1)} writes); write all K leaves at once, then one level of "
            f"parents at a time: log2(capacity) + 1 = {depth + 1} writes whatever K (at most {limit})"
        )
    if probe.big:
        fail(
            f"{what} computes {', '.join(probe.big[:3])} on {capacity // 2}+ elements: work that grows with the "
            "capacity (a rebuild of every node, or a mask, count or copy of the whole tree); touch only the K "
            "leaves and their ancestors, O(K log capacity)"
        )
    touch_limit = _su_touch_limit(capacity)
    if probe.touched > touch_limit:
        fail(
            f"{what} reads and writes {probe.touched} elements of the tree: work that grows with the capacity (a "
            "level, or several, rebuilt densely with slices, or a reduction over the tree); touch only the K leaves "
            f"and their ancestors: each level reads the two children of at most K parents and writes those parents, "
            f"about 3 K log2(capacity) = {3 * k * depth} elements (at most {touch_limit}, O(K log capacity))"
        )
    if probe.conflict is not None:
        node, first, second = probe.conflict
        fail(
            f"{what}: one scatter writes node {node} twice, with {fmt_number(first)} and {fmt_number(second)}: a "
            "repeated index left to the scatter, which keeps an unspecified one of them (on a GPU it varies; on "
            "this CPU the last, by chance); decide which entry is the last of its index and write only that one"
        )


SUMTREE_UPDATE = Exercise(
    name=SU,
    compiled=True,
    points=15,
    title="the batched write of priorities into the sum tree: last write wins, parents re-added level by level",
    checks=(_su_known, _su_program, _su_oracle, _su_exact),
    hints=(
        "Two steps. First write the leaves, once each, with the last value given for each index. Then, from the "
        "leaves' parents up to the root, one level at a time, give every ancestor of a written leaf the sum of its "
        "two children.",
        "Entry k loses when a later entry has the same index: compare every index with every other in one [K, K] "
        "array (or sort the indices with a stable argsort), and send the losers' node index out of range so that a "
        'scatter with `mode="drop"` skips them.',
        "The tree's depth is `capacity.bit_length() - 1` levels above the leaves; at each, halve the node indices "
        "(integer division) and set those nodes from a gather of their children. A parent written twice in one "
        "level gets the same sum both times, so repeats are harmless there. Traps: updating a parent by its "
        "child's change, and one level too many (index 0 is unused).",
    ),
)

EXERCISES: tuple[Exercise, ...] = (BICYCLE_STEP, SUMTREE_FIND, IMPORTANCE_WEIGHTS, SOFT_BELLMAN_TARGET, SUMTREE_UPDATE)
