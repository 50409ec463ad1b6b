"""Shared-memory rollout buffers and published weights (lesson 03).

TorchBeast's MonoBeast (Küttler et al. 2019, arXiv 1910.03552) preallocates ``n_slots``
rollout buffers in shared memory; a slot's *index* is all that travels between
processes: free indices go to the actors, an actor fills that slot with one unroll and
hands the index back as full, the learner reads a batch of full slots and frees them.
No trajectory is ever pickled or copied through a pipe.

A slot holds one unroll of ``T`` steps from ``B`` environments, time-major::

    obs             [T + 1, B, obs_dim]  x_0 .. x_T (x_T: the bootstrap state, also x_0 of the next unroll)
    actions         [T, B]   int64       a_t ~ mu(.|x_t)
    behaviour_logp  [T, B]   float32     log mu(a_t|x_t), the actor's log-probability
    rewards         [T, B]   float32     r_t
    dones           [T, B]   bool        the episode ended at step t (x_{t+1} starts a new one)
    versions        [T, B]   int64       version of the weights that chose a_t

The other direction, the learner's weights to the actors, is
:class:`course_lib.runtime.weights.SharedWeights`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: name -> (dtype, shape suffix after the slot index; "T1" is T + 1, "T" is T, "B" is B, "O" is obs_dim)
FIELDS: dict[str, tuple[torch.dtype, tuple[str, ...]]] = {
    "obs": (torch.float32, ("T1", "B", "O")),
    "actions": (torch.int64, ("T", "B")),
    "behaviour_logp": (torch.float32, ("T", "B")),
    "rewards": (torch.float32, ("T", "B")),
    "dones": (torch.bool, ("T", "B")),
    "versions": (torch.int64, ("T", "B")),
}


@dataclass
class RolloutBuffers:
    """``n_slots`` preallocated shared-memory slots (see the module docstring)."""

    unroll: int
    n_envs: int
    obs_dim: int
    n_slots: int
    tensors: dict[str, torch.Tensor]

    @classmethod
    def allocate(cls, unroll: int, n_envs: int, obs_dim: int, n_slots: int) -> RolloutBuffers:
        """Zero-filled slots in shared memory (``tensor.share_memory_()``)."""
        sizes = {"T1": unroll + 1, "T": unroll, "B": n_envs, "O": obs_dim}
        tensors = {
            name: torch.zeros((n_slots, *(sizes[d] for d in dims)), dtype=dtype).share_memory_()
            for name, (dtype, dims) in FIELDS.items()
        }
        return cls(unroll, n_envs, obs_dim, n_slots, tensors)

    def slot(self, index: int) -> dict[str, torch.Tensor]:
        """Views (not copies) of slot ``index``: writing into them writes shared memory."""
        return {name: t[index] for name, t in self.tensors.items()}

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Copies of the slots ``indices`` side by side along ``B``: ``[T(+1), len(indices) * B, ...]``."""
        return {name: torch.cat([t[i] for i in indices], dim=1) for name, t in self.tensors.items()}

    @property
    def nbytes_per_slot(self) -> int:
        """Bytes of one slot (what one unroll weighs)."""
        return sum(t[0].numel() * t.element_size() for t in self.tensors.values())
