"""Planted bugs in lesson 10's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

CC, NC, OI, TU = "commit_checkpoint", "newest_complete", "optimal_interval", "train_until"

FILE_FSYNC = (
    "            f.write(data)\n            f.flush()\n            os.fsync(f.fileno())  # on disk before the commit\n"
)
MANIFEST = (
    '    with open(tmp / "manifest.json", "w") as f:\n'
    '        json.dump({"step": step, "files": entries}, f)\n'
    "        f.flush()\n"
    "        os.fsync(f.fileno())\n"
)
TMP_FSYNC = (
    "    fd = os.open(tmp, os.O_RDONLY)\n"
    "    try:\n"
    "        os.fsync(fd)  # the names of the files in tmp are durable too\n"
    "    finally:\n"
    "        os.close(fd)\n"
)
COMMIT = "    os.replace(tmp, final)  # the commit: one atomic rename\n"
DIR_FSYNC = (
    "    fd = os.open(root, os.O_RDONLY)\n"
    "    try:\n"
    "        os.fsync(fd)  # the rename itself survives a power loss\n"
    "    finally:\n"
    "        os.close(fd)\n"
)
FSYNC_AFTER_RENAME = (
    "    for name in files:  # fsync after the rename: too late\n"
    '        with open(final / name, "rb") as f:\n'
    "            os.fsync(f.fileno())\n"
)
TAIL = (
    "    for name, data in files.items():\n"
    '        with open(tmp / name, "wb") as f:\n'
    + FILE_FSYNC
    + '        entries[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}\n'
    + MANIFEST
    + TMP_FSYNC
    + COMMIT
    + DIR_FSYNC
)
HASH = ' and hashlib.sha256(data).hexdigest() == entry["sha256"]'
EXCEPT = "except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):"
SPLIT = "        key, k_batch, k_noise = jax.random.split(key, 3)\n"
RESULT = '"step": total_steps, "params": params, "key": key}'
TMP_NAME = 'tmp = root / f".tmp-step_{step:08d}-{os.getpid()}-{secrets.token_hex(4)}"'
CLEANUP = (
    "    for old in root.iterdir():  # leftovers of saves that crashed before their rename\n"
    '        match = re.fullmatch(r"\\.tmp-step_\\d+-(\\d+)-[0-9a-f]+", old.name)\n'
    "        if match and old.is_dir() and not writer_alive(int(match.group(1))):\n"
    "            shutil.rmtree(old)  # its writer is gone: it can never finish\n"
)
NEWEST_FIRST = "    for step, path in sorted(committed, reverse=True):  # newest first, by number\n"
QUARANTINE = (
    "            for bad in corrupt:  # quarantine only once an older one verifies\n"
    '                os.replace(bad, bad.with_name(".corrupt-" + bad.name))\n'
)
FOUND = "        if intact:\n" + QUARANTINE + "            return step, path\n        corrupt.append(path)\n"
REFUSE = (
    "    if corrupt:\n"
    "        raise RuntimeError(f\"no committed checkpoint verifies ({', '.join(p.name for p in corrupt)}): not starting "
    'from 0")\n'
)
VERIFY_LOOP = (
    NEWEST_FIRST
    + "        try:\n"
    + '            manifest = json.loads((path / "manifest.json").read_text())\n'
    + "            intact = True\n"
    + '            for name, entry in manifest["files"].items():\n'
    + "                data = (path / name).read_bytes()\n"
    + '                intact = intact and len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == '
    + 'entry["sha256"]\n'
    + "        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):  # integrity, not I/O\n"
    + "            intact = False\n"
    + FOUND
)

MUTANTS: list[Mutant] = [
    # commit_checkpoint: the order of fsync and rename, the manifest, atomicity, leftovers
    Mutant(
        CC,
        "rename_before_fsync",
        TAIL,
        TAIL.replace(FILE_FSYNC, "            f.write(data)\n").replace(COMMIT, COMMIT + FSYNC_AFTER_RENAME),
        "renamed before fsync",
    ),
    Mutant(
        CC,
        "manifest_fsync_after_rename",
        MANIFEST + TMP_FSYNC + COMMIT,
        MANIFEST.replace("        os.fsync(f.fileno())\n", "")
        + TMP_FSYNC
        + COMMIT
        + '    with open(final / "manifest.json", "rb") as f:\n        os.fsync(f.fileno())\n',
        "renamed before fsync",
    ),
    Mutant(CC, "files_not_fsynced", FILE_FSYNC, "            f.write(data)\n", "is never fsynced"),
    Mutant(
        CC,
        "no_fsync_at_all",
        TAIL,
        TAIL.replace("            os.fsync(f.fileno())  # on disk before the commit\n", "")
        .replace("        os.fsync(f.fileno())\n", "")
        .replace(TMP_FSYNC, "")
        .replace(DIR_FSYNC, ""),
        "never calls os.fsync",
    ),
    Mutant(CC, "no_dir_fsync", DIR_FSYNC, "", "fsync the root directory"),
    Mutant(
        CC,
        "fsync_without_flush",
        FILE_FSYNC,
        FILE_FSYNC.replace("            f.flush()\n", ""),
        "call f.flush() before os.fsync",
    ),
    Mutant(
        CC,
        "tmp_dir_fsynced_when_empty",
        "    tmp.mkdir()\n    entries = {}\n" + TAIL,
        "    tmp.mkdir()\n" + TMP_FSYNC + "    entries = {}\n" + TAIL.replace(TMP_FSYNC, ""),
        "before its entries were written",
    ),
    Mutant(CC, "no_tmp_dir_fsync", TMP_FSYNC, "", "fsync the temporary directory itself before os.replace"),
    Mutant(
        CC,
        "tmp_dir_fsync_after_rename",
        TMP_FSYNC + COMMIT,
        COMMIT + TMP_FSYNC.replace("os.open(tmp,", "os.open(final,"),
        "fsync the temporary directory itself before os.replace",
    ),
    Mutant(
        CC,
        "manifest_after_rename",
        MANIFEST + TMP_FSYNC + COMMIT,
        COMMIT + MANIFEST.replace("tmp /", "final /") + TMP_FSYNC.replace("os.open(tmp,", "os.open(final,"),
        "write the manifest before the rename",
    ),
    Mutant(CC, "straight_into_final", TMP_NAME, "tmp = final", "non-atomic"),
    # wrong mechanism (issue 45, review defect 9): one fixed temporary name, its leftover removed: deletes the
    # save of a writer that is still alive
    Mutant(
        CC,
        "fixed_tmp_name",
        CLEANUP + "    " + TMP_NAME + "  # no other writer holds it\n",
        '    tmp = root / f".tmp-step_{step:08d}"\n    if tmp.exists():\n        shutil.rmtree(tmp)\n',
        "a fixed name is shared with a writer",
    ),
    Mutant(CC, "dead_leftovers_kept", CLEANUP, "", "whose writer is gone"),
    Mutant(
        CC,
        "deletes_live_leftovers",
        "        if match and old.is_dir() and not writer_alive(int(match.group(1))):\n",
        "        if match and old.is_dir():\n",
        "is still running",
    ),
    Mutant(
        CC,
        "hash_of_the_name",
        '"sha256": hashlib.sha256(data).hexdigest()',
        '"sha256": hashlib.sha256(name.encode()).hexdigest()',
        "sha256 of params.bin",
    ),
    Mutant(
        CC,
        "overwrites",
        "    if final.exists():\n",
        "    if False:\n",
        "expected FileExistsError",
    ),
    # newest_complete: ordering, verification, names, robustness
    Mutant(
        NC,
        "string_order",
        "sorted(committed, reverse=True)",
        "sorted(committed, key=lambda c: c[1].name, reverse=True)",
        "ordered as strings",
    ),
    Mutant(NC, "no_hash_check", HASH, "", "without checking the hashes"),
    Mutant(
        NC,
        "trusts_the_manifest",
        '            for name, entry in manifest["files"].items():\n                data = (path / name).read_bytes()\n',
        '            for name, entry in []:  # the manifest parses: trust it\n                data = b""\n',
        "without checking the hashes",
    ),
    Mutant(
        NC,
        "takes_temporary_dirs",
        're.fullmatch(r"step_(\\d+)", path.name)',
        're.search(r"step_(\\d+)", path.name)',
        "not step_<digits> in full",
    ),
    Mutant(NC, "crashes_on_unreadable_manifest", EXCEPT, "except FileNotFoundError:", "integrity mismatch"),
    # wrong mechanism (issue 45, review defect 1): any exception, an EIO included, taken for corruption: good
    # checkpoints quarantined and the run restarted from an older one, or from 0
    Mutant(NC, "quarantines_on_any_exception", EXCEPT, "except Exception:", "let other OSErrors propagate"),
    Mutant(NC, "catches_every_oserror", EXCEPT, EXCEPT.replace("FileNotFoundError", "OSError"), "propagate"),
    # wrong mechanism (review 10, defect 6): only the errnos a first grader injected are I/O errors; an ESTALE or a
    # ETIMEDOUT from a network filesystem quarantines good checkpoints
    Mutant(
        NC,
        "errno_whitelist",
        EXCEPT,
        "except OSError as error:  # EIO and EACCES are the disk's; anything else is the checkpoint's\n"
        "            if error.errno in (5, 13):\n"
        "                raise\n"
        "            intact = False\n"
        "        " + EXCEPT.replace("FileNotFoundError, ", ""),
        "let other OSErrors propagate",
    ),
    Mutant(NC, "fresh_start_over_corrupt", REFUSE, "", "expected RuntimeError"),
    Mutant(
        NC,
        "quarantines_before_a_good_one",
        FOUND,
        "        if intact:\n            return step, path\n"
        '        os.replace(path, path.with_name(".corrupt-" + path.name))\n        corrupt.append(path)\n',
        "move nothing",
    ),
    Mutant(NC, "oldest_first", "sorted(committed, reverse=True)", "sorted(committed)", "the newest that verifies"),
    # wrong mechanism (issue 45): every checkpoint verified, then the newest kept (right answer, every byte read)
    Mutant(
        NC,
        "verifies_every_checkpoint",
        VERIFY_LOOP,
        VERIFY_LOOP.replace(
            NEWEST_FIRST,
            "    verified = []\n    for step, path in sorted(committed):  # verify them all, keep the newest\n",
        ).replace(
            FOUND,
            "        if intact:\n            verified.append((step, path))\n        corrupt.append(path)\n"
            "    return max(verified) if verified else None\n",
        ),
        "stop at the first that verifies",
    ),
    # wrong mechanism (issue 45): a broken checkpoint deleted instead of quarantined (no post-mortem)
    Mutant(
        NC,
        "deletes_broken_checkpoints",
        QUARANTINE,
        "            for bad in corrupt:\n                shutil.rmtree(bad)\n",
        "quarantine the newer corrupt",
    ),
    # optimal_interval: the exact waste (10.5) and its minimiser
    Mutant(OI, "returns_young", "    tau = (lo + hi) / 2\n", "    tau = math.sqrt(2 * C * M)\n", "Young's interval"),
    Mutant(
        OI,
        "first_order_waste",
        "    return tau, (M + R) * math.expm1((tau + C) / M) / tau - 1",
        "    return tau, C / tau + (tau + C) / (2 * M) + R / M",
        "first-order (10.1)",
    ),
    Mutant(OI, "waste_without_r", "(M + R) * math.expm1", "M * math.expm1", "leaves out R"),
    Mutant(OI, "too_few_bisections", "range(200)", "range(12)", "allowed 1e-6"),
    Mutant(
        OI,
        "tau_moves_with_r",
        "(tau / M - 1) * math.expm1((tau + C) / M) + tau / M",
        "(tau / (M + R) - 1) * math.expm1((tau + C) / (M + R)) + tau / (M + R)",
        "moves with R",
    ),
    Mutant(
        OI,
        "imports_library_intervals",
        "def optimal_interval(C, M, R=0.0):\n",
        "from course_lib.checkpoint.interval import daly_interval, exact_waste_fraction\n\n\n"
        "def optimal_interval(C, M, R=0.0):\n"
        "    return daly_interval(C, M), float(exact_waste_fraction(daly_interval(C, M), C, M, R))\n\n\n"
        "def unused(C, M, R=0.0):\n",
        "optimal_interval uses course_lib.checkpoint.interval",
    ),
    Mutant(
        OI, "no_value_error", "    if C <= 0 or M <= 0 or R < 0:\n", "    if C < 0 and M < 0:\n", "expected ValueError"
    ),
    # train_until: the key stream and the checkpoint
    Mutant(
        TU,
        "reuses_key",
        SPLIT,
        "        key, k_batch = jax.random.split(key)\n        k_noise = k_batch\n",
        "with one key",
    ),
    Mutant(
        TU,
        "no_carry",
        SPLIT,
        "        _, k_batch, k_noise = jax.random.split(key, 3)\n",
        "every step draws the same keys",
    ),
    Mutant(
        TU,
        "restarts_from_seed",
        'key, params = checkpoint["key"], checkpoint["params"]',
        'key, params = jax.random.key(checkpoint["seed"]), checkpoint["params"]',
        "from the seed",
    ),
    # wrong mechanism (issue 45): the key rebuilt by replaying the seed's stream to the checkpoint's step (the
    # same keys whenever the run started from key(seed))
    Mutant(
        TU,
        "replays_key_from_seed",
        'key, params = checkpoint["key"], checkpoint["params"]',
        'key, params = jax.random.key(checkpoint["seed"]), checkpoint["params"]\n'
        '    for _ in range(checkpoint["step"]):  # replay the stream up to the resume point\n'
        "        key, _, _ = jax.random.split(key, 3)",
        "replayed from the seed",
    ),
    Mutant(
        TU,
        "skips_a_step",
        'range(checkpoint["step"], total_steps)',
        'range(checkpoint["step"] + 1, total_steps)',
        "off by one",
    ),
    Mutant(
        TU, "step_off_by_one", RESULT, RESULT.replace('"step": total_steps', '"step": total_steps - 1'), "off by one"
    ),
    Mutant(TU, "saves_a_step_key", RESULT, RESULT.replace('"key": key}', '"key": k_noise}'), "a step's key"),
    Mutant(
        TU,
        "saves_the_start_key",
        RESULT,
        RESULT.replace('"key": key}', '"key": checkpoint["key"]}'),
        "the key the run started from",
    ),
]
