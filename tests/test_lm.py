"""Lesson 07's tiny transformer, its KV-cache sampler and the countdown task."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from course_lib.lm import CountdownTask, LMConfig, SlotSampler, TaskConfig, TinyLM, sequence_logprobs
from course_lib.lm.sampler import keyed_uniforms, sample_key
from course_lib.lm.task import EOS, PROMPT_LEN, Problem, num, teacher_forcing_batch, warm_start
from course_lib.runtime.weights import flat_parameters

TASK = CountdownTask(TaskConfig(max_quotient=12))
CFG = LMConfig(vocab=TASK.config.vocab, max_len=TASK.config.max_len)


def model(seed: int) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(CFG)


def decode(sampler: SlotSampler, problems: list[Problem]) -> list[dict[str, torch.Tensor]]:
    for slot, p in enumerate(problems):
        sampler.start(slot, p.prompt)
    out: dict[int, dict[str, torch.Tensor]] = {}
    while sampler.n_active:
        for slot in sampler.step():
            out[slot] = sampler.result(slot)
    return [out[i] for i in range(len(problems))]


def test_step_logits_equal_the_full_forward_pass():
    m = model(0)
    tokens = torch.randint(0, CFG.vocab, (3, 10))
    cache = m.new_cache(3)
    with torch.no_grad():
        full = m(tokens)
        for t in range(10):
            step = m.step(tokens[:, t], torch.full((3,), t), cache)
            assert torch.allclose(step, full[:, t], atol=1e-5)


def test_kv_cache_sampler_logprobs_equal_a_full_recompute_without_weight_changes():
    m = model(1)
    problems = TASK.sample(np.random.default_rng(0), 6)
    results = decode(SlotSampler(m, 6, EOS, torch.Generator().manual_seed(0), version=3), problems)
    for r in results:
        p = int(r["prompt_len"])
        with torch.no_grad():
            ref = sequence_logprobs(m, r["tokens"][None])[0]
        assert torch.allclose(r["logp"][p:], ref[p:], atol=1e-5)
        assert (r["versions"][p:] == 3).all() and (r["versions"][:p] == -1).all()
        assert r["tokens"][-1] == EOS or len(r["tokens"]) == CFG.max_len


def test_slots_at_different_positions_do_not_interfere():
    """Continuous batching: a slot refilled mid-way decodes as if it were alone."""
    m = model(2)
    prompt = Problem(9, 2).prompt
    alone = SlotSampler(m, 1, EOS)
    alone.start(0, prompt)
    busy = SlotSampler(m, 3, EOS)
    busy.start(1, Problem(30, 1).prompt)
    for _ in range(5):
        busy.step()
    busy.start(0, prompt)
    for _ in range(PROMPT_LEN + 2):
        with torch.no_grad():
            a = m.step(alone.tokens[[0], alone.pos], alone.pos, alone.cache)
            b = m.step(busy.tokens[[0, 1, 2], busy.pos], busy.pos, busy.cache)[0]
        assert torch.allclose(a[0], b, atol=1e-5)
        alone.pos += 1
        busy.pos[0] += 1
        busy.pos[1] += 1


def test_a_keyed_sequence_draws_the_same_answer_in_any_slot_beside_anything():
    """(seed, group, answer) keys: the answer depends on its key, prompt and weights only."""
    m = model(3)
    problems = TASK.sample(np.random.default_rng(1), 5)
    keys = [sample_key(7, k, 0) for k in range(5)]

    def run(order: list[int], n_slots: int, noise: int) -> dict[int, list[int]]:
        sampler = SlotSampler(m, n_slots, EOS, torch.Generator().manual_seed(noise))
        todo, owner, out = list(order), {}, {}
        sampler.start(n_slots - 1, Problem(30, 1).prompt)  # an unkeyed neighbour from the shared generator
        while todo or sampler.n_active:
            for slot in sampler.free_slots():
                if todo:
                    i = todo.pop()
                    owner[slot] = i
                    sampler.start(slot, problems[i].prompt, key=keys[i])
            for slot in sampler.step():
                if slot in owner:
                    out[owner.pop(slot)] = sampler.result(slot)["tokens"].tolist()
        return out

    a, b = run([0, 1, 2, 3, 4], 3, noise=0), run([4, 2, 0, 3, 1], 6, noise=1)
    assert a == b
    assert len({tuple(v[PROMPT_LEN:]) for v in a.values()}) > 1  # different keys, different answers


def test_keyed_draws_follow_the_probabilities():
    probs = torch.tensor([[0.1, 0.6, 0.3]]).repeat(20_000, 1)
    sampler = SlotSampler(model(0), 1, EOS)
    sampler.keys = np.array([sample_key(1, i) for i in range(20_000)], dtype=np.int64)
    sampler.pos = torch.zeros(20_000, dtype=torch.long)
    freq = np.bincount(sampler._keyed_sample(probs, np.arange(20_000)).numpy(), minlength=3) / 20_000
    assert np.allclose(freq, [0.1, 0.6, 0.3], atol=0.015), freq
    u = keyed_uniforms(np.array([5, 5, 6], dtype=np.int64), np.array([1, 2, 1]))
    assert len(set(u.tolist())) == 3 and ((u >= 0) & (u < 1)).all()
    with pytest.raises(ValueError, match="sample_key"):
        sampler.start(0, [1], key=-3)


def test_in_flight_swap_keeps_the_cache_and_stamps_later_tokens_with_the_new_version():
    old, new = model(3), model(4)
    problems = [Problem(20, 1)] * 4
    sampler = SlotSampler(old, 4, EOS, torch.Generator().manual_seed(0), version=0)
    for slot, p in enumerate(problems):
        sampler.start(slot, p.prompt)
    for _ in range(PROMPT_LEN + 3):
        sampler.step()
    before = (sampler.cache[0].clone(), sampler.cache[1].clone())
    swapped_at = sampler.pos.clone()
    sampler.load_weights(flat_parameters(new), version=5)
    assert torch.equal(sampler.cache[0], before[0]) and torch.equal(sampler.cache[1], before[1])
    assert torch.allclose(flat_parameters(old), flat_parameters(new))  # the sampler's model holds the new weights
    sampler.step()
    for slot in range(4):
        v = sampler.versions[slot]
        s = int(swapped_at[slot])
        assert (v[PROMPT_LEN : s + 1] == 0).all() and v[s + 1] == 5
    # the kept cache was computed by the old weights: not what a fresh pass of the new ones gives
    with torch.no_grad():
        fresh = torch.log_softmax(new(sampler.tokens[:, : s + 1])[:, -1], -1)
    got = sampler.logp[torch.arange(4), swapped_at + 1]
    ref = fresh.gather(1, sampler.tokens[torch.arange(4), swapped_at + 1, None]).squeeze(1)
    assert not torch.allclose(got, ref, atol=1e-4)


def test_recompute_after_a_swap_equals_a_fresh_forward_pass():
    old, new = model(5), model(6)
    sampler = SlotSampler(old, 3, EOS, torch.Generator().manual_seed(1), version=0)
    for slot in range(3):
        sampler.start(slot, Problem(25, 1).prompt)
    for _ in range(PROMPT_LEN + 4):
        sampler.step()
    sampler.load_weights(flat_parameters(new), version=1, recompute=True)
    pos = sampler.pos.clone()
    sampler.step()
    rows = torch.arange(3)
    with torch.no_grad():
        ref = sequence_logprobs(new, sampler.tokens[:, : int(pos.max()) + 2])
    assert torch.allclose(sampler.logp[rows, pos + 1], ref[rows, pos + 1], atol=1e-5)
    assert (sampler.versions[rows, pos + 1] == 1).all()


def test_verifier_is_exact_and_lengths_have_a_long_tail():
    p = Problem(23, 5)
    assert p.answer == [num(18), num(13), num(8), num(3), EOS]
    assert CountdownTask.reward(p, p.answer) == 1.0
    assert CountdownTask.reward(p, p.answer[:-1]) == 0.0
    assert CountdownTask.reward(p, p.answer + [EOS]) == 0.0
    task = CountdownTask(TaskConfig(max_quotient=64))
    q = np.array([len(x.answer) - 1 for x in task.sample(np.random.default_rng(0), 4000)])
    assert q.min() >= 1 and q.max() <= 64
    assert np.median(q) <= 6 and np.percentile(q, 99) >= 40  # most short, a few very long
    assert abs(q.mean() + 1 - task.mean_answer_tokens()) < 0.5


def test_teacher_forcing_masks_the_answer_and_warm_start_lowers_the_loss():
    problems = [Problem(5, 2), Problem(3, 1)]
    _tokens, mask = teacher_forcing_batch(problems, CFG.max_len)
    assert mask.sum().item() == sum(len(p.answer) for p in problems)
    assert not mask[:, :PROMPT_LEN].any()
    losses = warm_start(model(7), TASK, steps=30, batch=32)
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])


def test_bad_configurations_are_named():
    with pytest.raises(ValueError, match="multiple of n_heads"):
        LMConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_slots"):
        SlotSampler(model(0), 0, EOS)
    sampler = SlotSampler(model(0), 1, EOS)
    sampler.start(0, [1, 2])
    with pytest.raises(ValueError, match="free slot"):
        sampler.start(0, [1, 2])
