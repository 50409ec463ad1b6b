"""Lesson 07's graders beyond what tests/test_exercises.py checks for every lesson: the slot
refill's oracle agrees with the generator the lesson runs (``GroupGenerator._refill_free_slots``
with ``may_start_group``), the loss's new slips change the answer on the grader's batches,
the share loss's wrong routes are named and the guard refuses the library's own share loss,
the teacher-forced decoding check accepts another natural sampler, and misused fakes are
reported.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import solution_function

from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import l07_pipeline_rl as l07

LESSON = "07_pipeline_rl"
NAMES = ("token_is_loss", "token_lags", "share_loss", "inflight_decode", "refill_free_slots")

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


def test_the_reference_share_loss_passes_and_its_shares_sum_to_the_batch():
    import torch

    solution = solution_function(LESSON, "share_loss")
    outcome = run_exercise(l07.SHARE_LOSS, solution)
    assert outcome.passed and outcome.n_passed == len(l07.SHARE_LOSS.checks), outcome.message
    data = l07.loss_batch(5, n=8)
    n_real = int(data["mask"].sum())
    args = (data["logp_behaviour"], data["advantages"], data["mask"])
    whole = data["logp_new"].detach().clone().requires_grad_(True)
    batch_loss = solution(whole, *args, torch.arange(8), n_real, 1.5)
    batch_loss.backward()
    leaf = data["logp_new"].detach().clone().requires_grad_(True)
    shares = l07.random_shares(np.random.default_rng(0), 8, 3)
    total = sum(solution(leaf, *args, rows, n_real, 1.5) for rows in shares)
    total.backward()
    assert total.item() == pytest.approx(batch_loss.item(), rel=1e-12)
    assert total.item() == pytest.approx(l07.naive_token_loss(data["logp_new"].detach(), *args, 1.5), rel=1e-9)
    torch.testing.assert_close(leaf.grad, whole.grad, rtol=1e-12, atol=1e-15)


def _share_terms(logp_new, logp_behaviour, advantages, mask, rows, c, *, detach=True):
    """The weighted terms sg[w] A log pi of the share's rows (padding selected away first) and their mask."""
    import torch

    m = mask[rows]
    lp = torch.where(m, logp_new[rows], 0.0)
    lm = torch.where(m, logp_behaviour[rows], 0.0)
    w = torch.clamp(torch.exp((lp.detach() if detach else lp) - lm), max=c)
    return w * advantages[rows][:, None] * lp, m


def _own_count(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
    terms, m = _share_terms(logp_new, logp_behaviour, advantages, mask, rows, c)
    return -terms.sum() / m.sum()


def _per_rank_mean(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
    """Each rank's own token mean, the ranks' gradients then averaged (DDP's default): / n_shares."""
    terms, m = _share_terms(logp_new, logp_behaviour, advantages, mask, rows, c)
    return -terms.sum() / m.sum() * len(rows) / len(mask)


def _n_real_and_ranks(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
    terms, _ = _share_terms(logp_new, logp_behaviour, advantages, mask, rows, c)
    return -terms.sum() / n_real / (len(mask) / len(rows))


def _per_answer(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
    terms, m = _share_terms(logp_new, logp_behaviour, advantages, mask, rows, c)
    return -(terms.sum(1) / m.sum(1)).sum() / len(mask)


def _through_the_weight(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
    terms, _ = _share_terms(logp_new, logp_behaviour, advantages, mask, rows, c, detach=False)
    return -terms.sum() / n_real


def _every_row(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
    import torch

    terms, _ = _share_terms(logp_new, logp_behaviour, advantages, mask, torch.arange(len(mask)), c)
    return -terms.sum() / n_real


def _multiplies_by_the_mask(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
    m = mask[rows].to(logp_new.dtype)
    w = (logp_new[rows].detach() - logp_behaviour[rows]).exp().clamp(max=c)
    return -(w * advantages[rows][:, None] * logp_new[rows] * m).sum() / n_real


@pytest.mark.parametrize(
    ("route", "named"),
    [
        (_own_count, "its own real-token count"),
        (_per_rank_mean, "divided by the number of shares"),
        (_n_real_and_ranks, "divided by the number of shares"),
        (_per_answer, "the mean is taken per answer"),
        (_through_the_weight, "flows through the importance weight"),
        (_every_row, "every row of the batch"),
        (_multiplies_by_the_mask, "-inf * 0"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:24],
)
def test_each_wrong_share_route_fails_and_is_named(route, named):
    route.__name__ = "share_loss"
    outcome = run_exercise(l07.SHARE_LOSS, route)
    assert not outcome.passed and named in outcome.message, outcome.message


def test_the_share_slips_differ_on_the_graders_batches():
    """Each slip the messages name gives another answer than the oracle on the random batches
    the grader splits into two shares or more (else the check could not tell it apart)."""
    rng = np.random.default_rng(0)
    seen = {message: False for message, _ in l07.SHARE_SLIPS}
    for seed, c in enumerate(l07.LOSS_LEVELS):
        data = l07.loss_batch(20 + seed, n=8)
        args = (data["logp_new"].detach(), data["logp_behaviour"], data["advantages"], data["mask"])
        n_real = int(data["mask"].sum())
        for k in (1 + seed % 4, 2 + (seed + 1) % 3):
            shares = l07.random_shares(rng, 8, k)
            right = [l07.naive_share_loss(*args, rows, n_real, c) for rows in shares]
            assert sum(right) == pytest.approx(l07.naive_token_loss(*args, c), rel=1e-12)
            for message, slip in l07.SHARE_SLIPS:
                wrong = [l07.naive_share_loss(*args, rows, n_real, c, **slip) for rows in shares]
                seen[message] |= not np.allclose(wrong, right, rtol=1e-6)
    assert all(seen.values()), seen


def test_the_guard_refuses_the_librarys_share_loss():
    """`batch_share_loss` (the lesson's trainer) and exercise 1's library loss scaled to a share
    are refused by the runner-wide guard; the scaled library loss is otherwise right."""
    import torch

    from course_lib.course.grading.checks import run_check
    from course_lib.course.grading.guard import GUARD_DESCRIPTION

    def library_share(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
        from course_lib.pipeline.loss import pipeline_loss

        m = mask[rows]
        if not len(rows):
            return torch.zeros((), dtype=logp_new.dtype)
        a = advantages[rows][:, None].expand_as(m)
        return pipeline_loss(logp_new[rows], logp_behaviour[rows], a, m, c) * m.sum() / n_real

    assert all(run_check(check, library_share).passed for check in l07.SHARE_LOSS.checks)
    outcome = run_exercise(l07.SHARE_LOSS, library_share)
    assert not outcome.passed and outcome.results[0].description == GUARD_DESCRIPTION
    assert "course_lib.pipeline.loss.pipeline_loss" in outcome.message, outcome.message

    def trainer_share(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
        from course_lib.pipeline.system import batch_share_loss

        return torch.as_tensor(batch_share_loss(None, {"mask": mask[rows][:0]}, n_real, None)[0])

    outcome = run_exercise(l07.SHARE_LOSS, trainer_share)
    assert not outcome.passed and outcome.results[0].description == GUARD_DESCRIPTION
    assert "course_lib.pipeline.system.batch_share_loss, the library's own implementation" in outcome.message


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
