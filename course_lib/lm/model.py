"""A tiny decoder-only transformer with a KV cache (lesson 07).

Two ways to run the same weights:

* :meth:`TinyLM.forward`: ``tokens [B, T] -> logits [B, T, V]``, causal attention over the
  whole sequence (training, and the reference the cache is tested against); and
  :meth:`TinyLM.forward_kv` also the keys and values of every layer, to rebuild a cache;
* :meth:`TinyLM.step`: one token per sequence, ``tokens [B]`` at positions ``pos [B]``
  (each sequence at its own position: continuous batching), reading the keys and values
  of earlier positions from the cache and writing its own at ``pos``.

With the same weights both give the same log-probabilities (up to float rounding); after
the weights change, the cache still holds keys and values computed by the *old* weights,
which is exactly what an in-flight weight update in Pipeline RL leaves in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class LMConfig:
    """Sizes of :class:`TinyLM`."""

    vocab: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 48

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if min(self.vocab, self.d_model, self.n_layers, self.n_heads, self.max_len) < 1:
            raise ValueError(f"every size of LMConfig must be >= 1, got {self}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[..., d] -> 3 x [..., H, dh]``."""
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        shape = (*x.shape[:-1], self.cfg.n_heads, self.cfg.head_dim)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, T, d]`` -> (``x``, keys ``[B, H, T, dh]``, values ``[B, H, T, dh]``)."""
        q, k, v = (t.transpose(1, 2) for t in self._split(x))  # [B, H, T, dh]
        n_t = x.shape[1]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.cfg.head_dim)
        causal = torch.ones(n_t, n_t, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v  # [B, H, T, dh]
        x = x + self.proj(att.transpose(1, 2).reshape(x.shape))
        return x + self.mlp(self.ln2(x)), k, v

    def step(self, x: torch.Tensor, pos: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> torch.Tensor:
        """``x [B, d]`` at positions ``pos [B]``; writes keys/values at ``pos`` of ``cache_* [B, H, M, dh]``."""
        q, k, v = self._split(x)  # [B, H, dh]
        rows = torch.arange(x.shape[0], device=x.device)
        cache_k[rows, :, pos] = k
        cache_v[rows, :, pos] = v
        scores = torch.einsum("bhd,bhmd->bhm", q, cache_k) / math.sqrt(self.cfg.head_dim)
        future = torch.arange(cache_k.shape[2], device=x.device)[None, :] > pos[:, None]  # [B, M]
        att = torch.einsum("bhm,bhmd->bhd", scores.masked_fill(future[:, None, :], float("-inf")).softmax(-1), cache_v)
        x = x + self.proj(att.reshape(x.shape))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Decoder-only transformer: token + learned position embeddings, ``n_layers`` blocks, a head."""

    def __init__(self, cfg: LMConfig = LMConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def new_cache(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed keys and values ``[L, B, H, max_len, dh]`` for :meth:`step`, on the model's device."""
        c = self.cfg
        shape = (c.n_layers, batch, c.n_heads, c.max_len, c.head_dim)
        device = self.head.weight.device
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, T] -> logits [B, T, V]``."""
        return self.forward_kv(tokens)[0]

    def forward_kv(self, tokens: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``tokens [B, T]`` -> (logits ``[B, T, V]``, the cache ``(K, V)``, each ``[L, B, H, T, dh]``)."""
        if tokens.ndim != 2 or tokens.shape[1] > self.cfg.max_len:
            raise ValueError(f"tokens must be [B, T] with T <= max_len = {self.cfg.max_len}, got {tuple(tokens.shape)}")
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        keys, values = [], []
        for block in self.blocks:
            x, k, v = block(x)
            keys.append(k)
            values.append(v)
        logits = self.head(self.ln_f(x))
        return logits, (torch.stack(keys), torch.stack(values))

    def step(self, tokens: torch.Tensor, pos: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """One decoding step: ``tokens [B]`` at ``pos [B]`` -> next-token logits ``[B, V]``.

        Reads the keys/values of positions ``< pos`` from ``cache`` and writes this step's at
        ``pos`` (in place). Positions after ``pos`` are masked, whatever the cache holds there.
        """
        if tokens.shape != pos.shape or tokens.ndim != 1:
            raise ValueError(f"tokens and pos must both be [B], got {tuple(tokens.shape)} and {tuple(pos.shape)}")
        if int(pos.max()) >= self.cfg.max_len:
            raise ValueError(f"a position reached max_len = {self.cfg.max_len}; stop decoding before it")
        x = self.tok(tokens) + self.pos(pos)
        for layer, block in enumerate(self.blocks):
            x = cast(Block, block).step(x, pos, cache[0][layer], cache[1][layer])
        return self.head(self.ln_f(x))


def sequence_logprobs(model: TinyLM, tokens: torch.Tensor) -> torch.Tensor:
    """``log pi(tokens[:, t] | tokens[:, :t])`` for ``t >= 1``, as ``[B, T]`` (column 0 is 0).

    One full forward pass; the trainer's log-probs, and the reference for the sampler's.
    """
    logp = F.log_softmax(model(tokens)[:, :-1], dim=-1)
    out = torch.zeros(tokens.shape, dtype=logp.dtype, device=tokens.device)
    out[:, 1:] = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return out
