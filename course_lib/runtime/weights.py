"""Weights shared between processes: one flat tensor, a version, and a seqlock.

A system's trainer publishes its parameters; its actors or generators pull them when the
version moved. Lesson 03's learner and actors use it, and lesson 07's trainer and
generator, whose in-flight update is one :meth:`SharedWeights.pull` between two decoding
steps.

- :func:`flat_parameters` / :func:`load_flat_parameters`: a model's parameters as one
  float32 vector, and back.
- :class:`SharedWeights`: that vector in shared memory, with a version counter.
"""

from __future__ import annotations

import time

import torch
from torch import nn


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """Every parameter of ``model`` as one flat float32 vector (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).float()


def load_flat_parameters(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a vector made by :func:`flat_parameters` back into ``model``'s parameters."""
    n_params = sum(p.numel() for p in model.parameters())
    if flat.numel() != n_params:
        raise ValueError(f"flat vector has {flat.numel()} numbers, the model {n_params}")
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


class SharedWeights:
    """The learner's parameters as one flat shared tensor plus a version counter.

    A *seqlock* instead of a lock: the single writer (the learner) makes the sequence
    number odd, copies, makes it even again; a reader copies and retries if the number
    was odd or changed meanwhile. No reader can block the writer, so an actor killed in
    the middle of a read cannot wedge the learner (a killed lock holder would).
    ``version`` counts the learner updates the weights reflect.

    Memory order: there are no explicit fences. The sequence number and the weights are
    separate stores through torch, each a C call that returns before the next begins. x86-64
    keeps stores in order, so a reader there sees the odd number before any new weight; on
    a weakly ordered CPU (arm64) a torn read would need the writer's stores to become
    visible out of order across a whole ``copy_`` call. A production seqlock (the Linux
    kernel's, for one) puts release/acquire barriers around the copy instead of relying on
    that.
    """

    def __init__(self, model: nn.Module) -> None:
        self.flat = flat_parameters(model).share_memory_()
        self._seq = torch.zeros(1, dtype=torch.int64).share_memory_()  # 2 * version (+1 while writing)

    @property
    def version(self) -> int:
        return int(self._seq[0]) // 2

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def publish(self, model: nn.Module, version: int) -> None:
        """Copy ``model``'s parameters in and stamp them with ``version`` (the writer side)."""
        new = flat_parameters(model)
        self._seq[0] = 2 * version + 1
        self.flat.copy_(new)
        self._seq[0] = 2 * version

    def pull(self, model: nn.Module, have_version: int, max_tries: int = 1000) -> int:
        """Load the published weights into ``model`` if they are newer than ``have_version``;
        return the version ``model`` now holds."""
        for _ in range(max_tries):
            before = int(self._seq[0])
            if before // 2 == have_version and before % 2 == 0:
                return have_version
            if before % 2:
                time.sleep(0.0001)
                continue
            flat = self.flat.clone()
            if int(self._seq[0]) == before:
                load_flat_parameters(model, flat)
                return before // 2
        return have_version  # the writer kept us out: act with the weights we have
