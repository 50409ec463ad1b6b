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
# # Exercises 10 · Fault tolerance and checkpointing
#
# This notebook is generated from `exercises/src/10_fault_tolerance.py`; the worked
# solutions are in `solutions/10_fault_tolerance.ipynb`. Write the function bodies where
# they raise `NotImplementedError`, run the *check yourself* cell under each one, and when
# all pass grade the notebook from a terminal:
#
# ```
# course grade exercises/10_fault_tolerance.ipynb
# ```
#
# The equations are numbered as in `lessons/10_fault_tolerance.ipynb`. These are the four
# small pieces every fault-tolerant trainer rests on: a checkpoint that is committed all at
# once or not at all, restoring the newest one that is really complete, how often to save,
# and a resumed run that draws exactly the random numbers the uninterrupted run would have.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `commit_checkpoint`: write, fsync, then rename | 15 | ★★☆ | 30 min |
# | 2. `newest_complete`: the newest checkpoint that verifies | 15 | ★★☆ | 20 min |
# | 3. `optimal_interval`: the interval that minimises the exact waste | 10 | ★★☆ | 15 min |
# | 4. `train_until`: resume the key stream exactly | 10 | ★★☆ | 15 min |

# %%
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from course_lib import check


def writer_alive(pid):
    """Whether process ``pid`` is still running (given: exercise 1 uses it). A zombie, dead but
    not yet reaped by its parent, counts as gone: it can never finish a save."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True

# %% [markdown]
# ## Exercise 1 · Write, fsync, then rename (★★☆, 30 min, 15 points)
#
# A process can die at any instruction of a save: SIGKILL, a preempted host, a full disk.
# A checkpoint is safe when the name a restore looks for appears **only after every byte
# under it is on disk**. The recipe every serious checkpointer uses (Orbax's
# `CheckpointManager`, `torch.distributed.checkpoint`) is write-then-rename:
#
# 1. `root = Path(root)`, create it if missing; the final name is
#    `root / f"step_{step:08d}"`. If it already exists, raise `FileExistsError` (a committed
#    checkpoint is never overwritten).
# 2. Clean up, then write into a temporary directory **inside `root`** (a rename is atomic
#    only within one filesystem) whose name no other writer can hold:
#    `root / f".tmp-step_{step:08d}-{os.getpid()}-{secrets.token_hex(4)}"`. A fixed name would
#    be shared with a writer that is still alive (a zombie after a preemption, a second job
#    launched on the same folder), and removing "its leftover" would delete a live save. So
#    remove (`shutil.rmtree`) only the `.tmp-step_<digits>-<pid>-<hex>` directories in `root`
#    whose writer is gone (`not writer_alive(pid)`, the helper above), and leave the rest.
# 3. For each `name, data` in `files` (a `dict[str, bytes]`): open the file `"wb"`, write,
#    `f.flush()`, then **`os.fsync(f.fileno())`** (`flush` only empties Python's buffer
#    into the kernel; `fsync` makes the kernel put it on the disk).
# 4. Write `manifest.json` the same way (flush and `os.fsync`), holding
#    `{"step": step, "files": {name: {"sha256": <hex digest of the bytes>, "size": <bytes>}}}`
#    (`hashlib.sha256(data).hexdigest()`).
# 5. Fsync the **temporary directory** itself: a directory's entries (the names of the
#    files just written) are data too, and an fsync of each file does not make its name
#    durable. A directory is fsynced through a descriptor from `os.open(path, os.O_RDONLY)`.
# 6. Commit: **`os.replace(tmp, final)`**, one atomic rename of the whole directory.
# 7. Make the rename itself durable: fsync the **root directory** the same way.
#
# This is the lesson's protocol (`checkpoint.atomic.commit`), step for step. A `SIGKILL`
# cannot tell steps 3, 5 and 7 apart from their absence (the kernel keeps what a killed
# process wrote); only a power loss would, so the grader traces the calls instead.
#
# Return the final directory, a `Path`. Call `os.fsync` and `os.replace` through the `os`
# module as written (`os.fsync(...)`, not `from os import fsync`): the grader traces them.
#
# **How it is graded:** the committed directory must hold exactly the files, their bytes
# and a manifest with each file's sha256 and size; the traced calls must come in the
# recipe's order (every file fsynced inside the temporary directory before `os.replace`,
# the manifest in it at the rename, the temporary directory itself fsynced before it: the
# grader records which fsynced descriptors are directories; the root directory fsynced
# after; the temporary name carries this process's pid); then the save is crashed at each traced call in turn, between two files, and in the
# middle of each file's write (a torn write: half its bytes on disk, twice in a row), and
# tried again each time as a restarted run would: the last good checkpoint must survive, no
# half-written `step_` directory may appear, and the resumed save must commit one that
# verifies. Renaming before fsync, no fsync at all, no fsync of the temporary directory or of
# the root, the manifest written after the rename, writing straight into the final
# directory, a fixed temporary name, a dead writer's leftover kept and a live writer's
# folder deleted are named in the message (the grader starts a process that sleeps, for a
# live writer, and one that has exited, for a dead one).


# %% tags=["exercise"]
def commit_checkpoint(root, step, files):
    """Commit ``files`` as checkpoint ``step`` under ``root``, all at once or not at all.

    Args:
        root: the checkpoint folder (str or Path).
        step: int >= 0.
        files: dict of file name -> bytes.

    Returns:
        the committed directory, ``root / f"step_{step:08d}"``.
    """
    ### BEGIN SOLUTION
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    if final.exists():
        raise FileExistsError(f"{final} is already committed; a checkpoint is never overwritten")
    for old in root.iterdir():  # leftovers of saves that crashed before their rename
        match = re.fullmatch(r"\.tmp-step_\d+-(\d+)-[0-9a-f]+", old.name)
        if match and old.is_dir() and not writer_alive(int(match.group(1))):
            shutil.rmtree(old)  # its writer is gone: it can never finish
    tmp = root / f".tmp-step_{step:08d}-{os.getpid()}-{secrets.token_hex(4)}"  # no other writer holds it
    tmp.mkdir()
    entries = {}
    for name, data in files.items():
        with open(tmp / name, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before the commit
        entries[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    with open(tmp / "manifest.json", "w") as f:
        json.dump({"step": step, "files": entries}, f)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)  # the names of the files in tmp are durable too
    finally:
        os.close(fd)
    os.replace(tmp, final)  # the commit: one atomic rename
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power loss
    finally:
        os.close(fd)
    return final
    ### END SOLUTION


# %% tags=["raises-in-stub"]
with tempfile.TemporaryDirectory() as folder:
    path = commit_checkpoint(folder, 7, {"params.bin": b"\x00\x01" * 8, "opt.bin": b"adam"})
    print(path.name, sorted(p.name for p in path.iterdir()))
    print(json.loads((path / "manifest.json").read_text())["files"]["opt.bin"])
    print("left in the folder:", sorted(p.name for p in Path(folder).iterdir()))

# %% tags=["exercise-check"]
check("10_fault_tolerance", "commit_checkpoint", commit_checkpoint)

# %% [markdown]
# ## Exercise 2 · Restore the newest checkpoint that verifies (★★☆, 20 min, 15 points)
#
# Restore starts by choosing what to load: the **newest committed checkpoint whose
# manifest verifies**, falling back to older ones. In `root`:
#
# - a committed checkpoint is a **directory** whose whole name is `step_` followed by
#   digits (`re.fullmatch(r"step_(\d+)", name)`); its step is that number. Anything else is
#   not a checkpoint: a `.tmp-step_...` directory of a save in flight or one that crashed
#   before its rename (even if its files happen to be complete), stray files, other names.
# - order by the step as a **number**: `step_100000000` is newer than `step_99999999`.
# - it verifies when `manifest.json` parses and every file it lists exists with that `size`
#   and that `sha256`. An **integrity mismatch** (a missing manifest or listed file:
#   `FileNotFoundError`; a manifest that does not parse or lacks a key; a wrong size or
#   hash) means corrupt: try the next older one. Read no checkpoint older than the one you
#   return (a real one is terabytes: stop at the first that verifies).
# - **any other error propagates.** An `OSError` that is not `FileNotFoundError` (EIO from a
#   failing disk, EACCES, ESTALE from a network filesystem) says nothing about the bytes: an
#   older checkpoint on the same disk would fail the same way, and treating it as corruption
#   throws good checkpoints away. Catch it nowhere and move nothing.
# - once an older checkpoint verifies, **quarantine** each newer corrupt one: rename it with
#   `os.replace(path, path.with_name(".corrupt-" + path.name))` (readers stop seeing it, its
#   step can be written again, and the bytes stay for a post-mortem). Change nothing else.
# - no committed checkpoint at all: return `None` (a fresh run). Committed checkpoints that
#   all fail to verify: raise `RuntimeError` and move nothing. Starting from update 0 over a
#   run that has committed steps would silently discard it; a person decides.
#
# Return `(step, path)` (an `int` and the directory's `Path`). Exercise 1's format:
# `manifest.json` is `{"step": ..., "files": {name: {"sha256": hex, "size": bytes}}}`.
#
# **How it is graded:** hand-built folders broken the ways crashes break them (a corrupt
# newest: a flipped byte of the same size, a torn file, a zero-length file left by a rename
# before fsync, a file whose name a missing fsync of the folder lost, a writer killed between
# files, a torn or missing manifest; all broken; empty), leftovers of crashed attempts and
# stray files beside real checkpoints, steps past eight digits, then random folders against
# an oracle that verifies every candidate. Then faked I/O errors (EIO, EACCES, ESTALE,
# ETIMEDOUT, ENOSPC, EROFS, through `open` and `os.open`) when the newest's manifest or a
# file it lists is opened: the error must reach the caller and the folder stay as it was. The
# grader records every file you open and compares the folder before and after with what the
# quarantine should have renamed. Ordering the steps as strings, trusting a manifest without
# checking the hashes, taking a temporary directory, raising on an unparsable manifest,
# quarantining on an I/O error, starting fresh over corrupt checkpoints, reading older
# checkpoints than the one returned, and other changes to the folder are named in the message.


# %% tags=["exercise"]
def newest_complete(root):
    """The newest committed checkpoint under ``root`` whose manifest verifies; newer corrupt ones
    are quarantined as ``.corrupt-<name>``.

    Returns:
        (step, path) with step an int, or None if no checkpoint is committed.

    Raises:
        RuntimeError: checkpoints are committed but none verifies (nothing is moved).
        OSError: other than FileNotFoundError, as raised by the filesystem.
    """
    ### BEGIN SOLUTION
    committed = []
    for path in Path(root).iterdir():
        match = re.fullmatch(r"step_(\d+)", path.name)  # a temporary directory does not match
        if match and path.is_dir():
            committed.append((int(match.group(1)), path))
    corrupt = []
    for step, path in sorted(committed, reverse=True):  # newest first, by number
        try:
            manifest = json.loads((path / "manifest.json").read_text())
            intact = True
            for name, entry in manifest["files"].items():
                data = (path / name).read_bytes()
                intact = intact and len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):  # integrity, not I/O
            intact = False
        if intact:
            for bad in corrupt:  # quarantine only once an older one verifies
                os.replace(bad, bad.with_name(".corrupt-" + bad.name))
            return step, path
        corrupt.append(path)
    if corrupt:
        raise RuntimeError(f"no committed checkpoint verifies ({', '.join(p.name for p in corrupt)}): not starting from 0")
    return None
    ### END SOLUTION


# %% tags=["raises-in-stub"]
with tempfile.TemporaryDirectory() as folder:
    for step in (8, 9, 10):
        manifest = {"step": step, "files": {"w.bin": {"sha256": hashlib.sha256(b"w" * step).hexdigest(), "size": step}}}
        (Path(folder) / f"step_{step:08d}").mkdir()
        (Path(folder) / f"step_{step:08d}" / "w.bin").write_bytes(b"w" * step)
        (Path(folder) / f"step_{step:08d}" / "manifest.json").write_text(json.dumps(manifest))
    step, path = newest_complete(folder)
    print("newest:", step, path.name)
    (path / "w.bin").write_bytes(b"w" * 9 + b"X")  # one byte flipped, same size
    step, path = newest_complete(folder)
    print("after corrupting it:", step, path.name, "| beside it:", sorted(p.name for p in Path(folder).iterdir()))

# %% tags=["exercise-check"]
check("10_fault_tolerance", "newest_complete", newest_complete)

# %% [markdown]
# ## Exercise 3 · The interval that minimises the exact waste (★★☆, 15 min, 10 points)
#
# Young's (10.2) and Daly's (10.3) intervals minimise approximations. The model the lesson
# simulates (a save of `C` seconds after every `tau` seconds of work, failures at random
# with mean time between failures `M`, a restart of `R` seconds that does not itself fail)
# has an exact mean: a segment of `tau + C` seconds takes on average
# `(M + R)(exp((tau + C)/M) - 1)` seconds, so the wall time wasted per second of work is
#
# $$W_{exact}(\tau) = \frac{(M + R)\,\big(e^{(\tau + C)/M} - 1\big)}{\tau} - 1 \qquad (10.5)$$
#
# Write `optimal_interval(C, M, R=0.0)`: return `(tau, waste)`, the `tau > 0` that minimises
# (10.5) and the waste there, two floats. `tau` must be within a relative `1e-6` of the true
# minimiser: Daly's interval is often closer than that to it, but not always. Work out
# `dW/dtau = 0` by hand first: it is a one-variable equation with exactly one root in
# `(0, M)` (look at the sign of the derivative at both ends, and how it changes in between),
# which bisection finds to the last bit. What does `R` change? Raise `ValueError` if `C` or
# `M` is not positive or `R` is negative.
#
# **How it is graded:** the lesson's Llama 3 numbers and hand cases (a save as long as the
# MTBF included), then random `C`, `M` and `R` (a save from 1e-7 to 2 MTBFs) against a
# root-finding oracle, and `ValueError` on bad input. Returning Young's or Daly's
# interval, the first-order waste (10.1) or a waste without `R`, and an interval that moves
# with `R` are named in the message.


# %% tags=["exercise"]
def optimal_interval(C, M, R=0.0):
    """The checkpoint interval that minimises the exact waste (10.5), and that waste.

    Args:
        C: seconds a save blocks training (> 0).
        M: mean time between failures, seconds (> 0).
        R: seconds a restart takes (>= 0).

    Returns:
        (tau, waste), two floats: tau in seconds of work, waste per second of work.
    """
    ### BEGIN SOLUTION
    if C <= 0 or M <= 0 or R < 0:
        raise ValueError(f"need C > 0, M > 0 and R >= 0; got C={C}, M={M}, R={R}")

    def slope_sign(tau):  # the sign of dW/dtau, times tau^2 / (M + R) > 0: R drops out
        return (tau / M - 1) * math.expm1((tau + C) / M) + tau / M

    lo, hi = 0.0, float(M)  # slope_sign(0) = -expm1(C/M) < 0 < slope_sign(M) = 1, increasing in between
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if slope_sign(mid) < 0 else (lo, mid)
    tau = (lo + hi) / 2
    return tau, (M + R) * math.expm1((tau + C) / M) / tau - 1
    ### END SOLUTION


# %% tags=["raises-in-stub"]
M_job = 54 * 24 * 3600 / 419  # the lesson's Llama 3 job: 419 interruptions in 54 days
for C, R in ((60.0, 600.0), (60.0, 0.0), (2.0, 600.0)):
    tau, waste = optimal_interval(C, M_job, R)
    young = math.sqrt(2 * C * M_job)
    print(f"C = {C:4.0f} s, R = {R:3.0f} s: tau = {tau:7.1f} s (Young {young:7.1f} s), waste {waste:.4f}, "
          f"training {1 / (1 + waste):.1%} of the wall time")

# %% tags=["exercise-check"]
check("10_fault_tolerance", "optimal_interval", optimal_interval)

# %% [markdown]
# ## Exercise 4 · Resume the key stream exactly (★★☆, 15 min, 10 points)
#
# A JAX training loop carries its random state as a key. Each step splits the carried key
# into the next carried key and the step's two keys, one for the minibatch and one for
# the noise, and never uses a key twice:
#
# ```
# key, k_batch, k_noise = jax.random.split(key, 3)
# params = step_fn(params, k_batch, k_noise)
# ```
#
# A checkpoint is a dict `{"seed": int, "step": steps done, "params": ..., "key": the
# carried key}`; a fresh run is `{"seed": s, "step": 0, "params": p0, "key":
# jax.random.key(s)}`. Write `train_until(checkpoint, total_steps, step_fn)`: continue the
# run from `checkpoint` until `total_steps` steps are done and return the checkpoint after
# them (a new dict; the same seed). A run stopped at any step `k` and resumed from its
# checkpoint must then draw **exactly** the keys, and end with **bitwise** the params, of
# the uninterrupted run. When `checkpoint["step"] == total_steps`, nothing runs. The
# checkpoint's key and params are the run's whole state: a run need not have started from
# `jax.random.key(seed)` (each rank of a data-parallel run starts from its own
# `jax.random.fold_in(jax.random.key(seed), rank)`), so the seed alone cannot rebuild them.
#
# **How it is graded:** the grader hands in its own `step_fn`, which records every key it
# is given, and compares with the keys of the split above: an uninterrupted run, runs
# stopped at several steps and resumed (also after the key went through numpy, as a saved
# checkpoint's does), a run that started from a rank's `fold_in` key, with the params its
# first step is given recorded (which state was restored), and a run with nothing to do.
# Reusing one key for the batch and the noise, not carrying the key forward, restarting or
# replaying the stream from the seed on resume, an off-by-one step, and saving a step's key
# or the starting key instead of the carried one are named in the message.


# %% tags=["exercise"]
def train_until(checkpoint, total_steps, step_fn):
    """Continue the run in ``checkpoint`` until ``total_steps`` steps are done.

    Args:
        checkpoint: {"seed", "step", "params", "key"}, the key being the carried key.
        total_steps: int >= checkpoint["step"].
        step_fn: step_fn(params, k_batch, k_noise) -> params.

    Returns:
        the checkpoint after ``total_steps`` steps (a new dict).
    """
    ### BEGIN SOLUTION
    key, params = checkpoint["key"], checkpoint["params"]
    for _ in range(checkpoint["step"], total_steps):
        key, k_batch, k_noise = jax.random.split(key, 3)
        params = step_fn(params, k_batch, k_noise)
    return {"seed": checkpoint["seed"], "step": total_steps, "params": params, "key": key}
    ### END SOLUTION


# %% tags=["raises-in-stub"]
X = jax.random.normal(jax.random.key(1), (64, 3))
Y = X @ jnp.array([1.0, -2.0, 0.5])


@jax.jit
def noisy_sgd_step(params, k_batch, k_noise):
    """One step of noisy minibatch SGD on least squares: both draws use their own key."""
    idx = jax.random.randint(k_batch, (8,), 0, X.shape[0])
    grad = X[idx].T @ (X[idx] @ params - Y[idx]) / 8
    return params - 0.1 * (grad + 0.01 * jax.random.normal(k_noise, params.shape))


start = {"seed": 0, "step": 0, "params": jnp.zeros(3), "key": jax.random.key(0)}
straight = train_until(start, 20, noisy_sgd_step)
saved = train_until(start, 7, noisy_sgd_step)
saved = dict(saved, key=jax.random.wrap_key_data(np.asarray(jax.random.key_data(saved["key"]))))  # as saved on disk
resumed = train_until(saved, 20, noisy_sgd_step)
print("step", resumed["step"], "| params bitwise equal:", bool(jnp.array_equal(straight["params"], resumed["params"])))
print(
    "same carried key:",
    bool(jnp.array_equal(jax.random.key_data(straight["key"]), jax.random.key_data(resumed["key"]))),
)

# %% tags=["exercise-check"]
check("10_fault_tolerance", "train_until", train_until)
