"""course_lib.offpolicy.replay against naive oracles written here and against flashbax 0.1.3.

The oracles are deliberately plain: the numbers of the last ``capacity`` items added for the
ring, a sum-tree rebuilt from its leaves bottom-up in float32 numpy, a cumulative-sum
search (``np.searchsorted``) for the tree walk, and eqs. 06.7 / 06.8 computed in float64
from the stored priorities. Frequencies are tested with fixed seeds and tolerances from
the binomial standard error (or a chi-square quantile), so the tests are deterministic.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from course_lib.offpolicy import replay
from course_lib.offpolicy.replay import (
    NumpyPrioritizedReplay,
    NumpyReplay,
    importance_weights,
    per_add,
    per_init,
    per_probabilities,
    per_sample,
    per_update,
    sumtree_find,
    sumtree_init,
    sumtree_update,
    uniform_add,
    uniform_init,
    uniform_sample,
)

pytestmark = pytest.mark.timeout(300)

ADD = jax.jit(uniform_add)
SAMPLE = jax.jit(uniform_sample, static_argnames="batch_size")
PER_ADD = jax.jit(per_add)
PER_SAMPLE = jax.jit(per_sample, static_argnames="batch_size")
PER_UPDATE = jax.jit(per_update)
FIND = jax.jit(sumtree_find)

EXAMPLE = {"obs": jnp.zeros(3, jnp.float32), "id": jnp.zeros((), jnp.int32)}


def _items(first_id: int, n: int) -> dict[str, jax.Array]:
    """``n`` items with ids ``first_id ..``; ``obs`` repeats the id so both leaves are checked."""
    ids = jnp.arange(first_id, first_id + n, dtype=jnp.int32)
    return {"obs": jnp.repeat(ids[:, None], 3, axis=1).astype(jnp.float32), "id": ids}


def _naive_tree(leaves: np.ndarray) -> np.ndarray:
    """The sum-tree of ``leaves`` (float32, power-of-two length) rebuilt from scratch, bottom up."""
    n = len(leaves)
    tree = np.zeros(2 * n, np.float32)
    tree[n:] = leaves
    for i in range(n - 1, 0, -1):
        tree[i] = tree[2 * i] + tree[2 * i + 1]
    return tree


def _stored_leaves(buf) -> np.ndarray:
    return np.asarray(buf.tree[buf.capacity :])


# ---------------------------------------------------------------------------------------
# Uniform ring buffer
# ---------------------------------------------------------------------------------------


def test_uniform_add_wraps_around_in_ring_order():
    """Item number t lands in slot t % capacity; the oldest are overwritten; size saturates."""
    capacity, buf, added = 8, uniform_init(EXAMPLE, 8), 0
    for n in (3, 6, 8, 7):  # 6 and 7 cross the end of the ring; 8 fills it in one batch
        buf = ADD(buf, _items(added, n))
        added += n
        live = range(max(0, added - capacity), added)  # the oracle: the last `capacity` items
        expect = {t % capacity: t for t in live}
        got = np.asarray(buf.data["id"])
        assert {s: int(got[s]) for s in expect} == expect
        assert np.all(np.asarray(buf.data["obs"])[list(expect)] == np.array(list(expect.values()))[:, None])
        assert int(buf.insert) == added % capacity and int(buf.size) == min(added, capacity)


def test_uniform_add_rejects_what_does_not_fit():
    buf = uniform_init(EXAMPLE, 8)
    with pytest.raises(ValueError, match="cannot be added"):
        uniform_add(buf, _items(0, 9))
    with pytest.raises(ValueError, match="do not match"):
        uniform_add(buf, {"obs": jnp.zeros((2, 3))})
    with pytest.raises(ValueError, match="leading batch axis"):
        uniform_add(buf, {"obs": jnp.zeros((2, 4)), "id": jnp.zeros(2, jnp.int32)})


def test_uniform_sample_draws_only_stored_items():
    buf = ADD(uniform_init(EXAMPLE, 16), _items(100, 5))
    batch = SAMPLE(buf, jax.random.key(0), batch_size=2000)
    assert batch["id"].shape == (2000,) and batch["obs"].shape == (2000, 3)
    assert set(np.asarray(batch["id"]).tolist()) == {100, 101, 102, 103, 104}
    assert np.all(np.asarray(batch["obs"]) == np.asarray(batch["id"])[:, None])


def test_uniform_sampling_is_uniform_over_the_valid_slots():
    """Chi-square goodness of fit (fixed seed) after a wrap-around, with part of the ring stale."""
    buf = uniform_init(EXAMPLE, 32)
    buf = ADD(ADD(buf, _items(0, 20)), _items(20, 20))  # 40 added: ids 8..39 live, size 32
    n = 200_000
    ids = np.asarray(SAMPLE(buf, jax.random.key(1), batch_size=n)["id"])
    counts = np.bincount(ids, minlength=40)
    assert counts[:8].sum() == 0  # overwritten items are gone
    chi2 = ((counts[8:] - n / 32) ** 2 / (n / 32)).sum()
    assert chi2 < stats.chi2.ppf(1 - 1e-4, df=31), chi2


# ---------------------------------------------------------------------------------------
# Sum-tree
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["sequential", "vectorised"])
def test_sumtree_update_matches_a_tree_rebuilt_from_its_leaves(method):
    """Random batches with repeated indices: the last write wins and every node is exact."""
    capacity, rng = 64, np.random.default_rng(0)
    tree, leaves = sumtree_init(capacity), np.zeros(capacity, np.float32)
    update = jax.jit(functools.partial(sumtree_update, method=method))
    for _ in range(30):
        idx = rng.integers(0, capacity, 16)
        idx[rng.integers(0, 16, 4)] = idx[0]  # force repeats of one index, in random places
        values = rng.exponential(1.0, 16).astype(np.float32) * (rng.random(16) > 0.2)  # some zeros
        tree = update(tree, jnp.asarray(idx), jnp.asarray(values))
        for i, v in zip(idx, values):  # sequential writes: the last one stays
            leaves[i] = v
        got = np.asarray(tree)
        np.testing.assert_array_equal(got, _naive_tree(leaves))
        np.testing.assert_array_equal(got[1:capacity], got[2 : 2 * capacity : 2] + got[3 : 2 * capacity : 2])
    assert got[1] == pytest.approx(leaves.astype(np.float64).sum(), rel=1e-5)


@pytest.mark.parametrize("method", ["auto", "sequential", "vectorised"])
def test_sumtree_update_keeps_the_last_of_repeated_indices(method):
    tree = sumtree_update(sumtree_init(8), jnp.array([3, 5, 3, 3]), jnp.array([1.0, 2.0, 7.0, 5.0]), method)
    assert float(tree[8 + 3]) == 5.0 and float(tree[8 + 5]) == 2.0 and float(tree[1]) == 7.0


def test_sumtree_find_matches_a_cumulative_sum_search():
    """Integer leaves (zeros among them): sums are exact in float32, so the walk must equal
    ``searchsorted(cumsum, u, 'right')`` for every u, boundaries included."""
    rng = np.random.default_rng(1)
    leaves = rng.integers(0, 5, 64).astype(np.float32)
    tree = jnp.asarray(_naive_tree(leaves))
    cumsum = np.cumsum(leaves.astype(np.float64))
    u = np.concatenate([np.arange(0, cumsum[-1], 0.5), rng.uniform(0, cumsum[-1], 2000)]).astype(np.float32)
    found = np.asarray(FIND(tree, jnp.asarray(u)))
    np.testing.assert_array_equal(found, np.searchsorted(cumsum, u, side="right"))
    assert np.all(leaves[found] > 0)
    np.testing.assert_array_equal(np.asarray(jax.vmap(sumtree_find, in_axes=(None, 0))(tree, jnp.asarray(u))), found)


def test_sumtree_find_with_rounding_never_lands_on_a_zero_leaf():
    """Random float leaves: equal to the cumsum search away from the interval ends (where the
    float32 tree and the float64 cumsum may round differently); u at or past the total (what
    rounding can produce) ends on the last positive leaf."""
    rng = np.random.default_rng(2)
    leaves = (rng.exponential(1.0, 256) * (rng.random(256) > 0.3)).astype(np.float32)
    leaves[-40:] = 0.0  # a zero tail: rounding past the total must not reach it
    tree = jnp.asarray(_naive_tree(leaves))
    cumsum = np.cumsum(leaves.astype(np.float64))
    total = float(tree[1])
    u = np.concatenate([rng.uniform(0, total, 20_000), [total, np.nextafter(np.float32(total), 0), total * 1.5]])
    found = np.asarray(FIND(tree, jnp.asarray(u, jnp.float32)))
    assert np.all(leaves[found] > 0)
    inside = u[:-3]
    clear = np.min(np.abs(inside[:, None] - cumsum[None, :]), axis=1) > 1e-4 * total
    np.testing.assert_array_equal(found[:-3][clear], np.searchsorted(cumsum, inside[clear], side="right"))
    assert clear.mean() > 0.9
    assert found[-1] == found[-3] == np.flatnonzero(leaves)[-1]


def test_capacity_must_be_a_power_of_two():
    with pytest.raises(ValueError, match=r"power of two .* got 12; use 16"):
        per_init(EXAMPLE, 12)
    with pytest.raises(ValueError, match="power of two"):
        sumtree_init(0)
    with pytest.raises(ValueError, match="power of two"):
        sumtree_update(jnp.zeros(24), jnp.array([0]), jnp.array([1.0]))
    with pytest.raises(ValueError, match="power of two"):
        NumpyPrioritizedReplay({"x": np.zeros(2)}, 100)


# ---------------------------------------------------------------------------------------
# Prioritized replay
# ---------------------------------------------------------------------------------------


def _prioritized(alpha: float = 0.7, seed: int = 3):
    """A 16-slot buffer holding 12 items (4 empty slots) with random priorities, and those priorities."""
    buf = PER_ADD(per_init(EXAMPLE, 16, alpha=alpha), _items(0, 12))
    priorities = np.random.default_rng(seed).uniform(0.1, 3.0, 12).astype(np.float32)
    return PER_UPDATE(buf, jnp.arange(12), jnp.asarray(priorities)), priorities


def _naive_p(priorities: np.ndarray, alpha: float) -> np.ndarray:
    """Eq. 06.7 in float64: P(i) = p_i^alpha / sum_k p_k^alpha."""
    pa = priorities.astype(np.float64) ** alpha
    return pa / pa.sum()


def test_per_add_gives_new_items_the_max_priority_and_wraps():
    buf = per_init(EXAMPLE, 8, alpha=0.5)
    buf = PER_ADD(buf, _items(0, 5))
    np.testing.assert_array_equal(_stored_leaves(buf), [1, 1, 1, 1, 1, 0, 0, 0])  # max priority starts at 1
    buf = PER_UPDATE(buf, jnp.array([0, 1]), jnp.array([9.0, 0.25]))
    assert float(buf.max_priority) == 9.0
    buf = PER_ADD(buf, _items(5, 4))  # slots 5, 6, 7, then 0 (overwritten: priority reset)
    np.testing.assert_allclose(_stored_leaves(buf), [3, 0.5, 1, 1, 1, 3, 3, 3])
    assert int(buf.size) == 8 and int(buf.insert) == 1 and int(buf.data["id"][0]) == 8
    np.testing.assert_array_equal(np.asarray(buf.tree), _naive_tree(_stored_leaves(buf)))


def test_per_update_stores_p_to_the_alpha_and_raises_the_max():
    buf, priorities = _prioritized(alpha=0.7)
    np.testing.assert_allclose(_stored_leaves(buf)[:12], priorities**0.7, rtol=1e-6)
    assert np.all(_stored_leaves(buf)[12:] == 0)
    assert float(buf.max_priority) == pytest.approx(max(1.0, priorities.max()))
    buf = PER_UPDATE(buf, jnp.array([4, 4]), jnp.array([50.0, 0.5]))  # the last write wins; the max sees both
    assert float(buf.tree[16 + 4]) == pytest.approx(0.5**0.7) and float(buf.max_priority) == 50.0
    np.testing.assert_array_equal(np.asarray(buf.tree), _naive_tree(_stored_leaves(buf)))


@pytest.mark.parametrize("batch_size", [1, 64])
def test_per_sampling_frequencies_follow_eq_06_7(batch_size):
    """Counts of each item over many draws vs n P(i), within 5 binomial standard errors (the
    stratified draw of batch_size 64 varies less than that: the bound still holds)."""
    alpha = 0.7
    buf, priorities = _prioritized(alpha)
    n_calls = 40_000 // batch_size
    keys = jax.random.split(jax.random.key(4), n_calls)
    draw = jax.jit(jax.vmap(lambda k: per_sample(buf, k, batch_size, 0.5)[1]))
    indices = np.asarray(draw(keys)).ravel()
    n = indices.size
    counts = np.bincount(indices, minlength=16)
    assert counts[12:].sum() == 0  # empty slots have priority 0
    p = _naive_p(priorities, alpha)
    np.testing.assert_array_less(np.abs(counts[:12] - n * p), 5 * np.sqrt(n * p * (1 - p)) + 1)


def test_per_sample_importance_weights_follow_eq_06_8():
    alpha, beta = 0.7, 0.4
    buf, priorities = _prioritized(alpha)
    items, indices, weights = PER_SAMPLE(buf, jax.random.key(5), 32, beta)
    idx = np.asarray(indices)
    np.testing.assert_array_equal(np.asarray(items["id"]), idx)  # the items are the ones indexed
    p = _naive_p(priorities, alpha)[idx]
    w = (12 * p) ** -beta
    np.testing.assert_allclose(np.asarray(weights), w / w.max(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(per_probabilities(buf, indices)), p, rtol=1e-5)
    assert float(weights.max()) == 1.0


def test_uniform_priorities_give_unit_weights():
    """alpha = 0 makes every P(i) = 1/N, so every weight is 1 for any beta (eq. 06.8)."""
    buf, _ = _prioritized(alpha=0.0)
    _, _, weights = PER_SAMPLE(buf, jax.random.key(6), 16, 1.0)
    np.testing.assert_allclose(np.asarray(weights), 1.0, rtol=1e-6)
    assert float(importance_weights(jnp.full(4, 0.25), 4, 0.7).min()) == pytest.approx(1.0)


def _add_sample_update(add, sample, per_add_, per_sample_, per_update_):
    """One pass over every operation, with the functions given (jitted or not)."""
    u = add(add(uniform_init(EXAMPLE, 8), _items(0, 5)), _items(5, 4))  # per_add's shapes: eager ops shared
    b = per_add_(per_add_(per_init(EXAMPLE, 8, 0.6), _items(0, 5)), _items(5, 4))
    b = per_update_(b, jnp.array([1, 1]), jnp.array([2.0, 4.0]))
    return u, sample(u, jax.random.key(8), batch_size=8), b, per_sample_(b, jax.random.key(7), batch_size=8, beta=0.4)


def test_jit_and_no_jit_agree():
    """The functions called as they are (op by op, Python loops unrolled eagerly: chex's
    ``without_jit`` variant) and jitted give the same buffers and draws."""
    jitted = _add_sample_update(ADD, SAMPLE, PER_ADD, PER_SAMPLE, PER_UPDATE)
    eager = _add_sample_update(uniform_add, uniform_sample, per_add, per_sample, per_update)
    assert jax.tree.structure(jitted) == jax.tree.structure(eager)
    for a, b in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_vmap_over_seeds_equals_one_seed_at_a_time():
    """A whole add / update / sample pass vmapped over keys (and alphas: alpha is a leaf)."""

    def one(key, alpha):
        buf = per_add(per_init(EXAMPLE, 8, alpha), _items(0, 5))
        buf = per_update(buf, jnp.array([1, 3, 1]), jax.random.uniform(key, (3,)) + 0.1)
        return per_sample(buf, key, 4, 0.5)

    keys, alphas = jax.random.split(jax.random.key(11), 3), jnp.array([0.3, 0.6, 1.0])
    batched = jax.jit(jax.vmap(one))(keys, alphas)
    for s in range(3):
        single = jax.jit(one)(keys[s], alphas[s])
        for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(single)):
            np.testing.assert_allclose(np.asarray(a)[s], np.asarray(b), rtol=1e-6)


def test_buffers_are_frozen_pytrees_with_a_static_capacity():
    buf = per_init(EXAMPLE, 8)
    assert len(jax.tree.leaves(buf)) == 7 and jax.tree.structure(buf) != jax.tree.structure(per_init(EXAMPLE, 16))
    with pytest.raises(AttributeError):
        buf.size = 1


# ---------------------------------------------------------------------------------------
# Against flashbax 0.1.3 and the numpy baselines
# ---------------------------------------------------------------------------------------


def test_same_contents_as_flashbax_after_wrap_around():
    import flashbax as fbx

    ours = uniform_init(EXAMPLE, 8)
    item = fbx.make_item_buffer(max_length=8, min_length=1, sample_batch_size=4, add_batches=True)
    flat = fbx.make_flat_buffer(max_length=8, min_length=1, sample_batch_size=4, add_sequences=True)
    item_state, flat_state = item.init(EXAMPLE), flat.init(EXAMPLE)
    item_add, flat_add = jax.jit(item.add), jax.jit(flat.add)  # eager flashbax is slow to run op by op
    added = 0
    for n in (5, 6, 7):
        batch = _items(added, n)
        ours, item_state, flat_state = ADD(ours, batch), item_add(item_state, batch), flat_add(flat_state, batch)
        added += n
        for state in (item_state, flat_state):
            for key in EXAMPLE:
                np.testing.assert_array_equal(np.asarray(state.experience[key][0]), np.asarray(ours.data[key]))
            assert int(state.current_index) == int(ours.insert)
            assert bool(state.is_full) == (int(ours.size) == 8)


@functools.cache
def _flashbax_prioritised_item_buffer(alpha: float):
    """flashbax's prioritised item buffer of 16 slots with its functions jitted (eager flashbax
    runs op by op, slowly)."""
    import flashbax as fbx

    fb = fbx.make_prioritised_item_buffer(
        max_length=16, min_length=1, sample_batch_size=16, add_batches=True, priority_exponent=alpha
    )
    return fb.replace(add=jax.jit(fb.add), set_priorities=jax.jit(fb.set_priorities), sample=jax.jit(fb.sample))


def test_same_priorities_and_probabilities_as_flashbax():
    """After the same adds (wrap-around included) and the same priority updates (repeated
    index included), flashbax's prioritised item buffer holds our tree shifted by one, and
    the probabilities of its draws are our eq. 06.7."""
    alpha = 0.6
    fb = _flashbax_prioritised_item_buffer(alpha)
    fb_state, ours = fb.init(EXAMPLE), per_init(EXAMPLE, 16, alpha)
    for first in (0, 9):  # the second add overwrites slots 0 and 1
        fb_state, ours = fb.add(fb_state, _items(first, 9)), PER_ADD(ours, _items(first, 9))
    rng = np.random.default_rng(9)
    for _ in range(3):
        idx = jnp.asarray(rng.integers(0, 16, 6).tolist() + [2, 2])
        pri = jnp.asarray(rng.uniform(0.1, 4.0, 8), jnp.float32)
        fb_state, ours = fb.set_priorities(fb_state, idx, pri), PER_UPDATE(ours, idx, pri)
        np.testing.assert_allclose(np.asarray(ours.tree[1:]), np.asarray(fb_state.sum_tree_state.nodes), rtol=1e-5)
        assert float(fb_state.sum_tree_state.max_recorded_priority) == pytest.approx(float(ours.max_priority) ** alpha)
    for key in EXAMPLE:
        np.testing.assert_array_equal(np.asarray(fb_state.experience[key][0]), np.asarray(ours.data[key]))
    sample = fb.sample(fb_state, jax.random.key(10))
    np.testing.assert_allclose(
        np.asarray(sample.probabilities), np.asarray(per_probabilities(ours, sample.indices)), rtol=1e-5
    )
    np.testing.assert_array_equal(np.asarray(sample.experience["id"]), np.asarray(ours.data["id"])[sample.indices])


def test_flashbax_truncates_the_priority_of_new_items():
    """A difference pinned down (flashbax 0.1.3): new items should get the max priority seen,
    ``max p^alpha``, but flashbax builds them with ``jnp.full_like`` of an int32 index array,
    which truncates that to an integer; ours get it exactly. If this test fails, flashbax
    changed: update the module docstring."""
    alpha = 0.6
    fb = _flashbax_prioritised_item_buffer(alpha)  # the same buffer and shapes as above: no new compile
    fb_state, ours = fb.add(fb.init(EXAMPLE), _items(0, 9)), PER_ADD(per_init(EXAMPLE, 16, alpha), _items(0, 9))
    idx, pri = jnp.zeros(8, jnp.int32), jnp.full(8, 4.0)  # 4^0.6 = 2.297...
    fb_state, ours = fb.set_priorities(fb_state, idx, pri), PER_UPDATE(ours, idx, pri)
    fb_state, ours = fb.add(fb_state, _items(9, 9)), PER_ADD(ours, _items(9, 9))  # slots 9..15, 0, 1
    new = np.r_[9:16, 0, 1]
    np.testing.assert_array_equal(np.asarray(fb_state.sum_tree_state.nodes[15:])[new], 2.0)
    np.testing.assert_allclose(_stored_leaves(ours)[new], 4.0**alpha, rtol=1e-6)


def test_flashbax_flat_buffer_cannot_draw_its_newest_step():
    """The semantic difference noted in the module docstring: flashbax's prioritised *flat*
    buffer stores steps and samples (step, next step) pairs, so its newest step has priority
    0; our items are whole transitions and all of them can be drawn."""
    import flashbax as fbx

    fb = fbx.make_prioritised_flat_buffer(max_length=8, min_length=1, sample_batch_size=4, add_sequences=True)
    fb_state = jax.jit(fb.add)(fb.init(EXAMPLE), _items(0, 5))
    ours = PER_ADD(per_init(EXAMPLE, 8), _items(0, 5))
    fb_leaves = np.asarray(fb_state.sum_tree_state.nodes[7:])
    np.testing.assert_array_equal(fb_leaves, [1, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(_stored_leaves(ours), [1, 1, 1, 1, 1, 0, 0, 0])


def test_numpy_baselines_hold_the_same_items_and_tree():
    """The benchmark's host baselines implement the same semantics."""
    example = {k: np.asarray(v) for k, v in EXAMPLE.items()}
    ring, prio = NumpyReplay(example, 8), NumpyPrioritizedReplay(example, 8, alpha=0.6)
    ours, ours_p, added = uniform_init(EXAMPLE, 8), per_init(EXAMPLE, 8, 0.6), 0
    for n in (3, 6, 8):
        batch = _items(added, n)
        host = {k: np.asarray(v) for k, v in batch.items()}
        ring.add(host)
        prio.add(host)
        ours, ours_p = ADD(ours, batch), PER_ADD(ours_p, batch)
        added += n
        idx, pri = np.array([1, 4, 1]), np.array([2.0, 0.5, 3.0])
        prio.update(idx, pri)
        ours_p = PER_UPDATE(ours_p, jnp.asarray(idx), jnp.asarray(pri, jnp.float32))
        for key in EXAMPLE:
            np.testing.assert_array_equal(ring.data[key], np.asarray(ours.data[key]))
            np.testing.assert_array_equal(prio.data[key], np.asarray(ours_p.data[key]))
        np.testing.assert_allclose(prio.tree[1:], np.asarray(ours_p.tree[1:]), rtol=1e-6)
        assert (ring.insert, ring.size) == (int(ours.insert), int(ours.size))
    items, indices, weights = prio.sample_prioritized(32, beta=0.4)
    p = prio.tree[8 + indices] / prio.tree[1]
    np.testing.assert_allclose(weights, (8 * p) ** -0.4 / ((8 * p) ** -0.4).max())
    np.testing.assert_array_equal(items["id"], prio.data["id"][indices])
    assert set(ring.sample(100)["id"].tolist()) <= set(ring.data["id"].tolist())


def test_module_states_the_equations_in_the_checked_format():
    """(06.7) and (06.8) are tagged copies that tests/test_equations.py can read."""
    from pathlib import Path

    from test_equations import docstring_equations

    found = docstring_equations(Path(replay.__file__))
    assert found == {
        "06.7": "P(i) = p_i^alpha / sum_k p_k^alpha",
        "06.8": "w_i = (N * P(i))^(-beta) / max_j w_j",
    }
