"""Training on stale batches: a grid of lags x corrections on CartPole, as one vectorised run (lesson 02).

An asynchronous RL system trains on batches its actors generated with an older policy.
Here the update at step ``t`` uses episodes sampled by the policy of ``k`` updates ago,
``mu = pi_{theta_{t-k}}`` (the initial policy while ``t < k``), and one of the
corrections of :func:`course_lib.rl.importance.correction_coefficients` (eq. 02.8)::

    g_t = (1/n) sum_i psi_i grad log pi_{theta_t}(a_i | s_i),
    psi_i = A_i | w_i A_i | min(w_i, c) A_i | w_i A_i 1[w_i not clipped] | min(v_i, c) r_i A_i 1[r_i not clipped],
    w_i = pi_t(a_i|s_i) / mu(a_i|s_i),  v_i = pi_{t-1}(a_i|s_i) / mu(a_i|s_i),  r_i = w_i / v_i

with ``A_i`` the reward-to-go of lesson 01 (eq. 01.3) minus its batch mean, divided by
its batch std, as computed from the stale episodes. The weights are per step (they
correct which action was taken, not which states were visited), as in PPO, IMPALA and
PipelineRL. ``decoupled`` is this course's variant of decoupled PPO (AReaL): the learner's
previous policy ``pi_{t-1}`` is the proximal policy (the clip is taken against it, not
against ``mu``) and the behaviour weight ``pi_{t-1}/mu`` is truncated at ``c``. AReaL's
proximal policy is the weights at the start of the step (with one gradient step per batch,
as here, ``r = 1``), and it drops tokens whose behaviour weight passes an optional cap
instead of truncating it.

The learning curve is the *learner's* return: each update also runs one batch of
episodes with the current policy ``pi_t`` (in the same vectorised env) and logs its
return. The sampler's return at update ``t`` would be ``pi_{t-k}``'s, a curve delayed by
``k`` updates whatever the correction does.

To run every (lag, correction, seed) of the grid at once, the policy is a *linear*
softmax over ``[observation, 1]`` whose score has a closed form,
``grad_W log pi(a|x) = x (onehot(a) - pi(.|x))^T``, and all runs step together in one
numpy-vectorised ``CartPoleVectorEnv`` (``n_runs * n_seeds * n_envs`` carts). Adam
(Kingma & Ba 2015) is elementwise, so one optimizer state for the stacked parameters is
exactly one optimizer per run.

Correcting is one answer to staleness; *bounding* it is the other, and systems do both.
:func:`may_start_group` is the bound as a system enforces it (backpressure: a producer waits
rather than get more than ``bound`` updates ahead), the rule lesson 07's pipeline and lesson
11's capstone share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from course_lib.rl.importance import (
    CORRECTIONS,
    Correction,
    categorical_kl,
    correction_coefficients,
    effective_sample_size,
)
from course_lib.rl.pg import discounted_returns

if TYPE_CHECKING:
    import gymnasium as gym

#: Names of the corrections in tables and legends.
LABELS: dict[Correction, str] = {
    "none": "no correction",
    "is": "per-step IS",
    "truncated": "truncated IS",
    "clip": "PPO clip",
    "decoupled": "decoupled PPO*",
}
N_FEATURES = 5  # CartPole's 4 observations and a constant 1
N_ACTIONS = 2


@dataclass(frozen=True)
class StalenessConfig:
    """The grid and every setting a run depends on; :func:`course_lib.describe` prints the help."""

    lags: tuple[int, ...] = field(
        default=(0, 1, 2, 4, 8, 16, 32),
        metadata={"help": "k: each batch is sampled by the policy of k updates ago (0 = on-policy)"},
    )
    corrections: tuple[Correction, ...] = field(
        default=CORRECTIONS, metadata={"help": "corrections run at every lag k > 0 (at k = 0 all coincide: one run)"}
    )
    n_seeds: int = field(
        default=16,
        metadata={"help": "independent runs per (lag, correction); seed i starts from the same weights in every cell"},
    )
    n_envs: int = field(default=8, metadata={"help": "episodes per update and run"})
    n_updates: int = field(default=60, metadata={"help": "policy updates per run"})
    lr: float = field(
        default=0.2, metadata={"help": "Adam learning rate (large: each update moves the policy noticeably)"}
    )
    c: float = field(
        default=1.0, metadata={"help": "cap of the weights of truncated IS and decoupled PPO (IMPALA's rho_bar = 1)"}
    )
    eps: float = field(default=0.2, metadata={"help": "clip range of PPO clip and decoupled PPO"})
    gamma: float = field(default=0.99, metadata={"help": "discount of the reward-to-go (01.3)"})
    max_episode_steps: int = field(
        default=200, metadata={"help": "CartPole time limit (200 as in CartPole-v0; keeps the grid fast)"}
    )
    init_scale: float = field(default=0.1, metadata={"help": "std of the initial linear weights"})
    seed: int = field(default=0, metadata={"help": "seeds the initial weights, the action sampling and the env resets"})

    def __post_init__(self) -> None:
        if any(k < 0 for k in self.lags):
            raise ValueError(f"lags must be >= 0, got {self.lags}")
        unknown = set(self.corrections) - set(CORRECTIONS)
        if unknown:
            raise ValueError(f"unknown corrections {sorted(unknown)}; use some of {CORRECTIONS}")
        if self.c < 1.0 and 0 in self.lags:
            raise ValueError("with c < 1 truncated IS differs from on-policy even at k = 0; use c >= 1")

    @property
    def runs(self) -> tuple[tuple[int, Correction], ...]:
        """The grid's cells ``(lag, correction)``; lag 0 once, as ``(0, "none")``."""
        cells: list[tuple[int, Correction]] = [(0, "none")] if 0 in self.lags else []
        cells += [(k, m) for k in self.lags if k > 0 for m in self.corrections]
        return tuple(cells)


def label(lag: int, correction: Correction) -> str:
    """``"k = 4, truncated IS"``; lag 0 is ``"on-policy (k = 0)"``."""
    return "on-policy (k = 0)" if lag == 0 else f"k = {lag}, {LABELS[correction]}"


# ---------------------------------------------------------------------------------------
# Bounded staleness: backpressure (lessons 07 and 11)
# ---------------------------------------------------------------------------------------


def may_start_group(k: int, consumed: int, bound: int, groups_per_batch: int) -> bool:
    """Backpressure: may group ``k`` (numbered as groups start) start, given the groups the
    trainer has ``consumed`` (read *before* pulling the weights)?

    Update ``u`` consumes groups ``u B .. (u + 1) B - 1`` (``B = groups_per_batch``). A group
    allowed to start holds weights of version ``>= consumed / B`` and is consumed by an update
    ``< consumed / B + bound + 1``: no token of it lags more than ``bound`` updates."""
    return k < consumed + (bound + 1) * groups_per_batch


# ---------------------------------------------------------------------------------------
# The linear softmax policy, for G runs at once
# ---------------------------------------------------------------------------------------


def features(obs: NDArray[np.floating], n_runs: int) -> NDArray[np.float64]:
    """``[n_runs * E, 4]`` observations -> ``[n_runs, E, 5]`` features ``[obs, 1]``."""
    x = np.asarray(obs, dtype=np.float64).reshape(n_runs, -1, obs.shape[-1])
    return np.concatenate([x, np.ones(x.shape[:-1] + (1,))], axis=-1)


def log_policy(params: NDArray[np.float64], x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``log softmax(x W_g)`` for every run ``g``.

    Args:
        params: ``[G, 5, 2]`` one weight matrix per run.
        x: ``[..., G, E, 5]`` features, run on the third axis from the end.

    Returns:
        ``[..., G, E, 2]`` log-probabilities of the two actions.
    """
    z = np.einsum("...gei,gio->...geo", x, params)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def linear_policy_gradient(
    params: NDArray[np.float64],
    x: NDArray[np.float64],
    actions: NDArray[np.int64],
    coefficients: NDArray[np.float64],
    mask: NDArray[np.bool_],
) -> NDArray[np.float64]:
    """``[G, 5, 2]`` ascent direction ``(1/n_g) sum_i psi_i x_i (onehot(a_i) - pi(.|x_i))^T`` per run (eq. 02.8).

    Args:
        params: ``[G, 5, 2]`` the current policy's weights.
        x: ``[T, G, E, 5]`` features of the visited states.
        actions: ``[T, G, E]`` actions taken.
        coefficients: ``[T, G, E]`` weights ``psi`` of the scores.
        mask: ``[T, G, E]`` True at real steps; ``n_g`` counts them per run.
    """
    pi = np.exp(log_policy(params, x))
    score = -pi
    np.put_along_axis(score, actions[..., None], np.take_along_axis(score, actions[..., None], -1) + 1.0, -1)
    psi = np.where(mask, coefficients, 0.0)
    n = np.maximum(mask.sum(axis=(0, 2)), 1)
    return np.einsum("tge,tgei,tgeo->gio", psi, x, score) / n[:, None, None]


def stale_policy(history: list[NDArray[np.float64]], lags: NDArray[np.int64]) -> NDArray[np.float64]:
    """``[G, 5, 2]`` the weights each run samples with: ``history[-1 - lag_g][g]``, or the oldest kept.

    Args:
        history: the last ``max_lag + 1`` stacked weights ``[G, 5, 2]``, oldest first, the
            current ones last; before ``max_lag`` updates the first entry is the initial policy.
        lags: ``[G]`` each run's lag ``k``.
    """
    snapshot = np.maximum(len(history) - 1 - np.asarray(lags), 0)
    return np.stack(history)[snapshot, np.arange(len(snapshot))]


@dataclass
class _Adam:
    """Adam ascent on one stacked array (elementwise, so each run keeps its own state)."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    step: int = 0
    m: NDArray[np.float64] | None = None
    v: NDArray[np.float64] | None = None

    def ascend(self, params: NDArray[np.float64], grad: NDArray[np.float64]) -> NDArray[np.float64]:
        if self.m is None or self.v is None:
            self.m, self.v = np.zeros_like(grad), np.zeros_like(grad)
        self.step += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
        m_hat = self.m / (1 - self.beta1**self.step)
        v_hat = self.v / (1 - self.beta2**self.step)
        return params + self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


# ---------------------------------------------------------------------------------------
# Collecting stale episodes and running the grid
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaleBatch:
    """One complete episode from each of the ``G * E`` envs, time-major, padded to the longest.

    ``x [T, G, E, 5]``, ``actions [T, G, E]``, ``rewards``/``dones`` ``[T, G * E]``,
    ``mask [T, G, E]`` (True at real steps), ``logp_behaviour [T, G, E]`` of the taken actions.
    """

    x: NDArray[np.float64]
    actions: NDArray[np.int64]
    rewards: NDArray[np.float64]
    dones: NDArray[np.float64]
    mask: NDArray[np.bool_]
    logp_behaviour: NDArray[np.float64]


def collect(
    envs: gym.vector.VectorEnv, behaviour: NDArray[np.float64], n_envs: int, seed: int, rng: np.random.Generator
) -> StaleBatch:
    """Reset all envs and run each until its episode ends, acting with ``behaviour [G, 5, 2]``."""
    n_runs = behaviour.shape[0]
    obs, _ = envs.reset(seed=seed)
    alive = np.ones(n_runs * n_envs, dtype=bool)
    xs, acts, rews, dones, masks, logps = [], [], [], [], [], []
    while alive.any():
        x = features(obs, n_runs)
        logp = log_policy(behaviour, x)  # [G, E, 2]
        a = (rng.random((n_runs, n_envs)) < np.exp(logp[..., 1])).astype(np.int64)
        obs, reward, terminated, truncated, _ = envs.step(a.reshape(-1))
        ended = np.logical_or(terminated, truncated)
        xs.append(x)
        acts.append(a)
        logps.append(np.take_along_axis(logp, a[..., None], -1)[..., 0])
        rews.append(np.where(alive, reward, 0.0))
        dones.append(np.logical_or(ended, ~alive))
        masks.append(alive.reshape(n_runs, n_envs).copy())
        alive &= ~ended
    return StaleBatch(
        np.stack(xs),
        np.stack(acts),
        np.stack(rews),
        np.stack(dones).astype(np.float64),
        np.stack(masks),
        np.stack(logps),
    )


def _split(batch: StaleBatch, n_runs: int, n_envs: int) -> tuple[StaleBatch, StaleBatch]:
    """A batch of ``2 G`` runs -> the first ``G`` runs' and the last ``G`` runs'."""

    def part(sl: slice, flat: slice) -> StaleBatch:
        return StaleBatch(
            batch.x[:, sl], batch.actions[:, sl], batch.rewards[:, flat], batch.dones[:, flat],
            batch.mask[:, sl], batch.logp_behaviour[:, sl],
        )  # fmt: skip

    first, second = slice(0, n_runs), slice(n_runs, 2 * n_runs)
    return part(first, slice(0, n_runs * n_envs)), part(second, slice(n_runs * n_envs, 2 * n_runs * n_envs))


def _episode_returns(batch: StaleBatch, n_cells: int, n_seeds: int) -> NDArray[np.float64]:
    """``[n_cells, n_seeds]`` mean undiscounted episode return of each run's envs."""
    return batch.rewards.sum(axis=0).reshape(n_cells * n_seeds, -1).mean(axis=1).reshape(n_cells, n_seeds)


def normalized_advantages(batch: StaleBatch, gamma: float) -> NDArray[np.float64]:
    """``[T, G, E]`` reward-to-go (01.3) minus its mean over each run's real steps, over its std (0 at padding)."""
    n_t, n_runs, n_envs = batch.mask.shape
    g = discounted_returns(batch.rewards, batch.dones, gamma).reshape(n_t, n_runs, n_envs)
    m = batch.mask
    n = m.sum(axis=(0, 2))
    mean = (g * m).sum(axis=(0, 2)) / n
    centred = g - mean[None, :, None]
    std = np.sqrt((centred**2 * m).sum(axis=(0, 2)) / n)
    return np.where(m, centred / (std[None, :, None] + 1e-8), 0.0)


def stale_update(
    params: NDArray[np.float64],
    previous: NDArray[np.float64],
    batch: StaleBatch,
    correction: NDArray[np.str_],
    config: StalenessConfig,
    adam: _Adam,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """One update of every run from its stale batch: ``(new params, w, share changed)`` (eq. 02.8).

    Args:
        params: ``[G, 5, 2]`` each run's current weights ``pi_t``; previous: its ``pi_{t-1}``.
        batch: the episodes ``mu`` sampled, with ``log mu`` of each taken action stored then.
        correction: ``[G]`` each run's correction; config: ``c``, ``eps``, ``gamma``.
        adam: the optimizer, one full-batch step per update.
    """
    adv = normalized_advantages(batch, config.gamma)
    logp_now = np.take_along_axis(log_policy(params, batch.x), batch.actions[..., None], -1)[..., 0]
    logp_prev = np.take_along_axis(log_policy(previous, batch.x), batch.actions[..., None], -1)[..., 0]
    w = np.where(batch.mask, np.exp(logp_now - batch.logp_behaviour), 0.0)  # pi_t / mu
    v = np.where(batch.mask, np.exp(logp_prev - batch.logp_behaviour), 1.0)  # pi_{t-1} / mu: decoupled PPO's
    psi, changed = np.zeros_like(adv), np.zeros_like(adv)
    for name in dict.fromkeys(correction.tolist()):  # every run's own (the on-policy cell is 'none' in any grid)
        cols = correction == name
        psi[:, cols] = correction_coefficients(
            name, w[:, cols], adv[:, cols], c=config.c, eps=config.eps, prox_ratios=v[:, cols]
        )
        if name == "truncated":
            changed[:, cols] = w[:, cols] > config.c
        elif name in ("clip", "decoupled"):
            changed[:, cols] = (psi[:, cols] == 0) & (adv[:, cols] != 0)
    grad = linear_policy_gradient(params, batch.x, batch.actions, psi, batch.mask)
    return adam.ascend(params, grad), w, changed


@dataclass(frozen=True)
class StalenessResult:
    """What :func:`run_staleness_grid` logs, per update, cell of the grid and seed.

    Attributes:
        config: the grid.
        runs: the cells ``(lag, correction)``, in the order of axis 1 below.
        returns: ``[n_updates, n_cells, n_seeds]`` mean undiscounted return of ``n_envs`` episodes of the
            learner's current policy ``pi_t`` (before update ``t``).
        sampler_returns: the same for the stale batch the update trained on (``pi_{t-k}``'s episodes).
        ess: ``[n_updates, n_cells, n_seeds]`` ``ESS / n`` of the batch's per-step weights ``w``.
        kl: ``[n_updates, n_cells, n_seeds]`` mean over the batch's states of ``KL(pi_t || mu)`` (nats).
        modified: ``[n_updates, n_cells, n_seeds]`` share of steps whose weight the correction changed
            (truncated: ``w > c``; clip, decoupled: clipped; otherwise 0).
        env_steps: environment steps of the whole grid; seconds: its wall-clock time.
    """

    config: StalenessConfig
    runs: tuple[tuple[int, Correction], ...]
    returns: NDArray[np.float64]
    sampler_returns: NDArray[np.float64]
    ess: NDArray[np.float64]
    kl: NDArray[np.float64]
    modified: NDArray[np.float64]
    env_steps: int
    seconds: float

    def index(self, lag: int, correction: Correction) -> int:
        """Axis-1 position of a cell (any correction at lag 0 is the on-policy run)."""
        key = (0, "none") if lag == 0 else (lag, correction)
        return self.runs.index(key)

    def mean_return(self, last: int | None = None) -> NDArray[np.float64]:
        """``[n_cells, n_seeds]`` mean return over the last ``last`` updates, or over all of them
        (``last=None``: the area under the learning curve divided by its length, i.e. learning speed)."""
        window = self.returns if last is None else self.returns[-last:]
        return window.mean(axis=0)

    def table(self, last: int | None = None) -> dict[tuple[int, Correction], tuple[float, float]]:
        """``{(lag, correction): (mean over seeds, standard error over seeds)}`` of :meth:`mean_return`."""
        scores = self.mean_return(last)
        n = scores.shape[1]
        return {
            cell: (float(scores[i].mean()), float(scores[i].std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0)
            for i, cell in enumerate(self.runs)
        }

    def best(self, lag: int, last: int | None = None) -> Correction:
        """The correction with the highest mean :meth:`mean_return` at ``lag > 0``."""
        table = self.table(last)
        return max(self.config.corrections, key=lambda m: table[lag, m][0])


def run_staleness_grid(config: StalenessConfig, progress: Callable[[int], None] | None = None) -> StalenessResult:
    """Train every ``(lag, correction, seed)`` of the grid together; see the module docstring.

    Seeded: the initial weights (seed ``i`` starts from the same weights in every cell), the
    action sampling and the env resets all derive from ``config.seed``.

    Args:
        config: the grid.
        progress: called after every update with its index (e.g. to advance a
            :func:`course_lib.course.display.progress` bar).
    """
    import gymnasium as gym

    cells = config.runs
    n_cells, n_seeds, n_envs = len(cells), config.n_seeds, config.n_envs
    n_runs = n_cells * n_seeds
    lag = np.repeat([k for k, _ in cells], n_seeds)
    correction = np.repeat([m for _, m in cells], n_seeds)
    rng = np.random.default_rng(config.seed)
    params = np.tile(rng.normal(scale=config.init_scale, size=(n_seeds, N_FEATURES, N_ACTIONS)), (n_cells, 1, 1))
    history = [params.copy()]  # history[-1 - k] = the policy of k updates ago
    max_lag = max(config.lags)
    adam = _Adam(config.lr)
    shape = (config.n_updates, n_cells, n_seeds)
    returns, sampler_returns, ess, kl, modified = (np.zeros(shape) for _ in range(5))
    env_steps = 0
    envs = gym.make_vec(
        "CartPole-v1",
        num_envs=2 * n_runs * n_envs,  # the stale batch's envs, then the learner's evaluation envs
        vectorization_mode="vector_entry_point",
        max_episode_steps=config.max_episode_steps,
    )
    start = time.perf_counter()
    try:
        for update in range(config.n_updates):
            behaviour = stale_policy(history, lag)
            both = collect(
                envs, np.concatenate([behaviour, params]), n_envs, seed=config.seed * 1_000_003 + update, rng=rng
            )
            batch, evaluation = _split(both, n_runs, n_envs)
            env_steps += int(both.mask.sum())
            previous = stale_policy(history, np.ones(n_runs, dtype=np.int64))  # pi_{t-1}
            p_now = np.exp(log_policy(params, batch.x))
            params, w, changed = stale_update(params, previous, batch, correction, config, adam)
            history = (history + [params.copy()])[-(max_lag + 1) :]
            n = batch.mask.sum(axis=(0, 2))
            sampler_returns[update] = _episode_returns(batch, n_cells, n_seeds)
            returns[update] = _episode_returns(evaluation, n_cells, n_seeds)
            ess[update] = (effective_sample_size(np.moveaxis(w, 1, 0).reshape(n_runs, -1)) / n).reshape(
                n_cells, n_seeds
            )
            p_beh = np.exp(log_policy(behaviour, batch.x))
            step_kl = np.where(batch.mask, categorical_kl(p_now, p_beh), 0.0)
            kl[update] = (step_kl.sum(axis=(0, 2)) / n).reshape(n_cells, n_seeds)
            modified[update] = ((changed * batch.mask).sum(axis=(0, 2)) / n).reshape(n_cells, n_seeds)
            if progress is not None:
                progress(update)
    finally:
        envs.close()
    return StalenessResult(
        config, cells, returns, sampler_returns, ess, kl, modified, env_steps, time.perf_counter() - start
    )
