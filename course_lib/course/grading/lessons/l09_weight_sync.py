"""Lesson 09's graded exercises: bucket packing, the pipelined schedule, shard ranges,
bucket verification and the time model of an update.

The learner writes:

* ``pack_buckets(tensors, bucket_bytes, align=64) -> (buckets, places)``  (the buckets of 09.2)
* ``pipeline_schedule(n_buckets) -> [[(stage, bucket, buffer), ...], ...]``  (the ping-pong schedule 09.3 times)
* ``shard_range(size, tp_rank, tp_size) -> (start, stop)``  (09.5)
* ``verify_bucket(slot, expected_version, expected_index) -> payload``  (09.6)
* ``update_time(method, nbytes, n_tensors, bucket_bytes, rates) -> seconds``  (09.1-09.3 and the naive path)

What each exercise teaches, and what its checks observe beyond the values:

* pack_buckets -- mechanism: a greedy in-order plan counted in bytes (a tensor stays in the bucket when
  its own end, offset + nbytes, fits; an oversized one sits alone; the next offset is that end rounded up
  to align), then each tensor's logical bytes, not its storage's, copied at its offset. Observed with
  mixed dtypes, bucket sizes that are and are not multiples of align, views, slices and transposed
  tensors, and with one-byte dtypes (a plan counted in elements works there only, and is named so).
* pipeline_schedule -- mechanism: the ping-pong pipeline: in step s pack s, send s - 1, unpack s - 2,
  bucket b in buffer b % 2, so neither side's two stages share a buffer. Observed against per-bucket
  timelines for n up to 40.
* shard_range -- mechanism: divmod's split, the first size % tp ranks one extra row, contiguous in rank
  order. Observed against rows dealt one by one, empty shards and size 0 included.
* verify_bucket -- mechanism: the header read as int64 words and checked in the statement's order
  (magic, version, index, nbytes, checksum; the first problem raised), version and index compared for
  equality (stale, future, repeated and skipped buckets all rejected), the payload's 64-bit words summed
  modulo 2^64 and compared unsigned with the signed header word. Observed with buckets carrying two faults
  at once and checksums whose top bit is set (about half of real buckets).
* update_time -- mechanism: one message costs alpha plus its bytes over beta (09.1); n = ceil(B / b)
  equal buckets each staged, sent and reloaded with their share of the per-tensor cost; in turn (09.2)
  the stages add up, pipelined (09.3) the first bucket fills the pipe and then the slowest stage sets
  the pace, eta blending that with the stages in turn. Observed against an event simulation of the
  buckets through the ping-pong buffers (not the closed forms), with each stage in turn the slowest,
  bucket sizes that do and do not divide B, and the bucket size where the pipelined time is smallest.

The checks never call ``course_lib.weight_sync``'s implementations: they compare with the
naive oracles below (a ``bytearray`` built byte by byte, per-bucket timelines, rows dealt
one by one like cards, words summed as Python integers, buckets simulated through the
stages), hand-written values and properties.
The error classes and header layout are taken from ``course_lib.weight_sync.integrity``.

The runner refuses a learner's function that uses course_lib's own implementation
(:mod:`course_lib.course.grading.guard`): the library's ``shard_range`` or ``BucketHeader.read`` +
``verify_bucket`` pass every check. The error classes the exercises raise (:data:`ALLOWED`) and the
constants (``HEADER_BYTES``, ``MAGIC``) may be imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.course.grading.checks import (
    Exercise,
    LearnerError,
    assert_true,
    call,
    check_case,
    fail,
    fmt_number,
    short_repr,
)
from course_lib.course.grading.vocab import assert_value_error, pass_stub, returned_instead_of_value_error

LESSON = "09_weight_sync"
# what the exercises may take from the library: the error classes they raise
ALLOWED = frozenset(
    f"course_lib.weight_sync.integrity.{name}"
    for name in ("CorruptBucketError", "OutOfOrderBucketError", "WeightSyncError")
)


# ---------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------


#: struct formats of the element types the exercises use (bfloat16: the top two bytes of its float32)
_STRUCT = {"float32": "<f", "float64": "<d", "int64": "<q", "int32": "<i", "int16": "<h", "uint8": "<B", "int8": "<b"}


def _logical_bytes(t: Any) -> bytes:
    """A tensor's bytes in logical (row-major) order, element by element with ``struct``: what a bucket
    holds whatever the tensor's strides or storage."""
    import struct

    dtype = str(t.dtype).removeprefix("torch.")
    values = t.detach().reshape(-1).tolist()
    if dtype == "bfloat16":
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    return b"".join(struct.pack(_STRUCT[dtype], v) for v in values)


def naive_pack(
    tensors: list[Any], bucket_bytes: int, align: int = 64, *, aligned_fit: bool = False
) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Buckets as ``bytes``, built by appending each tensor's bytes and zero padding to a ``bytearray``.

    ``aligned_fit`` computes a known slip: the fit test on the tensor's end rounded up to ``align``."""
    buckets: list[bytearray] = []
    places: list[tuple[int, int]] = []
    for t in tensors:
        data = _logical_bytes(t)
        end = len(buckets[-1]) + len(data) if buckets else 0
        if aligned_fit:
            end = -(-end // align) * align
        fits = buckets and (len(buckets[-1]) == 0 or end <= bucket_bytes)
        if not fits:
            buckets.append(bytearray())
        current = buckets[-1]
        places.append((len(buckets) - 1, len(current)))
        current.extend(data)
        while len(current) % align:
            current.append(0)
    return [bytes(b) for b in buckets], places


def naive_schedule(n_buckets: int) -> list[list[tuple[str, int, int]]]:
    """Per-bucket timelines (packed at step b, sent at b + 1, unpacked at b + 2) gathered into steps."""
    steps: list[list[tuple[str, int, int]]] = [[] for _ in range(n_buckets + 2)] if n_buckets else []
    order = {"pack": 0, "send": 1, "unpack": 2}
    for b in range(n_buckets):
        for stage, at in (("pack", b), ("send", b + 1), ("unpack", b + 2)):
            steps[at].append((stage, b, b % 2))
    return [sorted(step, key=lambda x: order[x[0]]) for step in steps]


def naive_shards(size: int, tp_size: int) -> list[tuple[int, int]]:
    """Deal the rows one by one to ranks 0, 1, ..., then give each rank a contiguous run of its count."""
    counts = [0] * tp_size
    for row in range(size):
        counts[row % tp_size] += 1
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


def naive_sum64(payload: bytes) -> int:
    """Sum of little-endian unsigned 64-bit words mod 2**64, as the signed int64 with the same bits."""
    total = 0
    for k in range(0, len(payload), 8):
        total = (total + int.from_bytes(payload[k : k + 8], "little")) % 2**64
    return total - 2**64 if total >= 2**63 else total


# ---------------------------------------------------------------------------------------
# Exercise 1: pack_buckets
# ---------------------------------------------------------------------------------------

PACK = "pack_buckets"


def _tensors(seed: int = 0) -> list[Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    sizes = [3, 17, 1, 200, 5, 64, 1000, 2, 33, 7, 400, 9]
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.float32, torch.int64, torch.bfloat16]
    out = []
    for i, n in enumerate(sizes):
        x = torch.randn(n, generator=gen)
        dt = dtypes[i % len(dtypes)]
        out.append((x * 1000).to(dt) if dt == torch.int64 else x.to(dt))
    out[3] = out[3].reshape(20, 10)
    return out


def _as_bytes(tensors: list[Any]) -> list[Any]:
    """The same bytes as 1-D uint8 tensors: one byte an element, where elements and bytes agree."""
    import torch

    return [torch.tensor(list(_logical_bytes(t)), dtype=torch.uint8) for t in tensors]


def _counts_elements(fn: Callable[..., Any], tensors: list[Any], bucket_bytes: int, align: int) -> bool:
    """Whether ``fn`` plans in elements: right when every element is one byte (the same bytes as uint8
    tensors), yet raising or placing by element counts on contiguous float32 tensors."""
    import torch

    def plan(given: list[Any]) -> list[tuple[int, int]] | None:
        try:
            _, places = fn(given, bucket_bytes, align)
            return [(int(p[0]), int(p[1])) for p in places]
        except Exception:
            return None

    same = _as_bytes(tensors)
    if plan(same) != naive_pack(same, bucket_bytes, align)[1]:
        return False
    floats = [torch.ones(t.numel()) for t in tensors]
    in_elements = naive_pack([torch.zeros(t.numel(), dtype=torch.uint8) for t in tensors], bucket_bytes, align)[1]
    return plan(floats) in (None, in_elements)


def _pack(
    fn: Callable[..., Any], tensors: list[Any], bucket_bytes: int, align: int = 64, *, clone: bool = True
) -> tuple[list[Any], list[Any]]:
    try:
        got = call(fn, [t.clone() for t in tensors] if clone else list(tensors), bucket_bytes, align)
    except LearnerError as exc:
        if not isinstance(exc.error, NotImplementedError) and _counts_elements(fn, tensors, bucket_bytes, align):
            dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors if t.element_size() > 1})
            fail(
                f"{PACK} raised {type(exc.error).__name__} on tensors of {', '.join(dtypes)}, yet plans the same "
                "bytes right when they come as uint8 tensors (one byte an element): sizes and offsets count bytes, "
                "t.numel() * t.element_size(), not elements"
            )
        raise
    if not (isinstance(got, tuple) and len(got) == 2):
        fail(f"{PACK} must return a tuple (buckets, places); got {type(got).__name__}")
    buckets, places = got
    out = []
    for p in places:
        ints = isinstance(p, tuple | list) and len(p) == 2
        if not ints or not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in p):
            fail(
                f"{PACK}: places must hold one (bucket_index, byte_offset) tuple of ints per tensor; got {short_repr(p)}"
            )
        out.append((int(p[0]), int(p[1])))
    return list(buckets), out


def _places_message(tensors: list[Any], got: list[Any], want: list[Any], bucket_bytes: int, align: int) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            t = tensors[i]
            nbytes = t.numel() * t.element_size()
            hint = ""
            if g[1] != w[1] and g[1] * t.element_size() == w[1]:
                hint = " (offsets count bytes, not elements)"
            elif g[1] % align:
                hint = f" (offsets must be multiples of align={align}: round the end up)"
            elif g[0] > w[0] and g[1] == 0:
                hint = (
                    " (a new bucket opens only when the tensor does not END within bucket_bytes, and never "
                    "before an empty bucket is used)"
                )
            elif g[0] < w[0]:
                hint = " (the tensor does not fit: its end would pass bucket_bytes, start a new bucket)"
            return (
                f"tensor {i} ({nbytes} bytes, {t.dtype}) placed at (bucket, offset) {g}, expected {w} with "
                f"bucket_bytes={bucket_bytes}, align={align}{hint}"
            )
    return f"{len(got)} places for {len(tensors)} tensors; expected one (bucket, offset) per tensor"


#: (bucket_bytes, align): multiples of align and not, no alignment at all, a wide one
PLAN_CASES = ((1024, 64), (4096, 16), (256, 8), (1000, 64), (300, 16), (777, 8), (500, 1), (2048, 128))


@check_case(
    "places every tensor like the greedy in-order plan, for bucket sizes that are and are not multiples of align"
)
def _pack_places(fn: Callable[..., Any]) -> None:
    for bucket_bytes, align in PLAN_CASES:
        tensors = _tensors(1)
        _, places = _pack(fn, tensors, bucket_bytes, align)
        _, want = naive_pack(tensors, bucket_bytes, align)
        if places == want:
            continue
        if places == naive_pack(tensors, bucket_bytes, align, aligned_fit=True)[1]:
            fail(
                f"with bucket_bytes={bucket_bytes}, align={align} the plan tests whether the tensor's end rounded up "
                "to align fits: a tensor stays when its own end, offset + nbytes, is within bucket_bytes (the "
                "padding after the last tensor may pass it)"
            )
        fail(_places_message(tensors, places, want, bucket_bytes, align))


@check_case("a tensor that exactly fills the rest of a bucket stays in it")
def _pack_exact_fit(fn: Callable[..., Any]) -> None:
    import torch

    tensors = [torch.ones(16), torch.ones(48)]  # 64 + 192 = 256 bytes
    _, places = _pack(fn, tensors, 256, 64)
    assert_true(
        places == [(0, 0), (0, 64)],
        f"with bucket_bytes=256 two tensors of 64 and 192 bytes fill one bucket "
        f"exactly; got places {places} (use >, not >=, to decide it does not fit)",
    )


@check_case("an oversized tensor gets one bucket of its own, with no empty bucket")
def _pack_oversized(fn: Callable[..., Any]) -> None:
    import torch

    tensors = [torch.ones(1000), torch.ones(4), torch.ones(2000), torch.ones(4)]
    buckets, places = _pack(fn, tensors, 512, 64)
    _, want = naive_pack(tensors, 512, 64)
    if places != want:
        fail(_places_message(tensors, places, want, 512, 64) + "; an empty bucket before a big tensor is a slip")
    assert_true(len(buckets) == 4, f"expected 4 buckets, got {len(buckets)}")


@check_case("bucket bytes equal the oracle's, padding zero, lengths aligned")
def _pack_bytes(fn: Callable[..., Any]) -> None:
    import torch

    tensors = _tensors(2)
    buckets, _ = _pack(fn, tensors, 1024, 64)
    want, _ = naive_pack(tensors, 1024, 64)
    assert_true(len(buckets) == len(want), f"{len(buckets)} buckets, expected {len(want)}")
    for b, (got, exp) in enumerate(zip(buckets, want)):
        if not isinstance(got, torch.Tensor) or got.dtype != torch.uint8 or got.dim() != 1:
            fail(f"bucket {b} must be a 1-D torch.uint8 tensor, got {getattr(got, 'dtype', type(got).__name__)}")
        if got.numel() != len(exp):
            fail(f"bucket {b} has {got.numel()} bytes, expected {len(exp)} (its last tensor's end rounded up to align)")
        if got.numpy().tobytes() != exp:
            fail(
                f"bucket {b}'s bytes differ from the tensors' bytes at their offsets (copy "
                "t.reshape(-1).view(torch.uint8), and leave the padding zero)"
            )


@check_case("unpacking at the returned offsets gives back every tensor")
def _pack_roundtrip(fn: Callable[..., Any]) -> None:
    import torch

    tensors = _tensors(3)
    buckets, places = _pack(fn, tensors, 2048, 64)
    for i, (t, (b, off)) in enumerate(zip(tensors, places)):
        nbytes = t.numel() * t.element_size()
        back = buckets[b][off : off + nbytes].view(t.dtype).view(t.shape)
        assert_true(torch.equal(back, t), f"tensor {i} ({t.dtype}) does not come back from bucket {b} at offset {off}")


def _views() -> list[Any]:
    """Tensors as a model's state dict can hold them: views of larger storages (slices, a transposed and a
    narrowed matrix, a strided column, an expanded row, every third row of a transposed bf16 block)."""
    import torch

    gen = torch.Generator().manual_seed(5)
    base = torch.randn(40, 24, generator=gen)
    ints = (torch.randn(300, generator=gen) * 1000).to(torch.int64)
    half = torch.randn(16, 30, generator=gen).to(torch.bfloat16)
    return [base[3:9], base.T, base[:, 5], ints[100:137], half[2:10, 4:19], base[7].expand(3, 24), half.T[::3]]


VIEWS = "views of larger tensors (slices, a transposed matrix, a strided column, an expanded row)"


@check_case("views, slices and transposed tensors: sizes from numel and element_size, bytes in logical order")
def _pack_views(fn: Callable[..., Any]) -> None:
    import torch

    tensors = _views()
    before = [t.clone() for t in tensors]
    try:
        buckets, places = _pack(fn, tensors, 1536, 64, clone=False)
    except LearnerError as exc:
        pass_stub(exc)
        fail(
            f"{PACK} raised {type(exc.error).__name__} on {VIEWS}: read a tensor's elements in logical order "
            "(reshape, or contiguous() first), not through view() of its memory or its storage"
        )
    if not all(torch.equal(a, b) for a, b in zip(tensors, before)):
        fail(f"{PACK} changed the tensors it was given")
    want_buckets, want = naive_pack(tensors, 1536, 64)
    if places != want:
        i = next((k for k, (g, w) in enumerate(zip(places, want)) if g != w), min(len(places), len(want)))
        t = tensors[min(i, len(tensors) - 1)]
        fail(
            f"{VIEWS}: tensor {i} ({tuple(t.shape)}, {t.dtype}) placed at {places[i] if i < len(places) else None}, "
            f"expected {want[i] if i < len(want) else None}: a tensor's size is t.numel() * t.element_size(), the "
            f"bytes it shows ({t.numel() * t.element_size()} here), not its storage's "
            f"({t.untyped_storage().nbytes()} bytes)"
        )
    for b, (got, exp) in enumerate(zip(buckets, want_buckets)):
        data = got.numpy().tobytes() if isinstance(got, torch.Tensor) and got.dtype == torch.uint8 else None
        if data != exp:
            fail(
                f"{VIEWS}: bucket {b}'s bytes differ from the tensors' elements in logical (row-major) order: copy "
                "what reshape(-1) shows, not the storage's bytes in memory order"
            )


@check_case("does not modify the tensors it was given")
def _pack_unchanged(fn: Callable[..., Any]) -> None:
    import torch

    tensors = _tensors(4)
    given = [t.clone() for t in tensors]
    call(fn, given, 1024, 64)
    assert_true(all(torch.equal(a, b) for a, b in zip(given, tensors)), f"{PACK} changed the tensors it was given")


PACK_BUCKETS = Exercise(
    name=PACK,
    allowed=tuple(sorted(ALLOWED)),
    points=15,
    title="tensors into flat buckets at aligned byte offsets",
    checks=(_pack_places, _pack_exact_fit, _pack_oversized, _pack_bytes, _pack_roundtrip, _pack_views, _pack_unchanged),
    advice="with torch tensors and byte offsets",
    hints=(
        "One loop computes (bucket, offset) per tensor and the bucket sizes; a second allocates uint8 buckets and "
        "copies.",
        "A tensor opens a new bucket when there is none yet, or when it does not fit in the current one, unless the "
        "current one is still empty (a tensor larger than `bucket_bytes` gets a bucket of its own). After placing a "
        "tensor, the next offset is its end rounded UP to a multiple of `align`; a bucket's size is the offset after "
        "its last tensor.",
        "A tensor's size in bytes is `numel()` times `element_size()`; round up with integer arithmetic (a ceiling "
        "division by `align`, times `align`). To copy, view each tensor's bytes as a flat uint8 tensor "
        "(`.contiguous()`, flatten, `.view(torch.uint8)`) and assign them to the slice of its bucket that starts at "
        "its offset. Trap: testing the fit with the tensor's aligned size instead of its own.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: pipeline_schedule
# ---------------------------------------------------------------------------------------

SCHED = "pipeline_schedule"


def _schedule(fn: Callable[..., Any], n: int) -> list[list[tuple[str, int, int]]]:
    got = call(fn, n)
    try:
        return [[(str(s), int(b), int(k)) for s, b, k in step] for step in got]
    except (TypeError, ValueError):
        fail(f"{SCHED}({n}) must return a list of steps, each a list of (stage, bucket, buffer) tuples")
    raise AssertionError  # unreachable


@check_case("matches the schedule written out by hand for n = 0, 1, 3")
def _sched_known(fn: Callable[..., Any]) -> None:
    known = {
        0: [],
        1: [[("pack", 0, 0)], [("send", 0, 0)], [("unpack", 0, 0)]],
        3: [
            [("pack", 0, 0)],
            [("pack", 1, 1), ("send", 0, 0)],
            [("pack", 2, 0), ("send", 1, 1), ("unpack", 0, 0)],
            [("send", 2, 0), ("unpack", 1, 1)],
            [("unpack", 2, 0)],
        ],
    }
    for n, want in known.items():
        got = _schedule(fn, n)
        if got != want:
            fail(f"{SCHED}({n}) = {got}, expected {want}")


@check_case("n + 2 steps: the three stages overlap")
def _sched_length(fn: Callable[..., Any]) -> None:
    for n in (2, 5, 9):
        got = _schedule(fn, n)
        if len(got) == 3 * n:
            fail(
                f"{SCHED}({n}) has {3 * n} steps: the stages run in turn; in step s pack s, send s - 1 and "
                "unpack s - 2 together (n + 2 steps)"
            )
        assert_true(len(got) == n + 2, f"{SCHED}({n}) has {len(got)} steps, expected n + 2 = {n + 2}")


@check_case("every bucket is packed, sent, unpacked in consecutive steps")
def _sched_order(fn: Callable[..., Any]) -> None:
    for n in range(1, 10):
        got = _schedule(fn, n)
        when: dict[tuple[str, int], int] = {}
        for s, step in enumerate(got):
            for stage, b, _ in step:
                if (stage, b) in when:
                    fail(f"{SCHED}({n}): bucket {b} is {stage}ed twice")
                when[stage, b] = s
        for b in range(n):
            found = [when.get((stage, b)) for stage in ("pack", "send", "unpack")]
            times = [s for s in found if s is not None]
            if len(times) < 3:
                fail(f"{SCHED}({n}): bucket {b} misses a stage ({found} for pack, send, unpack)")
            if times != [times[0], times[0] + 1, times[0] + 2]:
                fail(
                    f"{SCHED}({n}): bucket {b} is packed, sent, unpacked at steps {times}; expected three "
                    "consecutive steps (an unpack in the step of its own send has nothing to unpack yet)"
                )


@check_case("no side uses one buffer twice in a step; bucket b uses buffer b % 2")
def _sched_buffers(fn: Callable[..., Any]) -> None:
    for n in range(1, 10):
        for s, step in enumerate(_schedule(fn, n)):
            for stage, b, k in step:
                if k != b % 2:
                    fail(
                        f"{SCHED}({n}), step {s}: {stage} of bucket {b} uses buffer {k}; with two buffers bucket b "
                        "uses buffer b % 2 (a buffer per bucket is not double buffering)"
                    )
            buffers = {stage: k for stage, _, k in step}
            for a, c, side in (("pack", "send", "sender"), ("send", "unpack", "receiver")):
                if a in buffers and c in buffers and buffers[a] == buffers[c]:
                    fail(f"{SCHED}({n}), step {s}: the {side}'s {a} and {c} use the same buffer {buffers[a]}")


@check_case("stages within a step are listed pack, send, unpack; per-bucket timelines agree up to n = 40")
def _sched_stage_order(fn: Callable[..., Any]) -> None:
    for n in (4, 10, 17, 40):
        got = _schedule(fn, n)
        want = naive_schedule(n)
        if got != want:
            s = next((k for k, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            fail(
                f"{SCHED}({n}), step {s}: {got[s] if s < len(got) else 'missing'}, expected "
                f"{want[s] if s < len(want) else 'no such step'} (pack s, send s - 1, unpack s - 2, in that order)"
            )


PIPELINE_SCHEDULE = Exercise(
    name=SCHED,
    allowed=tuple(sorted(ALLOWED)),
    points=10,
    title="the double-buffered pack / send / unpack schedule",
    checks=(_sched_length, _sched_order, _sched_buffers, _sched_known, _sched_stage_order),
    advice="as lists of (stage, bucket, buffer) steps",
    hints=(
        "Three stages (pack, send, unpack), each one step behind the one before: at step s, bucket s is packed, "
        "bucket s - 1 sent and bucket s - 2 unpacked, those of them that exist; n buckets take n + 2 steps.",
        "Each entry is (stage, bucket, buffer), the two buffers used in turn: a bucket's buffer is its parity. Build "
        "one list per step holding the entries whose bucket is in range(n), in the order pack, send, unpack; zero "
        "buckets give an empty schedule.",
        "Check by hand: 3 buckets give 5 steps: [pack 0], [pack 1, send 0], [pack 2, send 1, unpack 0], [send 2, "
        "unpack 1], [unpack 2], each bucket in buffer 0, 1, 0. Trap: stopping after n steps, which drops the last "
        "sends and unpacks.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: shard_range
# ---------------------------------------------------------------------------------------

SHARD = "shard_range"


def _ranges(fn: Callable[..., Any], size: int, tp: int) -> list[tuple[int, int]]:
    out = []
    for r in range(tp):
        got = call(fn, size, r, tp)
        try:
            start, stop = got
        except (TypeError, ValueError):
            fail(f"{SHARD}({size}, {r}, {tp}) must return (start, stop), got {got!r}")
        if not all(isinstance(v, (int, np.integer)) for v in (start, stop)):
            fail(f"{SHARD}({size}, {r}, {tp}) returned {got!r}; start and stop must be ints")
        out.append((int(start), int(stop)))
    return out


@check_case("known values: 10 rows over 4 ranks, 12 over 3, 7 over 1")
def _shard_known(fn: Callable[..., Any]) -> None:
    known = {(10, 4): [(0, 3), (3, 6), (6, 8), (8, 10)], (12, 3): [(0, 4), (4, 8), (8, 12)], (7, 1): [(0, 7)]}
    for (size, tp), want in known.items():
        got = _ranges(fn, size, tp)
        if got != want:
            extra = (
                " (that is torch.chunk's ceil split; give the extra rows to the FIRST size % tp ranks)"
                if (size, tp) == (10, 4) and got == [(0, 3), (3, 6), (6, 9), (9, 10)]
                else ""
            )
            fail(f"{size} rows over {tp} ranks: got {got}, expected {want}{extra}")


@check_case("the shards tile [0, size) and match rows dealt one by one")
def _shard_tiles(fn: Callable[..., Any]) -> None:
    for size in (0, 1, 5, 16, 31, 100, 4099):
        for tp in (1, 2, 3, 7, 8):
            got = _ranges(fn, size, tp)
            want = naive_shards(size, tp)
            if got != want:
                covered = sum(max(0, b - a) for a, b in got)
                why = f" (they cover {covered} of {size} rows)" if covered != size else ""
                fail(f"{size} rows over {tp} ranks: got {got}, expected {want}{why}")


@check_case("more ranks than rows: the last ranks get empty shards")
def _shard_empty(fn: Callable[..., Any]) -> None:
    got = _ranges(fn, 3, 5)
    want = [(0, 1), (1, 2), (2, 3), (3, 3), (3, 3)]
    assert_true(got == want, f"3 rows over 5 ranks: got {got}, expected {want}")


@check_case("raises ValueError for a rank outside [0, tp_size) or tp_size < 1")
def _shard_errors(fn: Callable[..., Any]) -> None:
    for args in ((10, 4, 4), (10, -1, 4), (10, 0, 0)):
        what = f"{SHARD}{args}"
        no_error = returned_instead_of_value_error(what, "tp_rank must be in [0, tp_size), tp_size >= 1")
        assert_value_error(fn, *args, what=what, no_error=no_error)


SHARD_RANGE = Exercise(
    name=SHARD,
    allowed=tuple(sorted(ALLOWED)),
    points=10,
    title="the rows a tensor-parallel rank keeps",
    checks=(_shard_known, _shard_tiles, _shard_empty, _shard_errors),
    advice="with divmod and integer arithmetic (09.5)",
    hints=(
        "Split `size` rows as evenly as possible over `tp_size` ranks: every rank gets the same base count, and the "
        "remainder goes one extra row each to the FIRST ranks; rank r's rows are contiguous and follow those of ranks "
        "0 .. r - 1.",
        "`divmod` gives the base count and the remainder; rank r starts after r base counts plus one extra row for "
        "each earlier rank that got one (min(r, remainder) of them), and holds one more row than the base count if it "
        "is itself one of the first `remainder` ranks.",
        "Validate first, raising `ValueError`: `tp_size` at least 1 and `tp_rank` in [0, tp_size). Return (start, "
        "stop) with stop exclusive. Check: 10 rows over 4 ranks give (0, 3), (3, 6), (6, 8), (8, 10).",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: verify_bucket
# ---------------------------------------------------------------------------------------

VERIFY = "verify_bucket"


def make_slot(
    payload: bytes,
    version: int,
    index: int,
    *,
    nbytes: int | None = None,
    checksum: int | None = None,
    magic: int | None = None,
) -> Any:
    """A bucket as the sender writes it: payload, then the 8-word header (oracle checksum)."""
    import torch

    from course_lib.weight_sync.integrity import MAGIC

    words = [
        MAGIC if magic is None else magic,
        version,
        index,
        1,
        len(payload) if nbytes is None else nbytes,
        naive_sum64(payload) if checksum is None else checksum,
        0,
        0,
    ]
    header = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words)
    return torch.frombuffer(bytearray(payload + header), dtype=torch.uint8).clone()


def _payload(seed: int, n_words: int = 64, small: bool = False) -> bytes:
    """Random words; ``small`` ones (< 2^40) never make the sum wrap around."""
    rng = np.random.default_rng(seed)
    if small:
        return rng.integers(0, 2**40, size=n_words, dtype=np.uint64).tobytes()
    return rng.integers(0, 256, size=8 * n_words, dtype=np.uint8).tobytes()


SUM64 = (
    "sum the payload only (not the header), as unsigned 64-bit words modulo 2^64 (np.add.reduce(..., "
    "dtype=np.uint64)), and compare with words[5] % 2**64"
)


def _accept(fn: Callable[..., Any], slot: Any, version: int, index: int, why: str, corrupt: str = SUM64) -> Any:
    """The payload ``fn`` returns for a good bucket; a rejection fails with ``corrupt`` as the advice."""
    from course_lib.weight_sync.integrity import CorruptBucketError, OutOfOrderBucketError

    try:
        return fn(slot.clone(), version, index)
    except NotImplementedError:
        raise
    except CorruptBucketError as exc:
        fail(f"{why} was rejected as corrupt ({exc}): {corrupt}")
    except OutOfOrderBucketError as exc:
        fail(f"{why} was rejected as out of order ({exc}): read version and index from header words 1 and 2")
    except Exception as exc:
        fail(f"{why}: raised {type(exc).__name__}: {exc}")
    raise AssertionError  # unreachable


def _expect(fn: Callable[..., Any], slot: Any, version: int, index: int, error: str, why: str) -> None:
    from course_lib.weight_sync.integrity import CorruptBucketError, OutOfOrderBucketError

    errors = {"CorruptBucketError": CorruptBucketError, "OutOfOrderBucketError": OutOfOrderBucketError}
    other = "OutOfOrderBucketError" if error == "CorruptBucketError" else "CorruptBucketError"
    try:
        fn(slot.clone(), version, index)
    except errors[error]:
        return
    except NotImplementedError:
        raise
    except errors[other]:
        fail(f"{why}: raised {other}, expected {error}")
    except Exception as exc:
        fail(f"{why}: raised {type(exc).__name__}: {exc}; expected {error}")
    fail(f"{why}: the bucket was accepted; expected {error}")


@check_case("accepts good buckets and returns their payload")
def _verify_good(fn: Callable[..., Any]) -> None:
    for seed in range(4):
        payload = _payload(seed, 16 + 8 * seed, small=True)
        slot = make_slot(payload, version=3 + seed, index=seed)
        got = _accept(fn, slot, 3 + seed, seed, f"a good bucket ({len(payload)} bytes, no wrap-around)")
        data = got.numpy().tobytes() if hasattr(got, "numpy") else None
        if data != payload:
            n = getattr(got, "numel", lambda: "?")()
            fail(
                f"a good bucket of {len(payload)} payload bytes returned {n} bytes that are not the payload "
                "(return slot[:-HEADER_BYTES])"
            )


def _top_bit_payloads(count: int) -> list[bytes]:
    """Random payloads (uniform bytes, as real weights give) whose sum64 has its top bit set: the header word
    is then a negative int64. About half of all buckets are so."""
    found: list[bytes] = []
    seed = 100
    while len(found) < count:
        payload = _payload(seed, 8 + seed % 24)
        if naive_sum64(payload) < 0:
            found.append(payload)
        seed += 1
    return found


@check_case("a checksum with its top bit set (a negative int64 header word) is compared unsigned")
def _verify_top_bit(fn: Callable[..., Any]) -> None:
    clear = next(p for p in (_payload(s, 12) for s in range(50, 90)) if naive_sum64(p) >= 0)
    _accept(fn, make_slot(clear, 4, 1), 4, 1, "a good bucket whose checksum has its top bit clear")
    for k, payload in enumerate(_top_bit_payloads(4)):
        word = naive_sum64(payload)
        _accept(
            fn,
            make_slot(payload, 4, k),
            4,
            k,
            f"a good bucket ({len(payload)} random bytes) whose checksum has its top bit set (header word 5 reads "
            f"as the negative int64 {word})",
            corrupt=(
                "the sum of unsigned words is never negative, the header word is signed: compare the unsigned sum "
                "with words[5] % 2**64 (Python's % gives the unsigned value of the same 64 bits); a signed "
                "comparison rejects about half of real buckets"
            ),
        )


@check_case("a flipped bit anywhere in the payload is a CorruptBucketError")
def _verify_bitflip(fn: Callable[..., Any]) -> None:
    payload = _payload(7)
    for position, bit in ((0, 1), (len(payload) // 2, 64), (len(payload) - 1, 128), (7, 128)):
        slot = make_slot(payload, 5, 2)
        slot[position] ^= bit
        _expect(fn, slot, 5, 2, "CorruptBucketError", f"payload byte {position} flipped (bit {bit})")


@check_case("a stale or future version, a repeated or skipped index is an OutOfOrderBucketError")
def _verify_order(fn: Callable[..., Any]) -> None:
    slot = make_slot(_payload(8), 5, 2)
    equal = "version and index must EQUAL the expected ones"
    _expect(fn, slot, 6, 2, "OutOfOrderBucketError", "a bucket of version 5 when version 6 is expected (stale)")
    _expect(
        fn,
        slot,
        4,
        2,
        "OutOfOrderBucketError",
        f"a bucket of version 5 when version 4 is expected (from a future update; {equal})",
    )
    _expect(fn, slot, 5, 3, "OutOfOrderBucketError", "bucket 2 when bucket 3 is expected (repeated, out of order)")
    _expect(
        fn, slot, 5, 1, "OutOfOrderBucketError", f"bucket 2 when bucket 1 is expected (bucket 1 was skipped; {equal})"
    )
    _expect(
        fn,
        make_slot(_payload(8), 0, 0),
        2**40,
        0,
        "OutOfOrderBucketError",
        "a bucket of version 0 when version 2^40 is expected",
    )


@check_case(
    "two faults at once: the first in the statement's order is raised (magic, version, index, nbytes, checksum)"
)
def _verify_first_problem(fn: Callable[..., Any]) -> None:
    payload = _payload(12)
    damaged = make_slot(payload, 5, 2)
    damaged[3] ^= 16  # a flipped payload bit: the checksum is off too
    order = "check in the statement's order, the header (magic, version, index, nbytes) before the checksum"
    _expect(fn, damaged, 6, 2, "OutOfOrderBucketError", f"a stale bucket whose payload is also damaged ({order})")
    _expect(
        fn, damaged, 5, 3, "OutOfOrderBucketError", f"an out-of-order bucket whose payload is also damaged ({order})"
    )
    _expect(
        fn,
        make_slot(payload, 5, 2, nbytes=len(payload) + 8),
        5,
        4,
        "OutOfOrderBucketError",
        f"an out-of-order bucket whose nbytes is also wrong ({order})",
    )
    _expect(
        fn,
        make_slot(payload, 5, 2, magic=7),
        6,
        2,
        "CorruptBucketError",
        "a damaged magic number on a bucket of another version (not a bucket at all: the magic number comes first)",
    )


@check_case("bad magic or a wrong size is a CorruptBucketError")
def _verify_header(fn: Callable[..., Any]) -> None:
    payload = _payload(9)
    _expect(fn, make_slot(payload, 1, 0, magic=12345), 1, 0, "CorruptBucketError", "a header whose magic is damaged")
    _expect(
        fn,
        make_slot(payload, 1, 0, nbytes=len(payload) - 8),
        1,
        0,
        "CorruptBucketError",
        "a header whose nbytes is 8 less than the payload",
    )


@check_case("the checksum wraps modulo 2^64 and covers the payload only")
def _verify_wrap(fn: Callable[..., Any]) -> None:
    payload = b"\xff" * 8 * 40 + _payload(10, 8)  # the words' sum overflows 64 bits many times
    assert naive_sum64(payload) >= 0  # its top bit clear: a signed comparison is checked on its own, below
    got = _accept(fn, make_slot(payload, 2, 1), 2, 1, "a good bucket whose words sum past 2^64")
    assert_true(got is not None and got.numel() == len(payload), "a good bucket must return its payload")
    _expect(
        fn,
        make_slot(payload, 2, 1, checksum=naive_sum64(payload) ^ 1),
        2,
        1,
        "CorruptBucketError",
        "a checksum off by one bit",
    )


@check_case("does not modify the slot")
def _verify_unchanged(fn: Callable[..., Any]) -> None:
    import torch

    slot = make_slot(_payload(11), 4, 0)
    given = slot.clone()
    call(fn, given, 4, 0)
    assert_true(torch.equal(given, slot), f"{VERIFY} changed the slot it was given")


VERIFY_BUCKET = Exercise(
    name=VERIFY,
    allowed=tuple(sorted(ALLOWED)),
    points=15,
    title="versions, order and checksums of a received bucket",
    checks=(
        _verify_good,
        _verify_wrap,
        _verify_top_bit,
        _verify_bitflip,
        _verify_order,
        _verify_header,
        _verify_first_problem,
        _verify_unchanged,
    ),
    advice=(
        "reading the header words and summing the payload yourself (only the error classes and "
        "HEADER_BYTES, MAGIC may come from course_lib.weight_sync.integrity)"
    ),
    hints=(
        "A slot is the payload followed by a header: its last `HEADER_BYTES` bytes are int64 words (magic, version, "
        "index, a reserved word, nbytes, checksum). Check them in that order, the checksum last, raising the error "
        "the statement names for each.",
        "Read the header by viewing the slot's last `HEADER_BYTES` bytes as `torch.int64` and turning them into "
        "Python ints (`.tolist()`); the payload is every byte before the header. A wrong version or index is out of "
        "order (`OutOfOrderBucketError`); a bad magic, size or checksum is corrupt (`CorruptBucketError`).",
        "The checksum is the sum of the payload's 8-byte words as UNSIGNED 64-bit integers, wrapping modulo 2^64: "
        "view the payload's numpy array as `np.uint64` and reduce it with `np.add.reduce` and `dtype=np.uint64`. The "
        "header stores it as a signed int64: compare with it taken modulo 2**64. Trap: a signed comparison rejects "
        "about half of real buckets.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 5: update_time
# ---------------------------------------------------------------------------------------

UT = "update_time"
METHODS = ("naive", "per_tensor", "bucketed", "pipelined")
RATES = ("alpha", "beta", "sigma", "rho", "gamma", "eta", "write", "read")


def _count_buckets(nbytes: int, bucket_bytes: int) -> int:
    """Buckets filled one after the other until the bytes run out (at least one)."""
    n, left = 0, nbytes
    while left > 0 or n == 0:
        n += 1
        left -= bucket_bytes
    return n


def _ping_pong(durations: list[tuple[float, float, float]]) -> float:
    """When the last bucket is unpacked, buckets going pack -> send -> unpack with each stage busy with one
    bucket at a time, and bucket i taking buffer i % 2 of a side only once bucket i - 2 has left it
    (exercise 2's schedule, with durations)."""
    packed: list[float] = []
    sent: list[float] = []
    unpacked: list[float] = []
    for i, (pack, send, unpack) in enumerate(durations):
        start = max(packed[i - 1] if i else 0.0, sent[i - 2] if i >= 2 else 0.0)
        packed.append(start + pack)
        start = max(packed[i], sent[i - 1] if i else 0.0, unpacked[i - 2] if i >= 2 else 0.0)
        sent.append(start + send)
        start = max(sent[i], unpacked[i - 1] if i else 0.0)
        unpacked.append(start + unpack)
    return unpacked[-1]


def simulate_update(method: str, nbytes: int, n_tensors: int, bucket_bytes: int, rates: dict[str, float]) -> float:
    """Seconds of one update walked message by message and bucket by bucket (no closed form): the oracle."""
    if method == "naive":  # one after the other: write the checkpoint, read it back, reload it
        return sum(nbytes / rates[r] for r in ("write", "read", "rho"))
    if method == "per_tensor":  # one message per tensor, the tensor as it is: no stage, no reload
        clock = 0.0
        for _ in range(n_tensors):
            clock += rates["alpha"] + nbytes / n_tensors / rates["beta"]
        return clock
    n = _count_buckets(nbytes, bucket_bytes)
    size, share = nbytes / n, n_tensors * rates["gamma"] / n
    durations = [(size / rates["sigma"] + share, rates["alpha"] + size / rates["beta"], size / rates["rho"] + share)]
    in_turn = sum(sum(d) for d in durations * n)  # one stage at a time
    if method == "bucketed":
        return in_turn
    side_by_side = _ping_pong(durations * n)
    return in_turn - rates["eta"] * (in_turn - side_by_side)  # eta: the share of that overlap achieved


def _stages(n: int, size: float, k: int, r: dict[str, float]) -> tuple[float, float, float]:
    share = k * r["gamma"] / n
    return size / r["sigma"] + share, r["alpha"] + size / r["beta"], size / r["rho"] + share


def _paced(n: int, stages: tuple[float, float, float], m: float, eta: float) -> float:
    return sum(stages) + (n - 1) * (m + (1 - eta) * (sum(stages) - m))


def _slip_value(slip: str, method: str, nbytes: int, k: int, bucket_bytes: int, r: dict[str, float]) -> float | None:
    """What a known slip computes (closed forms, used only to name a wrong answer); None where it does not apply."""
    n = _count_buckets(nbytes, bucket_bytes)
    eta = r["eta"] if method == "pipelined" else 0.0
    if slip == "floor" and method in ("bucketed", "pipelined") and nbytes // bucket_bytes not in (0, n):
        n = nbytes // bucket_bytes
        return _paced(n, _stages(n, nbytes / n, k, r), max(_stages(n, nbytes / n, k, r)), eta)
    if method == "pipelined":
        stages = _stages(n, nbytes / n, k, r)
        if slip == "full_buckets":
            full = _stages(n, float(min(bucket_bytes, nbytes)), k, r)
            return _paced(n, full, max(full), eta)
        if slip == "no_fill":
            return n * (max(stages) + (1 - eta) * (sum(stages) - max(stages)))
        if slip == "eta_reversed":
            return _paced(n, stages, max(stages), 1 - eta)
        if slip == "pace_without_alpha":
            return _paced(n, stages, max(stages[0], stages[1] - r["alpha"], stages[2]), eta)
        if slip == "no_gamma_share":
            bare = _stages(n, nbytes / n, 0, r)
            return _paced(n, bare, max(bare), eta) + 2 * k * r["gamma"]
    if slip == "gamma_once" and method == "bucketed":
        return n * sum(_stages(n, nbytes / n, k, r)) - k * r["gamma"]
    if slip == "per_tensor_copies" and method == "per_tensor":
        return k * r["alpha"] + nbytes / r["beta"] + nbytes / r["sigma"] + nbytes / r["rho"]
    if slip == "naive_no_reload" and method == "naive":
        return nbytes / r["write"] + nbytes / r["read"]
    return None


UT_SLIPS = {
    "floor": "n is the number of buckets the bytes fill, ceil(B / bucket_bytes), not B // bucket_bytes",
    "full_buckets": "the model cuts the B bytes into n EQUAL buckets of b = B / n bytes, not n buckets of bucket_bytes",
    "no_fill": "the first bucket passes all three stages before the pace is set: t_1 + (n - 1) x pace, not n x pace",
    "eta_reversed": "eta = 1 hides every stage but the slowest (pace m), eta = 0 runs them in turn (pace t_1): "
    "pace = m + (1 - eta) (t_1 - m)",
    "pace_without_alpha": "a bucket's transfer stage is alpha + b / beta: the message's latency is part of the stage "
    "that may set the pace",
    "no_gamma_share": "each bucket's stage and reload carry their tensors' share k gamma / n of the per-tensor cost, "
    "so that cost is pipelined too",
    "gamma_once": "the per-tensor cost gamma is paid on each side, once packing and once unpacking: 2 k gamma (09.2)",
    "per_tensor_copies": "per-tensor broadcasts send each tensor as it is, with no stage and no reload: "
    "k alpha + B / beta (09.1 with n = k)",
    "naive_no_reload": "the naive path ends with the receiver reloading the weights: B / write + B / read + B / rho",
}


def _ut_text(method: str, nbytes: int, k: int, bucket_bytes: int, rates: dict[str, float]) -> str:
    shown = ", ".join(f"{name}={fmt_number(rates[name])}" for name in RATES)
    return f"{UT}({method!r}, {nbytes}, {k}, {bucket_bytes}, {{{shown}}})"


def _ut_value(
    fn: Callable[..., Any], method: str, nbytes: int, k: int, bucket_bytes: int, rates: dict[str, float]
) -> float:
    given = dict(rates)
    got = call(fn, method, nbytes, k, bucket_bytes, given)
    what = _ut_text(method, nbytes, k, bucket_bytes, rates)
    if given != rates:
        fail(f"{what} changed the rates dict it was given")
    if isinstance(got, bool | np.bool_) or not isinstance(got, int | float | np.integer | np.floating):
        fail(f"{what} returned {short_repr(got)}; expected seconds, a float")
    if not math.isfinite(float(got)):
        fail(f"{what} returned {fmt_number(got)}; expected finite seconds")
    return float(got)


def _ut_compare(
    fn: Callable[..., Any], method: str, nbytes: int, k: int, bucket_bytes: int, rates: dict[str, float], case: str = ""
) -> None:
    got = _ut_value(fn, method, nbytes, k, bucket_bytes, rates)
    want = simulate_update(method, nbytes, k, bucket_bytes, rates)
    if math.isclose(got, want, rel_tol=1e-9):
        return
    what = f"{_ut_text(method, nbytes, k, bucket_bytes, rates)}{case} = {fmt_number(got)} s"
    for slip, message in UT_SLIPS.items():
        wrong = _slip_value(slip, method, nbytes, k, bucket_bytes, rates)
        if wrong is not None and not math.isclose(wrong, want, rel_tol=1e-9) and math.isclose(got, wrong, rel_tol=1e-9):
            fail(f"{what}; {message}")
    in_turn = simulate_update("bucketed", nbytes, k, bucket_bytes, rates)
    if method == "pipelined" and math.isclose(got, in_turn, rel_tol=1e-9):
        fail(
            f"{what}, the stages in turn (09.2); with eta = {fmt_number(rates['eta'])} the pipeline hides that share "
            "of the other stages behind the slowest one (09.3)"
        )
    fail(f"{what}; expected {fmt_number(want)} s")


#: a 1 GB update of 100 tensors in 4 buckets of 250 MB, rates that make every term easy by hand
BY_HAND = {"alpha": 1e-3, "beta": 1e9, "sigma": 4e9, "rho": 2e9, "gamma": 1e-5, "eta": 1.0, "write": 5e8, "read": 1e9}
BY_HAND_SECONDS = {"naive": 3.5, "per_tensor": 1.1, "bucketed": 1.756, "pipelined": 1.192}


@check_case("hand-computed: a 1 GB update of 100 tensors in 4 buckets, each method")
def _ut_known(fn: Callable[..., Any]) -> None:
    for method, seconds in BY_HAND_SECONDS.items():
        assert math.isclose(simulate_update(method, 10**9, 100, 250_000_000, BY_HAND), seconds, rel_tol=1e-12)
        _ut_compare(fn, method, 10**9, 100, 250_000_000, BY_HAND)


def _random_case(rng: np.random.Generator) -> tuple[int, int, int, dict[str, float]]:
    """(B, k, bucket_bytes, rates): rates over orders of magnitude, buckets that divide B, do not, or exceed it."""

    def log_uniform(lo: float, hi: float) -> float:
        return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    rates = {
        "alpha": log_uniform(1e-6, 1e-2),
        "beta": log_uniform(1e8, 1e11),
        "sigma": log_uniform(1e8, 1e11),
        "rho": log_uniform(1e8, 1e12),
        "gamma": 0.0 if rng.random() < 0.2 else log_uniform(1e-7, 1e-3),
        "eta": float(rng.choice([0.0, 1.0, round(float(rng.uniform(-0.5, 1.0)), 3)])),
        "write": log_uniform(1e8, 1e10),
        "read": log_uniform(1e8, 1e11),
    }
    n, bucket_bytes = int(rng.integers(1, 200)), int(rng.integers(2**16, 2**28))
    kind = int(rng.integers(0, 3))
    nbytes = n * bucket_bytes - (0 if kind == 0 else int(rng.integers(1, bucket_bytes)))
    if kind == 2:
        bucket_bytes = nbytes + int(rng.integers(0, 2**20))  # one bucket, the whole update
    return nbytes, int(rng.integers(1, 2000)), bucket_bytes, rates


@check_case(
    "random rates over orders of magnitude, bucket sizes that divide B or not, eta from -0.5 to 1, against a "
    "simulation of the buckets through the ping-pong buffers"
)
def _ut_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(9)
    for _ in range(30):
        nbytes, k, bucket_bytes, rates = _random_case(rng)
        for method in METHODS:
            _ut_compare(fn, method, nbytes, k, bucket_bytes, rates)


#: every stage as fast as the others but one: which stage sets the pace
PACE_BASE = {
    "alpha": 2e-4,
    "beta": 2e10,
    "sigma": 2e10,
    "rho": 2e10,
    "gamma": 2e-6,
    "eta": 1.0,
    "write": 1e9,
    "read": 1e9,
}
BOUND = {"stage": {"sigma": 2e9}, "link": {"beta": 2e9}, "reload": {"rho": 2e9}, "message latency": {"alpha": 0.4}}


@check_case("with eta = 1 the first bucket fills the pipe, then the slowest stage sets the pace (each stage in turn)")
def _ut_pace(fn: Callable[..., Any]) -> None:
    for bound, change in BOUND.items():
        for nbytes, bucket_bytes in ((8 * 10**9, 10**9), (6 * 10**9 + 12345, 5 * 10**8)):
            case = f" ({bound}-bound)"
            _ut_compare(fn, "pipelined", nbytes, 300, bucket_bytes, {**PACE_BASE, **change}, case)


@check_case("one bucket or eta = 0 gives the bucketed time; the best bucket size is the simulation's")
def _ut_properties(fn: Callable[..., Any]) -> None:
    rates = {
        "alpha": 3e-3,
        "beta": 1e10,
        "sigma": 2e10,
        "rho": 5e10,
        "gamma": 0.0,
        "eta": 1.0,
        "write": 1e9,
        "read": 1e9,
    }
    nbytes = 16 * 10**9
    for bucket_bytes, eta, why in (
        (2 * nbytes, 1.0, "one bucket has nothing to overlap"),
        (10**9, 0.0, "eta = 0 runs the stages in turn"),
    ):
        r = {**rates, "eta": eta}
        piped = _ut_value(fn, "pipelined", nbytes, 500, bucket_bytes, r)
        in_turn = _ut_value(fn, "bucketed", nbytes, 500, bucket_bytes, r)
        if not math.isclose(piped, in_turn, rel_tol=1e-9):
            fail(
                f"{_ut_text('pipelined', nbytes, 500, bucket_bytes, r)} = {fmt_number(piped)} s but bucketed gives "
                f"{fmt_number(in_turn)} s; {why}: they must be equal"
            )
    sizes = [nbytes // 2**j for j in range(13)]
    got = [_ut_value(fn, "pipelined", nbytes, 500, b, rates) for b in sizes]
    want = [simulate_update("pipelined", nbytes, 500, b, rates) for b in sizes]
    best_got, best_want = sizes[int(np.argmin(got))], sizes[int(np.argmin(want))]
    if best_got != best_want:
        fail(
            f"over bucket sizes {sizes[-1]} to {sizes[0]} bytes (B = {nbytes}, alpha = 3 ms) your pipelined time is "
            f"smallest at {best_got} bytes, the simulation's at {best_want}: small buckets pay alpha per message, "
            "large ones a long fill t_1 (09.3)"
        )
    for b, g, w in zip(sizes, got, want):
        if not math.isclose(g, w, rel_tol=1e-9):
            fail(f"{_ut_text('pipelined', nbytes, 500, b, rates)} = {fmt_number(g)} s; expected {fmt_number(w)} s")


@check_case("raises ValueError for a method it does not know")
def _ut_errors(fn: Callable[..., Any]) -> None:
    methods = ", ".join(METHODS)
    for method in ("flat", "Pipelined", "ring"):
        what = f"{UT}({method!r}, ...)"
        no_error = returned_instead_of_value_error(what, f"the methods are {methods}")
        args = (method, 10**9, 10, 10**8, dict(BY_HAND))
        assert_value_error(fn, *args, what=what, no_error=no_error, other=f" (methods: {methods})")


UPDATE_TIME = Exercise(
    name=UT,
    allowed=tuple(sorted(ALLOWED)),
    points=15,
    title="the time of an update: naive, per tensor, bucketed, pipelined (09.1-09.3)",
    checks=(_ut_known, _ut_oracle, _ut_pace, _ut_properties, _ut_errors),
    advice="from (09.1)-(09.3) with plain arithmetic",
    hints=(
        "The naive and per-tensor methods are one line each. For the other two, write the three per-bucket stage "
        "times first (stage, transfer, reload, each with its share of the per-tensor cost): bucketed is n times "
        "their sum, and pipelined is built from the same three numbers.",
        "`n` is how many buckets the bytes fill (a ceiling), and every bucket carries the same B / n bytes. The "
        "transfer stage of one bucket is one message: its latency belongs to that stage, and so to the pace.",
        "Check by hand: 1 GB, 100 tensors, 4 buckets, alpha = 1 ms, beta = 1 GB/s, sigma = 4 GB/s, rho = 2 GB/s, "
        "gamma = 10 us and eta = 1 give a fill t_1 of 0.439 s and a pace of 0.251 s, so 1.192 s in all; with eta = "
        "0 the same update takes 1.756 s, the bucketed time.",
    ),
)

EXERCISES: tuple[Exercise, ...] = (PACK_BUCKETS, PIPELINE_SCHEDULE, SHARD_RANGE, VERIFY_BUCKET, UPDATE_TIME)
