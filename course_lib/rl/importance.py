"""Importance sampling for off-policy policy gradients (lesson 02).

An asynchronous learner trains on samples that an older *behaviour* policy ``mu``
generated, while it differentiates its current *target* policy ``pi``. The importance
weight ``w = pi / mu`` makes such samples count as if ``pi`` had drawn them; its
variance grows with the divergence between the two policies. Everything here works on
log-probabilities, never on probabilities: a long sequence's probability underflows,
its log-probability does not.

Lesson 02's equations, by number:

- (02.1) on-policy gradient ``g = E_{a~pi}[A(a) grad log pi(a)]``
- (02.2) off-policy gradient with the full weight ``g = E_{a~mu}[w(a) A(a) grad log pi(a)]``,
  ``w = pi/mu = exp(log pi - log mu)``; the IS estimate ``(1/N) sum_i w_i f(x_i)``:
  :func:`log_ratios`, :func:`importance_weights`, :func:`is_estimate`
- (02.3) per-token ratios and their product over a sequence
  ``w_seq = prod_t w_t = exp(sum_t log w_t)``: :func:`masked_log_ratios`,
  :func:`token_and_sequence_ratios`
- (02.4) truncated IS ``min(w, c)`` (IMPALA, Espeholt et al. 2018; PipelineRL's loss):
  :func:`truncated_weights`, :func:`truncated_is_loss`
- (02.5) PPO's clipped surrogate ``min(r A, clip(r, 1-eps, 1+eps) A)`` (Schulman et al.
  2017, arXiv 1707.06347): :func:`clipped_surrogate`, :func:`clipped_surrogate_loss`; times the
  truncated behaviour weight ``sg[min(pi_old / mu, c)]`` (verl's and SkyRL's TIS): :func:`tis_ppo_loss`
- (02.6) effective sample size ``ESS = (sum w)^2 / sum w^2`` (Kong 1992; Owen, *Monte
  Carlo theory, methods and examples*, ch. 9): :func:`effective_sample_size`,
  :func:`ess_from_log_weights`
- (02.7) the weight's variance is a divergence:
  ``Var_mu[w] = chi2(pi || mu) = exp(D_2(pi || mu)) - 1 >= exp(KL(pi || mu)) - 1``:
  :func:`categorical_kl`, :func:`chi_square`; the large-batch ESS fraction
  ``1 / (1 + chi2) <= exp(-KL)``: :func:`expected_ess_fraction`; exact bias and variance of (truncated) IS
  on a finite space: :func:`exact_is_moments`
- (02.8) every correction is a per-sample weight on the score,
  ``g = mean_i psi_i grad log pi(a_i|s_i)``: :func:`correction_coefficients`

torch is imported only inside the loss functions, so the numpy parts stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    import torch

Correction = Literal["none", "is", "truncated", "clip", "decoupled"]
#: The five ways of using a stale sample compared in lesson 02, section 4.
CORRECTIONS: tuple[Correction, ...] = ("none", "is", "truncated", "clip", "decoupled")
#: Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before ``exp`` in the PPO
#: losses (verl clamps at 20): ``exp(89)`` overflows float32, and its backward is ``0 * inf``.
LOG_RATIO_CLAMP = 20.0
Level = Literal["token", "sequence"]


def _same_shape(a: NDArray[np.float64], b: NDArray[np.float64], names: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names} must have the same shape, got {a.shape} and {b.shape}")


# ---------------------------------------------------------------------------------------
# (02.2) importance weights and the IS estimate
# ---------------------------------------------------------------------------------------


def log_ratios(logp_target: ArrayLike, logp_behaviour: ArrayLike) -> NDArray[np.float64]:
    """``log w = log pi(x) - log mu(x)`` elementwise (eq. 02.2), in float64.

    Args:
        logp_target: log-probabilities of the samples under the target policy ``pi``.
        logp_behaviour: the same samples' log-probabilities under the behaviour ``mu``
            that drew them; same shape.
    """
    lt = np.asarray(logp_target, dtype=np.float64)
    lb = np.asarray(logp_behaviour, dtype=np.float64)
    _same_shape(lt, lb, "logp_target and logp_behaviour")
    return lt - lb


def importance_weights(logp_target: ArrayLike, logp_behaviour: ArrayLike) -> NDArray[np.float64]:
    """``w = pi(x) / mu(x) = exp(log pi(x) - log mu(x))`` (eq. 02.2).

    Computed from the log-ratio, so samples whose probabilities underflow (``log pi =
    -1000``) still get the right weight.
    """
    return np.exp(log_ratios(logp_target, logp_behaviour))


def is_estimate(values: ArrayLike, logp_target: ArrayLike, logp_behaviour: ArrayLike) -> float:
    r"""The importance-sampling estimate of ``E_{x~pi}[f(x)]`` from samples of ``mu`` (eq. 02.2).

    ::

        E_pi[f] = E_mu[w f] ~= (1/N) sum_i w_i f(x_i),    x_i ~ mu,  w_i = pi(x_i) / mu(x_i)

    Unbiased whenever ``mu(x) > 0`` wherever ``pi(x) f(x) != 0``; its variance is
    ``(E_mu[w^2 f^2] - (E_pi f)^2) / N``, which grows with the divergence of ``pi`` from
    ``mu`` (eq. 02.7).

    Args:
        values: ``[N]`` the function values ``f(x_i)``.
        logp_target: ``[N]`` ``log pi(x_i)``.
        logp_behaviour: ``[N]`` ``log mu(x_i)``.

    Raises:
        ValueError: on mismatched shapes or ``N = 0``.
    """
    f = np.asarray(values, dtype=np.float64)
    w = importance_weights(logp_target, logp_behaviour)
    _same_shape(f, w, "values and log-probabilities")
    if f.ndim != 1 or f.size == 0:
        raise ValueError(f"values must be a non-empty [N] array, got shape {f.shape}")
    return float(np.mean(w * f))


# ---------------------------------------------------------------------------------------
# (02.3) per-token and per-sequence ratios
# ---------------------------------------------------------------------------------------


def masked_log_ratios(logp_new: ArrayLike, logp_old: ArrayLike, mask: ArrayLike | None = None) -> NDArray[np.float64]:
    """``[N, T]`` per-token log-ratios ``log pi(y_t|...) - log mu(y_t|...)``, 0 at padding.

    Padding may hold anything, even ``-inf`` or NaN: it never reaches the result.

    Args:
        logp_new: ``[N, T]`` token log-probabilities under the current policy.
        logp_old: ``[N, T]`` under the behaviour policy that sampled the tokens.
        mask: ``[N, T]`` True (or 1) at real tokens; all real when None.
    """
    new = np.asarray(logp_new, dtype=np.float64)
    old = np.asarray(logp_old, dtype=np.float64)
    _same_shape(new, old, "logp_new and logp_old")
    if new.ndim != 2:
        raise ValueError(f"log-probabilities must be [N, T], got shape {new.shape}")
    real = np.ones(new.shape, dtype=bool) if mask is None else np.asarray(mask).astype(bool)
    if real.shape != new.shape:
        raise ValueError(f"mask must have shape {new.shape}, got {real.shape}")
    with np.errstate(invalid="ignore"):  # padding like -inf - (-inf) is discarded below
        return np.where(real, new - old, 0.0)


def token_and_sequence_ratios(
    logp_new: ArrayLike, logp_old: ArrayLike, mask: ArrayLike | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    r"""Per-token ratios and their product over each sequence (eq. 02.3).

    ::

        w_{i,t} = pi(y_it | y_i,<t) / mu(y_it | y_i,<t)          (1 at padding)
        w_i     = prod_t w_{i,t} = exp(sum_t log w_{i,t})        (real tokens only)

    The sequence weight is the exact ratio ``pi(y_i) / mu(y_i)`` of the whole sequence;
    its log is a sum of ``T`` terms, so its spread grows like ``sqrt(T)`` and the weight
    itself spreads exponentially in ``T``.

    Returns:
        ``(token_ratios [N, T], sequence_ratios [N])``, float64. A sequence ratio may
        overflow to ``inf`` or underflow to 0; use :func:`masked_log_ratios` summed over
        ``T`` to keep it in log space.
    """
    lr = masked_log_ratios(logp_new, logp_old, mask)
    with np.errstate(over="ignore"):
        return np.exp(lr), np.exp(lr.sum(axis=1))


# ---------------------------------------------------------------------------------------
# (02.4) truncation, (02.6) effective sample size, (02.7) divergences
# ---------------------------------------------------------------------------------------


def truncated_weights(log_weights: ArrayLike, c: float) -> NDArray[np.float64]:
    """``min(w, c)`` from ``log w`` (eq. 02.4), as ``exp(min(log w, log c))``: no overflow.

    ``c = inf`` keeps the full weights. IMPALA's V-trace truncates at ``rho_bar = 1``
    (Espeholt et al. 2018); PipelineRL's default loss at ``1 + eps``.

    Args:
        log_weights: log importance weights ``log w``, any shape.
        c: the truncation level, ``c > 0``.
    """
    if not c > 0:
        raise ValueError(f"the truncation level c must be > 0, got {c}")
    return np.exp(np.minimum(np.asarray(log_weights, dtype=np.float64), np.log(c)))


def effective_sample_size(weights: ArrayLike) -> float | NDArray[np.float64]:
    r"""Kish/Kong effective sample size ``ESS = (sum_i w_i)^2 / sum_i w_i^2`` (eq. 02.6).

    ``ESS = N`` for equal weights, 1 when one weight carries everything; scaling all
    weights changes nothing. For IS weights ``E[ESS] / N ~= 1 / E_mu[w^2] = 1 / (1 + chi2)``
    (Kong 1992; Owen, *Monte Carlo theory*, ch. 9). PipelineRL logs ``ESS / N``.

    Args:
        weights: ``[..., N]`` non-negative weights; the ESS is taken over the last axis.

    Returns:
        a float for ``[N]`` input, else a ``[...]`` array; 0 where every weight is 0.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 0:
        raise ValueError("weights must have at least one axis [N]")
    if np.any(w < 0):
        raise ValueError("importance weights must be non-negative")
    total = w.sum(axis=-1)
    squares = (w * w).sum(axis=-1)
    ess = np.divide(total * total, squares, out=np.zeros_like(total), where=squares > 0)
    return float(ess) if w.ndim == 1 else ess


def ess_from_log_weights(log_weights: ArrayLike) -> float | NDArray[np.float64]:
    """:func:`effective_sample_size` of ``exp(log_weights)``, exact even when every weight
    over- or underflows (``log w`` of a 1000-token sequence): the ESS does not change when
    all weights are scaled, so each row is shifted by its maximum first.

    Args:
        log_weights: ``[..., N]``; ``-inf`` is a zero weight.
    """
    lw = np.asarray(log_weights, dtype=np.float64)
    if lw.ndim == 0:
        raise ValueError("log_weights must have at least one axis [N]")
    top = np.max(lw, axis=-1, keepdims=True)
    shifted = np.exp(lw - np.where(np.isfinite(top), top, 0.0))
    return effective_sample_size(shifted)


def expected_ess_fraction(logp_target: ArrayLike, logp_behaviour: ArrayLike) -> float | NDArray[np.float64]:
    r"""The large-batch ESS fraction of ``mu``'s samples for ``pi``, from the two distributions (eq. 02.6-02.7).

    ::

        E[ESS] / N  ->  1 / E_mu[w^2] = 1 / sum_k mu_k (pi_k / mu_k)^2 = 1 / (1 + chi2(pi || mu))
                     =  exp(-D_2(pi || mu))  <=  exp(-KL(pi || mu))

    ``E_mu[w^2] = sum_k exp(2 log pi_k - log mu_k)``, formed from log-probabilities so
    that tiny probabilities neither underflow nor give ``0 / 0``. It is what a batch's
    ESS/N approaches as the batch grows; a small batch that misses the rare heavy weights
    shows more (lesson 02, section 1).

    Args:
        logp_target: ``[..., K]`` log pi over ``K`` actions (``-inf`` where pi is 0).
        logp_behaviour: same shape, log mu (finite where pi > 0).

    Returns:
        a float in ``[0, 1]`` for ``[K]`` input, else a ``[...]`` array.
    """
    lp = np.asarray(logp_target, dtype=np.float64)
    lm = np.asarray(logp_behaviour, dtype=np.float64)
    _same_shape(lp, lm, "logp_target and logp_behaviour")
    if lp.ndim == 0:
        raise ValueError("log-probabilities must have at least one axis [K]")
    with np.errstate(over="ignore"):  # a weight past e^709: E[w^2] overflows and the fraction is 0.0 anyway
        log_terms = np.where(np.isneginf(lp), -np.inf, 2.0 * lp - lm)  # log(mu_k w_k^2)
        top = np.max(log_terms, axis=-1, keepdims=True)
        safe_top = np.where(np.isfinite(top), top, 0.0)
        log_second = np.log(np.sum(np.exp(log_terms - safe_top), axis=-1)) + safe_top[..., 0]
        out = np.exp(-log_second)
    return float(out) if lp.ndim == 1 else out


def categorical_kl(p: ArrayLike, q: ArrayLike) -> float | NDArray[np.float64]:
    """``KL(p || q) = sum_k p_k log(p_k / q_k)`` over the last axis, in nats (terms with ``p_k = 0`` are 0)."""
    pp = np.asarray(p, dtype=np.float64)
    qq = np.asarray(q, dtype=np.float64)
    _same_shape(pp, qq, "p and q")
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(pp > 0, pp * (np.log(pp) - np.log(qq)), 0.0)
    out = terms.sum(axis=-1)
    return float(out) if pp.ndim == 1 else out


def chi_square(p: ArrayLike, q: ArrayLike) -> float | NDArray[np.float64]:
    r"""``chi2(p || q) = sum_k p_k^2 / q_k - 1 = Var_{x~q}[p(x)/q(x)]`` over the last axis (eq. 02.7).

    The variance of the importance weight when ``q`` samples for ``p``. It equals
    ``exp(D_2(p || q)) - 1`` (Renyi divergence of order 2) and so is at least
    ``exp(KL(p || q)) - 1``. Infinite where ``q_k = 0 < p_k``.
    """
    pp = np.asarray(p, dtype=np.float64)
    qq = np.asarray(q, dtype=np.float64)
    _same_shape(pp, qq, "p and q")
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(pp > 0, pp * pp / qq, 0.0)
    out = terms.sum(axis=-1) - 1.0
    return float(out) if pp.ndim == 1 else out


def exact_is_moments(
    pi: ArrayLike, mu: ArrayLike, f_mean: ArrayLike, f_second: ArrayLike, c: float = np.inf
) -> tuple[NDArray[np.float64], float]:
    r"""Exact moments of one (truncated) importance-sampling term on a finite space.

    For ``x ~ mu``, ``w(x) = pi(x) / mu(x)`` and a random ``f`` with ``E[f | x] = f_mean[x]``
    and ``E[|f|^2 | x] = f_second[x]``::

        mean   = E_mu[min(w, c) f]       = sum_x mu(x) min(w(x), c) f_mean[x]
        second = E_mu[min(w, c)^2 |f|^2] = sum_x mu(x) min(w(x), c)^2 f_second[x]

    With ``c = inf``, ``mean = E_pi[f]`` (eq. 02.2). The estimate
    ``(1/N) sum_i min(w_i, c) f_i`` has bias ``mean - E_pi[f]`` and total variance
    ``(second - |mean|^2) / N``.

    Args:
        pi: ``[K]`` target probabilities.
        mu: ``[K]`` behaviour probabilities (positive where ``pi`` is).
        f_mean: ``[K]`` or ``[K, D]`` conditional means of ``f``.
        f_second: ``[K]`` conditional second moments ``E[|f|^2 | x]``.
        c: truncation level (``inf``: full weights).

    Returns:
        ``(mean [] or [D], second)``.
    """
    p = np.asarray(pi, dtype=np.float64)
    q = np.asarray(mu, dtype=np.float64)
    _same_shape(p, q, "pi and mu")
    fm = np.asarray(f_mean, dtype=np.float64)
    fs = np.asarray(f_second, dtype=np.float64)
    if p.ndim != 1 or fm.shape[:1] != p.shape or fs.shape != p.shape:
        raise ValueError(
            f"pi, mu, f_second must be [K] and f_mean [K] or [K, D]; got {p.shape}, {fm.shape}, {fs.shape}"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(p > 0, p / q, 0.0)
    wc = np.minimum(w, c)
    mean = np.tensordot(q * wc, fm, axes=(0, 0))
    return np.asarray(mean, dtype=np.float64), float(np.sum(q * wc * wc * fs))


# ---------------------------------------------------------------------------------------
# (02.5) PPO's clipped surrogate and (02.8) the corrections as weights on the score
# ---------------------------------------------------------------------------------------


def clipped_surrogate(ratios: ArrayLike, advantages: ArrayLike, eps: float) -> NDArray[np.float64]:
    r"""PPO's per-sample clipped objective (eq. 02.5; Schulman et al. 2017, arXiv 1707.06347).

    ::

        L_clip(r, A) = min(r A, clip(r, 1 - eps, 1 + eps) A)

    To be *maximised*. Flat (zero gradient) where ``r > 1 + eps`` with ``A > 0`` or
    ``r < 1 - eps`` with ``A < 0``: the sample has already moved the policy as far as
    the clip allows in the direction it pushes.
    """
    r = np.asarray(ratios, dtype=np.float64)
    a = np.asarray(advantages, dtype=np.float64)
    return np.minimum(r * a, np.clip(r, 1.0 - eps, 1.0 + eps) * a)


def correction_coefficients(
    correction: Correction,
    ratios: ArrayLike,
    advantages: ArrayLike,
    c: float = 1.0,
    eps: float = 0.2,
    prox_ratios: ArrayLike | None = None,
) -> NDArray[np.float64]:
    r"""Per-sample weight ``psi_i`` of the score in ``g = mean_i psi_i grad log pi(a_i|s_i)`` (eq. 02.8).

    ::

        none       psi = A                         (stale samples used as if on-policy)
        is         psi = w A                       (eq. 02.2, per-step weight)
        truncated  psi = min(w, c) A               (eq. 02.4)
        clip       psi = w A 1[not clipped]        (gradient of 02.5: d(wA)/dtheta = w A grad log pi)
        decoupled  psi = min(v, c) r A 1[r not clipped],   v = pi_prox / mu,  r = w / v = pi / pi_prox

    ``clip`` is clipped where ``(A > 0 and w > 1 + eps)`` or ``(A < 0 and w < 1 - eps)``;
    ``decoupled`` (this course's variant of AReaL's decoupled PPO, arXiv 2505.24298) applies
    the same rule to ``r``, the ratio to a *proximal* policy (lesson 02: ``pi_{t-1}``), and
    truncates the behaviour weight ``v`` at ``c``. AReaL's proximal policy is the weights at the
    start of the step (``r = 1`` when each batch gets one gradient step), and AReaL does not
    truncate ``v``: it drops the tokens whose ``v`` passes an optional cap.

    Args:
        correction: one of :data:`CORRECTIONS`.
        ratios: ``w_i = pi(a_i|s_i) / mu(a_i|s_i)``, any shape.
        advantages: ``A_i``, the same shape.
        c: truncation level of ``truncated`` and ``decoupled``.
        eps: clip range of ``clip`` and ``decoupled``.
        prox_ratios: ``v_i = pi_prox(a_i|s_i) / mu(a_i|s_i)`` for ``decoupled``; ``None``: ``pi_prox = pi``.
    """
    w = np.asarray(ratios, dtype=np.float64)
    a = np.asarray(advantages, dtype=np.float64)
    _same_shape(w, a, "ratios and advantages")
    if correction == "none":
        return a.copy()
    if correction == "is":
        return w * a
    if correction == "truncated":
        return np.minimum(w, c) * a
    if correction == "clip":
        clipped = ((a > 0) & (w > 1.0 + eps)) | ((a < 0) & (w < 1.0 - eps))
        return np.where(clipped, 0.0, w * a)
    if correction == "decoupled":
        v = w if prox_ratios is None else np.asarray(prox_ratios, dtype=np.float64)
        _same_shape(w, v, "ratios and prox_ratios")
        r = w / v
        clipped = ((a > 0) & (r > 1.0 + eps)) | ((a < 0) & (r < 1.0 - eps))
        return np.where(clipped, 0.0, np.minimum(v, c) * r * a)
    raise ValueError(f"unknown correction {correction!r}; use one of {CORRECTIONS}")


# ---------------------------------------------------------------------------------------
# torch losses, per token or per sequence
# ---------------------------------------------------------------------------------------


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 for half-precision tensors (a bf16 log-ratio rounds by about 0.016 near -2.3,
    more than the sampler-trainer mismatch TIS corrects), their own dtype otherwise."""
    import torch

    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def _real_mean(terms: torch.Tensor) -> torch.Tensor:
    """The mean of the real terms; 0 (with a zero gradient) when a micro-batch has none."""
    return terms.sum() / max(terms.numel(), 1)


def _loss_terms(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None,
    level: Level,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_ratio, logp, advantage)`` per loss term: one per real token, or one per sequence.

    ``[N]`` inputs are N independent samples (both levels agree). ``[N, T]`` inputs are
    N sequences: ``token`` keeps every real token (``advantages`` ``[N]`` broadcasts over
    its sequence); ``sequence`` sums log-ratios and log-probabilities over each
    sequence's real tokens and needs ``[N]`` advantages.
    """
    import torch

    logp_new = logp_new.to(_compute_dtype(logp_new))  # bf16 / fp16 log-probabilities: ratios in float32
    old = logp_old.detach().to(logp_new.dtype)
    adv = advantages.detach().to(logp_new.dtype)
    if logp_new.shape != old.shape:
        raise ValueError(f"logp_new {tuple(logp_new.shape)} and logp_old {tuple(old.shape)} must match")
    if logp_new.ndim == 1:
        if adv.shape != logp_new.shape:
            raise ValueError(f"advantages must be [N] = {tuple(logp_new.shape)}, got {tuple(adv.shape)}")
        return logp_new - old, logp_new, adv
    if logp_new.ndim != 2:
        raise ValueError(f"log-probabilities must be [N] or [N, T], got shape {tuple(logp_new.shape)}")
    real = torch.ones_like(logp_new, dtype=torch.bool) if mask is None else mask.to(torch.bool)
    zero = torch.zeros((), dtype=logp_new.dtype)
    log_ratio = torch.where(real, logp_new - old, zero)
    logp = torch.where(real, logp_new, zero)
    if level == "sequence":
        if adv.shape != logp_new.shape[:1]:
            raise ValueError(f"sequence-level advantages must be [N] = ({logp_new.shape[0]},), got {tuple(adv.shape)}")
        return log_ratio.sum(dim=1), logp.sum(dim=1), adv
    if level != "token":
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    adv_t = adv[:, None].expand_as(logp_new) if adv.ndim == 1 else adv
    return log_ratio[real], logp[real], adv_t[real]


def truncated_is_loss(
    logp_new: torch.Tensor,
    logp_behaviour: torch.Tensor,
    advantages: torch.Tensor,
    c: float = 1.0,
    mask: torch.Tensor | None = None,
    level: Level = "token",
) -> torch.Tensor:
    r"""REINFORCE with a truncated importance weight (eq. 02.4), PipelineRL's default loss.

    ::

        L = -mean_i  sg[min(w_i, c)] * A_i * log pi(a_i),     w_i = exp(log pi(a_i) - log mu(a_i))

    ``sg`` = stop-gradient: the weight rescales each sample's score, it is not
    differentiated. PipelineRL uses ``c = 1 + eps`` on per-token ratios. ``c = inf`` is
    the full-IS loss (02.2), its log-weight clamped at 20 so that float32 stays finite.

    Args:
        logp_new: ``[N]`` or ``[N, T]`` log-probabilities of the taken actions/tokens
            under the current policy (requires grad).
        logp_behaviour: same shape, under the policy that sampled them.
        advantages: ``[N]`` (or ``[N, T]`` at token level).
        c: truncation level.
        mask: ``[N, T]`` real tokens.
        level: ``token``: one weight per token, mean over real tokens; ``sequence``:
            one weight per sequence (the product of its token ratios), mean over sequences.
    """
    import torch

    log_ratio, logp, adv = _loss_terms(logp_new, logp_behaviour, advantages, mask, level)
    weight = torch.exp(torch.clamp(log_ratio.detach(), max=min(float(np.log(c)), LOG_RATIO_CLAMP)))  # c = inf too
    return -_real_mean(weight * adv * logp)


def clipped_surrogate_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    eps: float = 0.2,
    mask: torch.Tensor | None = None,
    level: Level = "token",
) -> torch.Tensor:
    r"""Minus PPO's clipped surrogate (eq. 02.5), averaged: a loss to minimise.

    ::

        L = -mean_i min(r_i A_i, clip(r_i, 1 - eps, 1 + eps) A_i),   r_i = exp(log pi(a_i) - sg[log mu(a_i)])

    The gradient flows through ``r_i`` (``grad r = r grad log pi``), never into
    ``logp_old`` or ``advantages``. ``level="sequence"`` uses one ratio per sequence,
    the raw product of its token ratios: its spread grows with the length, so at
    ``eps = 0.2`` nearly every long sequence is clipped. GSPO (arXiv 2507.18071) clips
    the length-normalised ratio ``r^(1/T)`` (the geometric mean) instead.

    Args: as :func:`truncated_is_loss`, with ``eps`` the clip range.
    """
    import torch

    log_ratio, _, adv = _loss_terms(logp_new, logp_old, advantages, mask, level)
    ratio = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # finite in float32, and its gradient
    return -_real_mean(torch.min(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv))


def tis_ppo_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    logp_behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps: float = 0.2,
    c: float = 2.0,
) -> torch.Tensor:
    r"""PPO's clipped loss times the truncated behaviour weight, per token (verl's and SkyRL's TIS).

    ::

        L = -mean_{real tokens} sg[min(pi_old / mu, c)] * min(r A, clip(r, 1 - eps, 1 + eps) A),
        r = exp(log pi - sg[log pi_old])

    ``pi_old`` is the trainer's own recomputation of the sampled tokens' log-probabilities
    at the start of the step, ``mu`` the inference engine's (a stale or numerically
    different policy). The weight is capped in log space and not differentiated; both
    log-ratios are clamped to ``[-20, 20]`` so that float32 never overflows. Where
    ``mask`` is False the inputs may hold NaN or -inf. Half-precision inputs are computed in
    float32, and a micro-batch with no real token gives 0.

    Args:
        logp_new: ``[N, T]`` (or ``[N]``) log pi_theta, requires grad.
        logp_old: the same shape, the trainer's log pi_old (a constant).
        logp_behaviour: the same shape, the sampler's log mu (a constant).
        advantages: ``[N]``, one per answer (or ``[N, T]``).
        mask: real tokens (``None``: all).
        eps: PPO's clip range; c: the cap of the behaviour weight.
    """
    import torch

    new = logp_new.to(_compute_dtype(logp_new))  # bf16 / fp16 log-probabilities: ratios in float32
    new = new if new.ndim == 2 else new[:, None]
    old = logp_old.detach().to(new.dtype).reshape(new.shape)
    beh = logp_behaviour.detach().to(new.dtype).reshape(new.shape)
    adv = advantages.detach().to(new.dtype)
    adv = adv[:, None] if adv.ndim == 1 else adv.reshape(new.shape)
    real = torch.ones_like(new, dtype=torch.bool) if mask is None else mask.to(torch.bool).reshape(new.shape)
    zero = torch.zeros((), dtype=new.dtype)
    log_r = torch.clamp(torch.where(real, new - old, zero), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_v = torch.clamp(torch.where(real, old - beh, zero), -LOG_RATIO_CLAMP, min(float(np.log(c)), LOG_RATIO_CLAMP))
    ratio = torch.exp(log_r)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)
    terms = torch.where(real, torch.exp(log_v) * surrogate, zero)
    return -terms.sum() / real.sum().clamp(min=1)  # an all-padding micro-batch gives 0, not 0 / 0
