r"""A procedurally generated driving simulator as pure JAX functions: the environment of lesson 06.

V-Max (Charraut et al. 2025, arXiv 2503.08388) trains SAC on Waymax, a JAX driving
simulator replaying the Waymo Open Motion Dataset. Neither the simulator nor the data
can be installed here, so this module builds the same kind of task from a key, in the
functional style of gymnax (Lange, 2022) and of :mod:`course_lib.envs.cartpole`:

- **Road**: a polyline of ``n_road_points`` vertices ``road_spacing`` metres apart,
  integrated from a random smooth curvature profile (piecewise linear between random knots
  every ``CHORDS_PER_KNOT`` chords, ``|kappa| <= curvature_scale``), with 2 or 3 lanes of
  ``lane_width`` metres.
- **Other vehicles** (``n_agents``): placed in lane slots ahead of, beside and behind the
  ego, each keeps its lane (arc length ``s``, lateral offset ``d``) and follows its leader
  with Treiber's Intelligent Driver Model (Treiber, Hennecke & Helbing, 2000,
  :func:`idm_acceleration`). The ego counts as a leader for an agent behind it when their
  boxes overlap laterally; agents never change lanes.
- **Ego**: the kinematic bicycle model (Kong et al. 2015, :func:`bicycle_step`, eq. 06.1),
  driven by ``action = (acceleration, steering)`` in ``[-1, 1]`` scaled by ``max_accel``
  and ``max_steer``. Its route is its starting lane, to a target ``route_length`` metres on.
- **Episode ends**: *terminated* by a collision (oriented boxes overlap,
  :func:`boxes_overlap`), by going off-road (any corner of the ego's box farther than the
  road's half-width from the centreline) or by reaching the target (``progress >= 1``, a
  success); *truncated* after ``max_steps`` steps (the state still has a value).

API: the course's continuous-action env interface
(:class:`course_lib.envs.interface.ContinuousJaxEnv`; every function is pure, so it
jits, vmaps and scans)::

    obs, state = reset(key, params)                       # obs [OBS_DIM] float32
    obs, state, reward, terminated, truncated = step_env(key, state, action, params)
    obs, state, reward, terminated, truncated, info = step(key, state, action, params)

``info`` holds ``final_obs`` and the episode metrics of the stepped (pre-reset) state:
``collision``, ``offroad``, ``goal`` (bool) and ``progress_ratio`` (float32); an episode
is a success by :func:`episode_success` (V-Max's *accuracy*).

**Reward** (per step, :func:`reward_fn`)::

    r = (progress' - progress) * route_length / (v_max * dt)      route progress, 1.0 per step at v_max
        - lane_center_weight * (lane_offset / (lane_width / 2))^2  stay near a lane centre
        - collision_penalty * collision - offroad_penalty * offroad

**Observation** (``OBS_DIM = 64``, all in the ego's frame: x forward, y left; layout in
:data:`OBS_NAMES`): 9 ego features, the ``N_OBS_AGENTS`` nearest agents (9 features each,
zero rows with ``present = 0`` when there are fewer), ``N_OBS_ROAD`` points of the ego's
nearest lane centre ahead, and the route target. Positions are divided by
``POS_SCALE`` (m), velocities by ``VEL_SCALE`` (m/s), so every feature is O(1).

:func:`heuristic_policy` (lane keeping by a P controller, IDM braking behind a leader)
solves most episodes; uniform random actions solve few (see :func:`evaluate_policy`).
:mod:`course_lib.envs.driving_numpy` is the same simulator as a classic numpy
``gymnasium.Env``, :mod:`course_lib.envs.driving_render` draws a scenario and
:mod:`course_lib.envs.driving_bench` measures steps per second.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from course_lib.envs.interface import step_with_auto_reset

ACTION_DIM = 2
#: The most lanes a road has (the lane-slot grid of :func:`reset` is ``[MAX_LANES, len(SLOT_OFFSETS)]``).
MAX_LANES = 3
#: Arc-length offsets (m) from the ego's start of the slots where agents are placed (+-3 m jitter).
SLOT_OFFSETS: tuple[float, ...] = (-18.0, 0.0, 18.0, 36.0, 54.0, 72.0)
SLOT_JITTER = 3.0
#: The road's curvature is linear between knots this many chords apart (:func:`make_road`).
CHORDS_PER_KNOT = 8
#: Agent box sizes (m) are uniform in these ranges.
AGENT_LENGTH = (4.4, 5.0)
AGENT_WIDTH = (1.8, 2.0)
N_OBS_AGENTS = 4
N_OBS_ROAD = 8
#: Spacing (m) along the lane of the observed lane-centre points: 6, 12, ..., 48 m ahead.
OBS_ROAD_SPACING = 6.0
POS_SCALE = 30.0
VEL_SCALE = 10.0
#: Chords searched around the nearest vertex when projecting the ego onto the road (:func:`project_to_road`).
PROJECTION_WINDOW = 6

EGO_FEATURES: tuple[str, ...] = (
    "ego speed / v_max",
    "previous acceleration action [-1, 1]",
    "previous steering action [-1, 1]",
    "heading error w.r.t. the road tangent (rad)",
    "offset from the nearest lane centre / (lane_width / 2), left +",
    "distance to the left road edge / lane_width",
    "distance to the right road edge / lane_width",
    "route progress ratio [0, 1]",
    "fraction of the episode's steps left",
)
AGENT_FEATURES: tuple[str, ...] = (
    "x / POS_SCALE",
    "y / POS_SCALE",
    "relative vx / VEL_SCALE",
    "relative vy / VEL_SCALE",
    "cos(relative heading)",
    "sin(relative heading)",
    "arc-length gap s_agent - s_ego / POS_SCALE",
    "lateral gap d_agent - d_ego / lane_width",
    "present (1) or padding (0)",
)
TARGET_FEATURES: tuple[str, ...] = ("target x / route_length", "target y / route_length", "distance / route_length")
#: Observation layout, one name per entry of the ``[OBS_DIM]`` vector.
OBS_NAMES: tuple[str, ...] = (
    EGO_FEATURES
    + tuple(f"agent {k}: {f}" for k in range(N_OBS_AGENTS) for f in AGENT_FEATURES)
    + tuple(f"lane point {k}: {c} / POS_SCALE" for k in range(N_OBS_ROAD) for c in ("x", "y"))
    + TARGET_FEATURES
)
OBS_DIM = len(OBS_NAMES)
#: Where each block starts in the observation.
AGENTS_AT = len(EGO_FEATURES)
ROAD_AT = AGENTS_AT + N_OBS_AGENTS * len(AGENT_FEATURES)
TARGET_AT = ROAD_AT + 2 * N_OBS_ROAD


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class EnvParams:
    """The simulator's constants and difficulty knobs (SI units). A pytree: the float fields
    can be vmapped; ``n_agents``, ``n_road_points`` and ``max_steps`` are static (shapes, loop lengths).

    Attributes:
        dt: time step (s).
        l_f, l_r: distances (m) from the centre of gravity to the front and rear axles.
        ego_length, ego_width: the ego's box (m).
        max_accel: |acceleration| (m/s^2) at action 1; max_steer: |steering angle| (rad) at action 1.
        v_max: the ego's top speed (m/s). ego_speed_min / _max: its initial speed range.
        ego_start_s: the ego's initial arc length (m) along the road.
        road_spacing: distance (m) between polyline vertices. lane_width: (m).
        three_lane_prob: probability that a road has 3 lanes (else 2).
        curvature_scale: the largest |curvature| (1/m) of the road.
        agent_speed_min / _max: the agents' speed range (m/s), also their IDM desired speed.
        idm_*: Treiber's IDM: max acceleration a, comfortable deceleration b, time headway T,
            minimum gap s0, exponent delta; idm_max_brake caps the deceleration (m/s^2).
        route_length: distance (m) along the ego's lane to the target.
        min_progress: the route fraction an episode must cover to count as a success.
        collision_penalty, offroad_penalty, lane_center_weight: reward terms (:func:`reward_fn`).
        n_agents: other vehicles (1 .. 11). n_road_points: polyline vertices. max_steps: time limit.
    """

    dt: float = 0.1
    l_f: float = 1.4
    l_r: float = 1.4
    ego_length: float = 4.6
    ego_width: float = 1.9
    max_accel: float = 4.0
    max_steer: float = 0.4
    v_max: float = 15.0
    ego_speed_min: float = 4.0
    ego_speed_max: float = 10.0
    ego_start_s: float = 25.0
    road_spacing: float = 6.0
    lane_width: float = 3.5
    three_lane_prob: float = 0.5
    curvature_scale: float = 0.012
    agent_speed_min: float = 4.0
    agent_speed_max: float = 10.0
    idm_accel: float = 1.5
    idm_decel: float = 2.0
    idm_time_headway: float = 1.5
    idm_min_gap: float = 2.0
    idm_delta: float = 4.0
    idm_max_brake: float = 8.0
    route_length: float = 120.0
    min_progress: float = 0.5
    collision_penalty: float = 10.0
    offroad_penalty: float = 10.0
    lane_center_weight: float = 0.05
    n_agents: int = field(default=6, metadata={"static": True})
    n_road_points: int = field(default=64, metadata={"static": True})
    max_steps: int = field(default=160, metadata={"static": True})


DEFAULT_PARAMS = EnvParams()


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class EnvState:
    """One scenario and where it stands (``[B, ...]`` on every field when vmapped).

    Attributes:
        x, y, psi, v: the ego's centre of gravity (m), heading (rad) and speed (m/s).
        s, d: the ego centre's arc length and lateral offset (m, left +) on the road
            (:func:`project_to_road`).
        prev_action: ``[2]`` the last (clipped) action; zeros after a reset.
        progress: route progress ratio in ``[0, 1]`` (:func:`progress_ratio`).
        collision, offroad: bool, the events of the step that produced this state.
        agent_s, agent_d, agent_v, agent_v0: ``[A]`` arc length (m), lateral offset (m, left +),
            speed and IDM desired speed (m/s) of each agent.
        agent_length, agent_width: ``[A]`` box sizes (m).
        road_xy: ``[N, 2]`` centreline vertices (m); road_psi: ``[N]`` its heading (rad) there.
        n_lanes: int32, 2 or 3. route_d: lateral offset (m) of the route's lane.
        route_s0: arc length (m) where the route starts; target: ``[2]`` the route's end (m).
        time: steps taken in the episode (int32).
    """

    x: Array
    y: Array
    psi: Array
    v: Array
    s: Array
    d: Array
    prev_action: Array
    progress: Array
    collision: Array
    offroad: Array
    agent_s: Array
    agent_d: Array
    agent_v: Array
    agent_v0: Array
    agent_length: Array
    agent_width: Array
    road_xy: Array
    road_psi: Array
    n_lanes: Array
    route_d: Array
    route_s0: Array
    target: Array
    time: Array


# --- vehicle models -------------------------------------------------------------------


def bicycle_step(
    x: Array, y: Array, psi: Array, v: Array, accel: Array, steer: Array, params: EnvParams = DEFAULT_PARAMS
) -> tuple[Array, Array, Array, Array]:
    """One explicit-Euler step of the kinematic bicycle model (Kong, Pfeiffer, Schildbach &
    Borrelli 2015, "Kinematic and dynamic vehicle models for autonomous driving control
    design"), referenced at the centre of gravity; ``delta`` = ``steer`` (rad), ``a`` =
    ``accel`` (m/s^2)::

        beta = arctan( l_r / (l_f + l_r) * tan(delta) )  (06.1)
        x'   = x + v * cos(psi + beta) * dt
        y'   = y + v * sin(psi + beta) * dt
        psi' = psi + (v / l_r) * sin(beta) * dt
        v'   = clip(v + a * dt, 0, v_max)

    Elementwise: scalars or broadcastable arrays. Returns ``(x', y', psi', v')``.
    """
    beta = jnp.arctan(params.l_r / (params.l_f + params.l_r) * jnp.tan(steer))
    x_next = x + v * jnp.cos(psi + beta) * params.dt
    y_next = y + v * jnp.sin(psi + beta) * params.dt
    psi_next = psi + (v / params.l_r) * jnp.sin(beta) * params.dt
    v_next = jnp.clip(v + accel * params.dt, 0.0, params.v_max)
    return x_next, y_next, psi_next, v_next


def idm_acceleration(v: Array, v0: Array, gap: Array, dv: Array, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """Treiber's Intelligent Driver Model (Treiber, Hennecke & Helbing 2000, "Congested
    traffic states in empirical observations and microscopic simulations"), elementwise::

        s* = s0 + max(0, v T + v dv / (2 sqrt(a b)))
        acc = a (1 - (v / v0)^delta - (s* / gap)^2),   floored at -idm_max_brake

    ``gap`` is the bumper-to-bumper distance to the leader (m; ``inf`` for a free road) and
    ``dv = v - v_leader`` the approach rate (m/s).
    """
    a, b = params.idm_accel, params.idm_decel
    s_star = params.idm_min_gap + jnp.maximum(0.0, v * params.idm_time_headway + v * dv / (2.0 * jnp.sqrt(a * b)))
    free = (v / v0) ** params.idm_delta
    interaction = (s_star / jnp.maximum(gap, 1e-3)) ** 2
    return jnp.maximum(a * (1.0 - free - interaction), -params.idm_max_brake)


def boxes_overlap(box_a: Array, box_b: Array) -> Array:
    """Whether two oriented boxes overlap, by the separating-axis theorem.

    Args:
        box_a, box_b: ``[..., 5]`` boxes ``(cx, cy, heading, length, width)`` (m, rad),
            broadcast against each other (e.g. the ego ``[5]`` against agents ``[A, 5]``).

    Returns:
        ``[...]`` bool: True unless one of the 4 box axes separates the two projections
        (boxes that only touch count as overlapping).
    """
    box_a, box_b = jnp.broadcast_arrays(jnp.asarray(box_a), jnp.asarray(box_b))
    axes_a, axes_b = _box_axes(box_a[..., 2]), _box_axes(box_b[..., 2])  # [..., 2, 2]
    axes = jnp.concatenate([axes_a, axes_b], axis=-2)  # [..., 4, 2]
    centre_gap = jnp.abs(jnp.sum(axes * (box_b[..., None, :2] - box_a[..., None, :2]), axis=-1))
    separated = centre_gap > _box_radius(box_a, axes_a, axes) + _box_radius(box_b, axes_b, axes)
    return ~jnp.any(separated, axis=-1)


def _box_axes(heading: Array) -> Array:
    """``[..., 2, 2]`` the unit vectors along a box's length and width."""
    c, s = jnp.cos(heading), jnp.sin(heading)
    return jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], axis=-2)


def _box_radius(box: Array, own_axes: Array, axes: Array) -> Array:
    """``[..., 4]`` half the extent of ``box``'s projection onto each of ``axes``."""
    along = jnp.abs(jnp.sum(axes * own_axes[..., None, 0, :], -1))
    across = jnp.abs(jnp.sum(axes * own_axes[..., None, 1, :], -1))
    return 0.5 * box[..., None, 3] * along + 0.5 * box[..., None, 4] * across


def box_corners(box: Array) -> Array:
    """``[..., 4, 2]`` corners of ``[..., 5]`` boxes ``(cx, cy, heading, length, width)``, counter-clockwise."""
    axes = _box_axes(box[..., 2])
    signs = jnp.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])
    half = 0.5 * signs * box[..., None, 3:5]  # [..., 4, 2]
    return box[..., None, :2] + half[..., :1] * axes[..., None, 0, :] + half[..., 1:] * axes[..., None, 1, :]


# --- road geometry ----------------------------------------------------------------------


def road_pose(s: Array, d: Array, road_xy: Array, road_psi: Array, spacing: float) -> tuple[Array, Array, Array]:
    """The point at arc length ``s`` and lateral offset ``d`` (left +) of the road, and the
    road's heading there: ``(x, y, heading)``, each shaped like ``s``.

    Position is linear along the polyline's chords (extrapolated past both ends along the
    end chords); heading is interpolated between the vertices' headings (held past the ends).
    """
    i = jnp.clip(jnp.floor(s / spacing).astype(jnp.int32), 0, road_xy.shape[0] - 2)
    f = s / spacing - i
    heading = road_psi[i] + jnp.clip(f, 0.0, 1.0) * (road_psi[i + 1] - road_psi[i])
    xy = road_xy[i] + f[..., None] * (road_xy[i + 1] - road_xy[i])
    return xy[..., 0] - d * jnp.sin(heading), xy[..., 1] + d * jnp.cos(heading), heading


def project_to_road(
    points: Array, road_xy: Array, spacing: float, window: int | None = PROJECTION_WINDOW
) -> tuple[Array, Array]:
    """Arc length and signed lateral offset of ``points [M, 2]`` from the centreline.

    Nearest-segment projection: each point's closest point on each chord (clipped to the
    chord), the nearest chord wins. With ``window``, only the ``window`` chords around the
    vertex nearest to ``points[0]`` are searched (the same answer for points within a
    few metres of a gently curved road, at a tenth of the cost); ``None`` searches all.
    The nearest chord is selected with a mask, not a gather (faster vmapped on CPU).

    Returns:
        ``(s [M], d [M])``: ``s`` = (chord index + fraction) * ``spacing``; ``|d|`` =
        distance to the polyline, positive on its left.
    """
    start = jnp.zeros((), jnp.int32)
    if window is not None:
        nearest_vertex = first_argmin(jnp.sum((road_xy - points[0]) ** 2, -1))
        start = jnp.clip(nearest_vertex - window // 2, 0, road_xy.shape[0] - 1 - window)
        road_xy = jax.lax.dynamic_slice_in_dim(road_xy, start, window + 1)
    a, ab = road_xy[:-1], road_xy[1:] - road_xy[:-1]  # [W, 2]
    ap = points[:, None, :] - a[None]  # [M, W, 2]
    t = jnp.clip(jnp.sum(ap * ab, -1) / jnp.sum(ab * ab, -1), 0.0, 1.0)  # [M, W]
    dist2 = jnp.sum((ap - t[..., None] * ab) ** 2, -1)
    chords = jnp.arange(ab.shape[0])
    nearest = chords == first_argmin(dist2)[:, None]  # [M, W] one-hot
    s = (start + select(nearest, chords + t)) * spacing
    cross = select(nearest, ab[:, 0] * ap[..., 1] - ab[:, 1] * ap[..., 0])
    return s, jnp.sign(cross) * jnp.sqrt(jnp.min(dist2, -1))


def first_argmin(x: Array) -> Array:
    """``jnp.argmin(x, -1)`` (the first minimum, int32) as two plain reductions: XLA's CPU
    argmin (a variadic reduce) is several times slower under ``vmap``."""
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(x == jnp.min(x, -1, keepdims=True), index, x.shape[-1]), -1)


def select(one_hot: Array, values: Array) -> Array:
    """``values`` at the True entry of ``one_hot`` along the last axis (a gather without a gather)."""
    return jnp.sum(jnp.where(one_hot, values, 0.0), -1)


def lane_center(d: Array, n_lanes: Array, lane_width: float) -> Array:
    """The lateral offset (m) of the lane centre nearest to offset ``d``; lanes are
    ``(l - (n_lanes - 1) / 2) * lane_width`` for ``l = 0 .. n_lanes - 1`` (lane 0 rightmost)."""
    half = (n_lanes - 1) / 2.0
    lane = jnp.clip(jnp.round(d / lane_width + half), 0, n_lanes - 1)
    return (lane - half) * lane_width


def _wrap(angle: Array) -> Array:
    """Angle in ``[-pi, pi)``."""
    return (angle + jnp.pi) % (2 * jnp.pi) - jnp.pi


# --- the scenario's parts at a state ------------------------------------------------------


def ego_box(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """``[5]`` the ego's box ``(x, y, psi, ego_length, ego_width)``."""
    size = jnp.broadcast_to(jnp.array([params.ego_length, params.ego_width]), state.x.shape + (2,))
    return jnp.concatenate([jnp.stack([state.x, state.y, state.psi], -1), size], -1)


def agent_boxes(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """``[A, 5]`` the agents' boxes, each aligned with its lane."""
    x, y, heading = road_pose(state.agent_s, state.agent_d, state.road_xy, state.road_psi, params.road_spacing)
    return jnp.stack([x, y, heading, state.agent_length, state.agent_width], -1)


def ego_road_coords(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> tuple[Array, Array, Array]:
    """The ego centre's ``(s, d)`` on the road and ``[4]`` the lateral offsets of its corners."""
    points = jnp.concatenate([jnp.stack([state.x, state.y])[None], box_corners(ego_box(state, params))])
    s, d = project_to_road(points, state.road_xy, params.road_spacing)
    return s[0], d[0], d[1:]


def half_width(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """The road's half-width (m): ``n_lanes * lane_width / 2``."""
    return state.n_lanes * params.lane_width / 2.0


def is_offroad(corner_d: Array, state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """Off-road: any corner of the ego's box farther than the half-width from the centreline."""
    return jnp.any(jnp.abs(corner_d) > half_width(state, params))


def is_collision(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """The ego's box overlaps an agent's box (:func:`boxes_overlap`)."""
    return jnp.any(boxes_overlap(ego_box(state, params), agent_boxes(state, params)))


def progress_ratio(s: Array, state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """Distance travelled along the route / route length, clipped to ``[0, 1]``."""
    return jnp.clip((s - state.route_s0) / params.route_length, 0.0, 1.0)


def episode_success(
    collision: Array, offroad: Array, progress_ratio: Array, params: EnvParams = DEFAULT_PARAMS
) -> Array:
    """V-Max's *accuracy* of an episode: no collision, never off-road, and at least
    ``params.min_progress`` of the route covered. The progress clause makes an ego that
    stalls (or creeps) safely until the time limit a failure, not a success.

    Call it on an episode's last step (``info`` of the step that ends it); elementwise.
    """
    return ~collision & ~offroad & (progress_ratio >= params.min_progress)


# --- dynamics -----------------------------------------------------------------------------


def idm_step(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> tuple[Array, Array]:
    """The agents' next ``(s [A], v [A])``: each follows its nearest leader by IDM, explicit Euler.

    A leader is a vehicle ahead (larger ``s``) whose box overlaps the agent's laterally:
    another agent of its lane, or the ego (at ``state.s``, ``state.d``, speed ``state.v``).
    """
    s_all = jnp.append(state.agent_s, state.s)
    d_all = jnp.append(state.agent_d, state.d)
    v_all = jnp.append(state.agent_v, state.v)
    len_all = jnp.append(state.agent_length, params.ego_length)
    wid_all = jnp.append(state.agent_width, params.ego_width)
    s_i, d_i = state.agent_s[:, None], state.agent_d[:, None]  # [A, 1] against [A + 1]
    ahead = s_all[None] > s_i
    beside = jnp.abs(d_all[None] - d_i) < 0.5 * (wid_all[None] + state.agent_width[:, None])
    gaps = jnp.where(ahead & beside, s_all[None] - s_i - 0.5 * (len_all[None] + state.agent_length[:, None]), jnp.inf)
    leader = jnp.arange(v_all.shape[0]) == first_argmin(gaps)[:, None]  # [A, A + 1] one-hot
    v_lead = select(leader, v_all[None])
    acc = idm_acceleration(state.agent_v, state.agent_v0, jnp.min(gaps, 1), state.agent_v - v_lead, params)
    return state.agent_s + state.agent_v * params.dt, jnp.maximum(state.agent_v + acc * params.dt, 0.0)


def reward_fn(
    progress: Array,
    next_progress: Array,
    lane_offset: Array,
    collision: Array,
    offroad: Array,
    params: EnvParams = DEFAULT_PARAMS,
) -> Array:
    """The step's reward (float32; see the module docstring): route progress in units of one
    step at ``v_max``, a small lane-centring cost, and the terminal penalties."""
    progress_term = (next_progress - progress) * params.route_length / (params.v_max * params.dt)
    lane_term = params.lane_center_weight * (lane_offset / (0.5 * params.lane_width)) ** 2
    penalty = params.collision_penalty * collision + params.offroad_penalty * offroad
    return (progress_term - lane_term - penalty).astype(jnp.float32)


def step_env(
    key: Array | None, state: EnvState, action: Array, params: EnvParams = DEFAULT_PARAMS
) -> tuple[Array, EnvState, Array, Array, Array]:
    """One transition (eq. 06.1 for the ego, IDM for the agents, both from the same state), no reset.

    Args:
        key: unused (the dynamics are deterministic); kept so every env has one signature.
        state: the current state.
        action: ``[2]`` (acceleration, steering) in ``[-1, 1]`` (clipped), scaled by
            ``max_accel`` and ``max_steer``.
        params: the constants.

    Returns:
        ``(obs [OBS_DIM] float32, next_state, reward float32, terminated, truncated)``.
    """
    del key
    action = jnp.clip(jnp.asarray(action, jnp.float32), -1.0, 1.0)
    agent_s, agent_v = idm_step(state, params)
    x, y, psi, v = bicycle_step(
        state.x, state.y, state.psi, state.v, action[0] * params.max_accel, action[1] * params.max_steer, params
    )
    moved = dataclasses.replace(
        state, x=x, y=y, psi=psi, v=v, agent_s=agent_s, agent_v=agent_v, prev_action=action, time=state.time + 1
    )
    s, d, corner_d = ego_road_coords(moved, params)
    next_state = dataclasses.replace(
        moved,
        s=s,
        d=d,
        progress=progress_ratio(s, moved, params),
        collision=is_collision(moved, params),
        offroad=is_offroad(corner_d, moved, params),
    )
    lane_offset = d - lane_center(d, state.n_lanes, params.lane_width)
    reward = reward_fn(
        state.progress, next_state.progress, lane_offset, next_state.collision, next_state.offroad, params
    )
    terminated = next_state.collision | next_state.offroad | (next_state.progress >= 1.0)
    truncated = next_state.time >= params.max_steps
    return get_obs(next_state, params), next_state, reward, terminated, truncated


def episode_metrics(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> dict[str, Array]:
    """``{collision, offroad, goal (bool), progress_ratio (float32)}`` of a state (``step``'s info)."""
    del params
    return {
        "collision": state.collision,
        "offroad": state.offroad,
        "progress_ratio": state.progress,
        "goal": state.progress >= 1.0,
    }


def step(
    key: Array, state: EnvState, action: Array, params: EnvParams = DEFAULT_PARAMS
) -> tuple[Array, EnvState, Array, Array, Array, dict[str, Array]]:
    """:func:`step_env`, then a reset in the same call if the episode ended
    (:func:`course_lib.envs.interface.step_with_auto_reset`, its key split before the reset).

    Returns:
        ``(obs, state, reward, terminated, truncated, info)``: ``obs`` / ``state`` start the
        next episode where it ended; ``info`` holds ``final_obs`` and
        :func:`episode_metrics` of the stepped (pre-reset) state.
    """
    return step_with_auto_reset(reset, step_env, key, state, action, params, info_fn=episode_metrics)


# --- observation --------------------------------------------------------------------------


def _to_ego_frame(dx: Array, dy: Array, psi: Array) -> tuple[Array, Array]:
    """World-frame vectors rotated into the ego's frame (x forward, y left)."""
    c, s = jnp.cos(psi), jnp.sin(psi)
    return c * dx + s * dy, -s * dx + c * dy


def get_obs(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """``[OBS_DIM]`` float32 observation (layout: :data:`OBS_NAMES`).

    One :func:`road_pose` call places every road-anchored point (the agents, the lane
    points ahead, the ego's own road tangent); the parts are then rotated into the ego's frame.
    """
    a = state.agent_s.shape[0]
    ahead = state.s + OBS_ROAD_SPACING * jnp.arange(1, N_OBS_ROAD + 1)
    lane_d = lane_center(state.d, state.n_lanes, params.lane_width)
    s_query = jnp.concatenate([state.agent_s, ahead, state.s[None]])
    d_query = jnp.concatenate([state.agent_d, jnp.full_like(ahead, lane_d), state.d[None]])
    x, y, heading = road_pose(s_query, d_query, state.road_xy, state.road_psi, params.road_spacing)
    rx, ry = _to_ego_frame(x - state.x, y - state.y, state.psi)
    parts = [
        _ego_features(state, heading[-1], params),
        _agent_features(state, rx[:a], ry[:a], heading[:a], params).ravel(),
        jnp.stack([rx[a:-1], ry[a:-1]], -1).ravel() / POS_SCALE,
        _target_features(state, params),
    ]
    return jnp.concatenate(parts).astype(jnp.float32)


def _ego_features(state: EnvState, road_heading: Array, params: EnvParams) -> Array:
    """``[9]`` :data:`EGO_FEATURES`; ``road_heading``: the road's heading at the ego's ``s``."""
    lane_offset = state.d - lane_center(state.d, state.n_lanes, params.lane_width)
    hw = half_width(state, params)
    return jnp.stack(
        [
            state.v / params.v_max,
            state.prev_action[0],
            state.prev_action[1],
            _wrap(state.psi - road_heading),
            lane_offset / (0.5 * params.lane_width),
            (hw - state.d) / params.lane_width,
            (hw + state.d) / params.lane_width,
            state.progress,
            1.0 - state.time / params.max_steps,
        ]
    )


def _agent_features(state: EnvState, rx: Array, ry: Array, heading: Array, params: EnvParams) -> Array:
    """``[N_OBS_AGENTS, 9]`` :data:`AGENT_FEATURES` of the nearest agents (zero rows pad),
    from the agents' ``[A]`` positions in the ego's frame and world headings."""
    vx, vy = _to_ego_frame(
        state.agent_v * jnp.cos(heading) - state.v * jnp.cos(state.psi),
        state.agent_v * jnp.sin(heading) - state.v * jnp.sin(state.psi),
        state.psi,
    )
    feats = jnp.stack(
        [
            rx / POS_SCALE,
            ry / POS_SCALE,
            vx / VEL_SCALE,
            vy / VEL_SCALE,
            jnp.cos(heading - state.psi),
            jnp.sin(heading - state.psi),
            (state.agent_s - state.s) / POS_SCALE,
            (state.agent_d - state.d) / params.lane_width,
            jnp.ones_like(rx),
        ],
        -1,
    )
    n_pad = max(N_OBS_AGENTS - feats.shape[0], 0)
    feats = jnp.concatenate([feats, jnp.zeros((n_pad, feats.shape[1]), feats.dtype)])
    dist2 = jnp.concatenate([rx**2 + ry**2, jnp.full((n_pad,), jnp.inf, rx.dtype)])
    return nearest_first(dist2, feats, N_OBS_AGENTS)


def nearest_first(dist2: Array, rows: Array, k: int) -> Array:
    """``rows [A, F]`` sorted by ``dist2 [A]`` (stable), the first ``k``: ``[k, F]``.

    Sorting by ranks (how many rows come before each) and a one-hot product, not
    ``argsort`` and a gather: a few hundred flops for the course's ``A <= 18``, and fast vmapped.
    """
    index = jnp.arange(dist2.shape[0])
    before = (dist2[None, :] < dist2[:, None]) | (
        (dist2[None, :] == dist2[:, None]) & (index[None, :] < index[:, None])
    )
    rank = jnp.sum(before, -1)  # [A]
    one_hot = jnp.arange(k)[:, None] == rank[None, :]  # [k, A]
    return jnp.sum(jnp.where(one_hot[..., None], rows[None], 0.0), 1)


def _target_features(state: EnvState, params: EnvParams) -> Array:
    """``[3]`` :data:`TARGET_FEATURES`."""
    rx, ry = _to_ego_frame(state.target[0] - state.x, state.target[1] - state.y, state.psi)
    return jnp.stack([rx, ry, jnp.hypot(rx, ry)]) / params.route_length


# --- reset --------------------------------------------------------------------------------


def n_uniforms(params: EnvParams = DEFAULT_PARAMS) -> int:
    """How many U(0, 1) numbers a scenario is made of (:func:`scenario_from_uniforms`)."""
    return n_knots(params.n_road_points) + 3 + MAX_LANES * len(SLOT_OFFSETS) + 4 * params.n_agents


def reset(key: Array, params: EnvParams = DEFAULT_PARAMS) -> tuple[Array, EnvState]:
    """A new scenario drawn from ``key``: one draw of :func:`n_uniforms` U(0, 1) numbers,
    made into road, lanes, ego, agents and route by :func:`scenario_from_uniforms`.

    Returns:
        ``(obs [OBS_DIM] float32, state)``.
    """
    return scenario_from_uniforms(jax.random.uniform(key, (n_uniforms(params),)), params)


def scenario_from_uniforms(u: Array, params: EnvParams = DEFAULT_PARAMS) -> tuple[Array, EnvState]:
    """A scenario from ``u [n_uniforms(params)]`` U(0, 1) numbers, in this order:

    - the road's curvature at its ``n_knots(n_road_points)`` knots (:func:`make_road`);
    - lanes: 3 with probability ``three_lane_prob`` (else 2); the ego's lane, uniform; its
      speed, uniform in ``[ego_speed_min, ego_speed_max]``;
    - ``MAX_LANES * len(SLOT_OFFSETS)`` slot scores: the agents take the valid slots
      with the lowest scores (:func:`place_agents`);
    - per agent, ``[4, n_agents]``: speed (uniform in the agent speed range, also its IDM
      desired speed), arc-length jitter (``+-SLOT_JITTER``), length and width (uniform in
      ``AGENT_LENGTH``, ``AGENT_WIDTH``).

    Pure arithmetic on ``u``: :mod:`course_lib.envs.driving_numpy` builds the same
    scenario from the same numbers.

    Returns:
        ``(obs [OBS_DIM] float32, state)``.
    """
    k, n_slots, a = n_knots(params.n_road_points), MAX_LANES * len(SLOT_OFFSETS), params.n_agents
    road_xy, road_psi = make_road(u[:k], params)
    u = u[k:]
    n_lanes = jnp.where(u[0] < params.three_lane_prob, 3, 2).astype(jnp.int32)
    ego_lane = jnp.minimum(jnp.floor(u[1] * n_lanes), n_lanes - 1).astype(jnp.int32)
    ego_v = params.ego_speed_min + u[2] * (params.ego_speed_max - params.ego_speed_min)
    lane, offset = place_agents(u[3 : 3 + n_slots], n_lanes, ego_lane, params)
    speed, jitter, length, width = u[3 + n_slots :].reshape(4, a)
    return _assemble(
        road_xy, road_psi, n_lanes, ego_lane, ego_v,
        params.ego_start_s + offset + SLOT_JITTER * (2.0 * jitter - 1.0),
        lane_offset_of(lane, n_lanes, params.lane_width),
        params.agent_speed_min + speed * (params.agent_speed_max - params.agent_speed_min),
        AGENT_LENGTH[0] + length * (AGENT_LENGTH[1] - AGENT_LENGTH[0]),
        AGENT_WIDTH[0] + width * (AGENT_WIDTH[1] - AGENT_WIDTH[0]),
        params,
    )  # fmt: skip


def n_knots(n_road_points: int) -> int:
    """Curvature knots of a road of ``n_road_points`` vertices: one every ``CHORDS_PER_KNOT``
    chords, from the first chord's midpoint past the last's."""
    return (n_road_points - 2) // CHORDS_PER_KNOT + 2


@functools.lru_cache
def knot_weights(n_road_points: int) -> np.ndarray:
    """``[n_road_points - 1, n_knots]`` linear-interpolation weights: chord ``j``'s curvature
    is row ``j`` times the knots' (knot ``k`` sits at chord ``k * CHORDS_PER_KNOT``)."""
    position = np.arange(n_road_points - 1) / CHORDS_PER_KNOT  # in knot units
    knots = np.arange(n_knots(n_road_points))
    return np.maximum(0.0, 1.0 - np.abs(position[:, None] - knots[None, :])).astype(np.float32)


@functools.lru_cache
def running_sum_matrix(n_road_points: int) -> np.ndarray:
    """``[n_road_points, n_road_points - 1]`` lower-triangular ones: row ``i`` sums chords ``0 .. i-1``."""
    return np.tril(np.ones((n_road_points, n_road_points - 1), np.float32), -1)


def make_road(knots: Array, params: EnvParams = DEFAULT_PARAMS) -> tuple[Array, Array]:
    """A centreline from ``knots [n_knots]`` U(0, 1) numbers: ``(road_xy [N, 2], road_psi [N])``,
    starting at the origin heading +x.

    The curvature at knot ``k`` is ``curvature_scale * (2 knots[k] - 1)``, linear in
    between (:func:`knot_weights`); heading and position are integrated chord by chord
    (midpoint rule), so every chord is ``road_spacing`` long. The running sums are
    products with a constant triangular matrix (one op; ``cumsum`` is many on XLA's CPU).
    """
    ds, n = params.road_spacing, params.n_road_points
    kappa = jnp.asarray(knot_weights(n)) @ (params.curvature_scale * (2.0 * knots - 1.0))  # [N - 1]
    running_sum = jnp.asarray(running_sum_matrix(n))
    psi = running_sum @ (kappa * ds)
    chord = 0.5 * (psi[1:] + psi[:-1])
    return running_sum @ (ds * jnp.stack([jnp.cos(chord), jnp.sin(chord)], -1)), psi


def lane_offset_of(lane: Array, n_lanes: Array, lane_width: float) -> Array:
    """Lateral offset (m) of lane index ``lane`` (0 = rightmost) on a road of ``n_lanes``."""
    return (lane - (n_lanes - 1) / 2.0) * lane_width


def place_agents(
    scores: Array, n_lanes: Array, ego_lane: Array, params: EnvParams = DEFAULT_PARAMS
) -> tuple[Array, Array]:
    """The agents' lanes and arc-length offsets from the ego: the ``n_agents`` valid lane
    slots with the lowest ``scores [MAX_LANES * len(SLOT_OFFSETS)]`` (a lane-major grid
    ``MAX_LANES x SLOT_OFFSETS``); a slot is valid on the road and not the ego's own.

    Returns:
        ``(lane [A] int32, offset [A] m)``: agent ``i`` in the slot ranked ``i`` (no jitter yet).
    """
    if not 1 <= params.n_agents <= 2 * len(SLOT_OFFSETS) - 1:
        raise ValueError(f"n_agents must be in 1..{2 * len(SLOT_OFFSETS) - 1}, got {params.n_agents}")
    lanes = jnp.repeat(jnp.arange(MAX_LANES), len(SLOT_OFFSETS))
    offsets = jnp.tile(jnp.array(SLOT_OFFSETS), MAX_LANES)
    valid = (lanes < n_lanes) & ~((lanes == ego_lane) & (offsets == 0.0))
    slots = jnp.stack([lanes, offsets], -1)
    ranked = nearest_first(scores + jnp.where(valid, 0.0, 2.0), slots, params.n_agents)
    return ranked[:, 0].astype(jnp.int32), ranked[:, 1]


def _assemble(
    road_xy: Array,
    road_psi: Array,
    n_lanes: Array,
    ego_lane: Array,
    ego_v: Array,
    agent_s: Array,
    agent_d: Array,
    agent_v: Array,
    agent_length: Array,
    agent_width: Array,
    params: EnvParams,
) -> tuple[Array, EnvState]:
    """The first ``(obs, state)`` of a scenario from its drawn parts: the ego on its lane
    at ``ego_start_s``, aligned with the road; the route's start and target on that lane."""
    f32 = jnp.float32
    route_d = lane_offset_of(ego_lane, n_lanes, params.lane_width).astype(f32)
    s_route = params.ego_start_s + jnp.array([0.0, params.route_length])
    x, y, psi = road_pose(s_route, jnp.full(2, route_d), road_xy, road_psi, params.road_spacing)
    s0, d0 = project_to_road(jnp.stack([x[:1], y[:1]], -1), road_xy, params.road_spacing)
    state = EnvState(
        x=x[0], y=y[0], psi=psi[0], v=jnp.asarray(ego_v, f32), s=s0[0], d=d0[0],
        prev_action=jnp.zeros(ACTION_DIM, f32),
        progress=jnp.clip((s0[0] - params.ego_start_s) / params.route_length, 0.0, 1.0),
        collision=jnp.zeros((), bool),
        offroad=jnp.zeros((), bool),
        agent_s=agent_s.astype(f32), agent_d=agent_d.astype(f32), agent_v=agent_v.astype(f32),
        agent_v0=agent_v.astype(f32), agent_length=agent_length.astype(f32), agent_width=agent_width.astype(f32),
        road_xy=road_xy.astype(f32), road_psi=road_psi.astype(f32),
        n_lanes=jnp.asarray(n_lanes, jnp.int32), route_d=route_d, route_s0=s_route[0].astype(f32), target=jnp.stack([x[1], y[1]]),
        time=jnp.zeros((), jnp.int32),
    )  # fmt: skip
    return get_obs(state, params), state


# --- reference policies and evaluation ---------------------------------------------------


def heuristic_policy(obs: Array, params: EnvParams = DEFAULT_PARAMS, target_speed: float = 11.0) -> Array:
    """A hand-written driver, from the observation alone: the task's reference line.

    Steering: a P controller on the heading error and the offset from the lane centre,
    ``delta = -1.0 * heading_error - 0.15 * lane_offset_m`` (rad). Speed: IDM
    (:func:`idm_acceleration`) towards ``target_speed`` behind the nearest observed agent
    ahead in the ego's lane (``0 < s gap``, ``|d gap| < 0.6`` lane), if any. It never
    changes lanes. Works on ``[OBS_DIM]``; vmap it for a batch.

    Returns:
        ``[2]`` action in ``[-1, 1]``.
    """
    heading_err = obs[3]
    lane_offset_m = obs[4] * 0.5 * params.lane_width
    steer = -1.0 * heading_err - 0.15 * lane_offset_m
    agents = obs[AGENTS_AT:ROAD_AT].reshape(N_OBS_AGENTS, len(AGENT_FEATURES))
    ds, dd, present = agents[:, 6] * POS_SCALE, agents[:, 7], agents[:, 8]
    in_lane = (present > 0.5) & (ds > 0.0) & (jnp.abs(dd) < 0.6)
    gaps = jnp.where(in_lane, ds - 0.5 * (params.ego_length + AGENT_LENGTH[1]), jnp.inf)
    lead = jnp.arange(N_OBS_AGENTS) == first_argmin(gaps)
    v = obs[0] * params.v_max
    dv = -select(lead, agents[:, 2]) * VEL_SCALE  # ego speed minus the leader's, along the ego's heading
    accel = idm_acceleration(v, jnp.asarray(target_speed), jnp.min(gaps), dv, params)
    return jnp.clip(jnp.stack([accel / params.max_accel, steer / params.max_steer]), -1.0, 1.0)


def random_policy(key: Array, obs: Array) -> Array:
    """Uniform random actions in ``[-1, 1]^ACTION_DIM`` (``obs`` only sets the batch shape)."""
    return jax.random.uniform(key, obs.shape[:-1] + (ACTION_DIM,), minval=-1.0, maxval=1.0)


#: A policy for :func:`evaluate_policy`: ``(key, obs [OBS_DIM]) -> action [ACTION_DIM]``.
Policy = Callable[[Array, Array], Array]


def evaluate_policy(
    policy: Policy, key: Array, n_episodes: int, params: EnvParams = DEFAULT_PARAMS
) -> dict[str, Array]:
    """Run ``n_episodes`` episodes (vmapped, ``max_steps`` scanned steps, no auto-reset) and
    return per-episode ``[n_episodes]`` metrics taken at each episode's last step:
    ``success`` (:func:`episode_success`), ``collision``, ``offroad``, ``goal``,
    ``progress_ratio``, ``return`` and ``length``. To compile it, jit a closure over
    ``policy``, ``n_episodes`` and ``params``: ``jax.jit(lambda k: evaluate_policy(pi, k, 256, params))``.
    """

    def one_episode(k: Array) -> dict[str, Array]:
        k_reset, k_act = jax.random.split(k)
        obs, state = reset(k_reset, params)
        first = {"done": jnp.zeros((), bool), "return": jnp.zeros(()), "length": jnp.zeros((), jnp.int32)}
        first |= episode_metrics(state, params)

        def body(
            carry: tuple[Array, EnvState, dict[str, Array]], k_t: Array
        ) -> tuple[tuple[Array, EnvState, dict[str, Array]], None]:
            obs, state, acc = carry
            obs, state, reward, terminated, truncated = step_env(None, state, policy(k_t, obs), params)
            live = ~acc["done"]
            new = episode_metrics(state, params) | {"done": terminated | truncated}
            new |= {"return": acc["return"] + reward, "length": acc["length"] + 1}
            acc = jax.tree.map(lambda n, o: jnp.where(live, n, o), new, acc)
            return (obs, state, acc), None

        (_, _, acc), _ = jax.lax.scan(body, (obs, state, first), jax.random.split(k_act, params.max_steps))
        acc["success"] = episode_success(acc["collision"], acc["offroad"], acc["progress_ratio"], params)
        del acc["done"]
        return acc

    return jax.vmap(one_episode)(jax.random.split(key, n_episodes))


def episode_trajectory(
    policy: Policy, key: Array, params: EnvParams = DEFAULT_PARAMS
) -> tuple[EnvState, Array, Array, dict[str, Array]]:
    """One episode of ``policy`` from ``reset(key)`` (the same keys as :func:`evaluate_policy`
    uses for one episode), for a picture.

    Returns:
        ``(first_state, xy [max_steps + 1, 2], length, metrics)``: the ego's positions,
        the last ones repeated after the episode ended at step ``length``, and the
        :func:`episode_metrics` of its last step.
    """
    k_reset, k_act = jax.random.split(key)
    obs, first = reset(k_reset, params)

    def body(carry: tuple[Array, EnvState, Array], k_t: Array) -> tuple[tuple[Array, EnvState, Array], Array]:
        obs, state, done = carry
        new_obs, new_state, _, terminated, truncated = step_env(None, state, policy(k_t, obs), params)
        keep = lambda new, old: jnp.where(done, old, new)  # noqa: E731
        state = jax.tree.map(keep, new_state, state)
        return (keep(new_obs, obs), state, done | terminated | truncated), jnp.stack([state.x, state.y])

    (_, last, _), xy = jax.lax.scan(body, (obs, first, jnp.zeros((), bool)), jax.random.split(k_act, params.max_steps))
    xy = jnp.concatenate([jnp.stack([first.x, first.y])[None], xy])
    return first, xy, last.time, episode_metrics(last, params)


def outcome_name(metrics: dict[str, Array]) -> str:
    """``"collision"``, ``"offroad"``, ``"goal"`` or ``"time limit"`` for one episode's metrics."""
    for name in ("collision", "offroad", "goal"):
        if bool(metrics[name]):
            return name
    return "time limit"


__all__ = [
    "ACTION_DIM",
    "AGENT_FEATURES",
    "DEFAULT_PARAMS",
    "EGO_FEATURES",
    "OBS_DIM",
    "OBS_NAMES",
    "TARGET_FEATURES",
    "EnvParams",
    "EnvState",
    "agent_boxes",
    "bicycle_step",
    "box_corners",
    "boxes_overlap",
    "ego_box",
    "ego_road_coords",
    "episode_metrics",
    "episode_success",
    "episode_trajectory",
    "evaluate_policy",
    "get_obs",
    "heuristic_policy",
    "idm_acceleration",
    "idm_step",
    "is_collision",
    "is_offroad",
    "lane_center",
    "make_road",
    "n_uniforms",
    "outcome_name",
    "progress_ratio",
    "project_to_road",
    "random_policy",
    "reset",
    "reward_fn",
    "road_pose",
    "scenario_from_uniforms",
    "step",
    "step_env",
]
