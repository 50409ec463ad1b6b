"""Lesson 05's graded exercises: where arrays live on a mesh, a ring all-reduce from
``ppermute``, the data-parallel gradient, and gradient accumulation.

The learner writes:

* ``partition_specs(mesh) -> {"obs", "w1", "b1", "w2", "b2": PartitionSpec}``: a batch
  split over ``"data"``; an MLP replicated, or column- then row-parallel over ``"model"``
* ``ring_allreduce(x, axis_name, axis_size) -> x summed over the axis``, from
  ``jax.lax.ppermute`` only, inside ``jax.shard_map``
* ``data_parallel_grad(loss_fn, params, batch, axis_name) -> grads``: the gradient of the
  global-mean loss inside ``jax.shard_map(..., check_vma=False)``
* ``accumulate_grads(loss_fn, params, batch, n_micro) -> grads``: the mean of the
  micro-batches' gradients by one ``lax.scan``
* ``remat_segments(layer, params, x, k) -> h``: a deep network's layers scanned in
  segments of ``k``, each segment under ``jax.checkpoint`` (Chen et al. 2016's
  ``sqrt(n)`` rematerialisation)

What each exercise teaches, and how its checks observe it:

* ``partition_specs``, mechanism: a layout is a spec per array axis (batch over "data", Megatron's column- then
  row-parallel over "model"); observed: every device's shard after ``jax.device_put`` on 1-D and 2-D meshes.
* ``ring_allreduce``, mechanism: reduce-scatter then all-gather of n chunks, each step one ``ppermute`` to a
  neighbour (2 (n - 1) / n of the array sent); observed: values against ``psum``, the jaxpr's collectives (only
  ring ``ppermute``s), the elements each device sends, no host callback.
* ``data_parallel_grad``, mechanism: each device differentiates its own shard, only the gradient crosses, by one
  all-reduce (the mean, 05.2); observed: every device's result against one device's full-batch gradient, three
  SGD steps, a dependency walk of every collective's operands in the jaxpr, no host callback.
* ``accumulate_grads``, mechanism: contiguous micro-batches run by one ``lax.scan`` whose carry is the running
  sum of their gradients (05.3), one micro-batch's activations alive at a time; observed: the full-batch
  gradient, a per-micro-batch normalised loss, the scan's length, carry and stacked outputs in the jaxpr, the
  loss's gradient (its matrix products) inside the scan's step, no host callback, a ValueError naming both sizes.
* ``remat_segments``, mechanism: ``jax.checkpoint`` around each scanned segment of k layers (scans, not Python
  loops); observed: output and gradient, XLA's planned temp memory, the checkpoints and their matrix products
  in the jaxpr, the program's size against the depth and k, no host callback, a ValueError naming both sizes.

The oracles share no code with the solutions: the placement of every shard is computed
from the mesh's device grid with numpy slices and compared with what
``jax.device_put`` put on each device (``addressable_shards``); the all-reduce with
``jax.lax.psum`` and a numpy sum, and its planted slips with a numpy simulation of the
ring schedule the exercise states; the gradients with ``jax.grad`` over the whole batch
on one device (or over explicit contiguous slices). Structure is checked on the program
itself (``jax.make_jaxpr``): the ring holds only ``ppermute`` collectives, each one step
round the ring, sending ``2 (n - 1) / n`` of the array; accumulation is one ``scan``; in
the data-parallel gradient only gradient-shaped values cross devices, and only by a
reduction (:func:`collective_operands`, a walk of every collective's operand shapes and
dependencies, and :func:`moved_operands`: an ``all_gather`` of the batch gives the right
numbers but moves the data and splits no work, even when ``0 * params`` is added to it so
that it depends on the parameters too; and :func:`crossing_numbers`: the numbers sent per
call, each operand's size times the trips of the loops around it, at most twice the
gradient's, so scalar ``psum``s round a ``lax.map`` cannot gather the batch either); remat's checkpoints are counted with the matrix products inside each
(:func:`checkpointed_segments`), and its memory is read from XLA's buffer assignment of
the compiled gradient against the same network without remat (the oracle is a plain
``lax.scan`` of the layer; the library's ``remat`` module only builds the problem and
reads the memory).

Every check first refuses a function that is, wraps or calls course_lib's own answer
(anything from ``course_lib.scaling``: the lesson's ring, accumulation, DP gradient, remat),
by a static walk of its code, closures and wrappers
(:func:`course_lib.course.grading.helpers.library_references`); the message names the
library function and asks the learner to write it.

Multi-device runs (the test session and the exercise notebook have 4 CPU devices) obey
the lesson's rules: every program is compiled first and refused if it would run a LAPACK
call on several CPU devices (:func:`course_lib.scaling.devices.check_multidevice_safe`: the
deadlock of ``course_lib/scaling/devices.py``), then runs under
:func:`course_lib.runtime.watchdog.watchdog` and is blocked on, so a hang ends the
process with a clear message instead of hanging the grader. Parameters and data are made
with numpy, outside the programs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    Exercise,
    LearnerError,
    assert_allclose,
    assert_true,
    call,
    check_case,
    describe_type,
    fail,
)
from course_lib.course.grading.helpers import fail_if_known_mistake
from course_lib.course.grading.programs import refuse_host_callbacks

LESSON = "05_scaling_jax"
#: Devices the checks use at most (the notebook's first cell asks for this many).
N_DEVICES = 4
#: Seconds a multi-device program may run before the watchdog ends the process.
WATCHDOG_S = 60.0
#: Time limit of each check (``course grade`` caps it with ``--check-timeout``).
CHECK_S = 30.0
#: Closeness of float32 gradients to their float64-compared oracles.
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6
#: Where course_lib's own answers live (collectives, accumulation, ppo_dp, remat, ...); the
#: runner's guard refuses them (and the rest of course_lib) for every exercise.
LIBRARY = ("course_lib.scaling",)

# ---------------------------------------------------------------------------------------
# Helpers: meshes, running a multi-device program safely, walking a jaxpr
# ---------------------------------------------------------------------------------------


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """A mesh over the first ``prod(shape)`` devices; fails clearly when the process has fewer."""
    import jax

    need = int(np.prod(shape))
    have = jax.device_count()
    if have < need:
        fail(
            f"these checks need {need} JAX devices and this kernel has {have}: run the notebook's first cell "
            f"(use_cpu_devices({N_DEVICES})) before anything else touches JAX; restart the kernel if JAX already "
            "started"
        )
    return jax.make_mesh(shape, names, devices=jax.devices()[:need])


def _mesh_text(mesh: Any) -> str:
    """``a 2 x 2 ('data', 'model') mesh``, ``a 4-device ('data',) mesh``."""
    sizes = " x ".join(str(mesh.shape[a]) for a in mesh.axis_names)
    if len(mesh.axis_names) == 1:
        sizes += "-device"
    return f"a {sizes} {tuple(mesh.axis_names)} mesh"


def _learner_trace_error(exc: Exception, call_text: str) -> LearnerError:
    """The learner's code failed while JAX traced it; a Python ``if`` on a traced value is named."""
    import jax

    if isinstance(exc, jax.errors.ConcretizationTypeError | jax.errors.TracerBoolConversionError):
        fail(
            f"{call_text} fails under jax.jit: a Python `if`, `bool()`, `int()` or `float()` on a traced value "
            "(the device index from jax.lax.axis_index is traced too); index with it, or use jnp.where"
        )
    return LearnerError(exc, call_text)


def run_on_devices(prog: Any, args: tuple[Any, ...], what: str, call_text: str) -> Any:
    """Compile the jitted multi-device ``prog`` for ``args``, refuse LAPACK on several CPU
    devices, run it under the watchdog and block on the result.

    An exception while tracing or running is the learner's (a :class:`LearnerError`
    naming ``call_text``, so a stub reads "not implemented yet").
    """
    import jax

    from course_lib.runtime.watchdog import watchdog
    from course_lib.scaling.devices import MultiDeviceHazard, check_multidevice_safe

    try:
        compiled = check_multidevice_safe(prog, *args)
    except MultiDeviceHazard as exc:
        fail(f"{what}: {exc}")
        raise AssertionError("unreachable") from exc
    except Exception as exc:
        raise _learner_trace_error(exc, call_text) from exc
    with watchdog(WATCHDOG_S, what):
        try:
            return jax.block_until_ready(compiled(*args))
        except Exception as exc:
            raise LearnerError(exc, call_text) from exc


def _jaxpr(fn: Callable[..., Any], args: tuple[Any, ...], call_text: str) -> Any:
    """``jax.make_jaxpr(fn)(*args).jaxpr``; a failure while tracing is the learner's."""
    import jax

    try:
        return jax.make_jaxpr(fn)(*args).jaxpr
    except Exception as exc:
        raise _learner_trace_error(exc, call_text) from exc


def walk_eqns(jaxpr: Any, times: int = 1, in_while: bool = False) -> Iterator[tuple[Any, int, bool]]:
    """Every equation of ``jaxpr`` and of the programs nested in it (jit, shard_map, scan,
    while, cond, custom derivatives), with how many times it runs per call (a ``scan``
    multiplies by its length) and whether it sits in a ``while`` loop (count unknown)."""
    from jax.extend import core as jcore

    for eqn in jaxpr.eqns:
        yield eqn, times, in_while
        name = eqn.primitive.name
        inner_times = times * int(eqn.params.get("length", 1)) if name == "scan" else times
        inner_while = in_while or name == "while"
        for param in eqn.params.values():
            for sub in param if isinstance(param, list | tuple) else (param,):
                if isinstance(sub, jcore.ClosedJaxpr):
                    yield from walk_eqns(sub.jaxpr, inner_times, inner_while)
                elif isinstance(sub, jcore.Jaxpr):
                    yield from walk_eqns(sub, inner_times, inner_while)


def program_size(jaxpr: Any) -> int:
    """Equations in ``jaxpr`` and every program nested in it, each counted once however often
    it runs: a ``lax.scan`` keeps this fixed as its length grows, a Python loop (unrolled
    into the program) adds its body once per turn."""
    return sum(1 for _ in walk_eqns(jaxpr))


def raises_naming(fn: Callable[..., Any], *args: Any, text: str, numbers: tuple[int, int], no_error: str) -> None:
    """``fn(*args)`` must raise ``ValueError`` whose message names both ``numbers`` (the
    statements ask for an error that names both sizes, so the caller sees what to change);
    ``text`` is the call, ``no_error`` the message when it returns."""
    import re

    try:
        fn(*args)
    except ValueError as exc:
        missing = [n for n in numbers if not re.search(rf"(?<![\d.]){n}(?![\d.])", str(exc))]
        if missing:
            fail(
                f"{text} raised ValueError({str(exc)[:80]!r}), which does not name {' or '.join(map(str, missing))}: "
                f"name both sizes ({numbers[0]} and {numbers[1]}) so that the caller sees what to change"
            )
        return
    except NotImplementedError:
        raise
    except Exception as exc:
        fail(
            f"{text} raised {type(exc).__name__}; check the sizes first and raise ValueError naming both "
            f"({numbers[0]} and {numbers[1]})"
        )
    fail(no_error)


def _flat(tree: Any) -> NDArray[np.float64]:
    """Every leaf of a pytree, flattened and concatenated (float64)."""
    import jax

    leaves = jax.tree.leaves(tree)
    if not leaves:
        return np.zeros(0)
    return np.concatenate([np.asarray(leaf, np.float64).reshape(-1) for leaf in leaves])


# ---------------------------------------------------------------------------------------
# Exercise 1: partition_specs
# ---------------------------------------------------------------------------------------

PS = "partition_specs"
ARRAYS = ("obs", "w1", "b1", "w2", "b2")
#: Array shapes the placements are checked with: B = 8, D = 6, H = 8, A = 4.
SHAPES: dict[str, tuple[int, ...]] = {"obs": (8, 6), "w1": (6, 8), "b1": (8,), "w2": (8, 4), "b2": (4,)}


def canonical(spec: Any) -> tuple[Any, ...]:
    """A spec as a tuple, one-axis groups unwrapped and trailing ``None`` dropped, so
    ``P("data")``, ``P("data", None)`` and ``P(("data",), None)`` compare equal."""
    entries = [e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in tuple(spec)]
    entries = [tuple(e) if isinstance(e, list) else e for e in entries]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def spec_text(spec: tuple[Any, ...]) -> str:
    """A canonical spec written as code: ``P('data')``, ``P(None, 'model')``, ``P()``."""
    return f"P({', '.join(repr(e) for e in spec)})"


def expected_specs(axis_names: tuple[str, ...]) -> dict[str, tuple[Any, ...]]:
    """The layout of the exercise, canonical: the batch over "data"; parameters replicated,
    or column-parallel w1 (and b1) and row-parallel w2 over "model"."""
    if "model" in axis_names:
        return {"obs": ("data",), "w1": (None, "model"), "b1": ("model",), "w2": ("model",), "b2": ()}
    return {"obs": ("data",), "w1": (), "b1": (), "w2": (), "b2": ()}


def expected_blocks(mesh: Any, spec: tuple[Any, ...], shape: tuple[int, ...]) -> dict[int, tuple[slice, ...]]:
    """Which block of an array of ``shape`` each device holds under ``spec`` (canonical), from
    the mesh's device grid alone: array axis ``k`` split over mesh axes ``spec[k]`` (the
    first named varies slowest) is cut into equal parts, and the device at grid position
    ``c`` holds part ``c[spec[k]]`` of it."""
    names = tuple(mesh.axis_names)
    grid = np.asarray(mesh.devices)
    blocks: dict[int, tuple[slice, ...]] = {}
    for coords in np.ndindex(grid.shape):
        index = []
        for dim, size in enumerate(shape):
            entry = spec[dim] if dim < len(spec) else None
            axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
            parts, part = 1, 0
            for axis in axes:
                k = names.index(axis)
                parts, part = parts * grid.shape[k], part * grid.shape[k] + coords[k]
            step = size // parts
            index.append(slice(part * step, (part + 1) * step))
        device: Any = grid[coords]
        blocks[int(device.id)] = tuple(index)
    return blocks


def _slice_text(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    parts = [
        ":" if (s.start or 0) == 0 and s.stop in (None, n) else f"{s.start}:{s.stop}" for s, n in zip(index, shape)
    ]
    return f"[{', '.join(parts)}]"


def _ps_call(fn: Callable[..., Any], mesh: Any) -> dict[str, Any]:
    """The learner's specs for ``mesh``, checked for form: a dict of five PartitionSpecs."""
    from jax.sharding import NamedSharding, PartitionSpec

    out = call(fn, mesh)
    what = f"{PS}({_mesh_text(mesh)})"
    if not isinstance(out, Mapping):
        fail(
            f"{what} returned {type(out).__name__}; expected a dict {{'obs': P(...), 'w1': ..., 'b1': ..., 'w2': ..., 'b2': ...}}"
        )
    if set(out) != set(ARRAYS):
        fail(f"{what} has keys {sorted(map(str, out))}; expected exactly {list(ARRAYS)}")
    for name in ARRAYS:
        spec = out[name]
        if isinstance(spec, NamedSharding):
            fail(f"{what}['{name}'] is a NamedSharding; return the PartitionSpec alone (the mesh is given)")
        if not isinstance(spec, PartitionSpec):
            fail(
                f"{what}['{name}'] is {type(spec).__name__}; expected a jax.sharding.PartitionSpec, e.g. P('data', None)"
            )
    return dict(out)


def _ps_named_mistake(specs: dict[str, tuple[Any, ...]], axis_names: tuple[str, ...]) -> str | None:
    """The message for a known slip in the (canonical) ``specs``, or None."""
    two_d = "model" in axis_names
    obs = specs["obs"]
    if obs == ():
        return "obs is replicated: every device would compute on the whole batch; split its batch axis over 'data': P('data', None)"
    if obs[0] is None:
        return f"obs is {spec_text(obs)}: its features are split, not its batch axis (axis 0); P('data', None)"
    for name in ARRAYS[1:]:
        if any(e == "data" or (isinstance(e, tuple) and "data" in e) for e in specs[name]):
            return (
                f"{name} is split over 'data' ({spec_text(specs[name])}): in data parallelism every device holds the whole "
                "parameter, only the batch is split over 'data'"
            )
    if not two_d:
        return None
    if specs["w1"] == ("model",) and specs["w2"] == (None, "model"):
        return (
            "w1 and w2 are swapped: the first layer is column-parallel (w1: P(None, 'model'), its output columns "
            "split) and the second row-parallel (w2: P('model', None), its input rows split)"
        )
    if specs["w1"] == () or specs["w2"] == ():
        which = "w1" if specs["w1"] == () else "w2"
        return f"{which} is replicated on the ('data', 'model') mesh: split w1's columns and w2's rows over 'model'"
    if specs["w1"] == (None, "model") and specs["b1"] == ():
        return (
            "b1 is replicated but w1's output columns are split over 'model': each device adds the biases of its "
            "own hidden units, b1: P('model')"
        )
    if specs["b2"] != ():
        return "b2 is added once, after the row-parallel partial outputs are summed over 'model': replicate it, P()"
    return None


def _ps_check_placement(fn: Callable[..., Any], shape: tuple[int, ...], names: tuple[str, ...]) -> None:
    """Place every array with the learner's spec; each device must hold the block the layout gives it."""
    import jax
    from jax.sharding import NamedSharding

    from course_lib.runtime.watchdog import watchdog

    mesh = _mesh(shape, names)
    specs = _ps_call(fn, mesh)
    where = f"on {_mesh_text(mesh)}"
    canon = {k: canonical(v) for k, v in specs.items()}
    expected = expected_specs(names)
    for name in ARRAYS:
        full = np.arange(np.prod(SHAPES[name]), dtype=np.float32).reshape(SHAPES[name])
        try:
            sharding = NamedSharding(mesh, specs[name])
            with watchdog(WATCHDOG_S, f"placing {name} {where}"):
                placed = jax.block_until_ready(jax.device_put(full, sharding))
        except Exception as exc:
            text = " ".join(str(exc).split())[:120] or type(exc).__name__
            fail(f"{where}, {name} {SHAPES[name]} cannot be placed with {specs[name]}: {text}")
        blocks = expected_blocks(mesh, expected[name], SHAPES[name])
        for shard in sorted(placed.addressable_shards, key=lambda s: s.device.id):
            want = blocks[shard.device.id]
            got = np.asarray(shard.data)
            if got.shape != full[want].shape or not np.array_equal(got, full[want]):
                mistake = _ps_named_mistake(canon, names)
                if mistake is not None:
                    fail(f"{where}: {mistake}")
                held = _slice_text(tuple(shard.index), SHAPES[name])
                fail(
                    f"{where}, device {shard.device.id} holds {name}{held} (shape {got.shape}) under "
                    f"{specs[name]}; the layout gives it {name}{_slice_text(want, SHAPES[name])} "
                    f"(shape {full[want].shape})"
                )


@check_case("returns a dict of PartitionSpecs for obs, w1, b1, w2 and b2", time_limit=CHECK_S)
def _ps_form(fn: Callable[..., Any]) -> None:
    for shape, names in (((2,), ("data",)), ((2, 2), ("data", "model"))):
        _ps_call(fn, _mesh(shape, names))


@check_case("1-D meshes of 2 and 4 devices: each device holds its rows of obs and every parameter", time_limit=CHECK_S)
def _ps_data_parallel(fn: Callable[..., Any]) -> None:
    for n in (2, 4):
        _ps_check_placement(fn, (n,), ("data",))


@check_case(
    "2 x 2 and 1 x 4 meshes: obs by rows, w1 and b1 by columns, w2 by rows over 'model', b2 whole",
    time_limit=CHECK_S,
)
def _ps_tensor_parallel(fn: Callable[..., Any]) -> None:
    for shape in ((2, 2), (1, 4)):
        _ps_check_placement(fn, shape, ("data", "model"))


@check_case("the specs equal the layout's on every mesh, 1-device meshes too", time_limit=CHECK_S)
def _ps_equal(fn: Callable[..., Any]) -> None:
    for shape, names in (
        ((1,), ("data",)),
        ((4,), ("data",)),
        ((1, 1), ("data", "model")),
        ((2, 2), ("data", "model")),
    ):
        mesh = _mesh(shape, names)
        got = {k: canonical(v) for k, v in _ps_call(fn, mesh).items()}
        expected = expected_specs(names)
        for name in ARRAYS:
            if got[name] != expected[name]:
                mistake = _ps_named_mistake(got, names)
                fail(
                    f"on {_mesh_text(mesh)}: "
                    + (
                        mistake
                        or f"{name} is {spec_text(got[name])}; the layout is {spec_text(expected[name])} (whatever the axis sizes)"
                    )
                )


PARTITION_SPECS = Exercise(
    name=PS,
    points=10,
    title="PartitionSpecs: a batch split over 'data', an MLP replicated or column- then row-parallel over 'model'",
    checks=(_ps_form, _ps_data_parallel, _ps_tensor_parallel, _ps_equal),
    advice="returning jax.sharding.PartitionSpec objects you choose",
    hints=(
        'mesh.axis_names is ("data",) or ("data", "model"); branch on "model" in mesh.axis_names (a Python '
        "if on a static value is fine).",
        "A spec has one entry per array axis, from the first: the mesh axis that splits that array axis, or "
        "None where it stays whole; entries left off at the end count as None, so a spec with no entries is "
        "an array held whole on every device.",
        "On the 2-D mesh, ask of each weight: which of its two axes indexes the hidden units? That is the "
        'axis to split over "model" (it is not the same axis in w1 and w2). A bias is added to a layer\'s '
        'output: split it like that output if it is added before any sum over "model", keep it whole if it '
        "is added after.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: ring_allreduce
# ---------------------------------------------------------------------------------------

RA = "ring_allreduce"
#: Collectives other than ppermute: the ring must not use them (name prefixes of jaxpr primitives).
OTHER_COLLECTIVES = (
    "psum",
    "pmax",
    "pmin",
    "all_gather",
    "all_to_all",
    "reduce_scatter",
    "ragged_all_to_all",
    "pgather",
)


def ring_simulation(blocks: NDArray[Any], *, all_gather: bool = True, gather_adds: bool = False) -> NDArray[np.float64]:
    """The ring schedule of the exercise, one device after another in numpy.

    ``blocks[i]`` is device ``i``'s array (flattened), cut into ``n`` chunks. Reduce-scatter
    step ``s``: device ``j`` receives chunk ``(j - 1 - s) mod n`` of device ``j - 1`` and adds it
    to its own chunk ``(j - 1 - s) mod n``; all-gather step ``s``: device ``j`` replaces its
    chunk ``(j - s) mod n`` by device ``j - 1``'s. ``all_gather=False`` stops after the
    reduce-scatter and ``gather_adds=True`` adds in the all-gather, to name those slips.
    """
    n = blocks.shape[0]
    chunks = np.asarray(blocks, np.float64).reshape(n, n, -1).copy()
    for s in range(n - 1):
        sent = [chunks[i, (i - s) % n].copy() for i in range(n)]
        for j in range(n):
            chunks[j, (j - s - 1) % n] += sent[(j - 1) % n]
    for s in range(n - 1 if all_gather else 0):
        sent = [chunks[i, (i + 1 - s) % n].copy() for i in range(n)]
        for j in range(n):
            k = (j - s) % n
            chunks[j, k] = chunks[j, k] + sent[(j - 1) % n] if gather_adds else sent[(j - 1) % n]
    return chunks.reshape(n, -1)


#: (mesh shape, mesh axis names, the ring's axis, elements per device) of each case.
RING_CASES: dict[str, tuple[tuple[int, ...], tuple[str, ...], str, int]] = {
    "2 devices": ((2,), ("data",), "data", 6),
    "4 devices": ((4,), ("ring",), "ring", 12),
    "2 x 2 mesh": ((2, 2), ("data", "model"), "model", 8),
}


def _ra_setup(case: str, seed: int) -> tuple[Any, Any, str, int, NDArray[np.float32], Any]:
    """The mesh, the spec splitting one array over all its devices, the ring axis and size,
    the per-device blocks ``[devices, N]`` (device grid order) and the global array placed."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    shape, names, axis, local = RING_CASES[case]
    mesh = _mesh(shape, names)
    spec = P(names if len(names) > 1 else names[0])
    blocks = np.random.default_rng(seed).normal(size=(int(np.prod(shape)), local)).astype(np.float32)
    placed = jax.device_put(blocks.reshape(-1), NamedSharding(mesh, spec))
    return mesh, spec, axis, mesh.shape[axis], blocks, placed


def _ra_expected(blocks: NDArray[Any], shape: tuple[int, ...], axis_pos: int) -> NDArray[np.float64]:
    """Each device's block summed over the ring it belongs to (the devices that differ only
    in their position along the ring's mesh axis)."""
    grid = np.asarray(blocks, np.float64).reshape(shape + (-1,))
    return np.broadcast_to(grid.sum(axis=axis_pos, keepdims=True), grid.shape).reshape(blocks.shape)


def _ra_compare(fn: Callable[..., Any], case: str, seed: int) -> None:
    import jax

    shape, names, _, _ = RING_CASES[case]
    mesh, spec, axis, n, blocks, placed = _ra_setup(case, seed)

    def both(block: Any) -> tuple[Any, Any]:
        return fn(block, axis, n), jax.lax.psum(block, axis)

    prog = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=spec, out_specs=(spec, spec), check_vma=False))
    what = f"{RA} over '{axis}' on {_mesh_text(mesh)}"
    ring, summed = run_on_devices(prog, (placed,), what, f"{RA}(x of {blocks.shape[1]} elements, {axis!r}, {n})")
    got = np.asarray(ring, np.float64)
    if got.shape != (blocks.size,):
        fail(
            f"{what}: each device returned {got.size // len(blocks)} elements for an x of {blocks.shape[1]}; return x's shape"
        )
    got = got.reshape(blocks.shape)
    expected = _ra_expected(blocks, shape, names.index(axis))
    assert_allclose(
        np.asarray(summed, np.float64).reshape(blocks.shape),
        expected,
        what="jax.lax.psum (the oracle)",
        rtol=1e-5,
        atol=1e-5,
    )
    if np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        return
    if np.allclose(got, blocks, rtol=1e-6, atol=1e-6):
        fail(f"{what}: every device returned its own x unchanged; the ring must leave the sum over all devices on each")
    if len(shape) == 1:
        fail_if_known_mistake(
            got,
            {
                f"{what}: it stops after the reduce-scatter: then device i holds only chunk (i + 1) mod n of the "
                "sum; the all-gather's n - 1 steps must pass the finished chunks round the ring": lambda: (
                    ring_simulation(blocks, all_gather=False)
                ),
                f"{what}: the all-gather adds what it receives to a chunk that already holds a partial sum; there each "
                "device replaces (.at[k].set) its chunk with the finished one": lambda: ring_simulation(
                    blocks, gather_adds=True
                ),
            },
            expected=expected,
            rtol=1e-5,
            atol=1e-5,
        )
    close = np.isclose(got.reshape(len(blocks), n, -1), expected.reshape(len(blocks), n, -1), rtol=1e-5, atol=1e-5)
    chunks_ok: NDArray[np.bool_] = np.asarray(np.asarray(close, dtype=bool).all(axis=-1))
    if chunks_ok.any():
        device = int(np.flatnonzero(~chunks_ok.all(-1))[0])
        fail(
            f"{what}: device {device} holds the sum in chunks {np.flatnonzero(chunks_ok[device]).tolist()} of "
            f"{list(range(n))} only; after the reduce-scatter, the all-gather must give every device every chunk"
        )
    assert_allclose(got, expected, what=f"{what} (device by device)", rtol=1e-5, atol=1e-5)


def _ra_collectives(fn: Callable[..., Any], case: str) -> tuple[list[tuple[Any, int, bool]], list[str], str, int, int]:
    """The ppermutes (with how often each runs) and the other collectives in the program of
    ``fn`` on ``case``'s mesh, its axis, its size and the elements per device."""
    import jax

    mesh, spec, axis, n, blocks, placed = _ra_setup(case, 0)
    prog = jax.shard_map(lambda b: fn(b, axis, n), mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    jaxpr = _jaxpr(prog, (placed,), f"{RA}(x, {axis!r}, {n})")
    refuse_host_callbacks(jaxpr, RA)
    ppermutes, others = [], []
    for eqn, times, in_while in walk_eqns(jaxpr):
        name = eqn.primitive.name
        if name == "ppermute":
            ppermutes.append((eqn, times, in_while))
        elif name.startswith(OTHER_COLLECTIVES):
            others.append(name)
    return ppermutes, sorted(set(others)), axis, n, blocks.shape[1]


@check_case("matches jax.lax.psum on 2 devices (random data)", time_limit=CHECK_S)
def _ra_two(fn: Callable[..., Any]) -> None:
    _ra_compare(fn, "2 devices", seed=0)


@check_case("matches jax.lax.psum on 4 devices and on one axis of a 2 x 2 mesh", time_limit=CHECK_S)
def _ra_four(fn: Callable[..., Any]) -> None:
    _ra_compare(fn, "4 devices", seed=1)
    _ra_compare(fn, "2 x 2 mesh", seed=2)


@check_case("built from ppermute alone, each one step round the ring (no psum, no all_gather)", time_limit=CHECK_S)
def _ra_only_ppermute(fn: Callable[..., Any]) -> None:
    ppermutes, others, axis, n, _ = _ra_collectives(fn, "4 devices")
    if others:
        fail(
            f"{RA} uses {', '.join(others)}: build the all-reduce from jax.lax.ppermute only (reduce-scatter, then "
            "all-gather); psum, pmean and all_gather are what you are writing"
        )
    if not ppermutes:
        fail(
            f"{RA}'s program holds no ppermute: the devices never exchange anything; send chunks with jax.lax.ppermute"
        )
    ring = ({(j, (j + 1) % n) for j in range(n)}, {(j, (j - 1) % n) for j in range(n)})
    for eqn, _, _ in ppermutes:
        axes = tuple(eqn.params["axis_name"])
        if axes != (axis,):
            fail(f"{RA} calls ppermute over {axes}; the ring runs over the axis it is given, axis_name = {axis!r}")
        perm = {(int(a), int(b)) for a, b in eqn.params["perm"]}
        if perm not in ring:
            fail(
                f"{RA} calls ppermute with perm {sorted(perm)} on {n} devices: on a ring every device sends to its "
                f"neighbour, perm = [(j, (j + 1) % n) for j in range(n)]"
            )


@check_case("each device sends 2 (n - 1) / n of its array (a ring, not n - 1 whole copies)", time_limit=CHECK_S)
def _ra_volume(fn: Callable[..., Any]) -> None:
    ppermutes, _, _, n, size = _ra_collectives(fn, "4 devices")
    if any(in_while for _, _, in_while in ppermutes):
        fail(
            f"{RA} calls ppermute inside a while_loop, so the data it sends cannot be counted; loop over the "
            "n - 1 steps in Python (or lax.fori_loop with int bounds)"
        )
    sent = sum(times * sum(int(np.prod(v.aval.shape)) for v in eqn.invars) for eqn, times, _ in ppermutes)
    expected = 2 * (n - 1) * size // n
    assert_true(
        sent == expected,
        f"on {n} devices each device sends {sent} elements for an x of {size}; a ring all-reduce sends 2 (n - 1) / n "
        f"of it, {expected}: cut x into n chunks and send one chunk per step (n - 1 steps of reduce-scatter, n - 1 "
        "of all-gather)",
    )


RING_ALLREDUCE = Exercise(
    name=RA,
    compiled=True,
    points=15,
    title="an all-reduce from ppermute: reduce-scatter, then all-gather, round a ring",
    checks=(_ra_two, _ra_four, _ra_only_ppermute, _ra_volume),
    advice="from jax.lax.ppermute, jax.lax.axis_index and indexing",
    hints=(
        "Two phases of n - 1 steps each (n = axis_size), every step one ppermute in which each device sends one chunk "
        "to its right-hand neighbour (j to (j + 1) mod n): first a reduce-scatter, after which each device holds the "
        "complete sum of one chunk, then an all-gather, which passes the complete chunks on round the ring until "
        "every device holds all n of them.",
        "Cut `x` into n equal chunks on a new leading axis (a reshape) and find this device's position i with "
        "`jax.lax.axis_index`. At reduce-scatter step s, which chunk index does device i send, and which of its own "
        "chunks does the one arriving from device i - 1 belong to (what did device i - 1 send at that step)? Ask the "
        "same two questions of all-gather step s, knowing that device i starts it holding chunk (i + 1) mod n "
        "complete.",
        "The permutation is the list of (source, destination) pairs, one per device j, to j + 1 modulo n, passed to "
        "`jax.lax.ppermute` with one chunk per call. Update the chunks functionally with `.at[index]`: `.add` in the "
        "reduce-scatter, `.set` in the all-gather; reshape back to `x.shape` at the end. i is traced: index with it, "
        "modulo n, never branch on it; a Python `for` over the n - 1 steps is fine (n is static).",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: data_parallel_grad
# ---------------------------------------------------------------------------------------

DP = "data_parallel_grad"


def mlp_loss(params: Any, batch: Any) -> Any:
    """Mean squared error of a tanh MLP (dict parameters) on the batch it is given."""
    import jax.numpy as jnp

    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - batch["y"]) ** 2)


def softmax_loss(params: Any, batch: Any) -> Any:
    """Cross-entropy of a linear softmax classifier (tuple parameters ``(w, b)``)."""
    import jax
    import jax.numpy as jnp

    w, b = params
    logp = jax.nn.log_softmax(batch[0] @ w + b)
    return -jnp.mean(jnp.take_along_axis(logp, batch[1][:, None], axis=1))


def mlp_data(seed: int, batch_size: int = 16) -> tuple[dict[str, NDArray[np.float32]], dict[str, NDArray[np.float32]]]:
    """Parameters and a batch for :func:`mlp_loss`, made with numpy (outside any program)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    params = {
        "w1": rng.normal(0, 0.7, (3, 8)).astype(f32),
        "b1": rng.normal(0, 0.1, 8).astype(f32),
        "w2": rng.normal(0, 0.5, (8, 2)).astype(f32),
        "b2": rng.normal(0, 0.1, 2).astype(f32),
    }
    batch = {"x": rng.normal(size=(batch_size, 3)).astype(f32), "y": rng.normal(size=(batch_size, 2)).astype(f32)}
    return params, batch


def softmax_data(seed: int, batch_size: int = 16) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """Tuple parameters and a (features, labels) batch for :func:`softmax_loss`."""
    rng = np.random.default_rng(seed)
    params = (rng.normal(0, 0.5, (5, 3)).astype(np.float32), rng.normal(0, 0.1, 3).astype(np.float32))
    batch = (rng.normal(size=(batch_size, 5)).astype(np.float32), rng.integers(0, 3, batch_size).astype(np.int32))
    return params, batch


def _shard(batch: Any, n: int, k: int) -> Any:
    """Device ``k``'s contiguous shard of ``batch`` split ``n`` ways (as ``P(axis)`` places it)."""
    import jax

    return jax.tree.map(lambda x: x[k * (x.shape[0] // n) : (k + 1) * (x.shape[0] // n)], batch)


def _dp_per_device(
    fn: Callable[..., Any], loss_fn: Callable[..., Any], params: Any, batch: Any, n: int, axis: str, steps: int = 0
) -> tuple[NDArray[np.float64], Any]:
    """Run ``fn`` on ``n`` devices inside shard_map(check_vma=False) and collect every
    device's result: ``[n, parameters]`` flat, and the tree structure it returned. With
    ``steps > 0``, each device instead runs that many SGD steps (lr 0.1) with ``fn``'s
    gradient, by a ``lax.scan``, and returns its parameters."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh((n,), (axis,))

    def grad_fn(p: Any, b: Any) -> Any:
        return fn(loss_fn, p, b, axis)

    def body(p: Any, b: Any) -> Any:
        if steps:

            def sgd(q: Any, _: None) -> tuple[Any, None]:
                return jax.tree.map(lambda w, g: w - 0.1 * g, q, grad_fn(q, b)), None

            out, _ = jax.lax.scan(sgd, p, None, length=steps)
        else:
            out = grad_fn(p, b)
        return jax.tree.map(lambda leaf: jax.numpy.asarray(leaf)[None], out)

    prog = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(axis)), out_specs=P(axis), check_vma=False))
    args = (jax.device_put(params, NamedSharding(mesh, P())), jax.device_put(batch, NamedSharding(mesh, P(axis))))
    what = f"{DP} on {n} devices (axis {axis!r})"
    out = run_on_devices(prog, args, what, f"{DP}(loss_fn, params, batch shard, {axis!r})")
    if out is None or not jax.tree.leaves(out):
        fail(f"{what} returned None; return the gradient, a pytree like params")
    per_device = np.stack([_flat(jax.tree.map(lambda leaf, k=k: np.asarray(leaf)[k], out)) for k in range(n)])
    return per_device, jax.tree.structure(jax.tree.map(lambda leaf: 0, out))


def _dp_compare(
    fn: Callable[..., Any], loss_fn: Callable[..., Any], params: Any, batch: Any, n: int, axis: str
) -> None:
    import jax

    got, structure = _dp_per_device(fn, loss_fn, params, batch, n, axis)
    what = f"{DP} on {n} devices (axis {axis!r})"
    if structure != jax.tree.structure(jax.tree.map(lambda leaf: 0, params)):
        fail(f"{what} returned a pytree of structure {structure}; expected one like params")
    expected = _flat(jax.grad(loss_fn)(params, batch))
    local = np.stack([_flat(jax.grad(loss_fn)(params, _shard(batch, n, k))) for k in range(n)])
    disagree = [k for k in range(1, n) if not np.allclose(got[k], got[0], rtol=GRAD_RTOL, atol=GRAD_ATOL)]
    if disagree:
        if np.allclose(got, local, rtol=GRAD_RTOL, atol=GRAD_ATOL):
            fail(
                f"{what}: no reduction: each device returned the gradient of its own shard, and the devices disagree "
                "(the replicas would drift apart); average over devices with jax.lax.pmean(grads, axis_name)"
            )
        fail(f"{what}: the devices disagree (device {disagree[0]} differs from device 0); all-reduce the gradient")
    fail_if_known_mistake(
        got[0],
        {
            f"{what}: the gradient is {n} times too large: psum adds the devices' gradients; the gradient of the "
            "global mean is their mean, jax.lax.pmean": n * expected,
            f"{what}: the gradient is {n} times too small: it is averaged twice (pmean already divides by the "
            "number of devices; dividing by it again)": expected / n,
        },
        expected=expected,
        rtol=GRAD_RTOL,
        atol=GRAD_ATOL,
    )
    assert_allclose(
        got[0], expected, what=f"{what} vs jax.grad over the whole batch on one device", rtol=GRAD_RTOL, atol=GRAD_ATOL
    )


@check_case("equals jax.grad over the whole batch on one device: an MLP on 2 devices", time_limit=CHECK_S)
def _dp_two(fn: Callable[..., Any]) -> None:
    params, batch = mlp_data(0)
    _dp_compare(fn, mlp_loss, params, batch, 2, "data")


@check_case("a softmax classifier with tuple parameters on 4 devices, axis 'batch'", time_limit=CHECK_S)
def _dp_four(fn: Callable[..., Any]) -> None:
    params, batch = softmax_data(1)
    _dp_compare(fn, softmax_loss, params, batch, 4, "batch")


@check_case("three SGD steps on 4 devices equal three single-device steps on the whole batch", time_limit=CHECK_S)
def _dp_training(fn: Callable[..., Any]) -> None:
    import jax

    params, batch = mlp_data(2)
    got, _ = _dp_per_device(fn, mlp_loss, params, batch, 4, "dp", steps=3)
    reference = params
    for _ in range(3):
        grads = jax.grad(mlp_loss)(reference, batch)
        reference = jax.tree.map(lambda w, g: w - 0.1 * g, reference, grads)
    expected = _flat(reference)
    what = f"parameters after 3 SGD steps (lr 0.1) with {DP} on 4 devices"
    for k in range(4):
        assert_allclose(got[k], expected, what=f"{what}, device {k}, vs 3 steps on one device", rtol=1e-4, atol=1e-5)


#: Collectives (name prefixes of jaxpr primitives) whose operands the data-movement check inspects.
COLLECTIVES = ("pmean", "ppermute", *OTHER_COLLECTIVES)
#: Collectives that copy values between devices instead of reducing them: none may touch a
#: value computed from the batch (the gradient included: an all-reduce is the exercise).
COPYING = ("all_gather", "all_to_all", "ragged_all_to_all", "ppermute", "pgather")


class Operand(NamedTuple):
    """One operand of a collective: the primitive, the operand's shape, which of the
    program's inputs it was computed from (``{"params"}``, ``{"batch"}``, both) and how many
    times it runs: the product of the lengths of the scans (``lax.map``, ``fori_loop``)
    around it, ``inf`` inside a ``while`` loop, whose trip count the program does not fix."""

    primitive: str
    shape: tuple[int, ...]
    deps: frozenset[str]
    trips: float = 1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def moved(self) -> float:
        """Numbers this operand sends across devices per call: its size times its trips."""
        return self.size * self.trips


#: The dependency label of values computed from a reduce-scatter's output: the pieces of a
#: reduced gradient, which an all-gather may then copy (reduce-scatter + all-gather = all-reduce).
SCATTERED = "reduce-scattered"

#: Primitives whose sub-programs run their inputs round a loop: their sub-programs' inputs
#: get every input's dependencies (a carry started from zeros still picks up the batch).
LOOPS = ("scan", "while")


def _sub_jaxprs(eqn: Any) -> Iterator[Any]:
    """The programs nested in one equation (jit, shard_map, scan, while, cond, checkpoint, ...)."""
    from jax.extend import core as jcore

    for param in eqn.params.values():
        for sub in param if isinstance(param, list | tuple) else (param,):
            if isinstance(sub, jcore.ClosedJaxpr):
                yield sub.jaxpr
            elif isinstance(sub, jcore.Jaxpr):
                yield sub


def _trips(eqn: Any) -> float:
    """How many times one equation runs the programs nested in it: a scan's length, an
    unknown number (``inf``) for a while loop, once for everything else."""
    if eqn.primitive.name == "scan":
        return float(eqn.params["length"])
    return float("inf") if eqn.primitive.name == "while" else 1.0


def collective_operands(jaxpr: Any, labels: list[frozenset[str]], trips: float = 1) -> list[Operand]:
    """Every collective in ``jaxpr`` (and the programs nested in it), one :class:`Operand`
    per operand: the primitive, the operand's shape, which of the program's inputs it
    was computed from, ``labels[i]`` naming input ``i`` (``{"params"}``, ``{"batch"}``), and
    its trip count (``trips`` times the lengths of the loops around it in ``jaxpr``).

    Dependencies flow forward through every equation (each output depends on all its
    inputs); a nested program's inputs take the dependencies of the equation's matching
    inputs, or of all of them in a loop or when the two do not line up. Over-approximating
    dependencies can only hide data movement, never invent it.
    """
    from jax.extend import core as jcore

    env: dict[Any, frozenset[str]] = dict(zip(jaxpr.invars, labels))
    found: list[Operand] = []
    for eqn in jaxpr.eqns:
        ins = [frozenset() if isinstance(v, jcore.Literal) else env.get(v, frozenset()) for v in eqn.invars]
        union = frozenset().union(*ins)
        name = eqn.primitive.name
        if name.startswith(COLLECTIVES):
            found += [Operand(name, tuple(int(d) for d in v.aval.shape), dep, trips) for v, dep in zip(eqn.invars, ins)]
        for sub in _sub_jaxprs(eqn):
            exact = name not in LOOPS and len(sub.invars) <= len(ins)
            sub_labels = ins[len(ins) - len(sub.invars) :] if exact else [union] * len(sub.invars)
            found += collective_operands(sub, sub_labels, trips * _trips(eqn))
        for v in eqn.outvars:
            env[v] = union | {SCATTERED} if name.startswith("reduce_scatter") else union
    return found


def gradient_shaped(shape: tuple[int, ...], params: Any, n_devices: int = 1, scatter: bool = False) -> bool:
    """Whether a collective operand of ``shape`` can be (part of) the gradient of ``params``:
    the shape of one parameter leaf, or a flat vector of one leaf's size or of all the
    parameters' (``ravel_pytree`` of the gradient). For a reduce-scatter (``scatter``) also
    that vector zero-padded to a multiple of ``n_devices``, flat or as ``[n_devices, -1]``."""
    import jax

    leaves = [tuple(np.shape(leaf)) for leaf in jax.tree.leaves(params)]
    sizes = {int(np.prod(leaf)) for leaf in leaves} | {sum(int(np.prod(leaf)) for leaf in leaves)}
    if scatter:
        sizes |= {-(-size // n_devices) * n_devices for size in sizes}
        return shape in leaves or ((len(shape) == 1 or shape[:1] == (n_devices,)) and int(np.prod(shape)) in sizes)
    return shape in leaves or (len(shape) == 1 and shape[0] in sizes)


def moved_operands(found: list[Operand], params: Any, n_devices: int = 1) -> tuple[list[Operand], list[Operand]]:
    """The data-movement rule of exercise 3, structural: only gradient-shaped values may
    cross devices, and only through a reduction. Returns the non-scalar operands that are
    not gradient-shaped (data moved, whatever they were computed from: a batch tainted with
    ``0 * params`` is still the batch), and the gradient-shaped ones computed from the batch
    that a copying collective (``all_gather``, ``all_to_all``, ``ppermute``) sends instead
    of an all-reduce. An all-gather of the pieces a reduce-scatter left (``SCATTERED``) is
    the second half of an all-reduce, and allowed whatever its shape. Scalars are left to
    :func:`crossing_numbers`, which counts them with their trip counts."""
    gathered_sum = [op for op in found if SCATTERED in op.deps and op.primitive.startswith("all_gather")]
    not_gradient = [
        op
        for op in found
        if op.size > 1
        and op not in gathered_sum
        and not gradient_shaped(op.shape, params, n_devices, scatter=op.primitive.startswith("reduce_scatter"))
    ]
    copied = [
        op
        for op in found
        if op.size > 1
        and op not in gathered_sum
        and gradient_shaped(op.shape, params)
        and "batch" in op.deps
        and op.primitive.startswith(COPYING)
    ]
    return not_gradient, copied


def crossing_numbers(found: list[Operand]) -> float:
    """The numbers one call sends across devices: every collective operand's size times its
    trip count, except scalars not computed from the batch (``psum(1, axis)``, the device
    count). A scalar computed from the batch counts: one ``psum`` per batch element, run
    round a ``lax.map``, gathers the whole batch as surely as one ``all_gather`` does."""
    return sum(op.moved for op in found if op.size > 1 or "batch" in op.deps)


#: The most numbers a data-parallel gradient may send across devices per call, as a multiple
#: of the gradient's size: an all-reduce sends it once (a reduce-scatter then an all-gather
#: 1 + 1/N times, plus padding); twice leaves room for a scalar or two, not for the batch.
CROSSING_BUDGET = 2


@check_case("all-reduces the gradients, not the data: no collective on the batch itself", time_limit=CHECK_S)
def _dp_moves_gradients(fn: Callable[..., Any]) -> None:
    """The program inside the shard_map, traced: every collective's operands, with their
    shapes and whether they were computed from the parameters, the batch, or both. Only
    gradient-shaped values may cross devices, by a reduction (:func:`moved_operands`)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n, axis = 4, "data"
    params, batch = mlp_data(7, batch_size=64)
    mesh = _mesh((n,), (axis,))
    prog = jax.shard_map(
        lambda p, b: fn(mlp_loss, p, b, axis), mesh=mesh, in_specs=(P(), P(axis)), out_specs=P(), check_vma=False
    )
    args = (jax.device_put(params, NamedSharding(mesh, P())), jax.device_put(batch, NamedSharding(mesh, P(axis))))
    outer = _jaxpr(prog, args, f"{DP}(loss_fn, params, batch shard, {axis!r})")
    refuse_host_callbacks(outer, DP)
    (inner,) = [eqn.params["jaxpr"] for eqn in outer.eqns if eqn.primitive.name == "shard_map"]
    n_params, n_batch = len(jax.tree.leaves(params)), len(jax.tree.leaves(batch))
    labels = [frozenset({"params"})] * n_params + [frozenset({"batch"})] * n_batch
    found = collective_operands(inner, labels)
    not_gradient, copied = moved_operands(found, params, n)
    grad_size = sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(params))
    if not_gradient:
        names = ", ".join(sorted({op.primitive for op in not_gradient}))
        shapes = ", ".join(sorted({str(op.shape) for op in not_gradient}))
        shard = sum(op.size for op in not_gradient)
        fail(
            f"it moves the data, not the gradients: {names} on the batch itself (shaped {shapes}, not like any "
            f"parameter: {shard} numbers a device, every step, growing with the batch), then each device takes the "
            "whole batch's gradient, so no work is split; keep each shard in place and all-reduce its gradient "
            f"({grad_size} numbers, whatever the batch)"
        )
    if copied:
        names = ", ".join(sorted({op.primitive for op in copied}))
        fail(
            f"it copies the gradient between devices with {names}: each device receives the others' gradients "
            "(or some of them) instead of their mean; average the local gradients with one all-reduce, "
            "jax.lax.pmean(grads, axis_name)"
        )
    crossing = crossing_numbers(found)
    if crossing > CROSSING_BUDGET * grad_size:
        looped = [op for op in found if op.trips > 1 and (op.size > 1 or "batch" in op.deps)]
        how = (
            f", {len(looped)} of its collectives run inside loops (lax.map, lax.scan, fori_loop or while) "
            "that send something on every trip"
            if looped
            else ""
        )
        amount = "an unbounded number of" if crossing == float("inf") else f"{int(crossing)}"
        fail(
            f"it moves the data, not the gradients: one call sends {amount} numbers across devices{how}, more than "
            f"{CROSSING_BUDGET} times the gradient's {grad_size} numbers; a gradient all-reduce sends each gradient "
            "number once, whatever the batch, so keep each shard in place and all-reduce its gradient"
        )
    reductions = ("psum", "pmean", "reduce_scatter")
    reduced = sum(op.size for op in found if op.primitive.startswith(reductions) and "params" in op.deps)
    assert_true(
        reduced >= grad_size,
        f"only {reduced} of the gradient's {grad_size} numbers pass through an all-reduce (psum or pmean) over "
        f"{axis!r} (or a reduce-scatter): every leaf of the local gradient must be averaged over the devices",
    )


DATA_PARALLEL_GRAD = Exercise(
    name=DP,
    compiled=True,
    points=15,
    title="the data-parallel gradient: local gradient, then the mean over devices",
    checks=(_dp_two, _dp_four, _dp_training, _dp_moves_gradients),
    advice="from jax.grad and one jax.lax collective",
    hints=(
        "The reduction is over the mesh axis named axis_name. Among the collectives in jax.lax, one adds over a named "
        "axis and one averages over it: eq. 05.2 asks for which?",
        "Take this shard's gradient with jax.grad first, then reduce that pytree (the collectives accept a whole "
        "pytree), not the batch and not the loss. With check_vma=False jax.grad returns this device's own g_d, so "
        "nothing has been reduced for you yet.",
        "Two lines: this shard's gradient g_d, by `jax.grad` of `loss_fn` (it differentiates the first argument, the "
        "params), then one collective over `axis_name` on that whole pytree. (05.2) is the mean of the N per-device "
        "gradients: `jax.lax.pmean` is that mean; `jax.lax.psum` would leave a division by N to you.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: accumulate_grads
# ---------------------------------------------------------------------------------------

AG = "accumulate_grads"


def normalized_pg_loss(params: Any, batch: Any) -> Any:
    """A policy-gradient loss that normalises advantages over the batch it is given (as PPO
    does per minibatch): not a mean over examples, so which rows share a micro-batch matters."""
    import jax
    import jax.numpy as jnp

    adv = (batch["adv"] - batch["adv"].mean()) / (batch["adv"].std() + 1e-6)
    logp = jax.nn.log_softmax(batch["obs"] @ params["w"] + params["b"])
    return -jnp.mean(adv * jnp.take_along_axis(logp, batch["act"][:, None], axis=1)[:, 0])


def pg_data(seed: int, batch_size: int = 32) -> tuple[dict[str, NDArray[Any]], dict[str, NDArray[Any]]]:
    """Parameters and a batch for :func:`normalized_pg_loss`; advantages drift along the batch."""
    rng = np.random.default_rng(seed)
    params = {"w": rng.normal(0, 0.5, (4, 3)).astype(np.float32), "b": rng.normal(0, 0.1, 3).astype(np.float32)}
    batch = {
        "obs": rng.normal(size=(batch_size, 4)).astype(np.float32),
        "act": rng.integers(0, 3, batch_size).astype(np.int32),
        "adv": (rng.normal(size=batch_size) + np.linspace(-2, 2, batch_size)).astype(np.float32),
    }
    return params, batch


def micro_batch_mean(
    loss_fn: Callable[..., Any],
    params: Any,
    batch: Any,
    n_micro: int,
    *,
    interleaved: bool = False,
    keep: int = -1,
    divide_by: int = 0,
) -> NDArray[np.float64]:
    """The mean of ``jax.grad(loss_fn)`` over micro-batches taken by a Python loop over slices:
    contiguous rows ``k m ... (k + 1) m - 1`` (or, ``interleaved``, rows ``k, k + n_micro, ...``).
    ``keep`` micro-batches only (all by default) and a sum divided by ``divide_by`` (``n_micro``
    by default) name the slips of dropping the last one."""
    import jax

    size = jax.tree.leaves(batch)[0].shape[0]
    m = size // n_micro
    total = None
    for k in range(n_micro if keep < 0 else keep):
        rows = slice(k, size, n_micro) if interleaved else slice(k * m, (k + 1) * m)
        grads = _flat(jax.grad(loss_fn)(params, jax.tree.map(lambda x, r=rows: x[r], batch)))
        total = grads if total is None else total + grads
    assert total is not None
    return total / (divide_by or n_micro)


def _ag_run(
    fn: Callable[..., Any], loss_fn: Callable[..., Any], params: Any, batch: Any, n_micro: int
) -> NDArray[np.float64]:
    import jax

    text = f"{AG}(loss_fn, params, batch of {jax.tree.leaves(batch)[0].shape[0]} rows, n_micro={n_micro})"
    try:
        out = jax.jit(fn, static_argnums=(0, 3))(loss_fn, params, batch, n_micro)
    except Exception as exc:
        raise _learner_trace_error(exc, text) from exc
    if out is None or not jax.tree.leaves(out):
        fail(f"{text} returned None; return the accumulated gradient, a pytree like params")
    structure: Any = jax.tree.structure(out)
    if structure != jax.tree.structure(params):
        fail(f"{text} returned a pytree of structure {structure}; expected one like params")
    return _flat(out)


def _ag_compare(
    fn: Callable[..., Any], loss_fn: Callable[..., Any], params: Any, batch: Any, n_micro: int, expected: Any, what: str
) -> None:
    got = _ag_run(fn, loss_fn, params, batch, n_micro)
    if not np.allclose(got, expected, rtol=GRAD_RTOL, atol=GRAD_ATOL):
        mistakes: dict[str, Any] = {
            f"{what}: the micro-batches' gradients are summed, not averaged ({n_micro} times too large): divide the "
            "sum by n_micro": n_micro * np.asarray(expected),
        }
        if n_micro > 1:
            dropped = f"{what}: the last micro-batch is dropped: the scan must run over all {n_micro} micro-batches"
            fail_if_known_mistake(
                got,
                {
                    dropped: lambda: micro_batch_mean(loss_fn, params, batch, n_micro, keep=n_micro - 1),
                    dropped + f" (and divide by {n_micro}, not {n_micro - 1})": lambda: micro_batch_mean(
                        loss_fn, params, batch, n_micro, keep=n_micro - 1, divide_by=n_micro - 1
                    ),
                },
                expected=expected,
                rtol=GRAD_RTOL,
                atol=GRAD_ATOL,
            )
            mistakes[
                f"{what}: the micro-batches are interleaved (rows k, k + n_micro, ...): reshape every leaf to "
                "(n_micro, B // n_micro, ...) so that micro-batch k is the contiguous rows k m ... (k + 1) m - 1"
            ] = lambda: micro_batch_mean(loss_fn, params, batch, n_micro, interleaved=True)
        fail_if_known_mistake(got, mistakes, expected=expected, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    assert_allclose(got, np.asarray(expected, np.float64), what=what, rtol=GRAD_RTOL, atol=GRAD_ATOL)


@check_case(
    "equals the full-batch gradient of a mean loss for n_micro = 4, 2, 8 and 1 under jax.jit", time_limit=CHECK_S
)
def _ag_full_batch(fn: Callable[..., Any]) -> None:
    import jax

    params, batch = mlp_data(3, batch_size=16)
    expected = _flat(jax.grad(mlp_loss)(params, batch))
    for n_micro in (4, 2, 8, 1):
        what = f"{AG}(MLP, batch of 16, n_micro={n_micro}) vs jax.grad over the whole batch"
        _ag_compare(fn, mlp_loss, params, batch, n_micro, expected, what)


@check_case(
    "matches a loop over contiguous micro-batches for advantages normalised per micro-batch", time_limit=CHECK_S
)
def _ag_contiguous(fn: Callable[..., Any]) -> None:
    params, batch = pg_data(4)
    for n_micro in (4, 2):
        expected = micro_batch_mean(normalized_pg_loss, params, batch, n_micro)
        what = f"{AG}(normalised policy-gradient loss, batch of 32, n_micro={n_micro}) vs a loop over contiguous slices"
        _ag_compare(fn, normalized_pg_loss, params, batch, n_micro, expected, what)


@check_case(
    "is one lax.scan of length n_micro taking each micro-batch's gradient in its step and carrying the running sum "
    "(no Python loop, no stacked gradients)",
    time_limit=CHECK_S,
)
def _ag_structure(fn: Callable[..., Any]) -> None:
    import jax

    params, batch = mlp_data(5, batch_size=16)
    n_micro = 4
    jaxpr = _jaxpr(
        lambda p, b: fn(mlp_loss, p, b, n_micro), (params, batch), f"{AG}(loss_fn, params, batch, {n_micro})"
    )
    refuse_host_callbacks(jaxpr, AG)
    scans = [eqn for eqn, _, _ in walk_eqns(jaxpr) if eqn.primitive.name == "scan"]
    lengths = [int(eqn.params["length"]) for eqn in scans]
    if not lengths:
        fail(
            f"{AG}'s program holds no lax.scan: a Python loop over micro-batches puts n_micro copies of the gradient "
            "in the program (it grows with n_micro); scan over the micro-batch axis with jax.lax.scan"
        )
    assert_true(
        n_micro in lengths,
        f"{AG}'s program scans {lengths} steps for n_micro = {n_micro}; scan once per micro-batch over a leading "
        "axis of n_micro: reshape every leaf to (n_micro, B // n_micro, ...)",
    )
    # The scan over micro-batches must carry the running sum, not stack one gradient per micro-batch (as
    # jax.lax.map, a scan with no carry, does): stacked, all n_micro gradients are alive at once.
    grad_size = sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(params))
    scan = next(eqn for eqn in scans if int(eqn.params["length"]) == n_micro)
    n_carry = int(scan.params["num_carry"])
    carried = sum(int(np.prod(v.aval.shape)) for v in scan.outvars[:n_carry])
    stacked = sum(int(np.prod(v.aval.shape)) for v in scan.outvars[n_carry:])
    if stacked >= grad_size:
        fail(
            f"{AG}: the micro-batches' gradients are stacked: the scan over the {n_micro} micro-batches outputs "
            f"{stacked} numbers, {n_micro} copies of the {grad_size}-number gradient alive at once (what jax.lax.map, "
            "or a scan returning each gradient, does); add each gradient into the scan's carry, a running sum the "
            "size of one gradient, and output None per step"
        )
    assert_true(
        carried >= grad_size,
        f"{AG}: the scan over the {n_micro} micro-batches carries {carried} numbers, less than the {grad_size}-number "
        "gradient: its carry must be the running sum of the micro-batches' gradients",
    )
    # Each micro-batch's gradient must be taken inside the scan's step: gradients computed before the scan (a
    # jax.vmap over the micro-batches) and only summed by it give the same numbers, with all n_micro gradients
    # and their activations alive at once. The step must hold the matrix products of one micro-batch's grad.
    micro_batch = jax.tree.map(lambda x: x[: x.shape[0] // n_micro], batch)
    grad_program = _jaxpr(jax.grad(mlp_loss), (params, micro_batch), "jax.grad(loss_fn) on one micro-batch")
    needed = sum(eqn.primitive.name == "dot_general" for eqn, _, _ in walk_eqns(grad_program))
    inside = sum(eqn.primitive.name == "dot_general" for eqn, _, _ in walk_eqns(scan.params["jaxpr"].jaxpr))
    assert_true(
        inside >= needed,
        f"{AG}: the gradients are not computed inside the scan: its step holds {inside} of the {needed} matrix "
        "products (dot_general) of jax.grad(loss_fn) on one micro-batch, so they were computed before it (a jax.vmap "
        f"over the micro-batches?), all {n_micro} gradients and their activations alive at once; call "
        "jax.grad(loss_fn)(params, micro_batch) inside the scan's step, one micro-batch at a time",
    )


@check_case("a batch that n_micro does not divide raises ValueError naming both", time_limit=CHECK_S)
def _ag_indivisible(fn: Callable[..., Any]) -> None:
    import jax
    import jax.numpy as jnp

    params, batch = mlp_data(6, batch_size=10)
    text = f"{AG}(loss_fn, params, batch of 10 rows, n_micro=4)"
    raises_naming(
        fn,
        mlp_loss,
        jax.tree.map(jnp.asarray, params),
        jax.tree.map(jnp.asarray, batch),
        4,
        text=text,
        numbers=(10, 4),
        no_error=f"{text} returned a gradient; 10 rows do not split into 4 equal micro-batches: raise ValueError",
    )


ACCUMULATE_GRADS = Exercise(
    name=AG,
    compiled=True,
    points=10,
    title="gradient accumulation: the mean of contiguous micro-batches' gradients by one lax.scan",
    checks=(_ag_full_batch, _ag_contiguous, _ag_structure, _ag_indivisible),
    advice="from jax.grad, reshapes and one jax.lax.scan",
    hints=(
        "Put the micro-batches on a new leading axis: with `jax.tree.map`, reshape every leaf of `batch` from (B, "
        "...) to (n_micro, B // n_micro, ...); B is the leading size of any leaf (`jax.tree.leaves`). Check first "
        "that n_micro divides B (raise ValueError before reshaping).",
        "jax.lax.scan(step, zeros, micro) with zeros = jax.tree.map(jnp.zeros_like, params) hands step(total, mb) one "
        "micro-batch at a time.",
        "The scan body takes (running sum, one micro-batch), adds this micro-batch's `jax.grad` of `loss_fn` to the "
        "sum leaf by leaf (one `jax.tree.map` over the two pytrees) and returns (new sum, None). After the scan, divide the sum "
        "by `n_micro`, leaf by leaf: the mean of equal micro-batches' gradients is the full batch's gradient.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 5: remat_segments
# ---------------------------------------------------------------------------------------

RS = "remat_segments"
#: Names the checkpoint primitive has had in jaxprs (``remat2`` on jaxlib 0.10.2).
CHECKPOINT_PRIMITIVES = ("checkpoint", "remat", "remat2")
#: The memory case: 36 tanh layers of width 64 on a batch of 512, in segments of 6 layers.
#: Measured 2026-11 (jaxlib 0.10.2 CPU), temp bytes of jit(grad) over no remat's 14.6 MB:
#: segments of 6 0.27, per-layer checkpoints 0.35, one checkpoint around the whole network
#: 1.01, no checkpoint 1.00 (the same every compilation, to the byte).
MEMORY_CASE = (36, 64, 512, 6)
#: A learner's temp bytes must be at most this fraction of no remat's (segments give 0.27).
MEMORY_FRACTION = 0.5


def tanh_layer(h: Any, p: Any) -> Any:
    """One layer of the graded network: ``h_l = tanh(h_{l-1} W_l + b_l)`` (one matrix product)."""
    import jax.numpy as jnp

    return jnp.tanh(h @ p["W"] + p["b"])


def plain_forward(layer: Callable[..., Any], params: Any, x: Any) -> Any:
    """The network without remat, the oracle: one ``lax.scan`` of ``layer`` over the stacked layers."""
    import jax

    return jax.lax.scan(lambda h, p: (layer(h, p), None), x, params)[0]


def _rs_problem(depth: int, width: int, batch: int, seed: int = 0) -> tuple[Any, Any, Any]:
    from course_lib.scaling.remat import mlp_problem

    params, x, y = mlp_problem(seed, depth, width, batch)
    params = {"W": params["W"], "b": params["b"] + 0.05}  # non-zero biases, so their gradient is checked too
    return params, x, y


def _rs_loss(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``(params, x, y) -> 1/(2B) sum ||forward(params, x) - y||^2``."""
    import jax.numpy as jnp

    def loss(params: Any, x: Any, y: Any) -> Any:
        return 0.5 * jnp.mean(jnp.sum((forward(params, x) - y) ** 2, axis=-1))

    return loss


def _rs_learner(fn: Callable[..., Any], k: int) -> Callable[..., Any]:
    return lambda params, x: fn(tanh_layer, params, x, k)


def _rs_text(depth: int, k: int) -> str:
    return f"{RS}(layer, params of {depth} layers, x, k={k})"


def checkpointed_segments(jaxpr: Any) -> list[tuple[int, int]]:
    """``(times, products)`` for every ``jax.checkpoint`` in ``jaxpr``: how many times it runs
    per call (the scans around it multiply) and how many matrix products (``dot_general``)
    it runs each time, nested scans counted. One per equation, the outermost first."""
    rows = []
    for eqn, times, _ in walk_eqns(jaxpr):
        if eqn.primitive.name in CHECKPOINT_PRIMITIVES:
            (sub,) = _sub_jaxprs(eqn)
            rows.append((times, sum(t for e, t, _ in walk_eqns(sub) if e.primitive.name == "dot_general")))
    return rows


def _rs_jaxpr(fn: Callable[..., Any], depth: int, k: int, width: int = 8, batch: int = 4) -> Any:
    """The jaxpr of the learner's forward pass over ``depth`` layers in segments of ``k``."""
    params, x, _ = _rs_problem(depth, width, batch)
    return _jaxpr(_rs_learner(fn, k), (params, x), _rs_text(depth, k))


def _rs_segments(fn: Callable[..., Any], depth: int, width: int, batch: int, k: int) -> list[tuple[int, int]]:
    return checkpointed_segments(_rs_jaxpr(fn, depth, k, width, batch))


def _rs_loop_mistake(fn: Callable[..., Any], base: Any = None) -> str | None:
    """The message for a Python loop where the exercise asks for a ``lax.scan``, read from the
    program's size (:func:`program_size`): with a scan it is the same for 12 and 24 layers
    (k = 3: 4 and 8 segments) and for segments of 3 and 6 layers (4 segments each); a loop
    over the segments grows with the depth, a loop over a segment's layers grows with k.
    ``base``: the jaxpr for 12 layers and k = 3, when the caller has it."""
    sizes = {(12, 3): program_size(base if base is not None else _rs_jaxpr(fn, 12, 3))}
    for depth, k in ((24, 3), (24, 6)):
        sizes[depth, k] = program_size(_rs_jaxpr(fn, depth, k))
    if sizes[24, 3] > sizes[12, 3]:
        return (
            f"{RS} runs a Python loop over the segments: its program grows with the depth ({sizes[12, 3]} operations "
            f"for 12 layers, {sizes[24, 3]} for 24, k = 3), one copy of the segment per turn; scan over the n / k "
            "segments with jax.lax.scan, one jax.checkpoint around the scan's body"
        )
    if sizes[24, 6] > sizes[12, 3]:
        return (
            f"{RS} runs a Python loop over the k layers of a segment: its program grows with k ({sizes[12, 3]} "
            f"operations for k = 3, {sizes[24, 6]} for k = 6, 4 segments each); scan over the segment's layers "
            "with jax.lax.scan inside the checkpoint"
        )
    return None


def _rs_temp_bytes(forward: Callable[..., Any], params: Any, x: Any, y: Any, text: str) -> int:
    import jax

    from course_lib.scaling.remat import peak_memory

    try:
        return peak_memory(jax.jit(jax.grad(_rs_loss(forward))), params, x, y).temp_bytes
    except Exception as exc:
        raise _learner_trace_error(exc, text) from exc


@check_case(
    "the same output and gradient as the network without remat, for k = 3, 4, 1 and 12 of 12 layers", time_limit=CHECK_S
)
def _rs_gradient(fn: Callable[..., Any]) -> None:
    import jax

    params, x, y = _rs_problem(12, 16, 8, seed=1)
    plain = jax.tree.map(np.asarray, jax.grad(_rs_loss(lambda p, x: plain_forward(tanh_layer, p, x)))(params, x, y))
    for k in (3, 4, 1, 12):
        text = _rs_text(12, k)
        try:
            forward = _rs_learner(fn, k)
            out, grads = jax.jit(lambda p, x, y, f=forward: (f(p, x), jax.grad(_rs_loss(f))(p, x, y)))(params, x, y)
        except Exception as exc:
            raise _learner_trace_error(exc, text) from exc
        if getattr(out, "shape", None) != np.shape(x):
            got = f"shape {out.shape}" if hasattr(out, "shape") else describe_type(out)
            fail(f"{text} returned {got}; return h after the last layer, an array shaped like x {np.shape(x)}")
        assert_allclose(
            np.asarray(out),
            np.asarray(plain_forward(tanh_layer, params, x)),
            what=f"{text} vs the layers without remat",
            rtol=1e-5,
            atol=1e-6,
        )
        for name in ("W", "b"):
            assert_allclose(
                np.asarray(grads[name]),
                plain[name],
                what=f"d loss / d {name} through {text} vs without remat",
                rtol=1e-5,
                atol=1e-6,
            )


@check_case(
    "jit(grad)'s compiled temp memory: 36 layers in segments of 6 need at most half of no remat's", time_limit=CHECK_S
)
def _rs_memory(fn: Callable[..., Any]) -> None:
    depth, width, batch, k = MEMORY_CASE
    params, x, y = _rs_problem(depth, width, batch)
    text = _rs_text(depth, k)
    got = _rs_temp_bytes(_rs_learner(fn, k), params, x, y, text)
    none = _rs_temp_bytes(lambda p, x: plain_forward(tanh_layer, p, x), params, x, y, "the network without remat")
    if got <= MEMORY_FRACTION * none:
        return
    segments = _rs_segments(fn, depth, width, batch, k)
    where = f"{text}: jit(grad)'s temp is {got / 1e6:.1f} MB, {got / none:.2f} of no remat's {none / 1e6:.1f} MB"
    loop = _rs_loop_mistake(fn)
    if loop is not None:
        fail(f"{loop} ({where})")
    if not segments:
        fail(
            f"{where}: the program holds no jax.checkpoint, so the backward pass keeps every layer's activations; "
            "wrap each segment of k layers in jax.checkpoint"
        )
    if sum(t for t, _ in segments) == 1:
        fail(
            f"{where}: one jax.checkpoint around all {depth} layers (k ignored) saves only x, then recomputes the "
            "whole network at once and holds all its activations; checkpoint each segment of k layers"
        )
    fail(
        f"{where}; segments of k layers, each under jax.checkpoint, keep only n / k segment inputs (and one segment's activations)"
    )


@check_case(
    "the program checkpoints n / k segments of k layers each, by lax.scans (12 layers: k = 3 and 4)",
    time_limit=CHECK_S,
)
def _rs_structure(fn: Callable[..., Any]) -> None:
    jaxprs = {k: _rs_jaxpr(fn, 12, k) for k in (3, 4)}
    for k in (3, 4):
        depth = 12
        segments = checkpointed_segments(jaxprs[k])
        text = _rs_text(depth, k)
        if not segments:
            fail(f"{text}'s program holds no jax.checkpoint: wrap each segment of k layers in jax.checkpoint")
        total = sum(t for t, _ in segments)
        layers = sorted({d for _, d in segments})
        if layers == [1] and total == depth:
            fail(
                f"{text} checkpoints each layer alone ({depth} checkpoints of 1 layer): per-layer remat, not segments; "
                "put one jax.checkpoint around a scan over k layers, and scan over the n / k segments outside it"
            )
        if total == 1 and layers == [depth]:
            fail(f"{text} puts one jax.checkpoint around all {depth} layers: k is ignored; checkpoint segments of k")
        assert_true(
            layers == [k] and total == depth // k,
            f"{text} runs {total} checkpoints of {', '.join(map(str, layers))} layers each; segments of k={k} are "
            f"{depth // k} checkpoints of {k} layers (one jax.checkpoint per segment, nothing checkpointed inside it)",
        )
    refuse_host_callbacks(jaxprs[3], RS)
    loop = _rs_loop_mistake(fn, jaxprs[3])
    if loop is not None:
        fail(loop)


@check_case(
    "a k that does not divide the number of layers (16 layers, k = 5 or 0) raises ValueError naming both",
    time_limit=CHECK_S,
)
def _rs_indivisible(fn: Callable[..., Any]) -> None:
    params, x, _ = _rs_problem(16, 8, 4)
    for k in (5, 0):
        text = _rs_text(16, k)
        raises_naming(
            fn,
            tanh_layer,
            params,
            x,
            k,
            text=text,
            numbers=(16, k),
            no_error=f"{text} returned; 16 layers do not split into segments of {k}: raise ValueError",
        )


REMAT_SEGMENTS = Exercise(
    name=RS,
    compiled=True,
    points=15,
    title="rematerialisation in segments: jax.checkpoint around each run of k layers (Chen et al. 2016)",
    checks=(_rs_gradient, _rs_memory, _rs_structure, _rs_indivisible),
    advice="from jax.lax.scan and jax.checkpoint",
    hints=(
        "The number of layers n is the leading size of every leaf of `params` (any leaf: `jax.tree.leaves`). Give "
        "every leaf a leading axis of segments, (n // k, k) + leaf.shape[1:]: a lax.scan over that axis hands its "
        "body one segment's k layers at a time.",
        "Two scans, nested: an inner one over the k layers of a segment (the carry is h), inside the body of an outer "
        "one over the n // k segments. Which of the two bodies, wrapped in jax.checkpoint, keeps one array per "
        "segment rather than one per layer?",
        "A scan body returns (carry, output); the outer body's carry is the segment's input h and it has no output "
        "(None). Check k before you reshape.",
    ),
)

EXERCISES: tuple[Exercise, ...] = (
    PARTITION_SPECS,
    RING_ALLREDUCE,
    DATA_PARALLEL_GRAD,
    ACCUMULATE_GRADS,
    REMAT_SEGMENTS,
)
