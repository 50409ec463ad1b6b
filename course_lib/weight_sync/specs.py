"""A transformer-like set of weight tensors: many small ones (norms, biases) beside big matrices.

Real checkpoints are like this: a 7B model has ~300 tensors, of which half are under 100 kB
and a few dozen hold almost all the bytes. The mix matters for weight sync, since the
per-message cost hits the small tensors and the bandwidth hits the big ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MiB = 2**20


@dataclass(frozen=True)
class TensorSpec:
    """One named weight: its shape, dtype and the dimension tensor parallelism splits.

    ``tp_dim`` is 0 for column-parallel matrices (QKV, MLP up: each rank keeps some rows of
    ``[out, in]``), 1 for row-parallel ones (attention output, MLP down), ``None`` for
    tensors every rank keeps whole (norms, biases of row-parallel layers).
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    tp_dim: int | None = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def transformer_specs(hidden: int, n_layers: int, vocab: int = 512, mlp_ratio: int = 4) -> list[TensorSpec]:
    """Tensors of a decoder-only transformer, 10 per layer plus embeddings and the final norm.

    Per layer: two norms (weight and bias, ``[hidden]``), fused QKV ``[3h, h]`` with its bias,
    the attention output ``[h, h]`` with its bias, MLP up ``[r h, h]`` with its bias and MLP
    down ``[h, r h]`` with its bias.
    """
    if hidden <= 0 or n_layers <= 0:
        raise ValueError(f"hidden ({hidden}) and n_layers ({n_layers}) must be positive")
    h, f = hidden, mlp_ratio * hidden
    specs = [TensorSpec("embed.weight", (vocab, h), tp_dim=0)]
    for i in range(n_layers):
        p = f"layers.{i}."
        specs += [
            TensorSpec(p + "attn_norm.weight", (h,)),
            TensorSpec(p + "attn_norm.bias", (h,)),
            TensorSpec(p + "attn.qkv.weight", (3 * h, h), tp_dim=0),
            TensorSpec(p + "attn.qkv.bias", (3 * h,), tp_dim=0),
            TensorSpec(p + "attn.out.weight", (h, h), tp_dim=1),
            TensorSpec(p + "attn.out.bias", (h,)),
            TensorSpec(p + "mlp_norm.weight", (h,)),
            TensorSpec(p + "mlp_norm.bias", (h,)),
            TensorSpec(p + "mlp.up.weight", (f, h), tp_dim=0),
            TensorSpec(p + "mlp.up.bias", (f,), tp_dim=0),
            TensorSpec(p + "mlp.down.weight", (h, f), tp_dim=1),
            TensorSpec(p + "mlp.down.bias", (h,)),
        ]
    specs += [TensorSpec("final_norm.weight", (h,)), TensorSpec("final_norm.bias", (h,))]
    return specs


def model_of_size(megabytes: float, n_layers: int = 32, vocab: int = 512) -> list[TensorSpec]:
    """A :func:`transformer_specs` model of about ``megabytes`` MiB (float32) with ``n_layers`` layers.

    The hidden size is picked (a multiple of 16) so that the total is as close as possible to
    the target; ``12 * n_layers + 3`` tensors (387 for 32 layers).
    """
    if megabytes <= 0:
        raise ValueError(f"megabytes must be positive, got {megabytes}")
    target = megabytes * MiB / 4  # float32 elements
    best = min(
        range(16, 8192 + 1, 16), key=lambda h: abs(sum(s.numel for s in transformer_specs(h, n_layers, vocab)) - target)
    )
    return transformer_specs(best, n_layers, vocab)


def total_bytes(specs: list[TensorSpec]) -> int:
    """Bytes of all tensors."""
    return sum(s.nbytes for s in specs)


def make_weights(specs: list[TensorSpec], seed: int, version: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic weights for ``(seed, version)``: ``W_v = W_0 + 1e-3 * v * noise`` (a slow drift,
    like training), so that every rank can rebuild the same tensors without receiving them."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for s in specs:
        w = torch.randn(s.shape, generator=gen, dtype=torch.float32) * 0.02
        if version:
            w += 1e-3 * version * 0.02 * torch.randn(s.shape, generator=gen, dtype=torch.float32)
        out[s.name] = w.to(s.dtype)
    return out


def describe_model(specs: list[TensorSpec]) -> str:
    """One line: tensor count, total size, and how skewed the sizes are."""
    sizes = sorted(s.nbytes for s in specs)
    small = sum(x < 64 * 1024 for x in sizes)
    return (
        f"{len(specs)} tensors, {total_bytes(specs) / MiB:.0f} MiB; {small} under 64 KiB; "
        f"largest {sizes[-1] / MiB:.1f} MiB, median {sizes[len(sizes) // 2] / 1024:.0f} KiB"
    )
