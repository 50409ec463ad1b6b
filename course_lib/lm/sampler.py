"""A batched KV-cache sampler with slots and in-flight weight updates (lesson 07).

The sampler holds ``n_slots`` sequences side by side, each at its own position, and
decodes one token for every slot per :meth:`SlotSampler.step` (one batched forward
pass, like an inference engine's decoding step: its cost hardly depends on how many
slots are busy). A slot first *prefills* its prompt, one token per step, then samples
until the end-of-sequence token or ``max_len``. A finished slot can be refilled at once
(:meth:`start`): that is continuous batching.

Between two steps, :meth:`load_weights` may replace the model's weights:

* ``recompute=False`` (Pipeline RL's in-flight update): the KV cache is kept, so the
  keys and values of earlier tokens still come from the old weights;
* ``recompute=True``: the cache of the live sequences' prefixes is rebuilt with one forward
  pass of the new weights (what a fresh start would have computed, at the price of a
  prefill of every token in flight).

A sequence started with a ``key`` (:meth:`SlotSampler.start`) draws its token at position ``t``
from a uniform that depends only on ``(key, t)`` (a counter-based draw, inverse CDF): the same
key, prompt and weights give the same answer in any slot, beside any other sequences, in any
process. Two runs that differ only in where and when sequences are decoded then sample the
same answers; without a key, the sampler's ``generator`` draws.

For every sampled token the sampler records the behaviour log-probability
``log mu(y_t | y_<t)`` under the weights (and cache) that sampled it, and the version of
those weights (eq. 07.1 needs both).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from course_lib.lm.model import TinyLM
from course_lib.runtime.weights import load_flat_parameters

_MASK64 = (1 << 64) - 1


def sample_key(*parts: int) -> int:
    """A sequence's sampling key from integers (seed, group, answer, ...), in [0, 2**63)."""
    h = 0x9E3779B97F4A7C15
    for x in parts:
        h = _splitmix64((h ^ (int(x) & _MASK64)) & _MASK64)
    return h >> 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def keyed_uniforms(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per (key, position), the same on every machine (splitmix64 of both)."""
    with np.errstate(over="ignore"):
        x = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + positions.astype(np.uint64)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


def generator_for(model: TinyLM, seed: int) -> torch.Generator:
    """A random generator seeded with ``seed`` on ``model``'s device (where the sampler draws)."""
    return torch.Generator(device=next(model.parameters()).device).manual_seed(seed)


class SlotSampler:
    """``n_slots`` decoding slots over one :class:`TinyLM` and its KV cache.

    Per slot (``M = max_len``): ``tokens [S, M]``, ``logp [S, M]`` and ``versions [S, M]``
    (-1 where no token was sampled: the prompt, unused positions), ``pos [S]`` the
    position of the token fed at the next step, ``prompt_len [S]``, ``active [S]``.
    Every tensor lives on the model's device; a ``generator`` must be on that device too
    (``torch.multinomial`` refuses a CPU generator for CUDA probabilities).
    """

    def __init__(
        self, model: TinyLM, n_slots: int, eos: int, generator: torch.Generator | None = None, version: int = 0
    ) -> None:
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        device = next(model.parameters()).device
        if generator is not None and generator.device.type != device.type:
            raise ValueError(
                f"the sampler's random generator is on {generator.device}, the model on {device}: "
                f"make it with torch.Generator(device={str(device)!r})"
            )
        self.model = model
        self.device = device
        self.n_slots = n_slots
        self.eos = eos
        self.generator = generator
        self.version = version
        m = model.cfg.max_len
        self.tokens = torch.zeros(n_slots, m, dtype=torch.long, device=device)
        self.logp = torch.zeros(n_slots, m, device=device)
        self.versions = torch.full((n_slots, m), -1, dtype=torch.long, device=device)
        self.pos = torch.zeros(n_slots, dtype=torch.long, device=device)
        self.prompt_len = torch.ones(n_slots, dtype=torch.long, device=device)
        self.active = torch.zeros(n_slots, dtype=torch.bool, device=device)
        self.keys = np.full(n_slots, -1, dtype=np.int64)  # -1: the slot draws from ``generator``
        self.cache = model.new_cache(n_slots)
        self.swaps = 0

    def free_slots(self) -> list[int]:
        return [int(i) for i in torch.nonzero(~self.active).flatten()]

    @property
    def n_active(self) -> int:
        return int(self.active.sum())

    def start(self, slot: int, prompt: list[int], key: int | None = None) -> None:
        """Put a new sequence with ``prompt`` (at least one token) into the free ``slot``; with a
        ``key`` in [0, 2**63) (:func:`sample_key`) its tokens are drawn from that key alone."""
        if key is not None and not 0 <= key < 2**63:
            raise ValueError(f"a sampling key must be in [0, 2**63), got {key}: make it with sample_key(...)")
        if self.active[slot]:
            raise ValueError(f"slot {slot} is still decoding; start a sequence only in a free slot")
        if not 1 <= len(prompt) < self.model.cfg.max_len:
            raise ValueError(f"the prompt must have 1..{self.model.cfg.max_len - 1} tokens, got {len(prompt)}")
        self.tokens[slot] = 0
        self.tokens[slot, : len(prompt)] = torch.as_tensor(prompt, device=self.device)
        self.logp[slot] = 0.0
        self.versions[slot] = -1
        self.pos[slot] = 0
        self.prompt_len[slot] = len(prompt)
        self.keys[slot] = -1 if key is None else key
        self.active[slot] = True

    @torch.no_grad()
    def step(self) -> list[int]:
        """One decoding step for every slot; returns the slots whose sequence just finished.

        A slot still in its prompt only writes the cache; a slot at its last prompt token or
        later samples the next token, recording its log-prob and ``self.version``.
        """
        rows = torch.arange(self.n_slots, device=self.device)
        logits = self.model.step(self.tokens[rows, self.pos], self.pos, self.cache)
        logp_all = F.log_softmax(logits, dim=-1)
        probs = logp_all.exp()
        keyed = self.keys >= 0
        if keyed.all():
            sample = self._keyed_sample(probs, np.arange(self.n_slots))
        else:
            sample = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
            if keyed.any():
                rows_k = np.flatnonzero(keyed)
                sample[torch.as_tensor(rows_k, device=self.device)] = self._keyed_sample(probs, rows_k)
        nxt = self.pos + 1
        sampling = self.active & (nxt >= self.prompt_len)
        r = rows[sampling]
        self.tokens[r, nxt[r]] = sample[r]
        self.logp[r, nxt[r]] = logp_all[r, sample[r]]
        self.versions[r, nxt[r]] = self.version
        self.pos[self.active] += 1
        done = sampling & ((sample == self.eos) | (nxt >= self.model.cfg.max_len - 1))
        self.active &= ~done
        return [int(i) for i in torch.nonzero(done).flatten()]

    def _keyed_sample(self, probs: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
        """Inverse-CDF draws for ``rows``, each from the uniform of its key and next position."""
        nxt = (self.pos[torch.as_tensor(rows, device=self.device)] + 1).cpu().numpy()
        u = torch.as_tensor(keyed_uniforms(self.keys[rows], nxt), dtype=torch.float64, device=self.device)
        cdf = probs[torch.as_tensor(rows, device=self.device)].double().cumsum(-1)
        idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        return idx.clamp_(max=probs.shape[-1] - 1)

    def result(self, slot: int) -> dict[str, torch.Tensor]:
        """The finished sequence of ``slot``, on the CPU: ``tokens`` (prompt + answer), and for
        the answer positions ``logp`` and ``versions`` (prompt positions: 0 and -1)."""
        end = int(self.pos[slot]) + 1
        return {
            "tokens": self.tokens[slot, :end].to("cpu", copy=True),
            "logp": self.logp[slot, :end].to("cpu", copy=True),
            "versions": self.versions[slot, :end].to("cpu", copy=True),
            "prompt_len": torch.tensor(int(self.prompt_len[slot]), device="cpu"),
        }

    @torch.no_grad()
    def load_weights(self, flat: torch.Tensor, version: int, recompute: bool = False) -> None:
        """Replace the weights between two steps (an in-flight update); tokens sampled from now
        on are stamped with ``version``. ``recompute=True`` also rebuilds the KV cache."""
        load_flat_parameters(self.model, flat)
        self.weights_changed(version, recompute)

    def weights_changed(self, version: int, recompute: bool = False) -> None:
        """Record that the model's weights were replaced (by :meth:`load_weights` or a
        ``SharedWeights.pull``): stamp later tokens with ``version``; optionally rebuild the cache."""
        self.version = version
        self.swaps += 1
        if recompute:
            self.recompute_cache()

    @torch.no_grad()
    def recompute_cache(self) -> int:
        """Rebuild the keys and values of the live sequences' prefixes with one forward pass
        of the current weights (what a prefill of the new weights computes); free slots and
        positions past the longest live prefix are left alone (they are rewritten before
        they are read). Returns the number of prefix tokens recomputed."""
        live = torch.nonzero(self.active).flatten()
        if live.numel() == 0:
            return 0
        n_t = int(self.pos[live].max())  # positions < pos hold cached keys and values
        if n_t == 0:
            return 0
        _, (keys, values) = self.model.forward_kv(self.tokens[live, :n_t])
        self.cache[0][:, live, :, :n_t] = keys
        self.cache[1][:, live, :, :n_t] = values
        return int(self.pos[live].sum())


def sample_problems(
    model: TinyLM, prompts: list[list[int]], n_slots: int, eos: int, generator: torch.Generator | None = None
) -> list[dict[str, torch.Tensor]]:
    """Decode every prompt with continuous batching (a freed slot takes the next prompt at
    once); returns :meth:`SlotSampler.result` per prompt, in order."""
    sampler = SlotSampler(model, n_slots, eos, generator)
    todo = list(range(len(prompts)))[::-1]
    owner: dict[int, int] = {}
    out: dict[int, dict[str, torch.Tensor]] = {}
    while todo or sampler.n_active:
        for slot in sampler.free_slots():
            if not todo:
                break
            owner[slot] = todo.pop()
            sampler.start(slot, prompts[owner[slot]])
        for slot in sampler.step():
            out[owner.pop(slot)] = sampler.result(slot)
    return [out[i] for i in range(len(prompts))]
