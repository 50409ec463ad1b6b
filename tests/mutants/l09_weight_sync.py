"""Planted bugs in lesson 09's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

PACK, SCHED, SHARD, VERIFY = "pack_buckets", "pipeline_schedule", "shard_range", "verify_bucket"
FITS = "if not sizes or (offset > 0 and offset + nbytes > bucket_bytes):"
NEXT = "offset = -(-(offset + nbytes) // align) * align"
STAGES = '(("pack", s), ("send", s - 1), ("unpack", s - 2))'
START = "start = tp_rank * q + min(tp_rank, m)"
SUM = "total = int(np.add.reduce(payload.numpy().view(np.uint64), dtype=np.uint64))"

MUTANTS: list[Mutant] = [
    # pack_buckets
    Mutant(
        PACK,
        "offsets_in_elements",
        "nbytes = t.numel() * t.element_size()\n        if not sizes",
        "nbytes = t.numel()\n        if not sizes",
        "raised RuntimeError",
    ),
    Mutant(PACK, "no_alignment", NEXT, "offset = offset + nbytes", "multiples of align"),
    Mutant(
        PACK, "bucket_not_padded", "sizes[-1] = offset", "sizes[-1] = places[-1][1] + nbytes", "rounded up to align"
    ),
    Mutant(
        PACK, "fits_with_ge", FITS, "if not sizes or (offset > 0 and offset + nbytes >= bucket_bytes):", "use >, not >="
    ),
    Mutant(
        PACK,
        "copies_elements_not_bytes",
        "= t.contiguous().reshape(-1).view(torch.uint8)",
        "= t.contiguous().reshape(-1).to(torch.uint8).repeat_interleave(t.element_size())",
        "bytes differ",
    ),
    Mutant(
        PACK,
        "writes_into_input",
        "buckets[b][off:off + nbytes] = t.contiguous().reshape(-1).view(torch.uint8)",
        "buckets[b][off:off + nbytes] = t.contiguous().reshape(-1).view(torch.uint8)\n        t.zero_()",
        "changed the tensors",
    ),
    # pipeline_schedule
    Mutant(
        SCHED,
        "no_overlap",
        "for s in range(n_buckets + 2):\n        step = []\n        for stage, b in " + STAGES,
        "for s in range(3 * n_buckets):\n        step = []\n        for stage, b in "
        '(("pack", s // 3 if s % 3 == 0 else -1), ("send", s // 3 if s % 3 == 1 else -1), '
        '("unpack", s // 3 if s % 3 == 2 else -1))',
        "run in turn",
    ),
    Mutant(
        SCHED,
        "buffer_per_bucket",
        "step.append((stage, b, b % 2))",
        "step.append((stage, b, b))",
        "a buffer per bucket",
    ),
    Mutant(
        SCHED,
        "unpack_with_send",
        STAGES,
        '(("pack", s), ("send", s - 1), ("unpack", s - 1))',
        "in the step of its own send",
    ),
    Mutant(SCHED, "stages_reversed", STAGES, '(("unpack", s - 2), ("send", s - 1), ("pack", s))', "expected"),
    # shard_range
    Mutant(
        SHARD,
        "ceil_split",
        "q, m = divmod(size, tp_size)\n    start = tp_rank * q + min(tp_rank, m)\n"
        "    return start, start + q + (1 if tp_rank < m else 0)",
        "q = -(-size // tp_size)\n    start = min(size, tp_rank * q)\n    return start, min(size, start + q)",
        "torch.chunk",
    ),
    Mutant(
        SHARD,
        "drops_remainder",
        "return start, start + q + (1 if tp_rank < m else 0)",
        "return tp_rank * q, tp_rank * q + q",
        "expected",
    ),
    Mutant(SHARD, "extra_rows_last", START, "start = tp_rank * q + max(0, tp_rank - (tp_size - m))", "expected"),
    Mutant(
        SHARD,
        "imports_library_shard_range",
        "def shard_range(size, tp_rank, tp_size):\n",
        "from course_lib.weight_sync.reshard import shard_range\n\n\ndef my_shard_range(size, tp_rank, tp_size):\n",
        "shard_range uses course_lib.weight_sync.reshard.shard_range, the library's own implementation",
    ),
    Mutant(SHARD, "no_rank_check", "if not 0 <= tp_rank < tp_size:", "if tp_rank < 0:", "expected ValueError"),
    # verify_bucket
    Mutant(
        VERIFY, "no_wraparound", SUM, "total = int(sum(int(w) for w in payload.numpy().view(np.uint64)))", "past 2^64"
    ),
    Mutant(
        VERIFY,
        "sums_the_header_too",
        "np.add.reduce(payload.numpy().view(np.uint64)",
        "np.add.reduce(slot.numpy().view(np.uint64)",
        "not the header",
    ),
    Mutant(
        VERIFY,
        "masks_the_top_bit",
        "if total != sent % 2**64:",
        "if total & 0x7FFF_FFFF_FFFF_FFFF != sent & 0x7FFF_FFFF_FFFF_FFFF:",
        "bit 128",
    ),
    Mutant(
        VERIFY,
        "wraps_library_verify",
        "    words = slot[-HEADER_BYTES:].view(torch.int64).tolist()\n",
        "    from course_lib.weight_sync.integrity import BucketHeader, verify_bucket as library_verify\n\n"
        "    library_verify(slot[:-HEADER_BYTES], BucketHeader.read(slot), version=expected_version, "
        "index=expected_index)\n"
        "    return slot[:-HEADER_BYTES]\n"
        "    words = slot[-HEADER_BYTES:].view(torch.int64).tolist()\n",
        "verify_bucket uses course_lib.weight_sync.integrity.",
    ),
    Mutant(VERIFY, "no_version_check", "if version != expected_version:", "if False:", "stale"),
    Mutant(
        VERIFY,
        "stale_is_corrupt",
        'raise OutOfOrderBucketError(f"version {version}, expected {expected_version}")',
        'raise CorruptBucketError(f"version {version}, expected {expected_version}")',
        "raised CorruptBucketError, expected OutOfOrderBucketError",
    ),
    Mutant(VERIFY, "no_size_check", "if nbytes != payload.numel():", "if False:", "nbytes is 8 less"),
    Mutant(VERIFY, "returns_slot", "return payload", "return slot", "return slot[:-HEADER_BYTES]"),
]
