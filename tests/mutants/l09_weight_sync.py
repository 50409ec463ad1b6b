"""Planted bugs in lesson 09's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

PACK, SCHED, SHARD, VERIFY, UT = "pack_buckets", "pipeline_schedule", "shard_range", "verify_bucket", "update_time"
FITS = "if not sizes or (offset > 0 and offset + nbytes > bucket_bytes):"
NEXT = "offset = -(-(offset + nbytes) // align) * align"
STAGES = '(("pack", s), ("send", s - 1), ("unpack", s - 2))'
START = "start = tp_rank * q + min(tp_rank, m)"
SUM = "total = int(np.add.reduce(payload.numpy().view(np.uint64), dtype=np.uint64))"
MAGIC_CHECK = '        raise CorruptBucketError("bad magic number: not a bucket")\n    if version != expected_version:'
STAGES_UT = "stages = (b / sigma + k * gamma / n, alpha + b / beta, b / rho + k * gamma / n)"
PACE = 'return t_1 + (n - 1) * (m + (1 - rates["eta"]) * (t_1 - m))'

MUTANTS: list[Mutant] = [
    # pack_buckets
    Mutant(
        PACK,
        "offsets_in_elements",
        "nbytes = t.numel() * t.element_size()\n        if not sizes",
        "nbytes = t.numel()\n        if not sizes",
        "sizes and offsets count bytes, t.numel() * t.element_size(), not elements",
    ),
    # wrong mechanism (issue 45): the fit tested on the end rounded up to align (the same plan whenever
    # bucket_bytes is a multiple of align)
    Mutant(
        PACK,
        "fit_on_aligned_end",
        FITS,
        "if not sizes or (offset > 0 and -(-(offset + nbytes) // align) * align > bucket_bytes):",
        "a tensor stays when its own end, offset + nbytes, is within bucket_bytes",
    ),
    # wrong mechanism (issue 45): a tensor's size read from its storage (right for every fresh tensor,
    # wrong for a view of a larger one)
    Mutant(
        PACK,
        "size_from_storage",
        "nbytes = t.numel() * t.element_size()\n        if not sizes",
        "nbytes = t.untyped_storage().nbytes()\n        if not sizes",
        "not its storage's",
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
    Mutant(
        VERIFY,
        "signed_checksum_compare",
        "if total != sent % 2**64:",
        "if total != sent:",
        "compare the unsigned sum with words[5] % 2**64",
    ),
    # wrong mechanism (issue 45): only older versions rejected; a bucket of a future update is applied
    Mutant(
        VERIFY,
        "only_rejects_stale_versions",
        "if version != expected_version:",
        "if version < expected_version:",
        "from a future update",
    ),
    # wrong mechanism (issue 45): only repeated buckets rejected; a skipped bucket goes unnoticed
    Mutant(
        VERIFY, "only_rejects_repeated_buckets", "if index != expected_index:", "if index < expected_index:", "skipped"
    ),
    # wrong mechanism (issue 45): the checksum verified before the header, so a stale damaged bucket is "corrupt"
    Mutant(
        VERIFY,
        "checksum_before_header",
        MAGIC_CHECK,
        MAGIC_CHECK.replace(
            "    if version",
            "    if int(np.add.reduce(payload.numpy().view(np.uint64), dtype=np.uint64)) != sent % 2**64:\n"
            '        raise CorruptBucketError("checksum mismatch")\n    if version',
        ),
        "the header (magic, version, index, nbytes) before the checksum",
    ),
    # update_time
    # wrong mechanism (issue 45): the pace taken over the byte terms only, the message latency left out
    Mutant(
        UT,
        "pace_without_alpha",
        "    t_1, m = sum(stages), max(stages)\n",
        "    t_1, m = sum(stages), max(b / sigma + k * gamma / n, b / beta, b / rho + k * gamma / n)\n",
        "the message's latency is part of the stage",
    ),
    # wrong mechanism (issue 45): buckets of bucket_bytes (the last one short) instead of n equal ones
    Mutant(UT, "buckets_of_bucket_bytes", "    b = B / n\n", "    b = min(bucket_bytes, B)\n", "EQUAL buckets"),
    # wrong mechanism (issue 45): every bucket at the slowest stage's pace, the fill forgotten
    Mutant(UT, "no_fill", PACE, PACE.replace("return t_1 + (n - 1) *", "return n *"), "before the pace is set"),
    Mutant(UT, "eta_reversed", PACE, PACE.replace('(1 - rates["eta"])', 'rates["eta"]'), "eta = 1 hides every stage"),
    Mutant(UT, "floor_buckets", "n = -(-B // bucket_bytes)", "n = max(1, B // bucket_bytes)", "ceil(B / bucket_bytes)"),
    Mutant(
        UT,
        "per_tensor_with_copies",
        "return k * alpha + B / beta",
        "return k * alpha + B / beta + B / sigma + B / rho",
        "no stage and no reload",
    ),
    Mutant(UT, "gamma_once", "+ 2 * k * gamma", "+ k * gamma", "2 k gamma"),
    Mutant(
        UT,
        "imports_library_update_time",
        "    B, k = nbytes, n_tensors\n",
        "    from course_lib.weight_sync.scale_model import Hardware\n"
        "    from course_lib.weight_sync.scale_model import update_time as library\n\n"
        "    hw = Hardware(rates['beta'], rates['alpha'], rates['sigma'], rates['rho'], rates['write'], rates['read'],\n"
        "                  rates['eta'], rates['gamma'])\n"
        "    return library(method, nbytes, hw, n_tensors=n_tensors, bucket_bytes=bucket_bytes)\n"
        "    B, k = nbytes, n_tensors\n",
        "update_time uses course_lib.weight_sync.scale_model",
    ),
]
