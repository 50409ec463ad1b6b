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
# once or not at all, finding the newest one that is really complete, how often to save,
# and a resumed run that draws exactly the random numbers the uninterrupted run would have.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `commit_checkpoint`: write, fsync, then rename | 15 | ★★☆ | 30 min |
# | 2. `newest_complete`: the newest checkpoint that verifies | 15 | ★★☆ | 20 min |
# | 3. `optimal_interval`: Young's and Daly's intervals | 10 | ★☆☆ | 10 min |
# | 4. `train_until`: resume the key stream exactly | 10 | ★★☆ | 15 min |

# %%
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from course_lib import check

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
# 2. Write into the temporary directory `root / f".tmp-step_{step:08d}"`, **inside `root`**
#    (a rename is atomic only within one filesystem). If one is left over from a save that
#    crashed, remove it first (`shutil.rmtree`).
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
# after); then the save is crashed at each traced call in turn, between two files, and in the
# middle of each file's write (a torn write: half its bytes on disk, twice in a row), and
# tried again each time as a restarted run would: the last good checkpoint must survive, no
# half-written `step_` directory may appear, and the resumed save must commit one that
# verifies. Renaming before fsync, no fsync at all, no fsync of the temporary directory or of
# the root, the manifest written after the rename, writing straight into the final
# directory, a leftover temporary directory, and a crashed attempt's files reused are named
# in the message.


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
    final, tmp = root / f"step_{step:08d}", root / f".tmp-step_{step:08d}"
    if final.exists():
        raise FileExistsError(f"{final} is already committed; a checkpoint is never overwritten")
    if tmp.exists():  # a save that crashed before its rename
        shutil.rmtree(tmp)
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
# ## Exercise 2 · The newest checkpoint that verifies (★★☆, 20 min, 15 points)
#
# Restore starts by choosing what to load: the **newest committed checkpoint whose
# manifest verifies**, falling back to older ones. In `root`:
#
# - a committed checkpoint is a **directory** whose whole name is `step_` followed by
#   digits (`re.fullmatch(r"step_(\d+)", name)`); its step is that number. Anything else is
#   not a checkpoint: the `.tmp-step_...` directory of a save in flight or one that crashed
#   before its rename (even if its files happen to be complete), stray files, other names.
# - order by the step as a **number**: `step_100000000` is newer than `step_99999999`.
# - it verifies when `manifest.json` parses, and every file it lists exists with that
#   `size` and that `sha256`. A missing, truncated or unparsable manifest, a missing file, a
#   wrong size or a wrong hash: skip it and try the next older one. Never raise for a
#   broken checkpoint.
# - a restore only **reads**: change nothing under `root` (a broken checkpoint stays where it
#   is, for a person or another process to look at), and read no checkpoint older than the
#   one you return (a real one is terabytes: stop at the first that verifies).
#
# Return `(step, path)` (an `int` and the directory's `Path`), or `None` when no
# checkpoint verifies (an empty folder included). Exercise 1's format: `manifest.json` is
# `{"step": ..., "files": {name: {"sha256": hex, "size": bytes}}}`.
#
# **How it is graded:** hand-built folders broken the ways crashes break them (a corrupt
# newest: a flipped byte of the same size, a torn file, a zero-length file left by a rename
# before fsync, a file whose name a missing fsync of the folder lost, a writer killed between
# files, a torn or missing manifest; all broken; empty), leftovers of crashed attempts and
# stray files beside real checkpoints, steps past eight digits, then random folders against
# an oracle that verifies every candidate. The grader records every file you open and
# compares the folder before and after. Ordering the steps as strings, trusting a manifest
# without checking the hashes, taking a temporary directory, raising on an unreadable
# manifest, reading older checkpoints than the one returned, and changing the folder are
# named in the message.


# %% tags=["exercise"]
def newest_complete(root):
    """The newest committed checkpoint under ``root`` whose manifest verifies.

    Returns:
        (step, path) with step an int, or None if none verifies.
    """
    ### BEGIN SOLUTION
    committed = []
    for path in Path(root).iterdir():
        match = re.fullmatch(r"step_(\d+)", path.name)  # a temporary directory does not match
        if match and path.is_dir():
            committed.append((int(match.group(1)), path))
    for step, path in sorted(committed, reverse=True):  # newest first, by number
        try:
            manifest = json.loads((path / "manifest.json").read_text())
            intact = True
            for name, entry in manifest["files"].items():
                data = (path / name).read_bytes()
                intact = intact and len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # unreadable: not complete
            intact = False
        if intact:
            return step, path
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
    print("after corrupting it:", step, path.name)

# %% tags=["exercise-check"]
check("10_fault_tolerance", "newest_complete", newest_complete)

# %% [markdown]
# ## Exercise 3 · How often to checkpoint (★☆☆, 10 min, 10 points)
#
# A blocking save costs `C` seconds; failures come at random with mean time between
# failures `M` (MTBF); a failure costs a restart `R` and the work since the last completed
# checkpoint. Checkpointing every `tau` seconds of work wastes, to first order,
#
# $$W(\tau) = \frac{C}{\tau} + \frac{\tau + C}{2M} + \frac{R}{M} \qquad (10.1)$$
#
# (a save every `tau`; a failure loses on average half an interval plus the save in
# flight). Setting `dW/dtau = 0` gives Young's interval,
#
# $$\tau^* = \sqrt{2 C M} \qquad (10.2)$$
#
# and Daly's higher-order analysis corrects it for saves that are not short against `M`:
#
# $$\tau^* = \sqrt{2 C M}\Big(1 + \frac{1}{3}\sqrt{\frac{C}{2M}} + \frac{1}{9}\,\frac{C}{2M}\Big) - C \quad (C < 2M), \qquad \tau^* = M \quad (C \ge 2M) \qquad (10.3)$$
#
# Return `(young, daly)`, two floats in seconds. Raise `ValueError` if `C` or `M` is not
# positive.
#
# **How it is graded:** hand-computed values (a 60 s save at a one-hour MTBF: 657.3 s and
# 617.9 s), random `C` and `M` across six orders of magnitude against (10.2)-(10.3), the
# branch `C >= 2M`, Young's interval minimising (10.1) numerically, and `ValueError` on
# bad input. A missing factor 2, `C` and `M` swapped in Daly's correction, the `- C`
# forgotten, the `1/3` and `1/9` swapped and the missing `C >= 2M` branch are named.


# %% tags=["exercise"]
def optimal_interval(C, M):
    """Young's (eq. 10.2) and Daly's (eq. 10.3) checkpoint intervals, in seconds of work.

    Args:
        C: seconds a save blocks training (> 0).
        M: mean time between failures, seconds (> 0).

    Returns:
        (young, daly), two floats.
    """
    ### BEGIN SOLUTION
    if C <= 0 or M <= 0:
        raise ValueError(f"C and M must be > 0; got C={C}, M={M}")
    young = math.sqrt(2 * C * M)
    if C >= 2 * M:
        return young, float(M)
    x = C / (2 * M)
    daly = young * (1 + math.sqrt(x) / 3 + x / 9) - C
    return young, daly
    ### END SOLUTION


# %% tags=["raises-in-stub"]
for C, M in ((60.0, 3600.0), (600.0, 3600.0), (30.0, 86400.0)):
    young, daly = optimal_interval(C, M)
    print(f"C = {C:5.0f} s, MTBF = {M:6.0f} s: Young {young:7.1f} s, Daly {daly:7.1f} s")
print("(by hand: 657.3 and 617.9 s for the first)")

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
