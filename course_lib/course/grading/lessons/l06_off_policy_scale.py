"""Lesson 06's graded exercises: the kinematic bicycle step of the driving simulator, the
sum-tree descent of prioritized replay, prioritized replay's importance weights, SAC's soft
Bellman target, and the Polyak update of the target networks.

The learner writes:

* ``bicycle_step(x, y, psi, v, accel, steer, l_f, l_r, dt, v_max) -> (x', y', psi', v')``  (eq. 06.1)
* ``sumtree_find(tree, u) -> j``  (the descent that samples eq. 06.7)
* ``importance_weights(probabilities, n_stored, beta, normalize=True) -> w [K]``  (eq. 06.8)
* ``soft_bellman_target(reward, done, q1_next, q2_next, logp_next, alpha, gamma) -> y [B]``  (eq. 06.2)
* ``polyak_update(target, online, tau) -> pytree``  (eq. 06.6)

The checks never call ``course_lib.envs``, ``course_lib.offpolicy.replay`` or ``course_lib.offpolicy.sac``.
The oracles: (06.1) evaluated one car at a time with ``math`` in float64, and a circle whose
closure depends only on the yaw rate; a cumulative sum and ``np.searchsorted`` for the
sum tree (its leaves are multiples of 1/8, so every sum is exact and boundaries can be hit
exactly), and stratified draws whose counts are known in advance; (06.8) one weight at a
time in float64, and the unbiasedness it buys at beta = 1; (06.2) written out one
transition at a time; a recursive walk over dicts, lists and tuples for the Polyak update,
and the closed form ``(1 - tau)^n`` of its repeated application. Each oracle takes keyword
switches that compute a known slip, so a wrong answer that matches one is named.

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
    points=15,
    title="one explicit Euler step of the kinematic bicycle model, elementwise (eq. 06.1)",
    checks=(_bs_known, _bs_circle, _bs_oracle, _bs_shapes),
    hints=(
        "beta first, then one line per row of (06.1), each computed from the arguments (the old state), never "
        "from a value just updated",
        "beta = jnp.arctan(l_r / (l_f + l_r) * jnp.tan(steer)); move along psi + beta; turn by "
        "v / l_r * jnp.sin(beta) * dt",
        "v_new = jnp.clip(v + accel * dt, 0.0, v_max): elementwise, where Python's min/max fail on arrays",
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
        "capacity = len(tree) // 2; start at the root i = 1 and loop while i < capacity (the internal nodes)",
        "left = 2 * i; if u < tree[left]: i = left; else: u -= tree[left]; i = left + 1",
        "the loop ends at a leaf's tree index i in [capacity, 2 * capacity): return i - capacity",
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
    ``"times"`` (N P), ``"none"`` (P alone) or ``"divide"`` (P / N); ``sign=+1`` raises to
    ``+beta``; ``whole=False`` applies the power to P only (``N * P ** -beta``); ``norm`` is
    ``"max"``, ``"mean"``, ``"sum"``, ``"min"``, ``"none"`` (normalize ignored) or ``"always"``
    (divided by the max even when ``normalize`` is False)."""
    p = np.asarray(probabilities, dtype=np.float64)
    n, b = float(np.asarray(n_stored)), float(np.asarray(beta))
    factor = {"times": n, "none": 1.0, "divide": 1.0 / n}[n_factor]
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
    points=10,
    title="prioritized replay's importance weights, raw and normalised by the batch's largest (eq. 06.8)",
    checks=(_iw_known, _iw_oracle, _iw_unbiased, _iw_jit),
    hints=(
        "the raw weight is (N P(i))^(-beta): 1 when P(i) = 1/N, larger for items drawn less often than uniform",
        "w = (n_stored * probabilities) ** (-beta), with brackets: ** binds tighter than *",
        "if normalize: w = w / jnp.max(w); return w (jnp.max is the batch's largest weight, also under jax.jit)",
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
    points=10,
    title="SAC's soft Bellman target with twin target critics (eq. 06.2)",
    checks=(_sb_known, _sb_oracle, _sb_terminal, _sb_properties, _sb_jit),
    hints=(
        "build the soft value of s' first, the smaller critic minus alpha * logp_next; then discount and mask it",
        "jnp.minimum(q1_next, q2_next) is elementwise; Python's min is not",
        "return reward + gamma * (1.0 - done) * (jnp.minimum(q1_next, q2_next) - alpha * logp_next)",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 5: polyak_update, eq. 06.6
# ---------------------------------------------------------------------------------------

PU = "polyak_update"
PU_RTOL, PU_ATOL = 1e-5, 1e-6


def naive_leaves(tree: Any) -> list[NDArray[np.float64]]:
    """The leaves of a pytree of dicts (keys sorted, as JAX orders them), lists and tuples."""
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree) for leaf in naive_leaves(tree[key])]
    if isinstance(tree, list | tuple):
        return [leaf for item in tree for leaf in naive_leaves(item)]
    return [np.asarray(tree, dtype=np.float64)]


def naive_polyak(target: Any, online: Any, tau: float, *, slip: str = "") -> list[NDArray[np.float64]]:
    """(06.6) on each pair of leaves. ``slip``: ``"swapped"`` (tau and 1 - tau), ``"hard"`` (a copy
    of online), ``"first"`` (only the first leaf updated), ``"no_one_minus"`` (target + tau online)."""
    out = []
    for k, (t, o) in enumerate(zip(naive_leaves(target), naive_leaves(online))):
        if slip == "swapped":
            out.append((1 - tau) * o + tau * t)
        elif slip == "hard":
            out.append(o.copy())
        elif slip == "first" and k > 0:
            out.append(t.copy())
        elif slip == "no_one_minus":
            out.append(t + tau * o)
        else:
            out.append(tau * o + (1 - tau) * t)
    return out


PU_SLIPS = {
    "tau and 1 - tau are swapped (or the target and the online trees): the target moves a fraction tau toward "
    "the online parameters, tau * online + (1 - tau) * target": "swapped",
    "the result is the online parameters: a hard copy; (06.6) moves the target only a fraction tau": "hard",
    "only the first leaf is updated: map over every leaf (jax.tree.map)": "first",
    "the target is not scaled by (1 - tau): tau * online + (1 - tau) * target": "no_one_minus",
}


def _pu_text(tau: Any) -> str:
    return f"{PU}(target, online, tau={fmt_number(np.asarray(tau).item())})"


def _deep_copy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _deep_copy(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_deep_copy(v) for v in tree)
    return np.array(tree, copy=True) if isinstance(tree, np.ndarray) else tree


def _pu_call(fn: Callable[..., Any], target: Any, online: Any, tau: Any, what: str) -> list[NDArray[np.float64]]:
    """Call the learner on copies; require unchanged inputs and the target's structure; return the leaves."""
    given_target, given_online = _deep_copy(target), _deep_copy(online)
    try:
        out = _named_call(fn, what, given_target, given_online, tau)
    except LearnerError as exc:
        if isinstance(exc.error, TypeError | KeyError | AttributeError | IndexError) and _nested(target):
            fail(
                f"{what} raised {type(exc.error).__name__} on a nested pytree (dicts of lists of dicts): "
                "map over every leaf, wherever it sits (jax.tree.map)"
            )
        raise
    for name, given, before in (("target", given_target, target), ("online", given_online, online)):
        if not all(np.array_equal(a, b) for a, b in zip(naive_leaves(given), naive_leaves(before))):
            fail(f"{what} changed the {name} parameters it was given (an in-place *= or +=); build new arrays")
    return _pu_leaves(out, target, what)


def _nested(tree: Any) -> bool:
    return isinstance(tree, dict) and any(isinstance(v, dict | list | tuple) for v in tree.values())


def _pu_leaves(out: Any, target: Any, what: str) -> list[NDArray[np.float64]]:
    import jax

    if out is None:
        fail(f"{what} is None; did you forget to `return` the new target?")
    want, got = jax.tree.structure(target), jax.tree.structure(out)
    if str(got) != str(want):
        fail(f"{what} returned a pytree of structure {got}; expected the target's, {want}")
    leaves = []
    for k, (leaf, ref) in enumerate(zip(jax.tree.leaves(out), jax.tree.leaves(target))):
        arr = _as_float_array(leaf, f"{what}: leaf {k}")
        if arr.shape != np.shape(ref):
            fail(f"{what}: leaf {k} has shape {arr.shape}; expected {np.shape(ref)}, the target leaf's")
        leaves.append(arr.astype(np.float64))
    return leaves


def _leaf_paths(tree: Any) -> list[str]:
    import jax

    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _pu_compare(fn: Callable[..., Any], target: Any, online: Any, tau: float, what: str = "") -> None:
    what = what or _pu_text(tau)
    got = _pu_call(fn, target, online, tau, what)
    want = naive_polyak(target, online, tau)
    if all(np.allclose(g, w, rtol=PU_RTOL, atol=PU_ATOL) for g, w in zip(got, want)):
        return
    flat_got = np.concatenate([g.ravel() for g in got])
    mistakes = {
        message: (lambda s=slip: np.concatenate([w.ravel() for w in naive_polyak(target, online, tau, slip=s)]))
        for message, slip in PU_SLIPS.items()
    }
    fail_if_known_mistake(
        flat_got,
        mistakes,
        expected=np.concatenate([w.ravel() for w in want]),
        what=what,
        rtol=PU_RTOL,
        atol=PU_ATOL,
    )
    paths = _leaf_paths(target)
    for path, g, w in zip(paths, got, want):
        if not np.allclose(g, w, rtol=PU_RTOL, atol=PU_ATOL):
            bad = tuple(int(i) for i in np.argwhere(~np.isclose(g, w, rtol=PU_RTOL, atol=PU_ATOL))[0])
            fail(f"{what}: the leaf {path} holds {fmt_number(g[bad])}{_where(bad)}; (06.6) gives {fmt_number(w[bad])}")


def _flat_params() -> tuple[dict[str, NDArray[np.float64]], dict[str, NDArray[np.float64]]]:
    return {"w": np.array([0.0, 10.0]), "b": np.array(4.0)}, {"w": np.array([10.0, 0.0]), "b": np.array(2.0)}


@check_case(
    "hand-computed: tau = 0.1 gives w = [1, 9], b = 3.8; tau = 0 keeps the target, tau = 1 copies online",
    time_limit=30.0,
)
def _pu_known(fn: Callable[..., Any]) -> None:
    target, online = _flat_params()
    assert np.allclose(np.concatenate([w.ravel() for w in naive_polyak(target, online, 0.1)]), [3.8, 1.0, 9.0])
    _pu_compare(fn, target, online, 0.1)
    for tau, same_as in ((0.0, "the target"), (1.0, "the online parameters")):
        got = _pu_call(fn, target, online, tau, _pu_text(tau))
        want = naive_leaves(target if tau == 0.0 else online)
        if not all(np.allclose(g, w, rtol=PU_RTOL, atol=PU_ATOL) for g, w in zip(got, want)):
            fail(f"{_pu_text(tau)} should return {same_as}: (06.6) with tau = {fmt_number(tau)}")


def random_params(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two pytrees of the same structure: dicts of lists of dicts, a tuple, a 0-d leaf."""
    rng = np.random.default_rng(seed)

    def params() -> dict[str, Any]:
        def dense(n_in: int, n_out: int) -> dict[str, NDArray[np.float64]]:
            return {"w": rng.normal(size=(n_in, n_out)), "b": rng.normal(size=n_out)}

        return {
            "actor": {"dense_0": dense(4, 3), "log_std": rng.normal(size=2)},
            "critics": [{"dense_0": dense(5, 3), "out": dense(3, 1)}, {"dense_0": dense(5, 3), "out": dense(3, 1)}],
            "log_alpha": np.asarray(rng.normal()),
            "norm": (rng.normal(size=3), rng.normal(size=3)),
        }

    return params(), params()


@check_case(
    "random nested pytrees against a recursive (06.6): the same structure, both inputs unchanged", time_limit=30.0
)
def _pu_oracle(fn: Callable[..., Any]) -> None:
    for seed, tau in ((0, 0.005), (1, 0.3), (2, 0.9)):
        target, online = random_params(seed)
        _pu_compare(fn, target, online, tau, f"{_pu_text(tau)} on nested dicts, lists and tuples")


@check_case("60 updates under jax.jit with a traced tau close the gap by exactly (1 - tau)^60", time_limit=30.0)
def _pu_converges(fn: Callable[..., Any]) -> None:
    import jax
    import jax.numpy as jnp

    tau, steps = 0.05, 60
    target0, online0 = random_params(3)
    target = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float32), target0)
    online = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float32), online0)
    what = f"{steps} updates of jax.jit({PU})(target, online, tau={tau})"
    for _ in range(steps):
        target = _named_call(fn, what, target, online, jnp.float32(tau), jit=True)
        _pu_leaves(target, target0, what)
    got = _pu_leaves(target, target0, what)
    shrink = (1 - tau) ** steps
    for path, g, t0, o in zip(_leaf_paths(target0), got, naive_leaves(target0), naive_leaves(online0)):
        want = o + shrink * (t0 - o)
        if not np.allclose(g, want, rtol=1e-4, atol=1e-5):
            k = int(np.argmax(np.abs(g - want)))
            ratio = (g.ravel()[k] - o.ravel()[k]) / (t0.ravel()[k] - o.ravel()[k])
            fail(
                f"{what}: the leaf {path}'s gap to the online parameters shrank by a factor {fmt_number(ratio)}; "
                f"(06.6) shrinks it by (1 - tau)^{steps} = {fmt_number(shrink)}"
            )


POLYAK_UPDATE = Exercise(
    name=PU,
    points=10,
    title="the Polyak update of the target networks, leaf by leaf over a pytree (eq. 06.6)",
    checks=(_pu_known, _pu_oracle, _pu_converges),
    hints=(
        "one line: jax.tree.map with a function of two leaves, over target and online",
        "the function is lambda t, o: tau * o + (1 - tau) * t, with t from target and o from online (in the order "
        "you pass the trees)",
        "return jax.tree.map(lambda t, o: tau * o + (1 - tau) * t, target, online); no *= or +=, which change a "
        "numpy leaf in place",
    ),
)

EXERCISES: tuple[Exercise, ...] = (BICYCLE_STEP, SUMTREE_FIND, IMPORTANCE_WEIGHTS, SOFT_BELLMAN_TARGET, POLYAK_UPDATE)
