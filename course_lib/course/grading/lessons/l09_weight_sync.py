"""Lesson 09's graded exercises: bucket packing, the pipelined schedule, shard ranges and
bucket verification.

The learner writes:

* ``pack_buckets(tensors, bucket_bytes, align=64) -> (buckets, places)``  (09.2)
* ``pipeline_schedule(n_buckets) -> [[(stage, bucket, buffer), ...], ...]``  (09.3)
* ``shard_range(size, tp_rank, tp_size) -> (start, stop)``  (09.5)
* ``verify_bucket(slot, expected_version, expected_index) -> payload``  (09.6)

The checks never call ``course_lib.weight_sync``'s implementations: they compare with the
naive oracles below (a ``bytearray`` built byte by byte, per-bucket timelines, rows dealt
one by one like cards, words summed as Python integers), hand-written values and properties.
The error classes and header layout are taken from ``course_lib.weight_sync.integrity``.

Every check first refuses a learner's function that is, wraps or calls ``course_lib.weight_sync``'s
own implementation (:func:`_guard`, built on ``library_references`` as lesson 05's guard is): the
library's ``shard_range`` or ``BucketHeader.read`` + ``verify_bucket`` pass every check. The error
classes the exercises raise (:data:`ALLOWED`) and the constants (``HEADER_BYTES``, ``MAGIC``) may be
imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.course.grading.checks import Check, Exercise, assert_true, call, check_case, fail
from course_lib.course.grading.helpers import guard_checks

LESSON = "09_weight_sync"
LIBRARY = ("course_lib.weight_sync",)
# what the exercises may take from the library: the error classes they raise
ALLOWED = frozenset(
    f"course_lib.weight_sync.integrity.{name}"
    for name in ("CorruptBucketError", "OutOfOrderBucketError", "WeightSyncError")
)


def _guard(checks: tuple[Check, ...], *, name: str, advice: str) -> tuple[Check, ...]:
    """``checks``, each first failing when the learner's function is, wraps or calls an
    implementation from :data:`LIBRARY` other than the error classes in :data:`ALLOWED`
    (lesson 05's ``guard_checks`` with an allow-list). The stub passes the guard."""
    return guard_checks(checks, name=name, packages=LIBRARY, advice=advice, allowed=ALLOWED)


# ---------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------


def naive_pack(tensors: list[Any], bucket_bytes: int, align: int = 64) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Buckets as ``bytes``, built by appending each tensor's bytes and zero padding to a ``bytearray``."""
    buckets: list[bytearray] = []
    places: list[tuple[int, int]] = []
    for t in tensors:
        data = t.contiguous().reshape(-1).view(__import__("torch").uint8).numpy().tobytes()
        fits = buckets and (len(buckets[-1]) == 0 or len(buckets[-1]) + len(data) <= bucket_bytes)
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


def _pack(
    fn: Callable[..., Any], tensors: list[Any], bucket_bytes: int, align: int = 64
) -> tuple[list[Any], list[Any]]:
    got = call(fn, [t.clone() for t in tensors], bucket_bytes, align)
    if not (isinstance(got, tuple) and len(got) == 2):
        fail(f"{PACK} must return a tuple (buckets, places); got {type(got).__name__}")
    buckets, places = got
    return list(buckets), [tuple(int(v) for v in p) for p in places]


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


@check_case("places every tensor like the greedy in-order plan")
def _pack_places(fn: Callable[..., Any]) -> None:
    for bucket_bytes, align in ((1024, 64), (4096, 16), (256, 8)):
        tensors = _tensors(1)
        _, places = _pack(fn, tensors, bucket_bytes, align)
        _, want = naive_pack(tensors, bucket_bytes, align)
        if places != want:
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


@check_case("does not modify the tensors it was given")
def _pack_unchanged(fn: Callable[..., Any]) -> None:
    import torch

    tensors = _tensors(4)
    given = [t.clone() for t in tensors]
    call(fn, given, 1024, 64)
    assert_true(all(torch.equal(a, b) for a, b in zip(given, tensors)), f"{PACK} changed the tensors it was given")


PACK_BUCKETS = Exercise(
    name=PACK,
    points=15,
    title="tensors into flat buckets at aligned byte offsets",
    checks=_guard(
        (_pack_places, _pack_exact_fit, _pack_oversized, _pack_bytes, _pack_roundtrip, _pack_unchanged),
        name=PACK,
        advice="with torch tensors and byte offsets",
    ),
    hints=(
        "one loop computes (bucket, offset) per tensor and the bucket sizes; a second allocates uint8 buckets and copies",
        "new bucket when `not sizes or (offset > 0 and offset + nbytes > bucket_bytes)`; next offset = "
        "-(-(offset + nbytes) // align) * align",
        "buckets[b][off:off + nbytes] = t.contiguous().reshape(-1).view(torch.uint8)",
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


@check_case("stages within a step are listed pack, send, unpack")
def _sched_stage_order(fn: Callable[..., Any]) -> None:
    got = _schedule(fn, 4)
    want = naive_schedule(4)
    if got != want:
        fail(f"{SCHED}(4) = {got}, expected {want}")


PIPELINE_SCHEDULE = Exercise(
    name=SCHED,
    points=10,
    title="the double-buffered pack / send / unpack schedule",
    checks=_guard(
        (_sched_length, _sched_order, _sched_buffers, _sched_known, _sched_stage_order),
        name=SCHED,
        advice="as lists of (stage, bucket, buffer) steps",
    ),
    hints=(
        "for s in range(n + 2): the buckets s, s - 1, s - 2 are packed, sent and unpacked (when in range(n))",
        "each entry is (stage, bucket, bucket % 2); return [] for n = 0",
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
    for size in (1, 5, 16, 31, 100, 4099):
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
        try:
            fn(*args)
        except ValueError:
            continue
        except NotImplementedError:
            raise
        except Exception as exc:
            fail(f"{SHARD}{args} raised {type(exc).__name__}; expected ValueError")
        fail(f"{SHARD}{args} returned; expected ValueError (tp_rank must be in [0, tp_size), tp_size >= 1)")


SHARD_RANGE = Exercise(
    name=SHARD,
    points=10,
    title="the rows a tensor-parallel rank keeps",
    checks=_guard(
        (_shard_known, _shard_tiles, _shard_empty, _shard_errors),
        name=SHARD,
        advice="with divmod and integer arithmetic (09.5)",
    ),
    hints=(
        "q, m = divmod(size, tp_size): every rank gets q rows, the first m one more",
        "start = tp_rank * q + min(tp_rank, m); stop = start + q + (1 if tp_rank < m else 0)",
        "check tp_size >= 1 and 0 <= tp_rank < tp_size first, raising ValueError",
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


def _accept(fn: Callable[..., Any], slot: Any, version: int, index: int, why: str) -> Any:
    from course_lib.weight_sync.integrity import CorruptBucketError, OutOfOrderBucketError

    try:
        return fn(slot.clone(), version, index)
    except NotImplementedError:
        raise
    except CorruptBucketError as exc:
        fail(
            f"{why} was rejected as corrupt ({exc}): sum the payload only (not the header), as unsigned 64-bit "
            "words modulo 2^64 (np.add.reduce(..., dtype=np.uint64)), and compare with words[5] % 2**64"
        )
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


@check_case("a flipped bit anywhere in the payload is a CorruptBucketError")
def _verify_bitflip(fn: Callable[..., Any]) -> None:
    payload = _payload(7)
    for position, bit in ((0, 1), (len(payload) // 2, 64), (len(payload) - 1, 128), (7, 128)):
        slot = make_slot(payload, 5, 2)
        slot[position] ^= bit
        _expect(fn, slot, 5, 2, "CorruptBucketError", f"payload byte {position} flipped (bit {bit})")


@check_case("wrong version or index is an OutOfOrderBucketError")
def _verify_order(fn: Callable[..., Any]) -> None:
    slot = make_slot(_payload(8), 5, 2)
    _expect(fn, slot, 6, 2, "OutOfOrderBucketError", "a bucket of version 5 when version 6 is expected (stale)")
    _expect(fn, slot, 5, 3, "OutOfOrderBucketError", "bucket 2 when bucket 3 is expected (out of order)")


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
    points=15,
    title="versions, order and checksums of a received bucket",
    checks=_guard(
        (_verify_good, _verify_wrap, _verify_bitflip, _verify_order, _verify_header, _verify_unchanged),
        name=VERIFY,
        advice="reading the header words and summing the payload yourself (only the error classes and "
        "HEADER_BYTES, MAGIC may come from course_lib.weight_sync.integrity)",
    ),
    hints=(
        "words = slot[-HEADER_BYTES:].view(torch.int64).tolist(); payload = slot[:-HEADER_BYTES]; check magic, "
        "version, index, nbytes, checksum in that order",
        "the checksum is np.add.reduce(payload.numpy().view(np.uint64), dtype=np.uint64): it wraps modulo 2^64",
        "int(total) must equal words[5] % 2**64 (the header word is signed); raise CorruptBucketError otherwise",
    ),
)

EXERCISES: tuple[Exercise, ...] = (PACK_BUCKETS, PIPELINE_SCHEDULE, SHARD_RANGE, VERIFY_BUCKET)
