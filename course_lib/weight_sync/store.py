"""A receiver's weights, double-buffered: updates land in ``staging``; :meth:`commit` swaps.

Inference only ever reads :attr:`WeightStore.active`. An update writes the inactive copy
(and may fail half-way); only a complete, verified update is committed, by swapping two
references, so inference never sees half-updated weights (all-or-nothing).
"""

from __future__ import annotations

import torch

from course_lib.weight_sync.buckets import BucketPlan, view


class WeightStore:
    """``active`` (what inference reads, at ``version``) and ``staging`` (where an update lands)."""

    def __init__(
        self, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> None:
        self.active = {n: torch.zeros(s, dtype=dtype, device=device) for n, s in shapes.items()}
        self.staging = {n: torch.zeros(s, dtype=dtype, device=device) for n, s in shapes.items()}
        self.active_flats: list[torch.Tensor] = []
        self.staging_flats: list[torch.Tensor] = []
        self.version = 0

    @classmethod
    def in_bucket_layout(cls, plan: BucketPlan, extra_bytes: int = 0, device: str = "cpu") -> WeightStore:
        """A store whose tensors are views of per-bucket flat buffers laid out as ``plan``
        (``extra_bytes`` more at the end of each, for a header): buckets can then be received
        straight into ``staging_flats[b]``, with no unpacking copy."""
        store = cls({})
        for flats, weights in ((store.active_flats, store.active), (store.staging_flats, store.staging)):
            flats.extend(torch.zeros(n + extra_bytes, dtype=torch.uint8, device=device) for n in plan.bucket_nbytes)
            weights.update({m.name: view(flats[m.bucket], m) for m in plan.metas})
        return store

    def commit(self, version: int) -> None:
        """Make the staged update the active weights (a reference swap: atomic for readers)."""
        if version <= self.version:
            raise ValueError(f"commit: version {version} is not newer than the active {self.version}")
        self.active, self.staging = self.staging, self.active
        self.active_flats, self.staging_flats = self.staging_flats, self.active_flats
        self.version = version

    def nbytes(self) -> int:
        """Bytes of one copy of the weights."""
        return sum(t.numel() * t.element_size() for t in self.active.values())
