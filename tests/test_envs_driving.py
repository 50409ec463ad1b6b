"""course_lib.envs.driving (lesson 06's JAX driving simulator) against independent references:
the kinematic bicycle model against a naive float64 Euler loop, the box test against
shapely's polygons, every step against the numpy gymnasium env (driving_numpy) from the
same scenario with the same actions; then the env interface, auto-reset, jit/vmap,
the episode metrics, the reference policies' accuracy, the picture and the benchmark.

Compiles are the slow part on 2 CPU cores, so the jitted functions are built once here
and shared by the tests."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
import shapely.geometry
from gymnasium.utils.env_checker import check_env

from course_lib.envs import driving
from course_lib.envs.driving_numpy import DrivingNumpyEnv, ego_overlaps
from course_lib.envs.interface import ContinuousJaxEnv, JaxEnv

matplotlib.use("Agg")

pytestmark = pytest.mark.timeout(300)

P = driving.DEFAULT_PARAMS
#: mypy checks that the module follows the continuous-action protocol, member by member.
_DRIVING: ContinuousJaxEnv[driving.EnvState, driving.EnvParams] = driving
B = 8  # the batch of the vmapped tests

RESET = jax.jit(driving.reset)
STEP_ENV = jax.jit(driving.step_env)
VSTEP = jax.jit(jax.vmap(driving.step, in_axes=(0, 0, 0, None)))
VRESET = jax.jit(jax.vmap(driving.reset, in_axes=(0, None)))
HEURISTIC = jax.jit(driving.heuristic_policy)


def _take(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def _assert_trees_close(a, b, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=1e-6, atol=atol)


# --- the equations against independent references ---------------------------------------


def _naive_bicycle(x, y, psi, v, a, delta, p):
    """Eq. 06.1 written out with math, one scalar at a time, in float64."""
    import math

    beta = math.atan(p.l_r / (p.l_f + p.l_r) * math.tan(delta))
    return (
        x + v * math.cos(psi + beta) * p.dt,
        y + v * math.sin(psi + beta) * p.dt,
        psi + (v / p.l_r) * math.sin(beta) * p.dt,
        min(max(v + a * p.dt, 0.0), p.v_max),
    )


def test_bicycle_step_is_equation_06_1():
    """Elementwise against the naive loop, with speeds crossing both clip bounds, then a
    300-step trajectory in float64 that must not drift from the naive integration."""
    rng = np.random.default_rng(0)
    n = 400
    x, y = rng.uniform(-50, 50, (2, n))
    psi = rng.uniform(-np.pi, np.pi, n)
    v = np.concatenate([rng.uniform(0, P.v_max, n - 4), [0.0, 0.05, P.v_max, P.v_max - 0.05]])
    a = np.concatenate([rng.uniform(-P.max_accel, P.max_accel, n - 4), [-P.max_accel, -P.max_accel, 2.0, 2.0]])
    delta = rng.uniform(-P.max_steer, P.max_steer, n)
    got = jax.jit(driving.bicycle_step)(*(jnp.asarray(z, jnp.float32) for z in (x, y, psi, v, a, delta)), P)
    want = np.array([_naive_bicycle(*args, P) for args in zip(x, y, psi, v, a, delta)]).T
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-6, atol=2e-5)
    assert float(got[3][-4]) == 0.0 and float(got[3][-2]) == P.v_max  # both clips were crossed

    with jax.enable_x64(True):
        state = ref = (0.0, 0.0, 0.3, 5.0)
        for t in range(300):
            accel, steer = 2.0 * np.sin(t / 20), P.max_steer * np.cos(t / 15)
            state = driving.bicycle_step(*(jnp.float64(s) for s in state), jnp.float64(accel), jnp.float64(steer), P)
            ref = _naive_bicycle(*ref, accel, steer, P)
        np.testing.assert_allclose(np.array([float(s) for s in state]), np.array(ref), rtol=1e-12, atol=1e-9)


def _polygon(box):
    """The box as a shapely polygon, its corners written out independently of the library."""
    cx, cy, heading, length, width = box
    c, s = np.cos(heading), np.sin(heading)
    corners = [
        (cx + a * length / 2 * c - b * width / 2 * s, cy + a * length / 2 * s + b * width / 2 * c)
        for a, b in ((1, 1), (-1, 1), (-1, -1), (1, -1))
    ]
    return shapely.geometry.Polygon(corners)


def _box_pairs(rng, n_random, n_touching, margin=1e-3):
    """Random box pairs, plus pairs moved along a random direction to just inside or just
    outside the distance where shapely says they start to touch (bisection)."""

    def random_box(centre_scale):
        return np.array(
            [
                *rng.uniform(-centre_scale, centre_scale, 2),
                rng.uniform(-np.pi, np.pi),
                rng.uniform(3.5, 5.5),
                rng.uniform(1.6, 2.2),
            ]
        )

    pairs = [(random_box(1.0), random_box(6.0)) for _ in range(n_random)]
    for k in range(n_touching):
        a, b = random_box(1.0), random_box(0.0)
        direction = rng.normal(size=2)
        direction /= np.linalg.norm(direction)
        lo, hi = 0.0, 20.0  # overlapping at lo, apart at hi
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            b_mid = b.copy()
            b_mid[:2] = a[:2] + mid * direction
            lo, hi = (mid, hi) if _polygon(a).intersects(_polygon(b_mid)) else (lo, mid)
        b[:2] = a[:2] + (hi * (1 + margin) if k % 2 else lo * (1 - margin)) * direction
        pairs.append((a, b))
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def test_boxes_overlap_agrees_with_shapely_including_near_touching_pairs():
    box_a, box_b = _box_pairs(np.random.default_rng(1), n_random=300, n_touching=200)
    truth = np.array([_polygon(a).intersects(_polygon(b)) for a, b in zip(box_a, box_b, strict=True)])
    assert 0.2 < truth.mean() < 0.8  # both answers are well represented
    got = np.asarray(jax.jit(driving.boxes_overlap)(jnp.asarray(box_a, jnp.float32), jnp.asarray(box_b, jnp.float32)))
    np.testing.assert_array_equal(got, truth)
    assert bool(driving.boxes_overlap(jnp.asarray(box_a[0]), jnp.asarray(box_a[:3])).shape == (3,))  # broadcasts

    # the numpy env's version, written in the ego's frame, answers the same
    c, s = np.cos(box_a[:, 2]), np.sin(box_a[:, 2])
    dx, dy = box_b[:, 0] - box_a[:, 0], box_b[:, 1] - box_a[:, 1]
    rel = box_b[:, 2] - box_a[:, 2]
    for i in range(len(box_a)):
        overlap = ego_overlaps(
            np.array([c[i] * dx[i] + s[i] * dy[i]]), np.array([-s[i] * dx[i] + c[i] * dy[i]]),
            np.cos(rel[i : i + 1]), np.sin(rel[i : i + 1]), box_b[i : i + 1, 3:5].T, (box_a[i, 3], box_a[i, 4]),
        )  # fmt: skip
        assert bool(overlap[0]) == truth[i]


def test_idm_acceleration_fixed_values():
    """Treiber's IDM at points whose answer is known: free road at the desired speed,
    standing start, an equilibrium gap, and a hard-braking cap."""
    a = P.idm_accel
    free = driving.idm_acceleration(jnp.float32(10.0), jnp.float32(10.0), jnp.inf, jnp.float32(0.0), P)
    assert abs(float(free)) < 1e-6
    start = driving.idm_acceleration(jnp.float32(0.0), jnp.float32(10.0), jnp.inf, jnp.float32(0.0), P)
    np.testing.assert_allclose(float(start), a, rtol=1e-6)
    v = 5.0  # gap = s* at dv = 0: a (1 - (v/v0)^4 - 1)
    s_star = P.idm_min_gap + v * P.idm_time_headway
    eq = driving.idm_acceleration(jnp.float32(v), jnp.float32(10.0), jnp.float32(s_star), jnp.float32(0.0), P)
    np.testing.assert_allclose(float(eq), -a * (v / 10.0) ** 4, rtol=1e-5)
    crash = driving.idm_acceleration(jnp.float32(10.0), jnp.float32(10.0), jnp.float32(0.5), jnp.float32(10.0), P)
    assert float(crash) == -P.idm_max_brake


def test_road_is_made_of_equal_chords_with_bounded_curvature():
    _, states = VRESET(jax.random.split(jax.random.key(3), B), P)
    chords = np.diff(np.asarray(states.road_xy), axis=1)
    np.testing.assert_allclose(np.linalg.norm(chords, axis=-1), P.road_spacing, rtol=1e-4)
    heading_change = np.diff(np.asarray(states.road_psi), axis=1) / P.road_spacing
    assert np.abs(heading_change).max() <= P.curvature_scale * (1 + 1e-5)
    chord_heading = np.arctan2(chords[..., 1], chords[..., 0])
    midpoint = 0.5 * (np.asarray(states.road_psi)[:, 1:] + np.asarray(states.road_psi)[:, :-1])
    np.testing.assert_allclose(chord_heading, midpoint, atol=1e-5)


def test_windowed_projection_equals_the_full_search_near_the_road():
    """Points up to 6 m off the centreline, each with four companions like the ego's corners."""
    _, states = VRESET(jax.random.split(jax.random.key(4), B), P)
    rng = np.random.default_rng(4)
    s = jnp.asarray(rng.uniform(5, P.road_spacing * (P.n_road_points - 3), (B, 20)))
    d = jnp.asarray(rng.uniform(-6, 6, (B, 20)))
    around = jnp.asarray([[0, 0], [2.3, 1], [-2.3, 1], [-2.3, -1], [2.3, -1.0]])

    def both(s, d, road_xy, road_psi):
        x, y, _ = driving.road_pose(s, d, road_xy, road_psi, P.road_spacing)
        points = jnp.stack([x, y], -1)[:, None, :] + around  # [20, 5, 2]
        project = lambda w: jax.vmap(lambda p: driving.project_to_road(p, road_xy, P.road_spacing, window=w))(points)  # noqa: E731
        return project(driving.PROJECTION_WINDOW), project(None)

    window, full = jax.jit(jax.vmap(both))(s, d, states.road_xy, states.road_psi)
    _assert_trees_close(window, full, atol=1e-4)


def test_offroad_is_judged_by_the_corners():
    """The centre on the road and one corner past the edge is off-road; just inside is not."""

    @jax.jit
    def place(state, offset):
        x, y, psi = driving.road_pose(jnp.float32(60.0), offset, state.road_xy, state.road_psi, P.road_spacing)
        placed = dataclasses.replace(state, x=x, y=y, psi=psi)
        _, d, corner_d = driving.ego_road_coords(placed, P)
        return d, driving.is_offroad(corner_d, placed, P)

    _, state = RESET(jax.random.key(5), P)
    hw = float(driving.half_width(state, P))
    for sign in (1.0, -1.0):
        for margin, expected in [(-0.2, False), (0.2, True)]:
            d, offroad = place(state, jnp.float32(sign * (hw - 0.5 * P.ego_width + margin)))
            assert abs(float(d)) < hw and bool(offroad) == expected


# --- the JAX env against the numpy gymnasium env ------------------------------------------


def _drive_both(key, policy, rng, max_steps=P.max_steps):
    """One episode stepped by both envs from the JAX scenario; returns how it ended."""
    obs, state = RESET(key, P)
    env = DrivingNumpyEnv(P)
    n_obs, _ = env.reset(options={"uniforms": np.asarray(jax.random.uniform(key, (driving.n_uniforms(P),)))})
    np.testing.assert_allclose(n_obs, np.asarray(obs), atol=2e-5)  # the same scenario from the same numbers
    n_obs, _ = env.reset(options={"state": state})
    np.testing.assert_allclose(n_obs, np.asarray(obs), atol=2e-5)
    for _ in range(max_steps):
        action = np.asarray(HEURISTIC(obs, P)) if policy != "random" else rng.uniform([-0.2, -0.3], [1.0, 0.3])
        if policy == "reckless":  # lane keeping at full throttle: it runs into the vehicle ahead
            action = np.array([1.0, action[1]])
        obs, state, reward, terminated, truncated = STEP_ENV(None, state, jnp.asarray(action, jnp.float32), P)
        n_obs, n_reward, n_terminated, n_truncated, info = env.step(action)
        np.testing.assert_allclose(n_obs, np.asarray(obs), atol=5e-4)
        np.testing.assert_allclose(n_reward, float(reward), atol=5e-4)
        assert (n_terminated, n_truncated) == (bool(terminated), bool(truncated))
        assert (info["collision"], info["offroad"]) == (bool(state.collision), bool(state.offroad))
        np.testing.assert_allclose(info["progress_ratio"], float(state.progress), atol=1e-5)
        if n_terminated or n_truncated:
            return driving.outcome_name(info)
    raise AssertionError("the episode did not end")


def test_jax_env_matches_the_numpy_env_step_for_step():
    """Heuristic, reckless and random drivers over several scenarios, free-running (float32
    JAX, float64 numpy): observations, rewards, flags and metrics agree at every step,
    and the episodes end in every way an episode can."""
    rng = np.random.default_rng(6)
    outcomes = [
        _drive_both(jax.random.key(100 + i), policy, rng)
        for i, policy in enumerate(["heuristic"] * 3 + ["reckless"] * 3 + ["random"] * 3)
    ]
    assert {"collision", "offroad"} <= set(outcomes) and {"goal", "time limit"} & set(outcomes)


@pytest.mark.filterwarnings("ignore:.*Box observation space (minimum|maximum) value is:UserWarning")
def test_numpy_env_is_a_gymnasium_env():
    env = DrivingNumpyEnv(P)
    assert isinstance(env, gym.Env)
    assert env.observation_space.shape == (driving.OBS_DIM,) and env.action_space.shape == (driving.ACTION_DIM,)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    again, _ = DrivingNumpyEnv(P).reset(seed=3)
    np.testing.assert_array_equal(obs, again)
    envs = gym.vector.SyncVectorEnv([lambda: DrivingNumpyEnv(P) for _ in range(3)])
    obs, _ = envs.reset(seed=0)
    for _ in range(60):
        obs, *_ = envs.step(envs.action_space.sample())
    assert obs.shape == (3, driving.OBS_DIM) and np.isfinite(obs).all()


# --- the env interface, auto-reset, jit and vmap -----------------------------------------


def test_env_follows_the_continuous_interface():
    """Members, frozen pytrees, shapes and dtypes of one env (abstractly) and of a vmapped batch."""
    assert isinstance(driving, ContinuousJaxEnv) and not isinstance(driving, JaxEnv)
    for tree, what in ((P, "EnvParams"), (RESET(jax.random.key(0), P)[1], "EnvState")):
        assert dataclasses.is_dataclass(tree) and type(tree).__dataclass_params__.frozen, what
        assert jax.tree.leaves(tree)[0] is not tree, f"{what} is not a pytree"
    obs, state = jax.eval_shape(driving.reset, jax.random.key(0), P)
    assert (obs.shape, obs.dtype) == ((driving.OBS_DIM,), jnp.float32)
    action = jnp.zeros(driving.ACTION_DIM)
    out = jax.eval_shape(driving.step_env, None, state, action, P)
    assert jax.tree.structure(out[1]) == jax.tree.structure(state)
    assert [(x.shape, x.dtype) for x in out[2:]] == [((), jnp.float32), ((), jnp.bool_), ((), jnp.bool_)]
    out = jax.eval_shape(driving.step, jax.random.key(0), state, action, P)
    assert set(out[5]) == {"final_obs", "collision", "offroad", "progress_ratio", "goal"}
    assert out[5]["progress_ratio"].dtype == jnp.float32 and out[5]["goal"].dtype == jnp.bool_
    keys = jax.random.split(jax.random.key(1), B)
    obs, states = VRESET(keys, P)
    obs, _, reward, terminated, _, info = VSTEP(keys, states, jnp.zeros((B, 2)), P)
    assert obs.shape == info["final_obs"].shape == (B, driving.OBS_DIM) and reward.shape == terminated.shape == (B,)
    assert len(driving.OBS_NAMES) == driving.OBS_DIM == 64


def test_reset_is_a_function_of_the_key():
    obs_a, state_a = RESET(jax.random.key(7), P)
    obs_b, state_b = RESET(jax.random.key(7), P)
    _assert_trees_close((obs_a, state_a), (obs_b, state_b), atol=0)
    obs_c, _ = RESET(jax.random.key(8), P)
    assert not np.allclose(np.asarray(obs_a), np.asarray(obs_c))
    assert int(state_a.time) == 0 and float(state_a.progress) < 1e-3
    assert not bool(driving.is_collision(state_a, P))  # scenarios start collision-free


def test_jit_and_no_jit_agree():
    """The dynamics and the collision test, run op by op and compiled. (The whole step op by
    op costs ~10 s of per-primitive compiles on 2 cores; the numpy env checks it instead.)"""
    _, state = RESET(jax.random.key(9), P)
    pieces = {
        "bicycle": lambda s: driving.bicycle_step(s.x, s.y, s.psi, s.v, jnp.float32(1.5), jnp.float32(-0.2), P),
        "idm": lambda s: driving.idm_step(s, P),
        "collision": lambda s: driving.agent_boxes(s, P),
    }
    for name, piece in pieces.items():
        with jax.disable_jit():
            eager = piece(state)
        _assert_trees_close(eager, jax.jit(piece)(state), atol=1e-5)
        assert name


def _random_rollout(n_steps, seed=0):
    """``n_steps`` vmapped ``step`` calls with random actions; yields every call's inputs and outputs."""
    keys = jax.random.split(jax.random.key(seed), B)
    _, state = VRESET(keys, P)
    for t in range(n_steps):
        keys = jax.random.split(jax.random.key(1000 * seed + t), B)
        actions = jax.random.uniform(jax.random.key(50_000 + t), (B, 2), minval=-1, maxval=1) * jnp.array([1.0, 0.5])
        out = VSTEP(keys, state, actions, P)
        yield keys, state, actions, out
        state = out[1]


def test_step_is_step_env_then_a_reset_with_metrics_of_the_stepped_state():
    """Over a random rollout crossing many episode ends: where an episode ended the new
    observation is a fresh episode's, drawn with the reset half of the split key
    (``step`` is :func:`step_with_auto_reset` of ``reset`` and ``step_env``); elsewhere it
    is the stepped one; ``final_obs`` and the metrics are those of the stepped (pre-reset)
    state; observations stay finite and O(1)."""
    vstep_env = jax.jit(jax.vmap(driving.step_env, in_axes=(None, 0, 0, None)))
    ended = 0
    for keys, state, actions, out in _random_rollout(40):
        obs, new_state, _, terminated, truncated, info = out
        done = np.asarray(terminated | truncated)
        stepped_obs, stepped, *_ = vstep_env(None, state, actions, P)
        np.testing.assert_allclose(np.asarray(info["final_obs"]), np.asarray(stepped_obs), atol=1e-6)
        for name, value in driving.episode_metrics(stepped, P).items():
            np.testing.assert_array_equal(np.asarray(info[name]), np.asarray(value))
        fresh_obs, _ = VRESET(jax.vmap(lambda k: jax.random.split(k)[1])(keys), P)
        np.testing.assert_allclose(np.asarray(obs)[done], np.asarray(fresh_obs)[done], atol=1e-6)
        np.testing.assert_allclose(np.asarray(obs)[~done], np.asarray(stepped_obs)[~done], atol=1e-6)
        assert (np.asarray(new_state.time)[done] == 0).all()
        assert np.isfinite(np.asarray(obs)).all() and np.abs(np.asarray(obs)).max() < 10.0
        ended += int(done.sum())
    assert ended >= 5


def test_vmap_equals_a_loop_of_single_steps():
    _, state, actions, (obs, _, reward, terminated, truncated, info) = next(iter(_random_rollout(1, seed=3)))
    for i in range(B):
        single_obs, _, single_reward, single_terminated, single_truncated = STEP_ENV(
            None, _take(state, i), actions[i], P
        )
        _assert_trees_close(info["final_obs"][i], single_obs, atol=1e-5)
        _assert_trees_close(reward[i], single_reward, atol=1e-5)
        assert (bool(terminated[i]), bool(truncated[i])) == (bool(single_terminated), bool(single_truncated))
        if not bool(single_terminated | single_truncated):
            _assert_trees_close(obs[i], single_obs, atol=1e-5)


def test_clipped_actions():
    _, state = RESET(jax.random.key(11), P)
    big = STEP_ENV(None, state, jnp.array([5.0, -9.0]), P)
    unit = STEP_ENV(None, state, jnp.array([1.0, -1.0]), P)
    _assert_trees_close(big, unit, atol=0)


# --- episode metrics and the reference policies -------------------------------------------


def test_episode_success_truth_table():
    """Accuracy in V-Max's sense: no collision, no off-road, and enough progress (a stalled ego fails)."""
    p = P.min_progress
    cases = [
        ((False, False, 1.0), True),
        ((False, False, p), True),
        ((False, False, p - 0.01), False),  # stalled or too slow
        ((True, False, 1.0), False),
        ((False, True, 1.0), False),
        ((True, True, 0.0), False),
    ]
    for (collision, offroad, progress), expected in cases:
        got = driving.episode_success(jnp.array(collision), jnp.array(offroad), jnp.float32(progress), P)
        assert bool(got) == expected, (collision, offroad, progress)


def test_random_policy_fails_and_the_heuristic_succeeds():
    """256 episodes each (one program: the two policies vmapped): uniform random actions
    rarely succeed, the hand-written lane keeper with IDM braking nearly always does."""

    def evaluate(use_random):
        def policy(key, obs):
            return jnp.where(use_random, driving.random_policy(key, obs), driving.heuristic_policy(obs, P))

        return driving.evaluate_policy(policy, jax.random.key(12), 256, P)

    stats = jax.jit(jax.vmap(evaluate))(jnp.array([True, False]))
    rate = {k: np.asarray(v).mean(-1) for k, v in stats.items()}
    random, heuristic = ({k: float(v[i]) for k, v in rate.items()} for i in (0, 1))
    assert random["success"] < 0.3 and random["collision"] + random["offroad"] > 0.7
    assert heuristic["success"] > 0.8 and heuristic["collision"] < 0.05 and heuristic["offroad"] < 0.05
    assert heuristic["progress_ratio"] > 0.7


# --- the picture and the benchmark --------------------------------------------------------


def test_draw_scenario_makes_a_labelled_top_down_figure():
    import matplotlib.pyplot as plt

    from course_lib.envs.driving_render import draw_scenario

    _, state = RESET(jax.random.key(13), P)
    path = np.stack([np.linspace(float(state.x), float(state.x) + 30, 20), np.full(20, float(state.y))], -1)
    fig, ax = plt.subplots()
    draw_scenario(ax, state, P, [path, path + 1.0], title="a scenario", outcomes=["collision", "offroad"])
    assert ax.get_xlabel() == "x (m)" and ax.get_ylabel() == "y (m)" and ax.get_title() == "a scenario"
    assert len(ax.patches) == P.n_agents + 2 and ax.get_aspect() == 1.0  # agents, ego, tarmac
    labels = ax.get_legend_handles_labels()[1]
    assert {"ego", "route target", "collision", "offroad"} <= set(labels)
    plt.close(fig)


def test_numpy_throughput_is_measured():
    from course_lib.envs.driving_bench import measure_numpy_throughput

    rates = measure_numpy_throughput([1, 2], steps=10, repeats=1)
    assert set(rates) == {1, 2} and all(r > 0 for r in rates.values())
