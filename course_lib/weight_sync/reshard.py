"""Receiver-side resharding: each of ``tp_size`` receivers keeps only its slice of a matrix (eq. 09.5).

The split is balanced: dimension ``d`` of size ``n`` gives rank ``r`` the rows
``[r q + min(r, m), (r + 1) q + min(r + 1, m))`` with ``q, m = divmod(n, tp_size)``, so the
first ``m`` ranks get one extra row and every row goes to exactly one rank.
"""

from __future__ import annotations


def shard_range(size: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``tp_rank``'s share of ``size`` rows (eq. 09.5).

    Raises:
        ValueError: if ``tp_size < 1`` or ``tp_rank`` is not in ``[0, tp_size)``.
    """
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, {tp_size}), got {tp_rank}")
    q, m = divmod(size, tp_size)
    return tp_rank * q + min(tp_rank, m), (tp_rank + 1) * q + min(tp_rank + 1, m)


def shard_index(shape: tuple[int, ...], tp_dim: int | None, tp_rank: int, tp_size: int) -> tuple[slice, ...]:
    """Index of the shard of a tensor of ``shape`` split along ``tp_dim`` (all of it if ``None``)."""
    index = [slice(None)] * len(shape)
    if tp_dim is not None and tp_size > 1:
        start, stop = shard_range(shape[tp_dim], tp_rank, tp_size)
        index[tp_dim] = slice(start, stop)
    return tuple(index)


def shard_shape(shape: tuple[int, ...], tp_dim: int | None, tp_rank: int, tp_size: int) -> tuple[int, ...]:
    """Shape of that shard."""
    index = shard_index(shape, tp_dim, tp_rank, tp_size)
    return tuple(len(range(*ix.indices(n))) for ix, n in zip(index, shape))
