"""course_lib.rl.importance: known values, properties and independent oracles (lesson 02)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from course_lib.rl.importance import (
    CORRECTIONS,
    categorical_kl,
    chi_square,
    clipped_surrogate,
    clipped_surrogate_loss,
    correction_coefficients,
    effective_sample_size,
    ess_from_log_weights,
    exact_is_moments,
    expected_ess_fraction,
    importance_weights,
    is_estimate,
    log_ratios,
    masked_log_ratios,
    tis_ppo_loss,
    token_and_sequence_ratios,
    truncated_is_loss,
    truncated_weights,
)


@pytest.fixture
def no_warnings():
    """Turn every warning (numpy overflow, invalid value, ...) into an error inside the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="warn", invalid="warn", divide="warn", under="ignore"):
            yield


# ---------------------------------------------------------------------------------------
# (02.2) weights and the IS estimate
# ---------------------------------------------------------------------------------------


def test_weights_are_ratios_of_probabilities():
    pi, mu = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.5, 0.25])
    np.testing.assert_allclose(importance_weights(np.log(pi), np.log(mu)), [2.0, 0.5, 1.0])
    np.testing.assert_allclose(log_ratios([-1.0, -2.0], [-3.0, -1.0]), [2.0, -1.0])


def test_weights_survive_probabilities_that_underflow(no_warnings):
    w = importance_weights([-1000.0, -1001.0], [-1001.0, -1000.0])
    np.testing.assert_allclose(w, [math.e, 1 / math.e])


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same shape"):
        log_ratios([0.0, 1.0], [0.0])


def test_is_estimate_known_value_and_on_policy_mean():
    pi, mu = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.5, 0.25])
    assert is_estimate([1.0, 0.0, 2.0], np.log(pi), np.log(mu)) == pytest.approx(4 / 3)
    values = np.array([0.3, -1.0, 2.5, 4.0])
    logp = np.log([0.1, 0.2, 0.3, 0.4])
    assert is_estimate(values, logp, logp) == pytest.approx(values.mean())
    with pytest.raises(ValueError, match="non-empty"):
        is_estimate([], [], [])


def test_is_estimate_is_exactly_unbiased_over_one_sample():
    rng = np.random.default_rng(0)
    pi, mu, f = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6)), rng.normal(size=6)
    average = sum(mu[x] * is_estimate([f[x]], [np.log(pi[x])], [np.log(mu[x])]) for x in range(6))
    assert average == pytest.approx(pi @ f, rel=1e-12)


def test_is_estimate_converges_with_monte_carlo():
    rng = np.random.default_rng(1)
    pi, mu, f = np.array([0.7, 0.2, 0.1]), np.array([0.3, 0.3, 0.4]), np.array([1.0, -2.0, 5.0])
    x = rng.choice(3, size=200_000, p=mu)
    assert is_estimate(f[x], np.log(pi[x]), np.log(mu[x])) == pytest.approx(pi @ f, abs=0.02)


# ---------------------------------------------------------------------------------------
# (02.3) per-token and per-sequence ratios
# ---------------------------------------------------------------------------------------


def test_token_and_sequence_ratios_known_values_with_padding(no_warnings):
    new = np.log([[0.5, 0.3, 0.9], [0.2, 0.5, 0.5]])
    old = np.log([[0.25, 0.3, 0.45], [0.1, 0.5, 0.5]])
    new[1, 1:], old[1, 1:] = -np.inf, -np.inf  # padding may hold anything
    mask = np.array([[True, True, True], [True, False, False]])
    tokens, seqs = token_and_sequence_ratios(new, old, mask)
    np.testing.assert_allclose(tokens, [[2.0, 1.0, 2.0], [2.0, 1.0, 1.0]])
    np.testing.assert_allclose(seqs, [4.0, 2.0])


def test_sequence_ratio_is_the_product_of_token_ratios():
    rng = np.random.default_rng(2)
    new, old = rng.normal(size=(5, 12)), rng.normal(size=(5, 12))
    mask = np.arange(12)[None, :] < rng.integers(1, 13, size=5)[:, None]
    tokens, seqs = token_and_sequence_ratios(new, old, mask)
    np.testing.assert_allclose(seqs, [np.prod(tokens[i][mask[i]]) for i in range(5)], rtol=1e-12)
    np.testing.assert_array_equal(tokens[~mask], 1.0)
    np.testing.assert_allclose(masked_log_ratios(new, old).sum(axis=1), (new - old).sum(axis=1))


def test_long_sequences_stay_in_log_space(no_warnings):
    new = np.full((1, 2000), -800.0)
    old = new - 0.5  # every token e^0.5 times more likely under pi
    lr = masked_log_ratios(new, old)
    assert lr.sum() == pytest.approx(1000.0)
    _, seqs = token_and_sequence_ratios(new, old)  # e^1000 overflows: inf, without a warning
    assert np.isinf(seqs[0])
    assert ess_from_log_weights(np.array([1000.0, 1000.0])) == pytest.approx(2.0)


def test_masked_log_ratios_validates_shapes():
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        masked_log_ratios(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="mask must have shape"):
        masked_log_ratios(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((3, 2)))


# ---------------------------------------------------------------------------------------
# (02.4) truncation, (02.6) ESS, (02.7) divergences
# ---------------------------------------------------------------------------------------


def test_truncated_weights_on_both_sides_of_c(no_warnings):
    w = np.array([0.25, 1.0, 2.0, 4.0])
    np.testing.assert_allclose(truncated_weights(np.log(w), 2.0), [0.25, 1.0, 2.0, 2.0])
    np.testing.assert_allclose(truncated_weights(np.log(w), 1.0), [0.25, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(truncated_weights(np.log(w), np.inf), w)
    np.testing.assert_allclose(truncated_weights([800.0, -800.0, 1000.0], 3.0), [3.0, 0.0, 3.0])
    assert truncated_weights(np.zeros((2, 3)), 1.5).shape == (2, 3)
    with pytest.raises(ValueError, match="c must be > 0"):
        truncated_weights([0.0], 0.0)


def test_ess_known_values_and_properties():
    assert effective_sample_size(np.ones(7)) == pytest.approx(7.0)
    assert effective_sample_size(np.full(4, 0.3)) == pytest.approx(4.0)
    assert effective_sample_size([0.0, 0.0, 5.0]) == pytest.approx(1.0)
    assert effective_sample_size([1.0, 2.0, 3.0]) == pytest.approx(36 / 14)
    assert effective_sample_size(np.zeros(3)) == 0.0
    w = np.random.default_rng(3).exponential(size=50)
    assert effective_sample_size(1e3 * w) == pytest.approx(effective_sample_size(w))
    assert 1.0 <= effective_sample_size(w) <= 50.0
    with pytest.raises(ValueError, match="non-negative"):
        effective_sample_size([1.0, -1.0])


def test_ess_is_batched_over_the_last_axis():
    w = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(effective_sample_size(w), [3.0, 1.0, 0.0])
    assert isinstance(effective_sample_size(w[0]), float)


def test_ess_from_log_weights_matches_and_survives_overflow(no_warnings):
    lw = np.random.default_rng(4).normal(size=(3, 20))
    np.testing.assert_allclose(ess_from_log_weights(lw), effective_sample_size(np.exp(lw)))
    big = ess_from_log_weights(np.array([1000.0, 999.0]))
    assert big == pytest.approx((1 + math.exp(-1)) ** 2 / (1 + math.exp(-2)))
    assert ess_from_log_weights(np.array([-np.inf, -np.inf])) == 0.0


def test_ess_fraction_approaches_one_over_second_moment():
    rng = np.random.default_rng(5)
    pi, mu = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    x = rng.choice(3, size=400_000, p=mu)
    w = pi[x] / mu[x]
    assert effective_sample_size(w) / w.size == pytest.approx(1 / (1 + chi_square(pi, mu)), rel=0.01)


def test_expected_ess_fraction_known_values_and_the_kl_bound(no_warnings):
    assert expected_ess_fraction(np.log([0.5, 0.5]), np.log([0.8, 0.2])) == pytest.approx(0.64)
    assert expected_ess_fraction(np.log([0.3, 0.7]), np.log([0.3, 0.7])) == pytest.approx(1.0)
    # a rare action: pi^2 / mu = e^(-800 + 800) = 1, while pi^2 and mu underflow to 0.0 separately
    assert expected_ess_fraction([math.log(0.5), math.log(0.5), -400.0], [math.log(0.5), math.log(0.5), -800.0]) == (
        pytest.approx(0.5)
    )
    assert expected_ess_fraction([0.0, -np.inf], [math.log(0.5), math.log(0.5)]) == pytest.approx(0.5)  # pi_1 = 0
    assert expected_ess_fraction([math.log(0.5), math.log(0.5)], [0.0, -800.0]) == 0.0  # a weight of e^800
    rng = np.random.default_rng(7)
    p, q = rng.dirichlet(np.ones(6), size=50), rng.dirichlet(np.ones(6), size=50)
    frac = expected_ess_fraction(np.log(p), np.log(q))
    assert isinstance(frac, np.ndarray) and frac.shape == (50,)
    np.testing.assert_allclose(frac, 1 / (1 + chi_square(p, q)), rtol=1e-10)
    assert np.all(frac <= np.exp(-categorical_kl(p, q)) + 1e-12)  # eq. 02.7: D_2 >= KL
    with pytest.raises(ValueError, match="same shape"):
        expected_ess_fraction(np.zeros(3), np.zeros(4))


def test_kl_and_chi_square_known_values():
    p, q = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    assert categorical_kl(p, q) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))
    assert chi_square(p, q) == pytest.approx(0.25 / 0.25 + 0.25 / 0.75 - 1)
    assert categorical_kl(p, p) == 0.0 and chi_square(p, p) == pytest.approx(0.0, abs=1e-15)
    assert categorical_kl([0.0, 1.0], [0.5, 0.5]) == pytest.approx(math.log(2))  # p = 0 terms vanish
    np.testing.assert_allclose(categorical_kl(np.stack([p, p]), np.stack([q, p])), [categorical_kl(p, q), 0.0])


def test_chi_square_is_the_weight_variance_and_bounds_the_kl():
    rng = np.random.default_rng(6)
    for _ in range(200):
        p, q = rng.dirichlet(np.ones(5) * 0.5), rng.dirichlet(np.ones(5) * 0.5)
        w = p / q
        assert chi_square(p, q) == pytest.approx(np.sum(q * (w - 1) ** 2), rel=1e-9)  # Var_q[w], E_q[w] = 1
        assert chi_square(p, q) >= math.expm1(categorical_kl(p, q)) - 1e-12  # eq. 02.7


def test_exact_is_moments_against_enumeration_and_monte_carlo():
    pi, mu = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.3, 0.5])
    f = np.array([1.0, -2.0, 4.0])
    mean, second = exact_is_moments(pi, mu, f, f**2)
    assert float(mean) == pytest.approx(pi @ f)
    assert second == pytest.approx(np.sum(pi**2 / mu * f**2))
    mean_c, second_c = exact_is_moments(pi, mu, f, f**2, c=1.5)
    w = np.minimum(pi / mu, 1.5)
    assert float(mean_c) == pytest.approx(np.sum(mu * w * f)) and second_c == pytest.approx(np.sum(mu * w**2 * f**2))
    x = np.random.default_rng(7).choice(3, size=300_000, p=mu)
    terms = np.minimum(pi[x] / mu[x], 1.5) * f[x]
    assert terms.mean() == pytest.approx(float(mean_c), abs=0.01)
    assert terms.var() == pytest.approx(second_c - float(mean_c) ** 2, rel=0.02)
    vec_mean, _ = exact_is_moments(pi, mu, np.stack([f, 2 * f], axis=1), 5 * f**2)
    np.testing.assert_allclose(vec_mean, [pi @ f, 2 * pi @ f])


# ---------------------------------------------------------------------------------------
# (02.5) PPO and (02.8) the corrections as score weights
# ---------------------------------------------------------------------------------------


def test_clipped_surrogate_crosses_both_thresholds():
    r = np.array([1.5, 0.5, 1.5, 0.5, 1.1])
    a = np.array([1.0, 1.0, -1.0, -1.0, 2.0])
    np.testing.assert_allclose(clipped_surrogate(r, a, 0.2), [1.2, 0.5, -1.5, -0.8, 2.2])


def test_correction_coefficients_case_by_case():
    w = np.array([1.5, 0.5, 1.5, 0.5, 1.1])
    a = np.array([1.0, 1.0, -1.0, -1.0, 2.0])
    np.testing.assert_allclose(correction_coefficients("none", w, a), a)
    np.testing.assert_allclose(correction_coefficients("is", w, a), w * a)
    np.testing.assert_allclose(correction_coefficients("truncated", w, a, c=1.0), [1.0, 0.5, -1.0, -0.5, 2.0])
    np.testing.assert_allclose(correction_coefficients("clip", w, a, eps=0.2), [0.0, 0.5, -1.5, 0.0, 2.2])
    v = np.array([3.0, 0.5, 1.0, 1.0, 1.0])  # pi_prox / mu; r = w / v = [0.5, 1, 1.5, 0.5, 1.1]
    np.testing.assert_allclose(
        correction_coefficients("decoupled", w, a, c=2.0, eps=0.2, prox_ratios=v), [2 * 0.5, 0.5 * 1.0, -1.5, 0.0, 2.2]
    )
    np.testing.assert_allclose(
        correction_coefficients("decoupled", w, a, eps=0.2, prox_ratios=np.ones(5)),
        correction_coefficients("clip", w, a, eps=0.2),
    )
    with pytest.raises(ValueError, match="unknown correction"):
        correction_coefficients("vtrace", w, a)


def test_every_correction_is_on_policy_when_the_weights_are_one():
    a = np.random.default_rng(8).normal(size=10)
    for name in CORRECTIONS:
        np.testing.assert_allclose(correction_coefficients(name, np.ones(10), a, c=1.0, eps=0.2), a)


def _logps(seed: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    old = torch.tensor(np.log(rng.uniform(0.05, 0.95, size=shape)))
    new = (old + torch.tensor(rng.normal(scale=0.4, size=shape))).requires_grad_()
    adv = torch.tensor(rng.normal(size=shape[:1]))
    return new, old, adv


@pytest.mark.parametrize("correction", ["is", "truncated", "clip"])
def test_loss_gradients_are_the_score_weights(correction):
    """d loss / d log pi_i = -(1/N) psi_i, with psi from correction_coefficients (eq. 02.8)."""
    new, old, adv = _logps(9, (40,))
    if correction == "clip":
        loss = clipped_surrogate_loss(new, old, adv, eps=0.2)
    else:
        loss = truncated_is_loss(new, old, adv, c=1.0 if correction == "truncated" else np.inf)
    (grad,) = torch.autograd.grad(loss, new)
    w = torch.exp(new - old).detach().numpy()
    psi = correction_coefficients(correction, w, adv.numpy(), c=1.0, eps=0.2)
    np.testing.assert_allclose(grad.numpy(), -psi / 40, rtol=1e-10, atol=1e-14)


def test_loss_values():
    new, old, adv = _logps(10, (30,))
    w = torch.exp(new - old).detach().numpy()
    expected_clip = -clipped_surrogate(w, adv.numpy(), 0.2).mean()
    assert clipped_surrogate_loss(new, old, adv, eps=0.2).item() == pytest.approx(expected_clip)
    expected_tis = -(np.minimum(w, 1.2) * adv.numpy() * new.detach().numpy()).mean()
    assert truncated_is_loss(new, old, adv, c=1.2).item() == pytest.approx(expected_tis)


def test_no_gradient_reaches_the_behaviour_logps_or_advantages():
    new, old, adv = _logps(11, (8,))
    old.requires_grad_()
    adv.requires_grad_()
    (clipped_surrogate_loss(new, old, adv) + truncated_is_loss(new, old, adv)).backward()
    assert old.grad is None and adv.grad is None
    assert new.grad is not None


def test_token_level_losses_mask_padding_and_broadcast_advantages():
    new, old, _ = _logps(12, (4, 6))
    adv = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)
    mask = torch.tensor(np.arange(6)[None, :] < np.array([6, 3, 1, 4])[:, None])
    flat_new = new[mask]
    flat_old = old[mask]
    flat_adv = adv[:, None].expand(4, 6)[mask]
    for loss_fn in (clipped_surrogate_loss, truncated_is_loss):
        with torch.no_grad():
            garbage_new, garbage_old = new.clone(), old.clone()
            garbage_new[~mask], garbage_old[~mask] = 50.0, -50.0
        token = loss_fn(garbage_new.requires_grad_(), garbage_old, adv, mask=mask)
        flat = loss_fn(flat_new, flat_old, flat_adv)
        assert token.item() == pytest.approx(flat.item())
        per_token_adv = loss_fn(garbage_new, garbage_old, adv[:, None].expand(4, 6), mask=mask)
        assert per_token_adv.item() == pytest.approx(flat.item())


def test_sequence_level_losses_use_one_ratio_per_sequence():
    new, old, adv = _logps(13, (3, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    seq_new = torch.where(mask, new, torch.zeros((), dtype=new.dtype)).sum(dim=1)
    seq_old = torch.where(mask, old, torch.zeros((), dtype=old.dtype)).sum(dim=1)
    for loss_fn in (clipped_surrogate_loss, truncated_is_loss):
        seq = loss_fn(new, old, adv, mask=mask, level="sequence")
        direct = loss_fn(seq_new, seq_old, adv)
        assert seq.item() == pytest.approx(direct.item())
    with pytest.raises(ValueError, match="level"):
        truncated_is_loss(new, old, adv, level="answer")
    with pytest.raises(ValueError, match="sequence-level advantages"):
        clipped_surrogate_loss(new, old, torch.zeros(3, 5, dtype=torch.float64), level="sequence")


def test_ppo_losses_stay_finite_in_float32_at_a_log_ratio_of_100():
    """exp(100) overflows float32; unclamped, its backward gives 0 * inf = NaN in every gradient."""
    new = torch.tensor([95.0, -1.0, -2.0], dtype=torch.float32, requires_grad=True)
    old = torch.tensor([-5.0, -1.2, -1.9], dtype=torch.float32)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float32)
    for loss in (clipped_surrogate_loss(new, old, adv), tis_ppo_loss(new, old, old - 100.0, adv)):
        (grad,) = torch.autograd.grad(loss, new)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert grad[0] == 0.0  # clipped (A > 0, r > 1 + eps): flat


def test_tis_ppo_loss_is_ppo_times_the_capped_behaviour_weight():
    new, old, adv = _logps(14, (4, 6))
    beh = old - torch.tensor(np.random.default_rng(15).normal(scale=0.8, size=(4, 6)))
    mask = torch.tensor(np.arange(6)[None, :] < np.array([6, 3, 1, 4])[:, None])
    assert tis_ppo_loss(new, old, old, adv, mask).item() == pytest.approx(
        clipped_surrogate_loss(new, old, adv, mask=mask).item()
    )  # v = 1: PPO's loss, mean over real tokens
    v = torch.clamp(torch.exp(old - beh), max=2.0)
    r = torch.exp(new - old).detach()
    a = adv[:, None].expand(4, 6)
    terms = v * torch.minimum(r * a, torch.clamp(r, 0.8, 1.2) * a)
    assert tis_ppo_loss(new, old, beh, adv, mask, c=2.0).item() == pytest.approx(-terms[mask].mean().item())


@pytest.mark.parametrize("loss_name", ["tis_ppo_loss", "truncated_is_loss", "clipped_surrogate_loss"])
def test_losses_form_half_precision_ratios_in_float32_and_survive_an_all_padding_batch(loss_name):
    import torch

    from course_lib.rl import importance

    fn = getattr(importance, loss_name)
    gen = torch.Generator().manual_seed(0)
    logp = torch.log(torch.rand(4, 6, generator=gen) * 0.8 + 0.1)
    new32 = logp + 0.05 * torch.randn(4, 6, generator=gen)
    beh = logp - 0.05 * torch.randn(4, 6, generator=gen)
    adv = torch.randn(4, generator=gen)
    mask = torch.rand(4, 6, generator=gen) < 0.7
    args = (logp, beh) if loss_name == "tis_ppo_loss" else (beh,)

    def loss(new, m):
        return fn(new, *args, adv, mask=m) if loss_name != "tis_ppo_loss" else fn(new, *args, adv, m)

    exact = loss(new32.double(), mask).item()
    # bf16 log-probabilities in: the ratios are formed in float32, so only the inputs' rounding remains
    half = new32.to(torch.bfloat16).requires_grad_()
    out = loss(half, mask)
    assert out.dtype == torch.float32
    rounded = loss(half.detach().double(), mask).item()
    assert abs(out.item() - rounded) < 1e-5 and abs(out.item() - exact) < 0.05
    out.backward()
    assert half.grad is not None and torch.isfinite(half.grad.float()).all()
    # a micro-batch holding padding only: 0, with a zero (not NaN) gradient
    empty = new32.clone().requires_grad_()
    zero = loss(empty, torch.zeros_like(mask))
    zero.backward()
    assert zero.item() == 0.0 and bool((empty.grad == 0).all())
