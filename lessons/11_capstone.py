# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · Capstone: a multi-process asynchronous RL run, launched by torchrun
#
# Lessons 07-10 built the parts of an asynchronous RL system one at a time, each in a
# setting made to show it: a pipeline with one generator and one trainer process (07), a
# model that lays out a cluster (08), a weight-update engine (09), checkpoints that a
# `SIGKILL` cannot tear (10). This lesson runs them together as **one job**, the way a
# training cluster runs: `torchrun` starts identical processes (ranks), each reads its rank
# and takes a role; **generator** ranks decode with continuous batching and swap new weights
# in between two decoding steps; **trainer** ranks learn data-parallel and all-reduce their
# gradients; trainer 0 broadcasts every new policy to the generators with lesson 09's
# engine and commits a checkpoint every few updates; when a rank dies, torchrun restarts
# the job and it resumes from the newest complete checkpoint.
#
# This notebook is the run's **report**: it launches the default run, then reads every
# rank's logs back and checks each claim the system makes, with its numbers.
#
# **Learning goals**
# 1. Launch a multi-process RL job with `torchrun` (roles by rank, process groups, a
#    rendezvous store), and read what lesson 08's model chose for it and predicted.
# 2. Read learning off a distributed run: batch reward against wall-clock time, and the
#    held-out reward at the start and the end.
# 3. Compare measured throughput with the model's prediction, and explain the error with
#    the time each rank spent in each phase.
# 4. Check the staleness bound on every consumed token, across processes.
# 5. Read a per-rank timeline (decode, weight transfer, train, wait, checkpoint) and the
#    weight-sync latency and bandwidth of every update.
# 6. Kill a rank mid-run, watch torchrun restart the job from its checkpoint, and audit
#    the samples the trainers recorded against what the generators made: none lost or
#    counted twice, and no process left behind.
# 7. Measure asynchronous, synchronous and colocated RL side by side (interleaved, paired
#    per round, in updates/s), and set each beside the model's prediction: where it
#    agrees, where it misses, and why.
# 8. Map each part of the run to where production systems (PipelineRL, verl, AReaL,
#    checkpoint-engine, prime-rl) put it, and to their knobs.
#
# Builds on lesson 05 (several processes, collectives), lesson 07 (the pipeline: KV-cache
# sampler, in-flight updates, truncated-IS loss, backpressure), lesson 08 (the layout
# model), lesson 09 (the weight-update engine) and lesson 10 (atomic checkpoints, restarts).

# %%
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, describe, pick, show_source

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")
WORK = Path(tempfile.mkdtemp(prefix="lesson11-"))  # the runs of this lesson write here
# every multi-process run below gives up with its own error before the notebook's cell
# limit (300 s under nbval, 1800 s under `course run`) would kill the kernel with none
DEADLINE_S = pick(cpu=240, full=1500)  # below course run's 1800 s cell limit at full scale

# %% [markdown]
# ## The system
#
# ```
#   torchrun agent ── starts W ranks, restarts all of them if one dies (--max-restarts), c10d store
#        │
#        ├── rank 0  TRAINER 0 ── checkpoints every 40 updates (lesson 10: atomic commit)
#        │     │  ▲        │
#        │grads│  │        │ weights: lesson 09's engine (bucketed, pipelined, checksummed,
#        │     ▼  │        │ all-or-nothing) on the sync group {trainer 0, generators}
#        ├── rank 1  TRAINER 1          ▼                        ▼
#        │   (all-reduce on the      rank 2 GENERATOR   ...   rank W-1 GENERATOR
#        │    trainer group)          SlotSampler (lesson 07): continuous batching,
#        │          ▲                 in-flight weight updates, KV cache kept
#        │          │                        │
#        │          └──── group k: prompt, G answers, behaviour log-probs, per-token
#        │                versions, rewards (through the store) ◄──┘
#        └── store: announced version, consumed groups (backpressure), group counter, stop
# ```
#
# Every rank runs the same script (`python -m course_lib.capstone.job`). Rank 0 prepares
# the run (a short supervised warm start, a calibration of this machine that takes a second or less, the
# layout that lesson 08's model predicts to be fastest) and posts it in the store; then
# ranks `0 .. T-1` train and ranks `T .. W-1` generate. Every rank appends JSON lines
# (phases, updates, weight transfers, evaluations, events) to its own file under
# `run_dir/metrics/`; everything below is read from those files.
#
# A simplification to know: the groups themselves travel as JSON through torchrun's TCP
# store, and every generator polls the store once per decoding step. That is enough for a
# TinyLM on one host and naive at scale, where rollouts move through a queue or an object
# store (Ray's, Redis) or straight into the trainers' memory, and control through RPC.

# %% [markdown]
# ## Key equations
#
# **Data-parallel loss.** Update $u$ consumes the $B$ groups $k = uB \dots (u+1)B-1$;
# trainer $r$ of $N_t$ takes its shard $S_r$ of them (the same every run). Each shard's loss
# divides by the token count $N_{tok}$ of the *whole* batch (one all-reduce of a number),
# so the all-reduced **sum** of the shards' gradients is exactly the gradient of lesson
# 07's loss (07.2) on the whole batch:
#
# $$L_r = -\frac{1}{N_{tok}} \sum_{(i,t) \in S_r} \mathrm{sg}[w_{it}]\, A_i\, \log\pi_u(y_{it}\mid x, y_{i,<t}),
#   \qquad \nabla L = \sum_{r=1}^{N_t} \nabla L_r \qquad (11.1)$$
#
# with $w_{it}$ the truncated per-token importance weight (07.1) at $c = 2$ and $A_i$ the
# group-relative advantage (07.3).
#
# **The lag bound across processes.** A generator may start group $k$ only if
# $k < \text{consumed} + (k_{max} + 1) B$ (lesson 07's backpressure), where trainer 0
# raises `consumed` to $vB$ only after version $v$ went out. So group $k$ starts with a
# version $\ge \text{consumed}/B$, is consumed by update $\lfloor k/B \rfloor$, and every
# token $t$ of every answer $i$ satisfies
#
# $$0 \le \text{lag}_{it} = u - v_{it} \le k_{max} \qquad (11.2)$$
#
# (`max_lag` $= k_{max} = 4$ here; 0 is synchronous RL).
#
# **The prediction on shared cores.** Lesson 08's pipeline throughput (08.11), with the
# rates rank 0 measures alone (one thread each: a decoding step of $S$ slots takes
# $l_1(S)$, a trainer consumes $c_1$ sequence steps per second) and every rate scaled by
# the share of a core each of the $W$ ranks gets, $\sigma = \min(1, \text{cores}/W)$;
# sequence steps are the answer's $\bar L$ tokens plus $P = 3$ prompt steps:
#
# $$\widehat{T} = \frac{\bar L}{\bar L + P}\,\min\Big(\frac{N_s\, S\, \sigma}{l_1(S)},\ N_t\, c_1\, \sigma\Big) \qquad (11.3)$$
#
# answer tokens per second, for $N_s = W - N_t$ generators of $S$ slots, when nothing else
# binds. Two more rules of lesson 08 can hold it lower (the table below prints every term
# and what binds): the admission window (08.11) counts what else it holds (the queue, the
# batch in training, the weights on their way); and the capstone's trainer takes its groups
# in ticket order and **waits** for a straggler, so an update is at least the longest
# answer's decoding divided by `max_lag` (08.14):
#
# $$t_{step} \ge \frac{L_{max}\, l(B_w) + d}{\lfloor k_{max} \rfloor} \qquad (08.14)$$
#
# with $L_{max}$ the batch's longest answer in decoding steps, $l(B_w)$ a step of the
# engines' batch while they wait, $d$ the weight update (the capstone's planner gives the
# model $d = 0$: the calibration runs before any rank could receive weights, and section 3
# measures the sends). The share $\sigma$ is per regime: in the
# pipeline every rank is busy, in synchronous RL one side at a time (section 8); on GPUs it
# is 1 with a GPU per rank and 1/4 with four ranks colocated on one (`capstone.plan.rank_share`).
# With $N_t$ trainers that do not divide the $B$ groups, the update waits for the one with
# $\lceil B/N_t \rceil$ of them, so they count as $B / \lceil B/N_t \rceil$ trainers.
#
# **What an update costs, measured.** Trainer 0 does everything of an update in series:
#
# $$t_{step} = t_{wait} + t_{train} + t_{allreduce} + t_{send} + \frac{t_{ckpt}}{n_{ckpt}} \qquad (11.4)$$
#
# (waiting for its groups; forward, backward and Adam; the update's three all-reduces, where
# it also waits for the other trainers; sending the weights; a checkpoint every
# $n_{ckpt} = 40$ updates), while (11.3) counts only the training compute.
#
# **Weight-sync bandwidth.** A transfer of $N_{bytes}$ bytes in $n$ buckets takes (09.1)
# $T_x = n\alpha + N_{bytes}/\beta$; we report the effective bandwidth
#
# $$\beta_{eff} = \frac{N_{bytes}}{T_{transfer}} \qquad (11.5)$$
#
# which equals the link's $\beta$ only when the latency term $n\alpha$ is negligible.
#
# **The sample ledger.** Every sample a generator hands over is trained on exactly once,
# or discarded (generated after the checkpoint a restart resumed from), or left over at
# the end. Two independent records are held against each other: the generators' lines
# (what they made) and what the trainers *recorded* from the groups they trained on (each
# group carries its attempt, number and answers; the trainers gather these every update):
#
# $$n_{generated} = n_{consumed} + n_{discarded} + n_{left\,over} \qquad (11.6)$$
#
# **Pseudocode** (one script, every rank)
# ```
# rank 0:      restore the newest complete checkpoint (torchrun restarted us, or --resume)
#              or warm-start, calibrate, choose the layout (11.3); post the setup in the store
# every rank:  read the setup; take the role of its rank; join the trainer or sync group
# generator:   loop until stop:
#                  if announced > my version: receive it (lesson 09), keep the KV cache
#                  refill free slots while k < consumed + (max_lag + 1) B           (11.2)
#                  one decoding step; hand every complete group over (store, ledger)
# trainer r:   for u in step .. n_updates - 1:
#                  wait for my groups of u; loss (11.1); backward; all-reduce grads; Adam
#                  trainer 0: announce u + 1, send it, consumed = (u + 1) B;
#                             every 40 updates: atomic checkpoint (weights, Adam, ledger)
#              held-out evaluation; barrier; rank 0 audits the ledger (11.6)
# ```

# %% [markdown]
# | equation or step | function in `course_lib` |
# |---|---|
# | the whole run, from a notebook | `capstone.run` (`capstone.launch.run`: torchrun, deadline, progress bar, no orphans) |
# | every knob and its `--flag` | `capstone.config.CapstoneConfig` |
# | roles, process groups, routing of groups to trainers | `capstone.roles.assign_roles`, `Roles` |
# | (11.3) calibration and the layout choice | `capstone.plan.calibrate`, `choose_layout`, `spec_for`; `layout.predict` (lesson 08) |
# | (11.1) the shard's loss; the data-parallel update | `capstone.trainer.shard_loss`, `Trainer.update` |
# | (11.2) backpressure in a generator | `staleness.may_start_group` (lesson 07), in `capstone.generator.Generator.refill` |
# | in-flight weight update, KV cache kept | `capstone.generator.Generator.receive`, `lm.sampler.SlotSampler` |
# | (11.5) the weight broadcast | `capstone.channels.BroadcastChannel` (lesson 09's `weight_sync.endpoints.Sender`, `Receiver`) |
# | checkpoints and the restart | `capstone.trainer.Trainer.save_checkpoint`, `capstone.job.prepare_rank0` (lesson 10's `checkpoint.atomic`) |
# | (11.6) the ledger and its audit | `capstone.ledger.SampleLedger`, `capstone.ledger.audit` |
# | fault injection | `capstone.faults.kill_once` (`--kill-rank`, `--kill-at-update`) |
# | (11.4) phases, tokens/s, lags, syncs, restarts, read back | `capstone.report.load`, `CapstoneReport` |
#
# The trainers' loop, and a generator's refill of its free slots (its group numbers come
# from one counter in the store, shared by every generator):

# %%
from course_lib.capstone.generator import Generator
from course_lib.capstone.trainer import Trainer

show_source(Trainer.run)
show_source(Trainer.publish)  # the order behind (11.2): announce, send, then raise `consumed`
show_source(Trainer._all_reduce_grads)  # (11.1): the shards' gradients summed, one flat message
show_source(Generator.refill)

# %% [markdown]
# ## 1. Launch the default run
#
# Every knob of the run is a field of `CapstoneConfig` and a `--flag` of the job (the same
# run from a terminal: `course capstone --run-dir runs/capstone`). The defaults at this
# scale: 4 ranks on this machine, gloo, a 2-layer TinyLM, 240 updates of 4 prompts x 8
# answers, `max_lag` 4:

# %%
from course_lib.capstone.config import CapstoneConfig

print(describe(CapstoneConfig(), exclude=("run_dir", "resume", "kill_rank", "kill_at_update")))

# %% [markdown]
# `capstone.run` starts `torchrun --standalone --nproc-per-node 4 -m
# course_lib.capstone.job` in a process group of its own, shows a progress bar fed by
# trainer 0's metrics, echoes the lines that matter (the layout and its prediction, the
# end), kills the whole group if a deadline passes, and returns the run's report. The
# printed times vary from run to run; the cell after it checks what they claim.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.capstone import run

load_before = os.getloadavg()[0]
rep = run(WORK / "run", max_restarts=0, deadline_s=DEADLINE_S)
load_after = os.getloadavg()[0]
plan = rep.layout
print(f"\nload average (1 min, {os.cpu_count()} cores shared with other jobs): {load_before:.1f} before, {load_after:.1f} after")

# %%
from course_lib.capstone.config import SLOT_CHOICES

cfg = CapstoneConfig()
assert rep.result["updates"] == cfg.n_updates and rep.result["attempts"] == 1
assert plan["world_size"] == 4 and 2 <= plan["n_trainers"] < 4
assert plan["n_slots"] in SLOT_CHOICES and plan["predicted_tokens_per_s"] > 0
print(f"the run finished its {cfg.n_updates} updates in one attempt, on 4 ranks split by lesson 08's model "
      "(at least 2 trainers, at least 1 generator)")

# %% [markdown]
# **The layout the model chose.** Rank 0 timed a decoding step of 16, 32 and 64 slots and
# a trainer's forward and backward pass, alone (the calibration's time is printed above); `choose_layout` then
# asks lesson 08's `predict` for every split (2 or 3 trainers, the rest generators) and
# every slot count, and keeps the fastest. We redo its table from the rates it saved, and
# check that the run used the argmax:

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.capstone.plan import (
    answer_rate,
    choose_layout,
    rates_from_plan,
    spec_for,
    trainer_capacity,
    trainer_choices,
)
from course_lib.layout.model import predict

rates = rates_from_plan(plan)
answer = np.asarray(rates.answer_tokens, dtype=np.float64)
to_answer = answer.sum() / (answer + 3).sum()  # sequence steps -> answer tokens: L / (L + P) of (11.3)
print(f"calibration: share of a core sigma = {rates.cpu_share:.2f} per rank ({rates.units} cores, 4 ranks); "
      f"trainer c1 = {rates.train_steps_per_s:,.0f} sequence steps/s; policy's answers: mean {answer.mean():.1f} "
      f"tokens, longest {int(answer.max())}")
print(f"{'trainers':>8} {'generators':>10} {'slots':>5} {'l1(S) ms':>8} {'production':>11} {'consumption':>12} "
      f"{'predicted answer tokens/s':>26} {'updates/s':>10}  bound")
table = {}
for trainers in trainer_choices(cfg, 4):
    for slots in sorted(rates.decode_step_s):
        spec = spec_for(rates, cfg, 4, trainers, slots)  # a_s = l1(S) / sigma, c = c1 * sigma (x B/ceil(B/T) / T)
        prod = (4 - trainers) * slots / spec.a_s * to_answer
        cons = trainers * spec.train_tokens_per_s_per_gpu * to_answer
        p = answer_rate(rates, cfg, 4, trainers, slots)
        table[(trainers, slots)] = p.tokens_per_s
        bound = ("the straggler wait (08.14)" if p.wait_binds else "the admission window (08.11)" if p.cap_binds
                 else "consumption" if cons <= prod else "production")
        mark = "   <- chosen" if (trainers, slots) == (plan["n_trainers"], plan["n_slots"]) else ""
        print(f"{trainers:>8} {4 - trainers:>10} {slots:>5} {1e3 * rates.decode_step_s[slots]:>8.2f} {prod:>11,.0f} "
              f"{cons:>12,.0f} {p.tokens_per_s:>26,.0f} {1 / p.step_s:>10.1f}  {bound}{mark}")
sync_pred = plan["predicted_sync_tokens_per_s"]
print(f"synchronous RL (max_lag 0) on the chosen split, same model (08.9), each side alone on the cores: "
      f"{sync_pred:,.0f} answer tokens/s")

# %%
again = choose_layout(rates, cfg, 4)
assert (again.n_trainers, again.n_slots) == (plan["n_trainers"], plan["n_slots"])
assert abs(again.predicted_tokens_per_s - plan["predicted_tokens_per_s"]) < 1e-6 * plan["predicted_tokens_per_s"]
assert abs(max(table.values()) - plan["predicted_tokens_per_s"]) < 1e-6 * plan["predicted_tokens_per_s"]
assert sync_pred < plan["predicted_tokens_per_s"]
print("the run's layout is the argmax of the model's table (recomputed from the saved rates), and the model "
      "predicts the pipeline faster than synchronous RL on the same split")

# %% [markdown]
# **Takeaway:** on 4 ranks and 2 cores every rank gets half a core ($\sigma$ = 0.5; the
# calibration printed this machine's), and the
# model's table says where the run is bounded: the prediction is at most the smaller column
# (production or consumption, (11.3)), and below it where the admission window (08.11)
# keeps the generators under their slots or where the trainer waits for the longest answer
# (08.14: the `bound` column). The choice depends on the calibration's timings, which vary
# from run to run; the run uses whatever rank 0 measured, and every later run that
# resumes it keeps that layout.

# %% [markdown]
# ## 2. Learning: reward against wall-clock time
#
# Two signals. The **batch reward** is the mean reward of the 32 answers each update
# trained on (noisy: 4 prompts per batch; a 25-update trailing mean is drawn). The
# **held-out reward** is the reward of the policy on 512 fixed prompts (lesson 07's
# measure, split over the trainers), at the start (after the warm start) and at the end.

# %%
from course_lib.pipeline.timeline import smoothed

WINDOW = 25
t_upd, r_upd = rep.reward_vs_time()
evals = rep.evals
held_start, held_end = rep.held_out()
fig, ax = plt.subplots(figsize=(9, 3.8))
ax.plot(t_upd, r_upd, ".", color="tab:blue", alpha=0.25, ms=3, label="batch reward (one update)")
ax.plot(t_upd, smoothed(r_upd, WINDOW), color="tab:blue", label=f"batch reward, {WINDOW}-update trailing mean")
ax.plot(evals["t"] - rep.t0, evals["reward"], "s", color="tab:red", ms=8,
        label=f"held-out reward ({int(evals['prompts'][0])} prompts), start and end")
for t in [x["t"] - rep.t0 for x in rep.lines if x["kind"] == "checkpoint"]:
    ax.axvline(t, color="tab:purple", lw=0.6, ls=":")
ax.set_xlabel("wall-clock time since the run's first log line (s); dotted: checkpoints")
ax.set_ylabel("reward (exact-match, 0-1)")
ax.set_title(f"Capstone run: {cfg.n_updates} updates, {plan['n_trainers']} trainers + "
             f"{4 - plan['n_trainers']} generator(s), max_lag {cfg.max_lag}")
ax.legend(fontsize=8, loc="upper left")
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
# the standard error of a difference of two independent measurements of this size (the same prompts make the two
# correlated, which the stored totals cannot correct for: an approximation)
se = np.sqrt(2 * held_start * (1 - held_start) / int(evals["prompts"][0]))
print(f"held-out reward: {held_start:.3f} at the start -> {held_end:.3f} at the end ({held_end - held_start:+.3f}; "
      f"one standard error of the difference about {se:.3f}); updates took {t_upd[-1] - t_upd[0]:.0f} s of the run")
print(f"batch reward, mean of the first and the last {WINDOW} updates: {r_upd[:WINDOW].mean():.3f} -> "
      f"{r_upd[-WINDOW:].mean():.3f}")

# %%
MARGIN = 0.03  # held-out reward: one asynchronous run, whose gain varies with the ranks' timing (see the text)
low, high = pick(cpu=(0.08, 0.3), full=(0.5, 0.95))  # the warm start's reward: a 2-layer TinyLM, or a 4-layer one
assert low < held_start < high, held_start
assert held_end - held_start > MARGIN, (held_start, held_end)
print(f"the held-out reward rose by more than {MARGIN} from the warm start (its standard error is printed above)")

# %% [markdown]
# **Takeaway:** the held-out reward ends above where the warm start left it: the gain and
# its approximate standard error are printed above. The assert is weak on purpose
# (more than 0.03, about 1.3 standard errors of 512 prompts): one asynchronous run's gain
# varies with how its ranks were scheduled, and this is one run, not several seeds, so it
# is evidence that the run learned, not a measure of how much. The batch reward (4 prompts
# per update) is too noisy to show it: its first and last 25 updates are printed above,
# and they need not rise. Lesson 07 makes the learning claim with several seeds.

# %% [markdown]
# ## 3. Throughput: measured against lesson 08's prediction
#
# Measured tokens/s counts the answer tokens the trainers consumed, over the seconds from
# the start of the first update to the end of the last (warm start, evaluation and
# start-up left out). (11.4) splits trainer 0's time per update into its phases; the
# generators' phases say whether they kept up.

# %%
# NBVAL_IGNORE_OUTPUT
ph = rep.phases
u = rep.updates
lo = float(np.min(u["started"]))  # start of the first update
hi = float(np.max(u["t"]))  # end of the last
span_s = hi - lo


def phase_seconds(rank: int) -> dict[str, float]:
    """Seconds rank spent in each phase between the first update's start and the last update's end."""
    mine = ph["rank"] == rank
    out: dict[str, float] = {}
    for name, a, b in zip(ph["phase"][mine], ph["start"][mine], ph["end"][mine]):
        overlap = max(0.0, min(b, hi) - max(a, lo))
        out[name] = out.get(name, 0.0) + overlap
    return out


n_t = plan["n_trainers"]
measured = rep.tokens_per_s
predicted = plan["predicted_tokens_per_s"]
tokens_per_update = float(np.mean(u["tokens"]))
steps_per_update = tokens_per_update + 3 * float(np.mean(u["samples"]))
run_lengths = tuple(int(x) for x in rep.answer_lengths())
p_cal = answer_rate(rates, cfg, 4, n_t, plan["n_slots"])  # what the plan predicted
p_run = answer_rate(rates, cfg, 4, n_t, plan["n_slots"], answer_tokens=run_lengths)  # with this run's answers
ups = rep.updates_per_s
print(f"answers: the calibration's batch averaged {np.mean(rates.answer_tokens):.1f} tokens (longest "
      f"{max(rates.answer_tokens)}), this run's {np.mean(run_lengths):.1f} (longest {max(run_lengths)})")
print(f"updates/s: predicted {1 / p_cal.step_s:.1f} (calibration's answers), {1 / p_run.step_s:.1f} (this run's "
      f"answers), measured {ups:.1f}")
print(f"  length drift: {p_run.step_s / p_cal.step_s:.2f}x the predicted step; model / measured with this run's "
      f"answers (the system error): {1 / p_run.step_s / ups:.2f}")
print(f"per update: the model's step {1e3 * p_run.step_s:.0f} ms (this run's answers), measured "
      f"{1e3 / ups:.0f} ms; answer tokens/s: predicted {predicted:,.0f} (plan), measured {measured:,.0f}")
print(f"\nseconds per update, by phase, in the {span_s:.1f} s of updating (11.4):")
rows = {r: phase_seconds(r) for r in range(4)}
names = ("wait", "train", "allreduce", "sync", "checkpoint", "decode")
print(f"{'rank':>6} {'role':<10}" + "".join(f"{n + ' ms':>14}" for n in names) + f"{'covered':>9}")
for r, secs in rows.items():
    role = "trainer" if r < n_t else "generator"
    print(f"{r:>6} {role:<10}" + "".join(f"{1e3 * secs.get(n, 0.0) / cfg.n_updates:>14.1f}" for n in names)
          + f"{100 * sum(secs.values()) / span_s:>8.0f}%")
share0 = (cfg.groups_per_batch // n_t) / cfg.groups_per_batch  # trainer 0's part of a batch (roles: the fewest)
c_run = steps_per_update * share0 / (rows[0]["train"] / cfg.n_updates)
c_model = rates.train_steps_per_s * rates.cpu_share
print(f"\ntrainer 0's compute (the train phase) ran at {c_run:,.0f} sequence steps/s; the model assumed "
      f"c1 x sigma = {c_model:,.0f} ({c_model / c_run:.1f}x)")
c_with_reduce = steps_per_update * share0 / ((rows[0]["train"] + rows[0]["allreduce"]) / cfg.n_updates)
print(f"trainer 0 spent {100 * rows[0]['allreduce'] / span_s:.0f}% of the time in all-reduces (the model: 0); "
      f"compute and all-reduces together ran at {c_with_reduce:,.0f} sequence steps/s "
      f"({c_model / c_with_reduce:.1f}x below the model)")
decoding = ", ".join(f"{100 * rows[r].get('decode', 0.0) / span_s:.0f}%" for r in range(n_t, 4))
receiving = ", ".join(f"{100 * rows[r].get('sync', 0.0) / span_s:.0f}%" for r in range(n_t, 4))
print(f"trainer 0 spent {100 * rows[0]['sync'] / span_s:.0f}% of the time sending weights (the model: 0), "
      f"{100 * rows[0]['wait'] / span_s:.0f}% waiting for groups; the generators decoded {decoding} of it "
      f"and received weights {receiving}")
chosen = spec_for(rates, cfg, 4, n_t, plan["n_slots"])
model_bound = ("the straggler wait (08.14)" if p_run.wait_binds else "the admission window (08.11)" if p_run.cap_binds
               else "consumption (the trainers)" if n_t * chosen.train_tokens_per_s_per_gpu <= (4 - n_t) * plan[
                   "n_slots"] / chosen.a_s else "production (the generators)")
run_bound = "the trainers" if rows[0]["wait"] < 0.3 * span_s else "the generators"
print(f"the model said the run is bounded by {model_bound}; trainer 0 waited for groups "
      f"{100 * rows[0]['wait'] / span_s:.0f}% of the time, so the run was bounded by {run_bound}")
print(f"load average now: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores; the 4 ranks alone would make 4)")

# %%
# NBVAL_IGNORE_OUTPUT
# (what is claimed depends on the machine's cores: the claims of a 2-core run are asserted only where 4 ranks share
# fewer than 4 cores; the assert lines run either way)
covered0 = sum(rows[0].values()) / span_s
assert 0.9 < covered0 < 1.02, covered0
oversubscribed = rates.cpu_share < 1  # 4 ranks on fewer than 4 cores: what the claims below are about
if oversubscribed:
    assert rows[0]["sync"] > 0.05 * span_s and rows[0]["allreduce"] > 0.05 * span_s, rows[0]
    assert c_model > 1.5 * c_with_reduce, (c_model, c_with_reduce, c_run)
    assert rows[0]["wait"] < 0.3 * span_s, rows[0]
    assert all(rows[r]["allreduce"] > rows[0]["allreduce"] for r in range(1, n_t)), rows
    print("trainer 0's phases cover its whole time per update (11.4); it spent more than 5% of it in all-reduces "
          "and more than 5% sending weights, its compute and all-reduces together ran more than 1.5x slower than "
          "the model's c1 x sigma, and it waited for data less than 30% of the time: the run is trainer-bound "
          "(the model's verdict is printed above); the other trainers spent longer in all-reduces than trainer 0 "
          "(they wait there while it sends the weights)")
else:
    print(f"trainer 0's phases cover its whole time per update (11.4). This machine gives each of the 4 ranks a "
          f"core (share {rates.cpu_share:.2f}): the oversubscription costs discussed below are not expected "
          "here, so they are printed above but not asserted")

# %% [markdown]
# **Reading the error.** Two things separate the plan's prediction from the measurement,
# and the cell above prints each:
#
# - **Answer-length drift.** The calibration sampled one batch of the warm-started policy's
#   answers; RL then changed the policy, and this run's answers have another mean and
#   another longest one (printed). The model fed the run's own answers predicts another
#   step: that factor is not the model's error, and in answer tokens/s it looks much
#   larger, since tokens per update move with the length too (the plan's tokens/s against
#   the measured ones above). Updates/s is the fair unit: every update is one batch.
# - **The system error** (the model with the run's answers over the measurement). Above 1
#   the model is optimistic: it leaves out costs the run paid. Below 1 it charges a cost
#   the run did not pay in full: the straggler rule (08.14) charges every update with a
#   typical batch's longest answer, while the run's trainer waits only when that answer
#   is late. Trainer 0 does everything of an update in series (11.4), and the phase table
#   shows what (11.3) leaves out:
#   - the **all-reduces** (token count, gradients, metrics), where a trainer also waits for
#     the other to arrive; trainer 1's all-reduce time is larger than trainer 0's (asserted), by roughly
#     trainer 0's weight send: it reaches the next update's first all-reduce while trainer 0
#     is still sending (the other trainers take no part in the transfer, but they wait for it);
#   - the **weight send**, in series with training;
#   - **the train phase is more than the calibration timed.** $c_1$ is one forward and
#     backward pass over teacher-forced reference answers; the run's train phase also holds
#     Adam, chunking by length and the loss's bookkeeping;
#   - **cores shared unevenly.** Four ranks, the torchrun agent, the store, this notebook
#     and other jobs run on two cores (the load average above); nothing gives each rank its
#     half, and a trainer descheduled mid-step runs slower than the calibration's
#     $c_1 \sigma$. The logs do not separate these two: the ratio of the train phase to
#     $c_1 \sigma$ is printed above, and compute and all-reduces together are asserted more
#     than 1.5x slower.
#
# The model's *verdict* can differ from the run's, too (both printed): it may name the
# straggler wait (08.14) or the generators, while trainer 0 seldom waits for a group
# (asserted under 30% of its time) because the trainers are slower than the model
# assumed. On GPUs with one device per rank, $\sigma = 1$ and the uneven sharing goes away;
# the send in series is why production systems overlap the weight transfer with the next
# update (checkpoint-engine's pipelined buckets, section 9) or accept a lag of one step.
# Section 8 compares the model's regimes with measured runs of all three arms.

# %% [markdown]
# ## 4. The lag of every consumed token
#
# Each trainer histograms the lag (11.2) of the tokens it trains on, and the histograms
# are all-reduced; the last bin counts anything above `max_lag`, which the backpressure
# rule says never happens.

# %%
hist = rep.lag_histogram()
lags = np.arange(len(hist))
fig, ax = plt.subplots(figsize=(7, 3.3))
ax.bar(lags[:-1], hist[:-1] / hist.sum(), color="tab:blue", label="consumed tokens")
ax.bar([lags[-1]], [hist[-1] / hist.sum()], color="tab:red", label=f"lag > max_lag ({hist[-1]} tokens)")
ax.axvline(cfg.max_lag + 0.5, color="k", ls="--", label=f"bound: max_lag = {cfg.max_lag}")
ax.set_xticks(lags, [str(i) for i in lags[:-1]] + [f">{cfg.max_lag}"])
ax.set_xlabel("lag of a token: trainer version - version that sampled it (updates)")
ax.set_ylabel("fraction of consumed tokens")
ax.set_title(f"Per-token lag over {cfg.n_updates} updates, all trainers")
ax.legend(fontsize=8)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{int(hist.sum()):,} consumed tokens; per lag 0..{cfg.max_lag}: "
      + ", ".join(f"{100 * h / hist.sum():.1f}%" for h in hist[:-1]) + f"; above the bound: {hist[-1]}")
print(f"mean lag over the tokens {float((lags[:-1] * hist[:-1]).sum() / hist.sum()):.2f} updates (the run's "
      "summary averages the updates' means instead; the model's (08.12): "
      f"{plan['predicted_mean_lag']:.1f}); ESS/N mean {np.nanmean(u['ess']):.3f}; "
      f"tokens with a clipped weight: {100 * np.nanmean(u['clipped']):.2f}%")

# %%
# NBVAL_IGNORE_OUTPUT
# (the window's use depends on the machine's cores; the asserts run either way)
assert hist.sum() == int(u["tokens"].sum())
assert hist[-1] == 0 and int(np.nanmax(u["lag_max"])) <= cfg.max_lag
if oversubscribed:  # trainer-bound on shared cores: answers wait in the window
    assert hist[cfg.max_lag] > 0 and hist[2:].sum() > hist.sum() / 2
print(f"every one of the consumed tokens lagged at most max_lag = {cfg.max_lag} updates (11.2)"
      + (", and most of them lagged 2 or more: the pipeline uses its window" if oversubscribed else
         " (a core per rank: how much of the window the run uses is printed above, not asserted)"))

# %% [markdown]
# **Takeaway:** the bound holds across processes, on every token (asserted), and the
# distribution piles up near it: the generators fill the window faster than the trainers
# empty it, so most groups wait in it, and a pipeline whose window is full runs at its
# bound ((08.12) gives $k_{max}$ when the window fills; tokens sampled after an in-flight
# update carry the newer version, so the mean stays below it). The model's mean lag
# (printed beside the measured one) is what it expects from its own verdict: where it
# thinks the generators or the straggler wait set the pace, the window is not full, and its
# lag is lower than a trainer-bound run's. The per-token importance weights stay close to 1
# at this lag (ESS/N above), so the truncation at $c = 2$ rarely bites.

# %% [markdown]
# ## 5. The timeline of every rank
#
# Each rank logged every span of work: the generators' decoding steps (merged when they
# touch) and weight receptions, the trainers' waits for data, their compute (forward,
# backward, Adam: `train`) and all-reduces (`allreduce`), trainer 0's weight sends and
# checkpoints. The whole run first, then one second from its middle:

# %%
PHASE_COLOURS = {
    "warm_start": "tab:brown", "calibrate": "tab:pink", "eval": "tab:olive", "decode": "tab:green",
    "train": "tab:blue", "allreduce": "tab:red", "wait": "lightgray", "sync": "tab:orange",
    "checkpoint": "tab:purple",
}  # fmt: skip


def gantt_ranks(ax, report, window: tuple[float, float], n_trainers: int) -> None:
    """One row per rank: a bar per logged phase inside ``window`` (seconds since the run's first line)."""
    p, t0 = report.phases, report.t0
    a, b = window
    for name, colour in PHASE_COLOURS.items():
        for r in range(4):
            sel = (p["rank"] == r) & (p["phase"] == name) & (p["end"] - t0 > a) & (p["start"] - t0 < b)
            bars = [(s - t0, e - s) for s, e in zip(p["start"][sel], p["end"][sel])]
            ax.broken_barh(bars, (r - 0.38, 0.76), color=colour, label=name if r == 0 or name == "decode" else None)
    ax.set_yticks(range(4), [f"rank {r} ({'trainer' if r < n_trainers else 'generator'})" for r in range(4)])
    ax.set_xlim(a, b)
    ax.invert_yaxis()
    ax.set_xlabel("wall-clock time since the run's first log line (s)")


fig, axes = plt.subplots(2, 1, figsize=(11, 6.5))
gantt_ranks(axes[0], rep, (float(np.min(ph["start"]) - rep.t0), float(np.max(ph["end"]) - rep.t0)), n_t)
axes[0].set_title("The whole run: warm start and calibration (rank 0), held-out evaluations, updates, checkpoints")
mid = 0.5 * (lo + hi) - rep.t0
gantt_ranks(axes[1], rep, (mid, mid + 1.0), n_t)
axes[1].set_title("One second in the middle: white is idle (waiting at the backpressure bound, or descheduled)")
handles, labels = axes[0].get_legend_handles_labels()
unique = dict(zip(labels, handles))
fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=8, fontsize=8)
fig.tight_layout(rect=(0, 0.05, 1, 1))
plt.show()

# %% [markdown]
# **Takeaway:** the top panel is the run's life: rank 0 alone warms the policy up and
# calibrates (the others wait for the setup in the store), the trainers evaluate, the
# updates run with a checkpoint every 40, and the end evaluation closes it. The bottom
# panel is the steady state: after each update trainer 0 sends the weights (orange), and
# every generator receives them between two decoding steps (orange on its row, at the
# same moment: the broadcast is one collective of the sync group); the other trainers
# usually sit in a red `allreduce` bar meanwhile, the next update's first all-reduce. The generators' white
# gaps are the backpressure bound at work (and the scheduler: two cores, four ranks).

# %% [markdown]
# ## 6. Weight-sync latency, bytes and bandwidth
#
# Every update trainer 0 sends the new policy with lesson 09's pipelined, checksummed
# engine (0.25 MiB buckets); every generator receives it between two decoding steps,
# verifies every bucket, commits all-or-nothing and copies it into its model, keeping its
# KV cache (lesson 07's in-flight update).

# %%
s = rep.syncs
send = s["side"] == "send"
fig, ax = plt.subplots(figsize=(9, 3.5))
ax.plot(s["version"][send], 1e3 * s["total"][send], ".", ms=3, color="tab:orange", label="trainer 0: send")
for r, marker, colour in zip(range(n_t, 4), ("x", "+"), ("tab:green", "tab:olive")):
    mine = (s["side"] == "receive") & (s["rank"] == r)
    ax.plot(s["version"][mine], 1e3 * s["total"][mine], marker, ms=3, alpha=0.6, color=colour,
            label=f"rank {r} (generator): receive + load")
ax.set_yscale("log")
for axis_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
    axis_formatter(plt.matplotlib.ticker.FormatStrFormatter("%g"))
ax.set_xlabel("policy version (= update)")
ax.set_ylabel("milliseconds per weight update (log scale)")
ax.set_title(f"Weight sync per update: {int(s['nbytes'][0]):,} bytes to {4 - n_t} generator(s), broadcast")
ax.legend(fontsize=8)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
nbytes = int(s["nbytes"][0])
n_buckets = int(np.ceil(nbytes / (cfg.bucket_mb * 2**20)))
print(f"model: {nbytes:,} bytes of float32 weights, {n_buckets} bucket(s) of {cfg.bucket_mb} MiB")
print(f"{'side':<22} {'n':>4} {'median ms':>10} {'p90 ms':>8} {'stage':>7} {'transfer':>9} {'reload':>7} "
      f"{'load':>6} {'beta_eff (11.5)':>16}")
for label, sel in [("send (trainer 0)", send)] + [
    (f"receive (rank {r})", (s["side"] == "receive") & (s["rank"] == r)) for r in range(n_t, 4)
]:
    med = {k: 1e3 * float(np.median(s[k][sel])) for k in ("total", "stage", "transfer", "reload", "load")}
    bw = nbytes / np.median(s["transfer"][sel]) / 1e6
    print(f"{label:<22} {int(sel.sum()):>4} {med['total']:>10.1f} {1e3 * np.percentile(s['total'][sel], 90):>8.1f} "
          f"{med['stage']:>7.1f} {med['transfer']:>9.1f} {med['reload']:>7.1f} {med['load']:>6.1f} {bw:>11.0f} MB/s")
in_flight = s["in_flight"][s["side"] == "receive"]
print(f"answers in flight when a generator swapped weights: median {np.median(in_flight):.0f}, in "
      f"{100 * np.mean(in_flight > 0):.0f}% of the swaps "
      f"(their KV caches kept); weight sync in all: {s['total'][send].sum():.1f} s of trainer 0's {span_s:.1f} s")

# %%
# NBVAL_IGNORE_OUTPUT
# (the latency claim is a 2-core run's: asserted only where 4 ranks share fewer cores; the other asserts run always)
for r in range(n_t, 4):
    mine = (s["side"] == "receive") & (s["rank"] == r)
    assert sorted(s["version"][mine].astype(int)) == sorted(s["version"][send].astype(int)), r
assert int(send.sum()) == cfg.n_updates and (s["nbytes"] == nbytes).all()
bw_send = nbytes / np.median(s["transfer"][send])
print(f"all {cfg.n_updates} versions reached every generator (a broadcast, no version skipped)")
if oversubscribed:  # on shared cores a broadcast waits for every member to be scheduled: latency, not bandwidth
    assert bw_send < 5e8, bw_send  # gloo moved large tensors at 1.2-2 GB/s in lesson 09's benchmark
    assert (in_flight > 0).any()  # how often depends on the layout: generators at the window's bound swap idle
    print("the effective bandwidth of a half-megabyte update is below 0.5 GB/s, a fraction of what gloo reaches "
          "on large tensors: latency-bound; generators swapped weights with answers in flight (how often is printed "
          "above)")
else:
    print(f"effective bandwidth {bw_send / 1e6:,.0f} MB/s and answers in flight at a swap are printed above, "
          "not asserted: a core per rank")

# %% [markdown]
# **Takeaway:** a weight update here is a few to a few tens of milliseconds for half a
# megabyte, so the effective bandwidth (11.5) is of the order of a hundred MB/s (the table above), not the GB/s gloo reaches
# on large tensors (lesson 09): at this size (09.1) is all latency, $n\alpha$, and on two
# oversubscribed cores $\alpha$ includes waiting for every generator to finish its
# decoding step and be scheduled, since a broadcast starts when its last member joins. The
# spread of the times for updates of the same bytes (the p90 column against the median)
# is, we believe, mostly that wait (the logs do not separate it). With a 1T-parameter model
# the other term dominates, and that is what checkpoint-engine's buckets, double buffer and
# broadcast are built for (section 9). Every generator received every version; in the
# share of swaps printed above it had answers in flight and kept their KV caches (a
# generator waiting at the window's bound swaps with none: how often depends on the layout).

# %% [markdown]
# ## 7. Kill a rank, recover, audit
#
# A second run, shorter, on the layout the first one chose (no calibration), with a fault:
# the last rank, a generator, `SIGKILL`s itself as it receives the weights of update 50,
# with answers in flight (`--kill-rank 3 --kill-at-update 50`), and torchrun may restart
# the job once (`--max-restarts 1`). Checkpoints every 20 updates, so the newest complete
# one before the kill is step 40. What should happen:
#
# 1. torchrun sees a rank die and tears down the other ranks (their collectives would hang);
# 2. it starts all 4 ranks again (`TORCHELASTIC_RESTART_COUNT=1`); rank 0 restores the newest
#    complete checkpoint (weights, Adam state, step, ledger) and shares it with trainer 1;
# 3. the dead attempt's groups numbered from the checkpoint's batches on ($k \ge sB$ for
#    checkpoint step $s$) are **discarded**: the restored trainer consumes those numbers
#    again, and their numbers are drawn again, with the same prompts. Some of them were
#    sampled before the checkpoint, by versions the lag bound allowed; dropping rather than
#    re-using them is a design choice, simple and exact (a system could keep them, at the
#    price of tracking which attempt made what it trains on);
# 4. the run finishes its updates, and the ledger (11.6) balances exactly: the groups the
#    trainers recorded (from the groups' own attempt and number) against the generators'
#    lines, every generated group in exactly one of consumed, discarded, left over;
# 5. no process of either attempt is left.
#
# The audit is not true by construction: `tests/test_capstone.py` plants a group consumed
# twice, one never consumed, an answer lost on the way, a group of a dead attempt trained
# on, and sees it fail each time.
#
# Two pieces make this work across processes and hosts. The ranks of a restarted job
# must agree on which attempt they are in (their store keys and their process group are
# per attempt), and torchrun's restart counter is per agent, not kept in step between the
# agents of several hosts; so the ranks agree through the store: rank 0 takes the launch's
# next attempt number, and every other rank waits for a welcome at a key only it knows.
# And the audit holds two independent records against each other:

# %%
from course_lib.capstone.ledger import audit as audit_ledger

show_source(audit_ledger)

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.runtime.processes import live_children

KILL = dict(n_updates=pick(cpu=80, full=400), checkpoint_every=pick(cpu=20, full=100),
            kill_rank=3, kill_at_update=pick(cpu=50, full=250), eval_prompts=pick(cpu=128, full=512))
echoed: list[str] = []
rep_kill = run(WORK / "killed", max_restarts=1, deadline_s=DEADLINE_S, show_progress=False, echo=echoed.append,
               calibrate=False, n_trainers=plan["n_trainers"], n_slots=plan["n_slots"], **KILL)
for line in echoed:
    if "kills itself" in line or "restarted" in line or "finished" in line:
        print(line)

# %%
(restart,) = rep_kill.restarts
audit = rep_kill.result["audit"]
events = " ".join(rep_kill.events["message"])
expected_step = (KILL["kill_at_update"] // KILL["checkpoint_every"]) * KILL["checkpoint_every"]
assert (WORK / "killed" / "kills" / f"rank3-update{KILL['kill_at_update']}").exists()
assert "generator rank 3 kills itself (SIGKILL)" in events and "TORCHELASTIC_RESTART_COUNT=1" in events
assert restart["restart_count"] == 1 and restart["resumed_step"] == expected_step
assert rep_kill.result["updates"] == KILL["n_updates"] and rep_kill.result["attempts"] == 2
assert audit["ok"] and audit["discarded_groups"] == restart["discarded_groups"] > 0
assert audit["generated_samples"] == audit["consumed_samples"] + audit["discarded_samples"] + audit["leftover_samples"]
assert audit["consumed_samples"] == KILL["n_updates"] * cfg.batch_sequences and audit["consumed_twice"] == 0
assert not live_children()
print(f"generator rank 3 died at update {KILL['kill_at_update']}; torchrun restarted the job once; attempt 1 "
      f"resumed from checkpoint step {restart['resumed_step']} and finished all {KILL['n_updates']} updates; "
      f"the {KILL['n_updates']} x {cfg.batch_sequences} consumed samples were each consumed once; "
      "generated = consumed + discarded + left over (11.6) exactly; no process of either attempt is left")

# %%
# NBVAL_IGNORE_OUTPUT
print(rep_kill.summary().replace(str(WORK), "WORK"))
starts = {a: min(x["t"] for x in rep_kill.lines if x.get("attempt") == a) for a in (0, 1)}
kill_t = next(x["t"] for x in rep_kill.lines if x["kind"] == "event" and "kills itself" in x["message"])
first_new = min(x["t"] for x in rep_kill.lines if x["kind"] == "update" and x["attempt"] == 1)
redone = len(rep_kill.updates["update"]) - KILL["n_updates"]
print(f"\nfrom the kill to the restarted attempt's first log line: {starts[1] - kill_t:.1f} s; to its first "
      f"update: {first_new - kill_t:.1f} s; updates done twice: {redone} (attempt 0's after checkpoint step "
      f"{restart['resumed_step']})")

# %%
assert first_new > kill_t > starts[0] and 0 < redone <= KILL["kill_at_update"] + 1 - restart["resumed_step"]
print("the restarted attempt began after the kill and trained again from the checkpoint; only the updates "
      "after that checkpoint were done twice")

# %%
fig, ax = plt.subplots(figsize=(9, 3.3))
uk = rep_kill.updates
for a, colour in ((0, "tab:gray"), (1, "tab:blue")):
    sel = uk["attempt"] == a
    ax.plot(uk["t"][sel] - rep_kill.t0, uk["update"][sel], ".", ms=4, color=colour, label=f"attempt {a}: updates")
ax.axvline(kill_t - rep_kill.t0, color="tab:red", ls="--", label=f"rank 3 SIGKILLs itself (update {KILL['kill_at_update']})")
ax.axhline(restart["resumed_step"], color="tab:purple", ls=":", label=f"checkpoint resumed from (step {restart['resumed_step']})")
ax.set_xlabel("wall-clock time since the run's first log line (s)")
ax.set_ylabel("update")
ax.set_title("Kill and recover: torchrun restarts every rank, the job resumes from its newest checkpoint")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **Takeaway:** a dead rank costs the job a restart (the time printed above: starting four
# Python processes that import torch, restoring, and the rendezvous) plus the updates since
# the last checkpoint, which are done again. The audit found nothing lost or
# double-counted: what the trainers recorded matches what the generators made, group by
# group, and the discarded groups are named (generated by the dead attempt after the
# checkpoint). Why restart *every* rank for one dead generator? The
# ranks share collectives (the weight broadcast, the all-reduce), and a collective with a
# dead member cannot finish; torchrun's answer is to tear the group down and start it
# again, which is simple and exact. Systems that keep inference engines outside the
# training job's collectives (lesson 10's supervisor, production inference fleets)
# replace one engine instead. Lesson 10's section 7 has that design.

# %% [markdown]
# ## 8. Asynchronous, synchronous and colocated, measured side by side
#
# The lesson's core comparison, measured here. Three **arms** of the same script, on the
# layout section 1 chose (pinned: no calibration), from the same seed and warm start:
#
# - **async**: the pipeline as above (`max_lag` 4, lesson 09's broadcast);
# - **sync**: `max_lag 0`, synchronous RL: every group of update $u$ is sampled by version
#   $u$, so the generators wait while the trainers train and the other way round;
# - **colocated**: the pipeline with the weights written into a shared buffer instead of
#   broadcast (`--colocated`; on a GPU, CUDA IPC slots).
#
# Each arm starting its own four Python processes would pay a launch's start-up nine times
# (the agent and four ranks importing torch; section 7 prints what a restart costs), which
# would take this notebook past its time budget; so one torchrun launch runs the arms
# **in turn** (`run_arms`, the job's `--arms`): the same processes, each arm a fresh run
# with its own directory, store keys and ledger. Rounds are interleaved (async, sync,
# colocated, async, ...), so a change in the machine's load hits every arm alike, and ratios
# are taken **per round**, then their median.
#
# **Which rate.** Every update trains on one batch of exactly $B \times G$ = 32 answers, so
# updates/s (and samples/s, 32 times it) compare the arms batch for batch; a batch of
# shorter answers is still less work, so the arms' answer lengths are printed beside them.
# Answer tokens/s moves with those lengths too, which differ between arms and drift during
# a run; it is printed, not compared.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.capstone.launch import run_arms

import torch

# On a GPU host the colocated arm (every rank on GPU 0) and the others (the CPUs, or a GPU per rank) need different
# devices and backends, which one launch cannot mix (the job refuses): there the comparison is async against sync.
ARMS = ("async", "sync") if torch.cuda.is_available() else ("async", "sync", "colocated")
ROUNDS = 3
COMPARE = dict(n_updates=pick(cpu=60, full=200), eval_prompts=pick(cpu=64, full=512), calibrate=False,
               n_trainers=plan["n_trainers"], n_slots=plan["n_slots"])
load_cmp = os.getloadavg()[0]
arm_runs = run_arms(WORK / "arms", list(ARMS) * ROUNDS, deadline_s=DEADLINE_S, echo=None, **COMPARE)
print(f"{len(arm_runs)} runs of {COMPARE['n_updates']} updates in one launch, {plan['n_trainers']} trainers + "
      f"{4 - plan['n_trainers']} generator(s) x {plan['n_slots']} slots; load average {load_cmp:.1f} before, "
      f"{os.getloadavg()[0]:.1f} after")


def arm_figures(report) -> dict[str, float]:
    """The rates and costs of one arm's run (seconds of updating: its first update's start to its last's end)."""
    u, s = report.updates, report.syncs
    send = s["side"] == "send"
    return {"updates/s": report.updates_per_s, "samples/s": report.samples_per_s,
            "answer tokens/s": report.tokens_per_s, "answer length": float(u["tokens"].sum() / u["samples"].sum()),
            "send ms": 1e3 * float(np.median(s["total"][send])), "max lag": int(np.nanmax(u["lag_max"]))}


figs = {arm: [arm_figures(r) for name, r in arm_runs if name == arm] for arm in ARMS}
columns = ("updates/s", "samples/s", "answer tokens/s", "answer length", "send ms", "max lag")
print(f"\n{'arm':<10} {'round':>5}" + "".join(f"{c:>17}" for c in columns))
for rnd in range(ROUNDS):
    for arm in ARMS:
        f = figs[arm][rnd]
        print(f"{arm:<10} {rnd:>5}" + "".join(f"{f[c]:>17,.1f}" if c != "max lag" else f"{f[c]:>17}" for c in columns))
med = {arm: {c: float(np.median([f[c] for f in figs[arm]])) for c in columns} for arm in ARMS}
for arm in ARMS:
    print(f"{arm:<10} {'median':>5}" + "".join(f"{med[arm][c]:>17,.1f}" for c in columns))
pair = {
    "async / sync": [a["updates/s"] / b["updates/s"] for a, b in zip(figs["async"], figs["sync"])],
    "async / sync, answer tokens/s": [a["answer tokens/s"] / b["answer tokens/s"]
                                      for a, b in zip(figs["async"], figs["sync"])],
}
if "colocated" in ARMS:
    pair["colocated / async"] = [a["updates/s"] / b["updates/s"] for a, b in zip(figs["colocated"], figs["async"])]
print()
for name, values in pair.items():
    rate = "" if "tokens" in name else ", updates/s"
    print(f"{name}{rate}, per round: " + ", ".join(f"{v:.2f}" for v in values) + f"; median {np.median(values):.2f}")

# %%
fig, (ax_l, ax_r) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [2, 1]})
ARM_COLOURS = {"async": "tab:blue", "sync": "tab:gray", "colocated": "tab:orange"}
labelled: set[str] = set()
for name, r in arm_runs:
    u = r.updates
    ax_l.plot(u["t"] - np.min(u["started"]), smoothed(u["reward"], 10), color=ARM_COLOURS[name], alpha=0.8,
              label=None if name in labelled else name)
    labelled.add(name)
ax_l.set_xlabel("seconds since the arm's first update")
ax_l.set_ylabel("batch reward (10-update trailing mean)")
ax_l.set_title(f"Learning against time, {ROUNDS} rounds per arm ({COMPARE['n_updates']} updates each)")
ax_l.legend(fontsize=8)
for i, arm in enumerate(ARMS):
    vals = [f["updates/s"] for f in figs[arm]]
    ax_r.bar(i, np.median(vals), color=ARM_COLOURS[arm], alpha=0.6)
    ax_r.plot([i] * len(vals), vals, "k.", ms=6)
ax_r.set_xticks(range(len(ARMS)), ARMS)
ax_r.set_ylabel("updates per second (bar: median; dots: rounds)")
ax_r.set_title("Throughput per arm")
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
for arm in ARMS:
    ends = [r.held_out() for name, r in arm_runs if name == arm]
    print(f"{arm:<10} held-out reward ({COMPARE['eval_prompts']} prompts), start -> end per round: "
          + ", ".join(f"{a:.2f} -> {b:.2f}" for a, b in ends))

# %% [markdown]
# The learning curves are for reading, not for a claim: each arm ran a few seconds from
# the same warm start, its batch reward is a mean over 4 prompts, and the held-out rewards
# above are measured on a few dozen prompts, so differences between the arms are within
# their noise here. Which arm *learns* faster per second is PipelineRL's claim at scale;
# lesson 07 measures it with several seeds. This comparison is about throughput.

# %%
# (the claims below hold on a loaded machine too: the arms ran interleaved, and each is asserted on the median of
# the per-round ratios)
for name, r in arm_runs:
    assert r.result["audit"]["ok"] and r.result["updates"] == COMPARE["n_updates"], name
assert all(f["max lag"] == 0 for f in figs["sync"]) and all(f["max lag"] <= cfg.max_lag for f in figs["async"])
assert np.median(pair["async / sync"]) > 1.1, pair["async / sync"]
if "colocated" in ARMS:
    assert med["colocated"]["send ms"] < 0.5 * med["async"]["send ms"], (med["colocated"], med["async"])
print("every arm's ledger is exact and its lags within its bound (0 for sync); the pipeline ran more than 1.1x "
      "the updates per second of synchronous RL (median of the per-round ratios)"
      + (", and the colocated write took less than half the broadcast's time on trainer 0" if "colocated" in ARMS
         else ""))

# %% [markdown]
# **What the model says for each regime.** Lesson 08's model, with the calibration of
# section 1, predicts each arm's updates/s (its step time; no unit conversion needed). Two
# things differ between the regimes and the model takes both into account:
#
# - **the share of a core.** In the pipeline all 4 ranks are busy at once, $\sigma$ =
#   cores/4; in synchronous RL the generators decode while the trainers wait and the other
#   way round, so each side has the cores to itself: $\sigma$ = cores/2 for 2 + 2
#   (`capstone.plan.spec_for`). "To itself" is the model's idealisation: a waiting rank
#   still polls the store every 2 ms, and the agent and this notebook share the cores too;
# - **the answers.** The calibration sampled one batch of the warm-started policy's answers;
#   each arm's policy then made its own, of another length (the table above). The model,
#   fed each arm's own answer lengths (`answer_tokens=`, a typical batch of them), separates
#   that *length drift* from the **system error** (model / measured: above 1, costs the
#   model leaves out, the all-reduces, weight sends and cores shared unevenly of section 3;
#   below 1, a cost it charges in full that the run paid in part, such as the straggler
#   wait (08.14)).

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'arm':<10} {'share (gen, train)':>19} {'predicted, calibration lengths':>31} "
      f"{'predicted, arm lengths':>23} {'measured':>9} {'length drift':>13} {'model/measured':>15}")
predicted_ups = {}
for arm in ARMS:
    lag = 0 if arm == "sync" else cfg.max_lag
    spec_arm = spec_for(rates, cfg, 4, n_t, plan["n_slots"], max_lag=lag)
    lengths = tuple(int(x) for r in (rr for nn, rr in arm_runs if nn == arm) for x in r.answer_lengths())
    p_cal = 1 / answer_rate(rates, cfg, 4, n_t, plan["n_slots"], max_lag=lag).step_s
    p_arm = 1 / answer_rate(rates, cfg, 4, n_t, plan["n_slots"], max_lag=lag, answer_tokens=lengths).step_s
    predicted_ups[arm] = (p_cal, p_arm)
    gen_share = rates.decode_step_s[plan["n_slots"]] / spec_arm.a_s
    train_share = spec_arm.train_tokens_per_s_per_gpu / rates.train_steps_per_s / (
        trainer_capacity(n_t, cfg.groups_per_batch) / n_t)
    m = med[arm]["updates/s"]
    print(f"{arm:<10} {f'{gen_share:.2f}, {train_share:.2f}':>19} {p_cal:>31.1f} {p_arm:>23.1f} {m:>9.1f} "
          f"{p_cal / p_arm:>12.2f}x {p_arm / m:>12.2f}x")
ratio_model = predicted_ups["async"][1] / predicted_ups["sync"][1]
ratio_measured = float(np.median(pair["async / sync"]))
sync_lengths = tuple(int(x) for r in (rr for nn, rr in arm_runs if nn == "sync") for x in r.answer_lengths())
one_share = replace(spec_for(rates, cfg, 4, n_t, plan["n_slots"], max_lag=0, answer_tokens=sync_lengths),
                    a_s=rates.decode_step_s[plan["n_slots"]] / rates.cpu_share,
                    train_tokens_per_s_per_gpu=rates.train_steps_per_s * rates.cpu_share
                    * trainer_capacity(n_t, cfg.groups_per_batch) / n_t)
ratio_one_share = predicted_ups["async"][1] * predict("pipeline", one_share).step_s
print(f"\nasync / sync in updates/s: measured (median per round) {ratio_measured:.2f}; the model (each arm's "
      f"lengths) {ratio_model:.2f}; the model with the pipeline's share for synchronous RL too: {ratio_one_share:.2f}")
print("colocated: the model has no weight-transfer cost, so it predicts the colocated arm as the async one")

# %%
# (ratios of two arms measured in the same rounds, and the model's, which does not depend on the load)
miss = abs(np.log(ratio_model / ratio_measured))
assert miss < np.log(2), (ratio_model, ratio_measured)
if oversubscribed:  # where ranks share cores the regimes' shares differ, and a single share misses by far more
    assert abs(np.log(ratio_one_share / ratio_measured)) > miss + np.log(1.5), (ratio_one_share, ratio_measured)
print("with a share per regime the model's async/sync ratio is within 2x of the measured one"
      + ("; with one share for both regimes it would miss by 1.5x more" if oversubscribed else ""))

# %% [markdown]
# **Takeaway.** Measured here, in the same launch and rounds: the pipeline ran more
# updates per second than synchronous RL (the per-round ratios and their median are
# printed above; asserted above 1.1x, a margin a loaded machine keeps), with every token
# within its lag bound. Why, in the model's account (we did not measure the slots'
# occupancy): synchronous RL hands each side the cores while the other waits, so idle
# ranks cost it little; what it pays is the **tail** and the **turns**. A generator's
# decoding step computes every slot (lesson 07's sampler), and a synchronous batch keeps
# stepping until its longest answer ends, most slots empty (08.7); then the trainers train
# while nothing is generated; the pipeline refills a freed slot at once with the next
# batch's prompt and overlaps the two. The published systems report gains in the same direction at scale (section 9:
# about 2x faster learning for PipelineRL, up to 2.77x for AReaL, 2.35-2.67x for verl's
# fully-async trainer), but against *colocated* synchronous baselines and with long-tailed
# answers of thousands of tokens, where the tail and partial rollouts do much of the work
# (verl's streaming alone gives about 1.6x). Lesson 08's model reproduces PipelineRL's 2x
# (against a baseline whose throughput PipelineRL itself estimated from 2 + 2 nodes) and
# misses verl's fully-async figures by predicting less: 0.91x, 1.06x and 1.37x against the
# published 2.66x, 1.92x and 2.35x at 32, 64 and 128 GPUs (`BENCHMARKS.md`, "the layout
# model against published async-vs-sync speedups"), so at 32 and 64 GPUs it predicts no
# gain at all; that lesson says why (the published runs' answers drifted between the arms).
#
# The colocated arm's weight send is a copy into shared memory instead of a broadcast, a
# fraction of a millisecond against several (asserted: under half). Taking the broadcast
# off trainer 0's critical path would shorten an async update by the send alone; the cell
# below prints the speed-up that explains, beside the measured colocated / async ratios,
# which move from round to round (no claim is made on them: the generators also stop
# decoding while they join a broadcast, and the colocated ones do not, so the two effects
# are not separated here).
#
# The model, told that synchronous RL gives each side the cores to itself, predicts an
# async/sync ratio within 2x of the measured one (asserted; both printed); with one share
# for both regimes it misses by 1.5x more (asserted where the ranks share cores). In
# absolute terms its error is the *model/measured* column, and it differs between
# regimes: the pipeline pays the all-reduces, sends and uneven sharing of four ranks on
# the cores (above 1 when those dominate), synchronous RL runs half the ranks at a time
# (less contention), and the straggler charge can make the model pessimistic (below 1).
# Answer tokens/s would tell another story: the arms' answers differ in length (the
# *answer length* column), so their ratio (printed) is not the ratio of the work done.

# %%
# NBVAL_IGNORE_OUTPUT
update_ms = 1e3 / med["async"]["updates/s"]
saved_ms = med["async"]["send ms"] - med.get("colocated", med["async"])["send ms"]
if "colocated" not in ARMS:
    print("no colocated arm on this host (a GPU host: see the comparison's first cell)")
else:
    print(f"async update {update_ms:.0f} ms, of which trainer 0's broadcast {med['async']['send ms']:.1f} ms; the "
          f"colocated write {med['colocated']['send ms']:.2f} ms: taking the difference off the update would give "
          f"{update_ms / (update_ms - saved_ms):.2f}x; measured colocated / async per round: "
          + ", ".join(f"{v:.2f}" for v in pair["colocated / async"]))

# %% [markdown]
# ## 9. Where production systems put each part
#
# Every part of this run has a counterpart in the open-source systems the course cites
# (figures and knobs from `../shared/REFERENCES.md`, with their sources):
#
# | part of this run | here (knob) | production counterpart |
# |---|---|---|
# | generators decode while trainers train; new weights swapped in between decoding steps, KV cache kept | generator ranks, `SlotSampler` | **PipelineRL** (Piché et al., arXiv 2509.19128): the inference side pauses generation keeping in-flight requests and their KV cache, receives the new weights (a broadcast per parameter from trainer rank 0 over a NCCL group), loads them, resumes. vLLM's `pause_generation` with modes "abort", "wait" and "keep", and a separate clear-cache flag; NeMo-RL `in_flight_weight_updates`, `recompute_kv_cache_after_weight_updates`. AReaL discards and recomputes the KV cache on an interrupt; SkyRL keeps it by default |
# | staleness bound by backpressure | `max_lag` = 4 (0 = synchronous) | PipelineRL `max_lag`; AReaL `max_head_offpolicyness` (0 = synchronous; admission rule floor((N_r - 1)/B) <= i + eta, arXiv 2505.24298); verl `staleness_threshold`; prime-rl `max_off_policy_steps` (default 8); SkyRL `max_staleness_steps`; NeMo-RL `max_trajectory_age_steps` |
# | per-token lag, logged | `lag_hist`, `lag_mean`, `lag_max` | PipelineRL stamps each rollout with the weight version it started with and logs lag = last broadcast version - oldest version in the batch; its version counter is samples processed (ours: updates) |
# | off-policy correction | truncated per-token IS, `clip_c` = 2 (07.1) | PipelineRL: REINFORCE with the truncated ratio min(ratio, 1 + eps), detached, no KL or value net by default, ESS logged; verl, slime, SkyRL: token-level TIS with threshold 2.0; AReaL: decoupled PPO with recomputed proximal log-probs |
# | weight update | lesson 09's engine: `sync_method` = pipelined, `bucket_mb` = 0.25, checksums, all-or-nothing | **checkpoint-engine** (MoonshotAI): buckets up to a configurable size, a double (ping-pong) buffer, a failure code all-reduced after each bucket; broadcast mode (all instances at once) and P2P over RDMA (new instances joining); about 20 s to update Kimi-K2 (1T parameters) across thousands of GPUs; e.g. Qwen3-235B-A22B BF16 on 8xH800 in 6.22 s with 2.67 GiB buckets. verl with checkpoint-engine: 235B 58.57 -> 23.70 s (H20). vLLM's weight-transfer engine (NCCL or IPC); SGLang `update_weights_from_distributed` |
# | weights to same-host generators | `colocated` (a shared `/dev/shm` buffer, two slots; the generators' parameters are views on a slot: one copy per update, timed against memcpy by `bench/bench_capstone.py` (`BENCHMARKS.md`); on a GPU, CUDA IPC slots, run on an H200: `BENCHMARKS.md`, "Full scale on a GPU") | checkpoint-engine's buffer shared with the inference engine through CUDA IPC; SkyRL 14B TP2 4.4 -> 1.6 s with CUDA IPC in 1 GB chunks |
# | the split of ranks | lesson 08's model: `n_trainers`, `n_slots` = 0 (chosen) | AReaL: a 75/25 inference/training GPU split beat 50/50; verl fully-async: 96:32 inference:training for Qwen3-30B-A3B, rollouts in flight = (1 + `staleness_threshold`) x `trigger_parameter_sync_step` x `require_batches` x `ppo_mini_batch_size` - `num_stale` |
# | what asynchrony buys | section 8 (measured here), `bench/bench_capstone.py` | PipelineRL about 2x faster learning (128 H100s); AReaL up to 2.77x; verl fully-async 2.35-2.67x on 128 GPUs (Qwen2.5-7B), one-step-off-policy +23% (FSDP2) / +40% (Megatron); ROLL Flash 2.24x (RLVR), 2.72x (agentic) |
# | checkpoints, restart, ledger | lesson 10's atomic commit; torchrun `--max-restarts`; `SampleLedger` | lesson 10 (Llama 3's interruption figures, Young's and Daly's intervals) |
#
# Two cautions from the same sources: overlap buys little when generation time far exceeds
# training time (a reported UniRL case), and verl's headline speedup needs partial
# rollouts. And an open debate this run takes a side in: keeping the stale KV cache is
# faster, and some teams warn that it compounds policy error (lesson 07 measured both).

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | rank, role | a process torchrun started (0 .. W-1); ranks 0 .. T-1 train, the rest generate |
# | layout | trainers + generators x slots, chosen by lesson 08's model from rank 0's calibration |
# | cpu share $\sigma$ | min(1, cores / ranks): the share of a core the model gives each rank (11.3) |
# | predicted answer tokens/s | (11.3) for the chosen layout, from rates measured alone |
# | answer tokens/s (measured) | answer tokens the trainers consumed over the seconds from the first update's start to the last one's end |
# | phase | a span of work a rank logged: `decode` (generator steps, merged), `sync` (sending or receiving weights), `train` (forward, backward, Adam), `allreduce` (the update's three all-reduces, waiting for the other trainers included), `wait` (for groups), `checkpoint`, `eval`, `warm_start`, `calibrate` |
# | covered | share of the updating time a rank's logged phases account for |
# | batch reward | mean exact-match reward of the 32 answers an update trained on |
# | held-out reward | reward of the policy on 512 fixed prompts (one answer each, temperature 1), at the start and the end |
# | lag (per token) | trainer version minus the version that sampled the token (11.2); bound `max_lag` |
# | ESS/N, clipped | effective sample size of the batch's token weights over its tokens (07.4); share of tokens whose weight hit $c$ |
# | send / receive ms | seconds of one weight update on trainer 0 / a generator: stage, transfer, reload (lesson 09's phases) and load (copy into the model) |
# | $\beta_{eff}$ | bytes of the model over the median transfer time (11.5) |
# | in flight | answers being decoded when a generator swapped weights (their KV caches kept) |
# | attempt, restart count | a start of the job (0, 1, ...); the launch's restarts, which every rank agrees on through the store (`capstone.context.join_attempt`; torchrun's `TORCHELASTIC_RESTART_COUNT` on one node, but the agents of several nodes do not keep theirs in step) |
# | updates/s, samples/s | updates (and answers, 32 per update) per second of updating: the rates that compare runs whose answers differ in length |
# | arm | one run of section 8's comparison: async (as configured), sync (`max_lag` 0), colocated (shared buffer) |
# | resumed step | the checkpoint's update count a restarted attempt continued from |
# | generated, consumed, discarded, left over | samples handed over by generators (their lines); trained on, as the trainers recorded from the groups themselves; made by a dead attempt with a group number at or beyond the resumed checkpoint's batches; handed over but never trained on at the end (11.6) |
# | load average | the machine's 1-minute load average (its cores are shared with other jobs); above the number of cores, timings drift |
#
# ## Summary
#
# - One script, every rank: torchrun starts the ranks, each takes its role from its rank,
#   and the rendezvous store carries the setup, the groups, the announced version and the
#   backpressure counter; the run's every claim is read back from per-rank JSON lines.
# - Lesson 08's model chose the layout from a short calibration, and the run learned:
#   the held-out reward rose above the warm start's (asserted: by more than 0.03).
# - The plan's prediction in answer tokens/s mixes two errors: the answers' length drifted
#   from the calibration's (not the model's fault), and what the model does not count: the
#   all-reduces, the weight send in series with training, and four ranks sharing two cores
#   unevenly (the trainers' compute and all-reduces asserted more than 1.5x slower than the
#   calibrated rate). Updates/s, with the run's own answers, separates the two.
# - Measured side by side in one launch, interleaved: the pipeline ran more updates per
#   second than synchronous RL (the median of the per-round ratios printed in section 8;
#   asserted above 1.1x), the direction the published systems report at scale; the
#   colocated weight write took a fraction of the broadcast's time. The model's async/sync
#   ratio, with a share of the cores per regime, is within 2x of the measured one
#   (asserted), and a single share would miss by 1.5x more.
# - No consumed token lagged more than `max_lag` (11.2), checked on every update, and most
#   tokens lagged 2 or more: the pipeline fills its window.
# - Every weight update reached every generator, often with answers in flight and their KV
#   caches kept; at half a megabyte, a transfer is latency, not bandwidth (11.5).
# - A generator killed mid-run cost a restart of every rank and the updates since the
#   last checkpoint; the ledger (11.6), the trainers' record of the groups they trained on
#   held against the generators' lines, balanced exactly, and no process was left behind.
#
# **Full scale.** `COURSE_SCALE=full` runs 2000 updates of a 4-layer, 256-wide TinyLM from
# a 60-step warm start at a learning rate of 1e-4, evaluates on 2048 held-out prompts and
# checkpoints every 200 updates; the kill demonstration runs 400 updates, checkpoints every
# 100 and kills rank 3 at update 250; section 8's arms run 200 updates each. Rank 0
# calibrates on the ranks' device, so where the ranks run on GPUs the layout and the
# prediction describe the GPUs. As written, this notebook's runs take `--backend auto`:
# with fewer GPUs than 4 ranks (one GPU, say) they run on the CPUs, and the job says so in
# a printed line; on a GPU host section 8 compares async with sync only (the colocated arm
# would need another backend). Two ways to run on GPUs:
#
# - **one GPU per rank**: `--backend auto` picks NCCL (the oversubscription of section 3
#   goes away); more ranks are `--nproc-per-node 8` on one host, or several hosts meeting
#   through a c10d rendezvous (the command in `README.md` and `course_lib/capstone/job.py`,
#   the run directory on a filesystem every host sees; `tests/test_capstone_multinode.py`
#   runs that command as two agents on localhost, SIGKILLs a rank under one of them, and
#   checks that both agents re-rendezvous, the job resumes from its checkpoint and the
#   ledger balances). A machine with a single GPU cannot run this path;
# - **every rank on one GPU** (`--colocated`): gloo carries the trainers' all-reduce, the
#   weights go to the generators through CUDA IPC slots. This path ran on an H200 at the
#   cpu and the full sizes (400 of the 2000 updates; `BENCHMARKS.md`, "Full scale on a
#   GPU": updates/s, samples/s, weight-update latency, with date and device). There the
#   full-size policy collapsed at the cpu scale's learning rate (1e-3), held still at 3e-4
#   and learned at 1e-4, the rate the full scale now uses. The whole notebook at the full
#   scale (`course run 11 --scale full`) has not been run on a GPU.
#
# **References.** A. Piché, E. Kamalloo, R. Pardinas, X. Chen, D. Bahdanau, *PipelineRL:
# Faster On-policy Reinforcement Learning for Long Sequence Generation*, arXiv 2509.19128,
# 2025 (ServiceNow/PipelineRL). AReaL, arXiv 2505.24298 (sections 4.1 and 6.1: admission
# rule, inference/training split). verl documentation (fully-async and one-step-off-policy
# trainers; checkpoint-engine weight updates). MoonshotAI/checkpoint-engine (README: update
# times, buckets, broadcast and P2P modes). prime-rl (`max_off_policy_steps`). SkyRL,
# slime, NeMo-RL (staleness and correction knobs). ROLL Flash, arXiv 2510.11345. PyTorch
# `torchrun` (elastic launch: `--max-restarts`, c10d rendezvous) and `torch.distributed`
# documentation.
#
# **Exercises:** `exercises/11_capstone.ipynb`: a rank's role and its process groups, the
# weight-version handshake that admits a new group (11.2), which samples count after a
# restore (11.6), each trainer's loss over the global token count (11.1), and how the ranks
# of a restarted job agree on its attempt. Grade with
# `course grade exercises/11_capstone.ipynb`.
