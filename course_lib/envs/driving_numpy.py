r"""Lesson 06's driving simulator as a classic CPU environment: numpy, one env per object.

The same simulator as :mod:`course_lib.envs.driving` (same scenario from the same U(0, 1)
numbers, same equations: the kinematic bicycle model of Kong et al. 2015, eq. 06.1;
Treiber et al.'s 2000 IDM for the other vehicles; oriented-box collisions by the
separating-axis theorem; off-road by nearest-chord projection; the same reward and
observation), written the way a careful numpy author writes a ``gymnasium.Env``: the
state lives in the object, ``step`` mutates it, scalars use :mod:`math`, the per-agent
work is vectorised over the agents of the one env, and nothing calls JAX.

It is the baseline of lesson 06's throughput benchmark (``gymnasium.vector.SyncVectorEnv``
of these against ``jit(scan(vmap(step)))``, :mod:`course_lib.envs.driving_bench`) and the
oracle the JAX env is tested against step for step (``tests/test_envs_driving.py``):
``reset(options={"state": jax_state})`` loads a JAX scenario, ``reset(options={"uniforms": u})``
builds one from the same numbers as :func:`course_lib.envs.driving.scenario_from_uniforms`.
It computes in float64; the JAX env in float32.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from course_lib.envs.driving import (
    ACTION_DIM,
    AGENT_LENGTH,
    AGENT_WIDTH,
    AGENTS_AT,
    DEFAULT_PARAMS,
    MAX_LANES,
    N_OBS_AGENTS,
    N_OBS_ROAD,
    OBS_DIM,
    OBS_ROAD_SPACING,
    POS_SCALE,
    PROJECTION_WINDOW,
    ROAD_AT,
    SLOT_JITTER,
    SLOT_OFFSETS,
    TARGET_AT,
    VEL_SCALE,
    EnvParams,
    knot_weights,
    n_knots,
    n_uniforms,
)

#: State fields copied from a JAX ``EnvState`` by ``reset(options={"state": ...})``.
STATE_FIELDS = (
    "x", "y", "psi", "v", "s", "d", "prev_action", "progress", "agent_s", "agent_d", "agent_v", "agent_v0",
    "agent_length", "agent_width", "road_xy", "road_psi", "n_lanes", "route_d", "route_s0", "target", "time",
)  # fmt: skip


def road_pose(
    s: np.ndarray, d: np.ndarray, road_xy: np.ndarray, road_psi: np.ndarray, spacing: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, heading)`` of the road points at arc lengths ``s [Q]`` and offsets ``d [Q]``
    (:func:`course_lib.envs.driving.road_pose`)."""
    i = np.minimum(np.maximum(np.floor(s / spacing).astype(np.intp), 0), road_xy.shape[0] - 2)
    f = s / spacing - i
    heading = road_psi[i] + np.minimum(np.maximum(f, 0.0), 1.0) * (road_psi[i + 1] - road_psi[i])
    xy = road_xy[i] + f[:, None] * (road_xy[i + 1] - road_xy[i])
    return xy[:, 0] - d * np.sin(heading), xy[:, 1] + d * np.cos(heading), heading


def project_to_road(
    px: np.ndarray, py: np.ndarray, road_xy: np.ndarray, spacing: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(s [M], d [M])`` of the points ``(px, py) [M]``: nearest chord among the
    ``PROJECTION_WINDOW`` chords around the vertex nearest the first point
    (:func:`course_lib.envs.driving.project_to_road`)."""
    vx, vy = road_xy[:, 0], road_xy[:, 1]
    nearest_vertex = int(np.argmin((vx - px[0]) ** 2 + (vy - py[0]) ** 2))
    start = min(max(nearest_vertex - PROJECTION_WINDOW // 2, 0), road_xy.shape[0] - 1 - PROJECTION_WINDOW)
    ax, ay = vx[start : start + PROJECTION_WINDOW], vy[start : start + PROJECTION_WINDOW]
    abx, aby = vx[start + 1 : start + PROJECTION_WINDOW + 1] - ax, vy[start + 1 : start + PROJECTION_WINDOW + 1] - ay
    apx, apy = px[:, None] - ax, py[:, None] - ay  # [M, W]
    t = np.minimum(np.maximum((apx * abx + apy * aby) / (abx * abx + aby * aby), 0.0), 1.0)
    ex, ey = apx - t * abx, apy - t * aby
    dist2 = ex * ex + ey * ey
    rows, j = np.arange(px.shape[0]), np.argmin(dist2, 1)
    cross = abx[j] * apy[rows, j] - aby[j] * apx[rows, j]
    return (start + j + t[rows, j]) * spacing, np.sign(cross) * np.sqrt(dist2[rows, j])


def ego_overlaps(
    rx: np.ndarray,
    ry: np.ndarray,
    cos_rel: np.ndarray,
    sin_rel: np.ndarray,
    sizes: np.ndarray,
    ego_size: tuple[float, float],
) -> np.ndarray:
    """``[A]`` whether the ego's box overlaps each agent's: the separating-axis test of
    :func:`course_lib.envs.driving.boxes_overlap`, written in the ego's frame.

    Args:
        rx, ry: ``[A]`` agent centres in the ego's frame; cos_rel, sin_rel: ``[A]`` of the
            agents' heading minus the ego's; sizes: ``[2, A]`` lengths and widths; ego_size:
            the ego's (length, width).
    """
    hl, hw = 0.5 * sizes[0], 0.5 * sizes[1]
    el, ew = 0.5 * ego_size[0], 0.5 * ego_size[1]
    ac, as_ = np.abs(cos_rel), np.abs(sin_rel)
    separated = (
        (np.abs(rx) > el + hl * ac + hw * as_)  # the ego's long axis
        | (np.abs(ry) > ew + hl * as_ + hw * ac)  # the ego's lateral axis
        | (np.abs(rx * cos_rel + ry * sin_rel) > hl + el * ac + ew * as_)  # the agent's long axis
        | (np.abs(ry * cos_rel - rx * sin_rel) > hw + el * as_ + ew * ac)  # the agent's lateral axis
    )
    return ~separated


def lane_center(d: float, n_lanes: int, lane_width: float) -> float:
    """Offset (m) of the lane centre nearest to ``d`` (:func:`course_lib.envs.driving.lane_center`)."""
    half = (n_lanes - 1) / 2.0
    return (min(max(round(d / lane_width + half), 0), n_lanes - 1) - half) * lane_width  # round: half to even, as numpy


def make_road(knots: np.ndarray, params: EnvParams) -> tuple[np.ndarray, np.ndarray]:
    """``(road_xy [N, 2], road_psi [N])`` from ``knots [n_knots]`` U(0, 1) numbers
    (:func:`course_lib.envs.driving.make_road`; numpy's ``cumsum`` is the running sum here)."""
    ds = params.road_spacing
    kappa = knot_weights(params.n_road_points) @ (params.curvature_scale * (2.0 * knots - 1.0))
    psi = np.concatenate([[0.0], np.cumsum(kappa * ds)])
    chord = 0.5 * (psi[1:] + psi[:-1])
    xy = np.cumsum(ds * np.stack([np.cos(chord), np.sin(chord)], -1), 0)
    return np.concatenate([np.zeros((1, 2)), xy]), psi


class DrivingNumpyEnv(gym.Env[np.ndarray, np.ndarray]):
    """The driving simulator as a ``gymnasium.Env``: ``Box(-inf, inf, (OBS_DIM,))``
    float32 observations, ``Box(-1, 1, (2,))`` actions (acceleration, steering).

    ``reset(seed=..., options=None)`` draws a scenario with ``self.np_random``;
    ``options={"uniforms": u}`` builds it from ``u [n_uniforms(params)]`` and
    ``options={"state": s}`` loads a single (unbatched) JAX ``EnvState``. ``step``'s
    ``info`` holds ``collision``, ``offroad``, ``goal`` and ``progress_ratio``, as the JAX ``step``'s.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's class attribute)

    def __init__(self, params: EnvParams = DEFAULT_PARAMS) -> None:
        self.params = params
        self.observation_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self._ahead = OBS_ROAD_SPACING * np.arange(1, N_OBS_ROAD + 1)
        self._slot_lanes = np.repeat(np.arange(MAX_LANES), len(SLOT_OFFSETS))
        self._slot_offsets = np.tile(np.array(SLOT_OFFSETS), MAX_LANES)
        signs = np.array([[0.0, 1.0, -1.0, -1.0, 1.0], [0.0, 1.0, 1.0, -1.0, -1.0]])  # centre, then corners
        self._corner_signs = signs
        self._build(np.full(n_uniforms(params), 0.5))

    # --- episode start ---------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """A new scenario: drawn with ``self.np_random``, or from ``options["uniforms"]``, or
        loaded from ``options["state"]`` (a JAX ``EnvState``). Returns ``(obs [OBS_DIM], info)``."""
        super().reset(seed=seed)
        options = options or {}
        if "state" in options:
            self._load(options["state"])
        else:
            uniforms = options.get("uniforms")
            self._build(self.np_random.random(n_uniforms(self.params)) if uniforms is None else np.asarray(uniforms))
        return self._obs(), self._info()

    def _build(self, u: np.ndarray) -> None:
        """The scenario of :func:`course_lib.envs.driving.scenario_from_uniforms` from ``u``."""
        p, k, a = self.params, n_knots(self.params.n_road_points), self.params.n_agents
        u = np.asarray(u, np.float64)
        self.road_xy, self.road_psi = make_road(u[:k], p)
        u = u[k:]
        self.n_lanes = 3 if u[0] < p.three_lane_prob else 2
        ego_lane = min(math.floor(u[1] * self.n_lanes), self.n_lanes - 1)
        n_slots = MAX_LANES * len(SLOT_OFFSETS)
        valid = (self._slot_lanes < self.n_lanes) & ~((self._slot_lanes == ego_lane) & (self._slot_offsets == 0.0))
        chosen = np.argsort(u[3 : 3 + n_slots] + np.where(valid, 0.0, 2.0), kind="stable")[:a]
        speed, jitter, length, width = u[3 + n_slots :].reshape(4, a)
        half = (self.n_lanes - 1) / 2.0
        self.agent_s = p.ego_start_s + self._slot_offsets[chosen] + SLOT_JITTER * (2.0 * jitter - 1.0)
        self.agent_d = (self._slot_lanes[chosen] - half) * p.lane_width
        self.agent_v = p.agent_speed_min + speed * (p.agent_speed_max - p.agent_speed_min)
        self.agent_v0 = self.agent_v.copy()
        self.agent_length = AGENT_LENGTH[0] + length * (AGENT_LENGTH[1] - AGENT_LENGTH[0])
        self.agent_width = AGENT_WIDTH[0] + width * (AGENT_WIDTH[1] - AGENT_WIDTH[0])
        self._sizes_changed()
        self.route_d = (ego_lane - half) * p.lane_width
        self.route_s0 = p.ego_start_s
        s_route = np.array([p.ego_start_s, p.ego_start_s + p.route_length])
        x, y, psi = road_pose(s_route, np.full(2, self.route_d), self.road_xy, self.road_psi, p.road_spacing)
        self.x, self.y, self.psi, self.target = float(x[0]), float(y[0]), float(psi[0]), np.array([x[1], y[1]])
        self.v = p.ego_speed_min + float(u[2]) * (p.ego_speed_max - p.ego_speed_min)
        self.prev_action, self.time = np.zeros(ACTION_DIM), 0
        s, d = project_to_road(np.array([self.x]), np.array([self.y]), self.road_xy, p.road_spacing)
        self.s, self.d = float(s[0]), float(d[0])
        self.progress = min(max((self.s - self.route_s0) / p.route_length, 0.0), 1.0)
        self.collision = self.offroad = False

    def _load(self, state: Any) -> None:
        """Copy a single JAX ``EnvState`` (every field in :data:`STATE_FIELDS`) into this env."""
        for name in STATE_FIELDS:
            value = np.asarray(getattr(state, name), np.float64)
            setattr(self, name, value.copy() if value.ndim else float(value))
        self.n_lanes, self.time = int(self.n_lanes), int(self.time)
        self._sizes_changed()
        self.collision, self.offroad = bool(state.collision), bool(state.offroad)

    def _sizes_changed(self) -> None:
        """Cache the vehicles' sizes (constant in an episode): ``[A + 1]`` with the ego last, ``[2, A]``."""
        p = self.params
        self._len_all = np.append(self.agent_length, p.ego_length)
        self._wid_all = np.append(self.agent_width, p.ego_width)
        self._sizes = np.stack([self.agent_length, self.agent_width])

    # --- one step --------------------------------------------------------------------

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One transition, as :func:`course_lib.envs.driving.step_env`: the agents by IDM and the
        ego by eq. 06.1 from the same state, then projection, collision, off-road, reward.
        Returns ``(obs, reward, terminated, truncated, info)``."""
        p = self.params
        accel, steer = (min(max(float(a), -1.0), 1.0) for a in action)
        self.agent_s, self.agent_v = self._idm_step()
        self._bicycle_step(accel * p.max_accel, steer * p.max_steer)
        self.prev_action, self.time = np.array([accel, steer]), self.time + 1
        px, py = self._ego_points()
        s, d = project_to_road(px, py, self.road_xy, p.road_spacing)
        self.s, self.d = float(s[0]), float(d[0])
        progress = min(max((self.s - self.route_s0) / p.route_length, 0.0), 1.0)
        frame = self._frame()
        a = self.agent_s.shape[0]
        overlaps = ego_overlaps(
            frame[0][:a], frame[1][:a], frame[3][:a], frame[4][:a], self._sizes, (p.ego_length, p.ego_width)
        )
        self.collision = bool(overlaps.any())
        self.offroad = bool(np.abs(d[1:]).max() > self.n_lanes * p.lane_width / 2.0)
        lane_offset = self.d - lane_center(self.d, self.n_lanes, p.lane_width)
        reward = (
            (progress - self.progress) * p.route_length / (p.v_max * p.dt)
            - p.lane_center_weight * (lane_offset / (0.5 * p.lane_width)) ** 2
            - p.collision_penalty * self.collision
            - p.offroad_penalty * self.offroad
        )
        self.progress = progress
        terminated = self.collision or self.offroad or progress >= 1.0
        truncated = self.time >= p.max_steps
        return self._obs(frame), float(reward), terminated, truncated, self._info()

    def _bicycle_step(self, accel: float, steer: float) -> None:
        """Eq. 06.1 (:func:`course_lib.envs.driving.bicycle_step`) on the ego, in place."""
        p = self.params
        beta = math.atan(p.l_r / (p.l_f + p.l_r) * math.tan(steer))
        self.x, self.y, self.psi, self.v = (
            self.x + self.v * math.cos(self.psi + beta) * p.dt,
            self.y + self.v * math.sin(self.psi + beta) * p.dt,
            self.psi + (self.v / p.l_r) * math.sin(beta) * p.dt,
            min(max(self.v + accel * p.dt, 0.0), p.v_max),
        )

    def _idm_step(self) -> tuple[np.ndarray, np.ndarray]:
        """The agents' next ``(s, v)`` by IDM (:func:`course_lib.envs.driving.idm_step`)."""
        p, v = self.params, self.agent_v
        s_all, d_all = np.append(self.agent_s, self.s), np.append(self.agent_d, self.d)
        s_i = self.agent_s[:, None]
        ahead = s_all > s_i
        beside = np.abs(d_all - self.agent_d[:, None]) < 0.5 * (self._wid_all + self.agent_width[:, None])
        gaps = np.where(ahead & beside, s_all - s_i - 0.5 * (self._len_all + self.agent_length[:, None]), np.inf)
        leader = np.argmin(gaps, 1)
        gap, dv = gaps[np.arange(v.shape[0]), leader], v - np.append(v, self.v)[leader]
        s_star = p.idm_min_gap + np.maximum(
            0.0, v * p.idm_time_headway + v * dv / (2.0 * math.sqrt(p.idm_accel * p.idm_decel))
        )
        acc = p.idm_accel * (1.0 - (v / self.agent_v0) ** p.idm_delta - (s_star / np.maximum(gap, 1e-3)) ** 2)
        return self.agent_s + v * p.dt, np.maximum(v + np.maximum(acc, -p.idm_max_brake) * p.dt, 0.0)

    # --- geometry and observation ----------------------------------------------------

    def _ego_points(self) -> tuple[np.ndarray, np.ndarray]:
        """``[5]`` x and y of the ego's centre and corners (:func:`course_lib.envs.driving.box_corners`'s order)."""
        c, s = math.cos(self.psi), math.sin(self.psi)
        hl, hw = 0.5 * self.params.ego_length, 0.5 * self.params.ego_width
        along, across = self._corner_signs[0] * hl, self._corner_signs[1] * hw
        return self.x + along * c - across * s, self.y + along * s + across * c

    def _frame(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The road-anchored points (agents, lane points ahead, the ego's own road point) in
        the ego's frame: ``(rx, ry, heading, cos(heading - psi), sin(heading - psi))``, ``[A + P + 1]`` each."""
        p = self.params
        lane_d = lane_center(self.d, self.n_lanes, p.lane_width)
        s_q = np.concatenate([self.agent_s, self.s + self._ahead, [self.s]])
        d_q = np.concatenate([self.agent_d, np.full(N_OBS_ROAD, lane_d), [self.d]])
        x, y, heading = road_pose(s_q, d_q, self.road_xy, self.road_psi, p.road_spacing)
        c, s = math.cos(self.psi), math.sin(self.psi)
        dx, dy, rel = x - self.x, y - self.y, heading - self.psi
        return c * dx + s * dy, -s * dx + c * dy, heading, np.cos(rel), np.sin(rel)

    def _obs(self, frame: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
        """``[OBS_DIM]`` float32 (:func:`course_lib.envs.driving.get_obs`, same layout)."""
        p, a = self.params, self.agent_s.shape[0]
        rx, ry, heading, cos_rel, sin_rel = self._frame() if frame is None else frame
        lane_d = lane_center(self.d, self.n_lanes, p.lane_width)
        hw = self.n_lanes * p.lane_width / 2.0
        c, s = math.cos(self.psi), math.sin(self.psi)
        tx, ty = self.target[0] - self.x, self.target[1] - self.y
        tx, ty = c * tx + s * ty, -s * tx + c * ty
        ego_and_target = np.array([
            self.v / p.v_max, self.prev_action[0], self.prev_action[1],
            (self.psi - heading[-1] + math.pi) % (2 * math.pi) - math.pi,
            (self.d - lane_d) / (0.5 * p.lane_width), (hw - self.d) / p.lane_width, (hw + self.d) / p.lane_width,
            self.progress, 1.0 - self.time / p.max_steps,
            tx / p.route_length, ty / p.route_length, math.hypot(tx, ty) / p.route_length,
        ])  # fmt: skip
        out = np.empty(OBS_DIM, np.float32)
        out[:AGENTS_AT] = ego_and_target[:AGENTS_AT]
        out[AGENTS_AT:ROAD_AT] = self._agent_features(rx[:a], ry[:a], heading[:a], cos_rel[:a], sin_rel[:a]).ravel()
        out[ROAD_AT:TARGET_AT] = np.stack([rx[a:-1], ry[a:-1]], -1).ravel() / POS_SCALE
        out[TARGET_AT:] = ego_and_target[AGENTS_AT:]
        return out

    def _agent_features(
        self, rx: np.ndarray, ry: np.ndarray, heading: np.ndarray, cos_rel: np.ndarray, sin_rel: np.ndarray
    ) -> np.ndarray:
        """``[N_OBS_AGENTS, 9]`` nearest agents first, zero rows pad (:data:`~course_lib.envs.driving.AGENT_FEATURES`)."""
        c, s = math.cos(self.psi), math.sin(self.psi)
        dvx = self.agent_v * np.cos(heading) - self.v * c
        dvy = self.agent_v * np.sin(heading) - self.v * s
        feats = np.empty((9, rx.shape[0]))
        feats[0], feats[1] = rx / POS_SCALE, ry / POS_SCALE
        feats[2], feats[3] = (c * dvx + s * dvy) / VEL_SCALE, (-s * dvx + c * dvy) / VEL_SCALE
        feats[4], feats[5] = cos_rel, sin_rel
        feats[6], feats[7] = (self.agent_s - self.s) / POS_SCALE, (self.agent_d - self.d) / self.params.lane_width
        feats[8] = 1.0
        out = np.zeros((N_OBS_AGENTS, 9))
        order = np.argsort(rx * rx + ry * ry, kind="stable")[:N_OBS_AGENTS]
        out[: order.shape[0]] = feats[:, order].T
        return out

    def _info(self) -> dict[str, Any]:
        return {
            "collision": self.collision,
            "offroad": self.offroad,
            "progress_ratio": self.progress,
            "goal": self.progress >= 1.0,
        }


__all__ = ["STATE_FIELDS", "DrivingNumpyEnv", "ego_overlaps", "make_road", "project_to_road", "road_pose"]
