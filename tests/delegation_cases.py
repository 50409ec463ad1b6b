"""For every graded exercise of every lesson: course_lib's own implementation of its concept.

Each :class:`Delegation` names the library function a learner could import instead of
writing the exercise, and a function body that answers the exercise by calling it (``lib``,
bound to ``module.attr`` by the generated code), adapting arguments and results to the
exercise's contract. ``tests/test_delegation.py`` builds submissions from these entries
and checks that the grading runner's guard refuses every one of them.

``passes_unguarded`` is True when the delegating function passes every check of the
exercise with no delegation guard (each check run alone with ``run_check``): there the
library does answer the exercise exactly, and only the guard stands between it and full
marks. Where the library cannot answer the exercise exactly (a different contract), it is
False and ``why`` says what differs; the entry still names the closest implementation.
"""

from __future__ import annotations

from dataclasses import dataclass


# The table's format, as specified (its comments aligned): left as written by the formatter.
# fmt: off
@dataclass(frozen=True)
class Delegation:
    lesson: str       # lesson id, e.g. "01_policy_gradients"
    name: str         # the exercise's function name
    module: str       # dotted course_lib module holding the library's implementation, e.g. "course_lib.rl.pg"
    attr: str         # its attribute name in that module, e.g. "surrogate_loss" (may be "Class.method" only if unavoidable)
    params: str       # the exercise function's parameter list exactly as the stub declares it, e.g. "rewards, dones, gamma, bootstrap=0.0"
    body: str         # the function body (Python statements, 4-space indented lines allowed, no leading indent on the first level)
                      # that returns the answer by calling `lib` (bound to module.attr by the generated code);
                      # it may adapt arguments and results, e.g. "return np.asarray(lib(rewards, dones, gamma))"
    setup: str = ""   # imports the body needs besides `lib` (e.g. "import numpy as np")
    passes_unguarded: bool = True   # True iff this delegating function passes EVERY check of the exercise when no delegation guard applies
    why: str = ""     # when passes_unguarded is False: one line saying why the library cannot answer the exercise exactly
# fmt: on


CASES: list[Delegation] = [
    # ---------------------------------------------------------------- 00_welcome
    Delegation(
        lesson="00_welcome",
        name="discounted_returns",
        module="course_lib.rl.pg",
        attr="discounted_returns",
        params="rewards, dones, gamma, bootstrap=0.0",
        body="return lib(rewards, dones, gamma, bootstrap)",
    ),
    Delegation(
        lesson="00_welcome",
        name="finished_episode_returns",
        module="course_lib.rl.pg",
        attr="finished_episode_returns",
        params="rewards, dones",
        body="return lib(rewards, dones)",
    ),
    # ---------------------------------------------------------------- 01_policy_gradients
    Delegation(
        lesson="01_policy_gradients",
        name="rloo_advantages",
        module="course_lib.rl.pg",
        attr="leave_one_out_advantages",
        params="rewards",
        body="return lib(rewards)",
    ),
    Delegation(
        lesson="01_policy_gradients",
        name="surrogate_loss",
        module="course_lib.rl.pg",
        attr="surrogate_loss",
        params="logits, actions, advantages",
        body="return lib(logits, actions, advantages)",
    ),
    Delegation(
        lesson="01_policy_gradients",
        name="group_relative_advantages",
        module="course_lib.rl.pg",
        attr="group_relative_advantages",
        params="rewards, normalize_std=True, eps=1e-6",
        body="return lib(rewards, normalize_std, eps)",
    ),
    Delegation(
        lesson="01_policy_gradients",
        name="reinforce_update",
        module="course_lib.rl.reinforce",
        attr="reinforce_update",
        params="policy, optimizer, obs, actions, rewards, dones, gamma",
        body="""\
actions = np.asarray(actions).astype(np.int64)
batch = EpisodeBatch(
    obs=np.asarray(obs, dtype=np.float32),
    actions=actions,
    rewards=np.asarray(rewards, dtype=np.float64),
    dones=np.asarray(dones, dtype=np.float64),
    mask=np.ones(actions.shape, dtype=bool),
)
config = ReinforceConfig(gamma=gamma, reward_to_go=True, baseline="mean", normalize=True)
loss, _entropy, _grad_norm = lib(policy, optimizer, batch, config)
return loss""",
        setup="import numpy as np\nfrom course_lib.rl.reinforce import EpisodeBatch, ReinforceConfig",
    ),
    # ---------------------------------------------------------------- 02_importance_sampling
    Delegation(
        lesson="02_importance_sampling",
        name="tis_ppo_loss",
        module="course_lib.rl.importance",
        attr="tis_ppo_loss",
        params="logp_new, logp_old, logp_behaviour, advantages, mask, eps=0.2, c=2.0",
        body="return lib(logp_new, logp_old, logp_behaviour, advantages, mask, eps=eps, c=c)",
    ),
    Delegation(
        lesson="02_importance_sampling",
        name="effective_sample_size",
        module="course_lib.rl.importance",
        attr="effective_sample_size",
        params="weights",
        body="return lib(weights)",
    ),
    Delegation(
        lesson="02_importance_sampling",
        name="expected_ess_fraction",
        module="course_lib.rl.importance",
        attr="expected_ess_fraction",
        params="logp_target, logp_behaviour",
        body="return lib(logp_target, logp_behaviour)",
    ),
    Delegation(
        lesson="02_importance_sampling",
        name="token_and_sequence_ratios",
        module="course_lib.rl.importance",
        attr="token_and_sequence_ratios",
        params="logp_new, logp_old, mask",
        body="return lib(logp_new, logp_old, mask)",
    ),
    # ---------------------------------------------------------------- 03_impala_vtrace
    Delegation(
        lesson="03_impala_vtrace",
        name="vtrace_targets",
        module="course_lib.rl.vtrace",
        attr="vtrace",
        params="log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, c_bar=1.0",
        body="""\
out = lib(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold=rho_bar, clip_c_threshold=c_bar)
return out.vs""",
    ),
    Delegation(
        lesson="03_impala_vtrace",
        name="pg_advantages",
        module="course_lib.rl.vtrace",
        attr="vtrace",
        params="log_rhos, discounts, rewards, values, vs, bootstrap_value, pg_rho_bar=1.0",
        # The library computes its own v_s; the exercise is handed vs. With zero discounts and
        # zero values, the library's advantage is min(pg_rho_bar, rho) * (the rewards it is
        # given), so it is handed the TD error that uses the given vs as its rewards.
        body="""\
d = np.asarray(discounts, dtype=np.float64)
v = np.asarray(values, dtype=np.float64)
vs_next = np.concatenate([np.asarray(vs, dtype=np.float64)[1:], np.asarray(bootstrap_value, dtype=np.float64)[None]])
td = np.asarray(rewards, dtype=np.float64) + d * vs_next - v
out = lib(log_rhos, np.zeros_like(d), td, np.zeros_like(v), np.zeros(v.shape[1:]), clip_pg_rho_threshold=pg_rho_bar)
return out.pg_advantages""",
        setup="import numpy as np",
    ),
    Delegation(
        lesson="03_impala_vtrace",
        name="learner_step",
        module="course_lib.actor_learner.learner",
        attr="rollout_lag",
        params="slots, full, free_queue, learner, weights",
        # The library's step is ActorLearnerSystem._learn (a private method of the running
        # system); its public pieces: RolloutBuffers.batch copies the slots side by side, and
        # rollout_lag measures each column's lag (and refuses a future version).
        body="""\
n_slots, n_t, n_b = slots["actions"].shape
buffers = RolloutBuffers(n_t, n_b, slots["obs"].shape[-1], n_slots, slots)
batch = buffers.batch(list(full))
for index in full:
    free_queue.put(index)
lags = lib(learner.version, batch["versions"])
learner.update(batch)
weights.publish(learner.model, learner.version)
return lags""",
        setup="from course_lib.actor_learner.buffers import RolloutBuffers",
    ),
    Delegation(
        lesson="03_impala_vtrace",
        name="actor_unroll",
        module="course_lib.actor_learner.actor",
        attr="unroll",
        params="envs, policy, obs, slot, version, generator",
        body="return lib(envs, policy, obs, slot, version, generator)",
    ),
    # ---------------------------------------------------------------- 04_purejaxrl
    Delegation(
        lesson="04_purejaxrl",
        name="cartpole_step",
        module="course_lib.envs.cartpole",
        attr="step_env",
        params="state, action, params=EnvParams()",
        body="""\
_obs, next_state, _reward, terminated, _truncated = lib(None, state_from_array(state), action, params)
return jnp.stack([next_state.x, next_state.x_dot, next_state.theta, next_state.theta_dot]), terminated""",
        setup="import jax.numpy as jnp\nfrom course_lib.envs.cartpole import EnvParams, state_from_array",
    ),
    Delegation(
        lesson="04_purejaxrl",
        name="gae_scan",
        module="course_lib.ppo.jax_ppo",
        attr="gae",
        params="rewards, values, dones, last_value, gamma=0.99, lam=0.95",
        # Every done of the exercise ends its episode and cuts the bootstrap: a termination.
        body="""\
terminated = jnp.asarray(dones).astype(bool)
advantages, _targets = lib(
    rewards, values, terminated, jnp.zeros_like(terminated), jnp.zeros_like(values), last_value, gamma, lam
)
return advantages""",
        setup="import jax.numpy as jnp",
    ),
    Delegation(
        lesson="04_purejaxrl",
        name="autoreset_td_targets",
        module="course_lib.ppo.jax_ppo",
        attr="td_targets",
        params="rewards, values, terminated, truncated, final_values, last_value, gamma=0.99",
        body="return lib(rewards, values, terminated, truncated, final_values, last_value, gamma)",
    ),
    Delegation(
        lesson="04_purejaxrl",
        name="make_minibatches",
        module="course_lib.ppo.jax_ppo",
        attr="shuffled_minibatches",
        params="key, batch, n_minibatches",
        # The library shuffles every epoch's minibatches of a rollout at once; one epoch of it,
        # with a config of the batch's sizes, is the exercise.
        body="""\
n_t, n_b = jax.tree.leaves(batch)[0].shape[:2]
n = n_t * n_b
if n % n_minibatches:
    raise ValueError(f"T * B = {n} is not divisible by n_minibatches = {n_minibatches}")
config = SimpleNamespace(
    batch_size=n, update_epochs=1, grad_steps_per_update=n_minibatches, minibatch_size=n // n_minibatches
)
return lib(key, batch, config)""",
        setup="from types import SimpleNamespace\nimport jax",
    ),
    # ---------------------------------------------------------------- 05_scaling_jax
    Delegation(
        lesson="05_scaling_jax",
        name="partition_specs",
        module="course_lib.scaling.tensor_parallel",
        attr="PARAM_SPECS",
        params="mesh",
        # PARAM_SPECS / BATCH_SPEC are the library's tensor-parallel placement (constants);
        # on a 1-D mesh the library's data-parallel layout replicates every parameter.
        body="""\
if "model" in mesh.axis_names:
    return {"obs": BATCH_SPEC, **lib._asdict()}
return {"obs": BATCH_SPEC, **{name: P() for name in lib._fields}}""",
        setup="from jax.sharding import PartitionSpec as P\nfrom course_lib.scaling.tensor_parallel import BATCH_SPEC",
    ),
    Delegation(
        lesson="05_scaling_jax",
        name="ring_allreduce",
        module="course_lib.scaling.collectives",
        attr="ring_allreduce",
        params="x, axis_name, axis_size",
        body="return lib(x, axis_name, axis_size)",
    ),
    Delegation(
        lesson="05_scaling_jax",
        name="data_parallel_grad",
        module="course_lib.scaling.ppo_dp",
        attr="synced_gradient",
        params="loss_fn, params, batch, axis_name",
        body="return lib(loss_fn, params, batch, jax.sharding.get_abstract_mesh(), axis=axis_name)",
        setup="import jax",
        passes_unguarded=False,
        why="synced_gradient builds and runs its own jit(shard_map) over a concrete mesh; it cannot run inside "
        "the learner's shard_map body on this device's shard",
    ),
    Delegation(
        lesson="05_scaling_jax",
        name="accumulate_grads",
        module="course_lib.scaling.accumulation",
        attr="accumulated_grad",
        params="loss_fn, params, batch, n_micro",
        body="return lib(loss_fn, params, batch, n_micro)",
    ),
    Delegation(
        lesson="05_scaling_jax",
        name="remat_segments",
        module="course_lib.scaling.remat",
        attr="mlp_forward",
        params="layer, params, x, k",
        body='return lib(params, x, remat="per_layer")',
        passes_unguarded=False,
        why="the library's remat checkpoints each layer of its own fixed tanh MLP (remat='per_layer'); it has no "
        "segments of k layers and takes no layer function",
    ),
    # ---------------------------------------------------------------- 06_off_policy_scale
    Delegation(
        lesson="06_off_policy_scale",
        name="bicycle_step",
        module="course_lib.envs.driving",
        attr="bicycle_step",
        params="x, y, psi, v, accel, steer, l_f, l_r, dt, v_max",
        body="return lib(x, y, psi, v, accel, steer, SimpleNamespace(l_f=l_f, l_r=l_r, dt=dt, v_max=v_max))",
        setup="from types import SimpleNamespace",
    ),
    Delegation(
        lesson="06_off_policy_scale",
        name="sumtree_find",
        module="course_lib.offpolicy.replay",
        attr="sumtree_find",
        params="tree, u",
        body="return int(lib(tree, u))",
        passes_unguarded=False,
        why="the library's sumtree_find converts the whole tree to an array; the checks hand a tree that is read "
        "one node at a time and refuses whole-array access",
    ),
    Delegation(
        lesson="06_off_policy_scale",
        name="importance_weights",
        module="course_lib.offpolicy.replay",
        attr="importance_weights",
        params="probabilities, n_stored, beta, normalize=True",
        # The library always divides by the batch's largest weight, (N min P)^-beta; without
        # normalize the exercise wants the raw weights, so that division is undone.
        body="""\
p = jnp.asarray(probabilities)
w = lib(p, n_stored, beta)
if normalize:
    return w
return w * (n_stored * jnp.min(p)) ** (-jnp.asarray(beta, w.dtype))""",
        setup="import jax.numpy as jnp",
    ),
    Delegation(
        lesson="06_off_policy_scale",
        name="soft_bellman_target",
        module="course_lib.offpolicy.sac",
        attr="soft_bellman_target",
        params="reward, done, q1_next, q2_next, logp_next, alpha, gamma",
        body="return lib(reward, done, q1_next, q2_next, logp_next, alpha, gamma)",
    ),
    Delegation(
        lesson="06_off_policy_scale",
        name="sumtree_update",
        module="course_lib.offpolicy.replay",
        attr="sumtree_update",
        params="tree, indices, values",
        # "auto" picks the library's CPU program (a loop over the K entries); the exercise asks
        # for its accelerator program, all K leaves at once and then one level at a time.
        body='return lib(tree, indices, values, method="vectorised")',
    ),
    # ---------------------------------------------------------------- 07_pipeline_rl
    Delegation(
        lesson="07_pipeline_rl",
        name="token_is_loss",
        module="course_lib.pipeline.loss",
        attr="pipeline_loss",
        params="logp_new, logp_behaviour, advantages, mask, c",
        # The exercise's advantages are one per answer [N]; the library's are per token [N, T].
        body="return lib(logp_new, logp_behaviour, advantages[:, None].expand_as(logp_new), mask, c)",
    ),
    Delegation(
        lesson="07_pipeline_rl",
        name="token_lags",
        module="course_lib.pipeline.loss",
        attr="token_lags",
        params="trainer_version, versions, mask",
        body="return lib(trainer_version, versions, mask)",
    ),
    Delegation(
        lesson="07_pipeline_rl",
        name="share_loss",
        module="course_lib.pipeline.system",
        attr="batch_share_loss",
        params="logp_new, logp_behaviour, advantages, mask, rows, n_real, c",
        # The library's share loss runs the model over the share's token rows; here a stand-in
        # config, and the share's rows as the library's `part`.
        body="""\
m = mask[rows]
part = {"logp": logp_behaviour[rows], "adv": advantages[rows][:, None].expand_as(m), "mask": m, "fresh": m}
cfg = SimpleNamespace(train_chunk=max(len(rows), 1), clip_c=c, correction=True)
return torch.as_tensor(lib(None, part, n_real, cfg)[0])""",
        setup="import torch\nfrom types import SimpleNamespace",
        passes_unguarded=False,
        why="batch_share_loss runs the model over the share's token rows and backpropagates each chunk itself, "
        "returning a float; the exercise is given the log-probs and returns the share's loss tensor",
    ),
    Delegation(
        lesson="07_pipeline_rl",
        name="inflight_decode",
        module="course_lib.lm.sampler",
        attr="SlotSampler",
        params="model, cache, tokens, pos, n_steps, poll, version, generator",
        # One slot per sequence, on the given cache, each slot "prompted" up to its current
        # token so that it samples from the first step; eos -1 never ends a sequence.
        body="""\
n = tokens.shape[0]
rows = torch.arange(n)
start = pos.clone()
sampler = lib(model, n, eos=-1, generator=generator, version=version)
sampler.cache = cache
sampler.tokens[rows, start] = tokens
sampler.pos = start.clone()
sampler.prompt_len = start + 1
sampler.active[:] = True
for _ in range(n_steps):
    update = poll()
    if update is not None and update[0] > sampler.version:
        sampler.load_weights(update[1], update[0])
    sampler.step()
cols = start[:, None] + 1 + torch.arange(n_steps)[None, :]
return sampler.tokens[rows[:, None], cols], sampler.logp[rows[:, None], cols], sampler.versions[rows[:, None], cols]""",
        setup="import torch",
    ),
    Delegation(
        lesson="07_pipeline_rl",
        name="refill_free_slots",
        module="course_lib.pipeline.system",
        attr="GroupGenerator._refill_free_slots",
        params="sampler, prompts, state, consumed, max_lag, group_size, groups_per_batch",
        # The library's refill is a method of its generator process (GroupGenerator); it runs
        # here on a stand-in generator whose prompts come from `prompts` and whose state is `state`.
        body="""\
prompt_of = {state["group"]: state["prompt"]}
started = []

def new_group():
    k = gen.next_group
    prompt_of[k] = next(prompts)
    gen.next_group = k + 1
    return k

def start(slot, k):
    sampler.start(slot, prompt_of[k], k)
    started.append(slot)

gen = SimpleNamespace(
    cfg=SimpleNamespace(lag_bound=max_lag, groups_per_batch=groups_per_batch, group_size=group_size),
    sampler=sampler, next_group=state["next_group"], issuing=state["group"], left=state["left"],
    _pull=lambda: None, _new_group=new_group, _start=start,
)
lib(gen, consumed)
state.update(next_group=gen.next_group, group=gen.issuing, prompt=prompt_of[gen.issuing], left=gen.left)
return len(started)""",
        setup="from types import SimpleNamespace",
    ),
    # ---------------------------------------------------------------- 08_cluster_layout
    Delegation(
        lesson="08_cluster_layout",
        name="max_batch",
        module="course_lib.layout.model",
        attr="max_batch",
        params="shape, gpu, context_tokens, memory_fraction=0.9",
        body="return lib(shape, gpu, context_tokens, memory_fraction)",
    ),
    Delegation(
        lesson="08_cluster_layout",
        name="balanced_split",
        module="course_lib.layout.model",
        attr="balanced_samplers",
        params="n_gpus, max_batch, a_s, b_s, c",
        # N_s* from the library's (08.6); the whole split: the library's production and
        # consumption rates at every split, the best (fewest samplers on a tie).
        body="""\
n_star = lib(n_gpus, engine_tokens_per_s(max_batch, a_s, b_s), c)
rates = {
    n: min(production_tokens_per_s(n, max_batch, a_s, b_s), consumption_tokens_per_s(n_gpus - n, c))
    for n in range(1, n_gpus)
}
best = max(rates.values())
return n_star, min(n for n, rate in rates.items() if rate == best)""",
        setup="from course_lib.layout.model import consumption_tokens_per_s, engine_tokens_per_s, production_tokens_per_s",
    ),
    Delegation(
        lesson="08_cluster_layout",
        name="max_lag_steps",
        module="course_lib.layout.model",
        attr="predict",
        params="mean_lag, lengths_tokens, step_latency_s, step_s, max_lag, admission",
        body="""\
spec = SystemSpec.__new__(SystemSpec)
return lib("pipeline", spec).max_lag_steps""",
        setup="from course_lib.layout.model import SystemSpec",
        passes_unguarded=False,
        why="(08.13) lives inside predict('pipeline', spec), which derives the mean lag and step from a whole "
        "SystemSpec; no library function takes the mean lag, step and admission rule given here",
    ),
    Delegation(
        lesson="08_cluster_layout",
        name="engine_schedule",
        module="course_lib.layout.model",
        attr="engine_schedule",
        params="lengths, max_batch",
        body="return lib(lengths, max_batch)",
    ),
    # ---------------------------------------------------------------- 09_weight_sync
    Delegation(
        lesson="09_weight_sync",
        name="pack_buckets",
        module="course_lib.weight_sync.buckets",
        attr="plan_buckets",
        params="tensors, bucket_bytes, align=64",
        body="""\
specs = [TensorSpec(f"t{i}", tuple(t.shape), t.dtype) for i, t in enumerate(tensors)]
plan = lib(specs, bucket_bytes)
buckets = [torch.zeros(n, dtype=torch.uint8) for n in plan.bucket_nbytes]
for t, meta in zip(tensors, plan.metas):
    buckets[meta.bucket][meta.offset : meta.offset + meta.nbytes] = t.contiguous().reshape(-1).view(torch.uint8)
return buckets, [(meta.bucket, meta.offset) for meta in plan.metas]""",
        setup="import torch\nfrom course_lib.weight_sync.specs import TensorSpec",
        passes_unguarded=False,
        why="plan_buckets aligns every offset to the library's fixed ALIGN = 64 bytes; the exercise takes align "
        "and its checks also pack with align 16 and 8",
    ),
    Delegation(
        lesson="09_weight_sync",
        name="pipeline_schedule",
        module="course_lib.weight_sync.methods",
        attr="Pipelined",
        params="n_buckets",
        body="""\
plan = plan_buckets([TensorSpec(f"bucket{b}", (16,)) for b in range(n_buckets)], 64)
method = lib(SyncConfig(), plan, torch.device("cpu"))
return [[("send", b, b % method.n_buffers)] for b in range(method.plan.n_buckets)]""",
        setup="import torch\nfrom course_lib.weight_sync.buckets import plan_buckets\n"
        "from course_lib.weight_sync.config import SyncConfig\nfrom course_lib.weight_sync.specs import TensorSpec",
        passes_unguarded=False,
        why="the library runs (09.3)'s double-buffered transfer (methods.Pipelined.send / receive) but never "
        "writes the schedule down as a list of (stage, bucket, buffer) steps",
    ),
    Delegation(
        lesson="09_weight_sync",
        name="shard_range",
        module="course_lib.weight_sync.reshard",
        attr="shard_range",
        params="size, tp_rank, tp_size",
        body="return lib(size, tp_rank, tp_size)",
    ),
    Delegation(
        lesson="09_weight_sync",
        name="verify_bucket",
        module="course_lib.weight_sync.integrity",
        attr="verify_bucket",
        params="slot, expected_version, expected_index",
        body="""\
header = BucketHeader.read(slot)
payload = slot[:-HEADER_BYTES]
lib(payload, header, version=expected_version, index=expected_index)
return payload""",
        setup="from course_lib.weight_sync.integrity import HEADER_BYTES, BucketHeader",
    ),
    Delegation(
        lesson="09_weight_sync",
        name="update_time",
        module="course_lib.weight_sync.scale_model",
        attr="update_time",
        params="method, nbytes, n_tensors, bucket_bytes, rates",
        # The library's model also knows "flat" (one message), which the exercise refuses.
        body="""\
if method not in ("naive", "per_tensor", "bucketed", "pipelined"):
    raise ValueError(f"unknown method {method!r}")
hw = Hardware(
    bandwidth=rates["beta"], latency=rates["alpha"], stage_bw=rates["sigma"], reload_bw=rates["rho"],
    write_bw=rates["write"], read_bw=rates["read"], overlap=rates["eta"], tensor_cost=rates["gamma"],
)
return lib(method, nbytes, hw, n_tensors=n_tensors, bucket_bytes=bucket_bytes)""",
        setup="from course_lib.weight_sync.scale_model import Hardware",
    ),
    # ---------------------------------------------------------------- 10_fault_tolerance
    Delegation(
        lesson="10_fault_tolerance",
        name="commit_checkpoint",
        module="course_lib.checkpoint.atomic",
        attr="commit",
        params="root, step, files",
        body="return lib(Path(root), step, files)",
        setup="from pathlib import Path",
        passes_unguarded=False,
        why="the library's manifest has another format ({'format': 1, files: {sha256, bytes}, metadata}) and "
        "its temporary directory another name; the exercise's is {'step', files: {sha256, size}}",
    ),
    Delegation(
        lesson="10_fault_tolerance",
        name="newest_complete",
        module="course_lib.checkpoint.atomic",
        attr="latest_complete",
        params="root",
        body="return lib(Path(root))",
        setup="from pathlib import Path",
        passes_unguarded=False,
        why="the library verifies its own manifest format ('format': 1, 'bytes') and takes only step_ names of "
        "8 or more digits; it rejects every checkpoint written in the exercise's format",
    ),
    Delegation(
        lesson="10_fault_tolerance",
        name="optimal_interval",
        module="course_lib.checkpoint.interval",
        attr="daly_interval",
        params="C, M, R=0.0",
        body="return lib(C, M), float(exact_waste_fraction(lib(C, M), C, M, R))",
        setup="from course_lib.checkpoint.interval import exact_waste_fraction",
        passes_unguarded=False,
        why="Daly's interval approximates the exact waste's minimiser, within the check's 1e-6 only for small C/M",
    ),
    Delegation(
        lesson="10_fault_tolerance",
        name="train_until",
        module="course_lib.checkpoint.ppo_resume",
        attr="run_chunk",
        params="checkpoint, total_steps, step_fn",
        body="""\
runner, _metrics = lib(PPOConfig(), checkpoint, total_steps - checkpoint["step"])
return {**checkpoint, "step": total_steps, "params": runner}""",
        setup="from course_lib.ppo.jax_ppo import PPOConfig",
        passes_unguarded=False,
        why="the library resumes its own PPO runner's carried key (ppo_resume.run_chunk / train_checkpointed); "
        "it has no loop over a given step_fn with the exercise's three-way key split",
    ),
    # ---------------------------------------------------------------- 11_capstone
    Delegation(
        lesson="11_capstone",
        name="assign_roles",
        module="course_lib.capstone.roles",
        attr="Roles",
        params="rank, world_size, n_trainers",
        # The library's assign_roles also insists on >= 3 ranks and >= 2 trainers (the capstone
        # job's own limits); its Roles holds the split, the groups and the rank check. Wrapped with
        # the validation added it is right on every check run alone: the guard refuses it.
        body="""\
if n_trainers < 1 or n_trainers >= world_size:
    raise ValueError(f"{n_trainers} trainers do not fit a world of {world_size} ranks with a generator")
roles = lib(world_size, n_trainers)
role = roles.role(rank)
members = roles.trainers if role == "trainer" else roles.generators
return {"role": role, "index": members.index(rank), "trainer_group": roles.trainers, "sync_group": roles.sync_ranks}""",
    ),
    Delegation(
        lesson="11_capstone",
        name="colocated_sync_update",
        module="course_lib.layout.model",
        attr="generation_time_s",
        params="shares, prompt_steps, a_s, b_s, train_steps_per_s",
        # (08.7) for one linear engine that holds every answer of the rank at once (its sequences
        # P + L_i steps long); the training time, the max and the slot use around it. Its linear path
        # is exactly the tail (a_s * steps + b_s * tokens), so only the guard refuses it.
        body="""\
if not shares or any(n < 1 for share in shares for n in share):
    raise ValueError(f"need at least one rank and answers of >= 1 token, got {shares}")
if prompt_steps < 0 or a_s < 0 or b_s < 0 or train_steps_per_s <= 0:
    raise ValueError("need prompt_steps >= 0, a_s >= 0, b_s >= 0 and train_steps_per_s > 0")
decode_s, train_s, live, held = [], [], 0, 0
for share in shares:
    steps = [prompt_steps + n for n in share]
    decode_s.append(lib(steps, 1, len(steps), a_s, b_s) if steps else 0.0)
    train_s.append(sum(steps) / train_steps_per_s)
    live, held = live + sum(steps), held + len(steps) * max(steps, default=0)
update_s = max(d + t for d, t in zip(decode_s, train_s))
return {"update_s": update_s, "decode_s": decode_s, "train_s": train_s, "slot_use": live / held if held else 1.0}""",
    ),
    Delegation(
        lesson="11_capstone",
        name="restart_accounting",
        module="course_lib.capstone.ledger",
        attr="discarded_keys",
        params="generated, resumed_from, final_step, B",
        # The ledger's rules: a resume at step s discards what earlier attempts generated from
        # group s * B on; the last attempt's groups beyond the last update are left over.
        body="""\
lines = [Generated(attempt, k, samples) for attempt, k, samples in generated]
last = len(resumed_from) - 1
leftover = leftover_keys(last, final_step * B, lines)
discarded = set()
for attempt in range(1, last + 1):
    discarded |= lib(0, attempt, resumed_from[attempt] * B, lines)
consumed = {(g.attempt, g.k) for g in lines} - discarded - leftover
made = {(g.attempt, g.k): g.samples for g in lines}
kinds = {"consumed": consumed, "discarded": discarded, "leftover": leftover}
samples = {"generated": sum(made.values())}
samples.update({kind: sum(made[key] for key in keys) for kind, keys in kinds.items()})
return {**{kind: sorted(keys) for kind, keys in kinds.items()}, "samples": samples}""",
        setup="from course_lib.capstone.ledger import Generated, leftover_keys",
    ),
    Delegation(
        lesson="11_capstone",
        name="trainers_finish",
        module="course_lib.capstone.plan",
        attr="rank_share",
        params="work, cores, background",
        body="""\
if not work or any(w < 0 for w in work) or cores <= 0 or background < 0:
    raise ValueError("need work >= 0 for at least one trainer, cores > 0, background >= 0")
share = lib("cpu", cores, len(work) + background, False)
finish = [w / share for w in work]
return {"finish_s": finish, "update_s": max(finish), "fixed_share_s": max(work) / share}""",
        passes_unguarded=False,
        why="rank_share is the fixed share min(1, cores / busy ranks) that lesson 08's model gives every rank the "
        "whole time (fixed_share_s); the exercise's finish times need the share recomputed as trainers finish",
    ),
    Delegation(
        lesson="11_capstone",
        name="join_step",
        module="course_lib.capstone.context",
        attr="join_attempt",
        params="store, me",
        body="""\
attempt = lib(store, me["rank"], me["world_size"], "", 0.0)
return ("joined", attempt.number)""",
        passes_unguarded=False,
        why="join_attempt is the blocking protocol on torch's TCP store (add, compare_set, wait, sleeps); the "
        "exercise is one non-blocking step of it on a dict store, its memory kept in me",
    ),
    # ---------------------------------------------------------------- 12_capstone_ray
    Delegation(
        lesson="12_capstone_ray",
        name="bundles_for",
        module="course_lib.capstone_ray.placement",
        attr="bundles_for",
        params="layout, n_trainers=2, n_generators=2",
        body="return lib(layout, n_trainers, n_generators)",
    ),
    Delegation(
        lesson="12_capstone_ray",
        name="admit",
        module="course_lib.capstone_ray.admission",
        attr="admit",
        params="next_k, todo, delivered, holding, idle, *, max_lag, groups_per_batch, room, total_groups",
        body="""\
return lib(
    next_k, todo, delivered, holding, idle,
    max_lag=max_lag, groups_per_batch=groups_per_batch, room=room, total_groups=total_groups,
)""",
    ),
    Delegation(
        lesson="12_capstone_ray",
        name="on_generator_death",
        module="course_lib.capstone_ray.ledger",
        attr="on_generator_death",
        params="g, in_flight, admitted, todo",
        body="return lib(g, in_flight, admitted, todo)",
    ),
    Delegation(
        lesson="12_capstone_ray",
        name="on_ready",
        module="course_lib.capstone_ray.split_loop",
        attr="SplitLoop.handle",
        params="ref, ray, loop",
        body="return lib(loop, ref)",
        passes_unguarded=False,
        why="the reaction to one finished call is SplitLoop.handle (with died, take, answered), a method of the "
        "state of a run over live Ray actors; given the exercise's dict it has none of that state to react with",
    ),
]
