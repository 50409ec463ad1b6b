"""Lesson 07's graders beyond what tests/test_exercises.py checks for every lesson: the slot
refill's oracle agrees with the generator the lesson runs (``GroupGenerator._refill_free_slots``
with ``may_start_group``), the loss's new slips change the answer on the grader's batches,
the teacher-forced decoding check accepts another natural sampler, and misused fakes are
reported.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import l07_pipeline_rl as l07

LESSON = "07_pipeline_rl"
NAMES = ("token_is_loss", "token_lags", "time_to_target", "inflight_decode", "refill_free_slots")

pytestmark = pytest.mark.timeout(300)


def test_registry_lists_the_five_exercises():
    exercises = [e.name for e in l07.EXERCISES]
    assert tuple(exercises) == NAMES
    assert sum(e.points for e in l07.EXERCISES) == 65


class _LibrarySampler:
    """The library generator's view of a sampler: free slots in a given order, start(slot, prompt)."""

    def __init__(self, fake: l07.FakeSampler) -> None:
        self.fake = fake
        self.version = 0
        self.swaps = 0  # weight swaps so far (the generator stamps each slot's start with it)

    def free_slots(self):
        return self.fake.free_slots()

    def start(self, slot, prompt):
        self.fake.start(slot, prompt, None)


def _library_refills(n_slots, order, group_size, groups_per_batch, max_lag, schedule):
    """The lesson's generator refilling a fake sampler: the (slot, prompt, group) of each start."""
    from course_lib.pipeline.system import GroupGenerator, PipelineConfig

    cfg = PipelineConfig(
        regime="pipeline", n_slots=n_slots, group_size=group_size, groups_per_batch=groups_per_batch, max_lag=max_lag
    )
    fake = l07.FakeSampler(n_slots, order)
    queue = l07.PromptQueue()
    task = SimpleNamespace(sample=lambda rng, n: [SimpleNamespace(prompt=next(queue))])
    gen = GroupGenerator(cfg, weights=None, sampler=_LibrarySampler(fake), task=task, rng=None, conn=None)
    gen._pull = lambda: None  # no weights to swap in here
    out = []
    for finished, consumed in schedule:
        fake.finish(finished)
        n = len(fake.started)
        gen._refill_free_slots(consumed)
        out.append([(slot, prompt, gen.owner[slot]) for slot, prompt, _ in fake.started[n:]])
    return out


def test_the_refill_oracle_agrees_with_the_lessons_generator():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n_slots, group_size = int(rng.integers(1, 20)), int(rng.integers(2, 6))
        groups_per_batch, max_lag = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        order = [int(s) for s in rng.permutation(n_slots)]
        schedule, consumed = [], 0
        for step in range(30):
            finished = {s for s in range(n_slots) if rng.random() < 0.4} if step else set()
            consumed += groups_per_batch if rng.random() < 0.3 else 0
            schedule.append((finished, consumed))
        library = _library_refills(n_slots, order, group_size, groups_per_batch, max_lag, schedule)
        fake, state, taken = l07.FakeSampler(n_slots, order), l07.fresh_state(), 0
        for (finished, consumed), want in zip(schedule, library):
            fake.finish(finished)
            args = (fake.free_slots(), state, taken, consumed, max_lag, group_size, groups_per_batch)
            starts, state, taken = l07.naive_refill(*args)
            for slot, _, _ in starts:
                fake.start(slot, None, None)
            assert starts == want


def test_a_sampler_drawing_through_the_softmax_passes_the_decoding_checks():
    """Another natural loop: probabilities from torch.softmax of the logits (not exp of the
    log-softmax); the teacher-forced replay accepts it."""
    import torch

    from course_lib.runtime.weights import load_flat_parameters

    def decode(model, cache, tokens, pos, n_steps, poll, version, generator):
        out_tokens, out_logp, out_versions = [], [], []
        with torch.no_grad():
            for _ in range(n_steps):
                update = poll()
                if update is not None and update[0] > version:
                    version = update[0]
                    load_flat_parameters(model, update[1])
                logits = model.step(tokens, pos, cache)
                tokens = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[:, 0]
                out_logp.append(torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0])
                out_tokens.append(tokens)
                out_versions.append(torch.full_like(tokens, version))
                pos = pos + 1
        return torch.stack(out_tokens, 1), torch.stack(out_logp, 1), torch.stack(out_versions, 1)

    outcome = run_exercise(l07.INFLIGHT_DECODE, decode)
    assert outcome.passed, outcome.message


def _decode_with_cache(cache_of, recompute=False):
    """The solution's decoding loop, decoding into ``cache_of(cache)`` (the cache given, or a copy)
    and, with ``recompute``, re-encoding the steps fed so far with the new weights at a swap."""
    import torch

    from course_lib.runtime.weights import load_flat_parameters

    def decode(model, cache, tokens, pos, n_steps, poll, version, generator):
        tokens, pos, cache, fed = tokens.clone(), pos.clone(), cache_of(cache), []
        out_tokens, out_logp, out_versions = [], [], []
        with torch.no_grad():
            for _ in range(n_steps):
                update = poll()
                if update is not None and update[0] > version:
                    version = update[0]
                    load_flat_parameters(model, update[1])
                    for token, p in fed if recompute else ():
                        model.step(token, p, cache)
                fed.append((tokens, pos))
                logp = torch.log_softmax(model.step(tokens, pos, cache), dim=-1)
                tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
                out_tokens.append(tokens)
                out_logp.append(logp.gather(1, tokens[:, None]).squeeze(1))
                out_versions.append(torch.full_like(tokens, version))
                pos = pos + 1
        return torch.stack(out_tokens, 1), torch.stack(out_logp, 1), torch.stack(out_versions, 1)

    return decode


def test_the_decoding_checks_read_the_cache_given_after_the_call():
    """Right tokens and log-probs are not enough: the steps must write the KV cache given (not a
    copy, which the generator would never see), and a swap must not rewrite what the old weights
    wrote. The teacher-forced check rejects each wrong cache and names it."""
    right = _decode_with_cache(lambda cache: cache)
    assert run_exercise(l07.INFLIGHT_DECODE, right).passed
    for wrong, expected in (
        (_decode_with_cache(lambda cache: (cache[0].clone(), cache[1].clone())), "wrote into a copy"),
        (_decode_with_cache(lambda cache: cache, recompute=True), "before the swap, were rewritten"),
    ):
        outcome = run_exercise(l07.INFLIGHT_DECODE, wrong)
        assert not outcome.passed and expected in outcome.message, outcome.message
        check = next(r for r in outcome.results if not r.passed)
        assert check.description == l07._dec_teacher_forced.description


def test_the_loss_slips_differ_on_the_graders_batches():
    for seed, c in enumerate(l07.LOSS_LEVELS):
        data = l07.loss_batch(seed)
        args = (data["logp_new"].detach(), data["logp_behaviour"], data["advantages"], data["mask"])
        right = l07.naive_token_loss(*args, c)
        assert l07.naive_token_loss(*args, c, per_answer=True) != pytest.approx(right)
        if c != 1.5:
            assert l07.naive_token_loss(*args, 1.5) != pytest.approx(right)


def _ttt_running_sum(times, rewards, target, window):
    """time_to_target from differences of a running sum: a window whose mean is the target (to
    two decimals) can land an ulp below it."""
    c = np.concatenate([[0.0], np.cumsum(np.asarray(rewards, dtype=np.float64))])
    hits = np.flatnonzero((c[window:] - c[:-window]) / window >= target)
    return float(np.asarray(times, dtype=np.float64)[hits[0] + window - 1]) if hits.size else math.inf


def _ttt_rolling_mean(times, rewards, target, window):
    """time_to_target from a rolling mean kept up to date (add the new reward, drop the oldest)."""
    r, total = [float(x) for x in rewards], 0.0
    for i, x in enumerate(r):
        total += x - (r[i - window] if i >= window else 0.0)
        if i >= window - 1 and total / window >= target:
            return float(times[i])
    return math.inf


def _ttt_cases():
    """Every (times, rewards, target, window) the oracle check grades, read off a recording fake."""
    seen = []

    def record(times, rewards, target, window):
        seen.append((list(times), list(rewards), target, window))
        return l07.naive_time_to_target(times, rewards, target, window)

    l07._ttt_oracle.fn(record)
    return seen


@pytest.mark.parametrize("fn", [_ttt_running_sum, _ttt_rolling_mean])
def test_time_to_target_accepts_either_side_of_a_tie_within_rounding(fn):
    outcome = run_exercise(l07.TIME_TO_TARGET, fn)
    assert outcome.passed, outcome.message


def test_time_to_target_ties_exist_and_exact_ones_name_the_strict_slip():
    cases = _ttt_cases()
    fuzzy = [c for c in cases if len(l07.accepted_times(*c)) > 1]
    exact = [c for c in cases if l07.exact_ties(c[1], c[2], c[3])]
    assert fuzzy and exact
    assert any(l07.naive_time_to_target(*c, strict=True) != l07.naive_time_to_target(*c) for c in exact)

    def strict(times, rewards, target, window):
        means = [sum(rewards[i - window + 1 : i + 1]) / window for i in range(window - 1, len(rewards))]
        hits = [i for i, m in enumerate(means) if m > target]
        return float(times[hits[0] + window - 1]) if hits else math.inf

    outcome = run_exercise(l07.TIME_TO_TARGET, strict)
    assert not outcome.passed and "use >=" in outcome.message


def test_the_librarys_time_to_target_agrees_with_the_oracle():
    from course_lib.pipeline.timeline import time_to_target

    for case in _ttt_cases():
        assert time_to_target(*case) in l07.accepted_times(*case), case
    for check in l07.TIME_TO_TARGET.checks:  # the checks themselves, without the runner's guard
        check.fn(time_to_target)


def test_bad_refills_are_reported():
    def busy_slot(sampler, prompts, state, *args):
        sampler.start(0, next(prompts), 0)
        sampler.start(0, next(prompts), 0)
        return 2

    outcome = run_exercise(l07.REFILL_FREE_SLOTS, busy_slot)
    assert not outcome.passed and "slot 0 is busy" in outcome.message, outcome.message

    def drains(sampler, prompts, state, *args):
        return len(list(prompts))

    outcome = run_exercise(l07.REFILL_FREE_SLOTS, drains)
    assert not outcome.passed, outcome.message
