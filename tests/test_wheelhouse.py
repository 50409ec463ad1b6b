"""``course wheelhouse``: a folder of wheels for an install with no network, and its check.

The small wheelhouse here (the course's own wheel, its build backend and one pure-Python
dependency, ``six``) is built with the network cut for pip: every proxy points at a closed
port, so pip can only take what this machine's pip configuration finds on local disk
(find-links, file:// mirrors). It is then installed into a fresh venv with pip's
configuration switched off (``PIP_CONFIG_FILE=/dev/null``), ``--no-index`` and the same dead
proxies, and imported.

The full-size run (every pin of pyproject.toml, then ``make install WHEELHOUSE=DIR`` in a
fresh copy of the checkout and ``course doctor`` there) needs ~2 GB of disk and a few
minutes: it runs only with ``COURSE_TEST_WHEELHOUSE=1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from course_lib.course import wheelhouse as wh
from course_lib.course.paths import repo_root

HOST = wh.host_python_version()
OTHER = "3.12" if HOST != "3.12" else "3.11"
DEAD_PROXY = "http://127.0.0.1:9"


def _no_network(env: dict[str, str]) -> dict[str, str]:
    """Every HTTP(S) request pip makes fails at once; file:// and local paths still work."""
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[key] = DEAD_PROXY
    env["NO_PROXY"] = env["no_proxy"] = ""
    env["PIP_RETRIES"] = "0"
    env["PIP_TIMEOUT"] = "2"
    return env


def _offline_env() -> dict[str, str]:
    """No network, and none of this machine's pip configuration (no /opt/wheels, no mirrors)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "VIRTUAL_ENV"}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return _no_network(env)


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _copy_checkout(dest: Path, with_lessons: bool = False) -> Path:
    root = repo_root()
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "Makefile"):
        shutil.copy2(root / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(root / "course_lib", dest / "course_lib", ignore=ignore)
    if with_lessons:
        shutil.copytree(root / "lessons", dest / "lessons", ignore=ignore)
    else:
        (dest / "lessons").mkdir()
    return dest


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """The course's wheel, setuptools, wheel and six, from local sources only."""
    directory = tmp_path_factory.mktemp("wheelhouse") / "small"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in _no_network({}).items():
            mp.setenv(key, value)
        try:
            wh.build_wheelhouse(directory, wh.BuildOptions(requirements=("six",)))
        except wh.WheelhouseError as exc:
            if "no wheel of" in str(exc):
                pytest.skip(f"this machine's pip configuration has no local wheel of setuptools, wheel or six: {exc}")
            raise
    return directory


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _edit_manifest(directory: Path, **changes) -> None:
    path = directory / wh.MANIFEST
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


# --------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    ("text", "expected"), [("3.11", "3.11"), ("311", "3.11"), ("3.12.4", "3.12.4"), ("3.13", "3.13")]
)
def test_python_version_accepted(text, expected):
    assert wh.parse_python_version(text, ">=3.11,<3.14") == expected


@pytest.mark.parametrize("text", ["python3.11", "3", "three", "", "3.11-dev", "3..11"])
def test_python_version_unknown_string(text):
    with pytest.raises(wh.WheelhouseError, match=r"unknown Python version .*MAJOR\.MINOR"):
        wh.parse_python_version(text, ">=3.11,<3.14")


@pytest.mark.parametrize("text", ["3.10", "3.14", "2.7"])
def test_python_version_unsupported(text):
    with pytest.raises(wh.WheelhouseError, match=rf"Python {text} is not supported .*>=3\.11,<3\.14"):
        wh.parse_python_version(text, ">=3.11,<3.14")


def test_cli_rejects_bad_version_before_touching_dir(tmp_path, capsys):
    target = tmp_path / "wh"
    assert wh.main([str(target), "--python-version", "3.x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown Python version '3.x'") and err.count("\n") == 1
    assert wh.main([str(target), "--python-version", "3.9"]) == 2
    assert "Python 3.9 is not supported" in capsys.readouterr().err
    assert wh.main([str(target), "--platform", "Linux x86-64"]) == 2
    err = capsys.readouterr().err
    assert "unknown platform tag 'Linux x86-64'" in err
    # the examples name only what the course supports: Linux and macOS on Apple silicon, no Windows
    assert "manylinux_2_28_x86_64 (Linux x86-64) or macosx_14_0_arm64" in err and "win" not in err
    assert not target.exists()


@pytest.mark.parametrize("tag", ["win_amd64", "win32", "win_arm64"])
def test_windows_tags_are_refused_before_touching_dir(tmp_path, capsys, tag):
    target = tmp_path / "wh"
    assert wh.main([str(target), "--platform", "manylinux_2_28_x86_64", "--platform", tag]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tag} is a Windows tag, and the course does not run on Windows")
    assert "WSL 2" in err and "manylinux_2_28_x86_64 (Linux x86-64)" in err and err.count("\n") == 1
    assert not target.exists()


def test_help_says_which_platforms_can_install_the_pins(capsys):
    with pytest.raises(SystemExit):
        wh.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "win_amd64" not in text and "does not run on Windows" in text
    assert "macOS on Intel (x86_64) cannot install it" in text and "no macOS x86-64 wheels after torch 2.2" in text
    assert f"pins torch {wh.TORCH_PIN}" in text and "macosx_14_0_arm64: it needs macOS 14 or later" in text
    # the torch named in the help is the one pyproject.toml pins
    assert f'"torch=={wh.TORCH_PIN}"' in (repo_root() / "pyproject.toml").read_text()


def test_cli_check_takes_no_build_options(tmp_path, capsys):
    assert wh.main(["--check", str(tmp_path), "--platform", "macosx_14_0_arm64"]) == 2
    assert "--check verifies DIR against the Python running it and takes no --platform" in capsys.readouterr().err


def test_unwritable_dir(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(wh.WheelhouseError, match="exists and is not a folder"):
        wh._prepare_dir(a_file)
    with pytest.raises(wh.WheelhouseError, match=r"cannot write to .*a_file/wh \(Not a directory\)"):
        wh._prepare_dir(a_file / "wh")
    if os.geteuid() == 0:  # root writes through permission bits: take a path no one can create
        with pytest.raises(wh.WheelhouseError, match="cannot write to /proc/"):
            wh._prepare_dir(Path("/proc/course-wheelhouse-test"))
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(wh.WheelhouseError, match=r"cannot write to .*locked \(Permission denied\)"):
            wh._prepare_dir(locked)


def test_dir_with_other_files_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(wh.WheelhouseError, match=r"not from a wheelhouse \(notes\.txt\): give an empty or new folder"):
        wh._prepare_dir(tmp_path)


def test_check_missing_or_foreign_dir(tmp_path):
    with pytest.raises(wh.WheelhouseError, match="no such folder"):
        wh.check_wheelhouse(tmp_path / "missing")
    with pytest.raises(wh.WheelhouseError, match=r"holds no MANIFEST\.json"):
        wh.check_wheelhouse(tmp_path)


def test_no_wheel_is_named_with_what_to_do(tmp_path, monkeypatch):
    for key, value in _no_network({}).items():
        monkeypatch.setenv(key, value)
    empty = tmp_path / "empty"
    empty.mkdir()
    opts = wh.BuildOptions(
        requirements=("course-test-no-such-package==1.0",),
        include_project=False,
        no_index=True,
        find_links=(str(empty),),
    )
    with pytest.raises(wh.WheelhouseError) as info:
        wh.build_wheelhouse(tmp_path / "wh", opts)
    message = str(info.value)
    assert message.startswith(f"no wheel of course-test-no-such-package==1.0 for Python {HOST} on ")
    assert "pip wheel 'course-test-no-such-package==1.0' -w WHEELS" in message and "--find-links" in message
    assert "\n" not in message


def test_no_wheel_names_the_package_that_needs_it():
    output = (
        "Collecting jax==0.10.2\n"
        "ERROR: Could not find a version that satisfies the requirement ml-dtypes>=0.5 (from jax==0.10.2) "
        "(from versions: none)\n"
        "ERROR: No matching distribution found for ml-dtypes>=0.5\n"
    )
    error = wh._no_wheel_error(wh.PipFailed("pip failed", output), "3.13", "macosx_14_0_arm64")
    assert error is not None
    assert str(error).startswith(
        "no wheel of ml-dtypes>=0.5 (needed by jax==0.10.2) for Python 3.13 on macosx_14_0_arm64"
    )


def test_a_pin_needing_a_later_micro_release_is_explained():
    output = (
        "ERROR: Ignored the following versions that require a different python version: 13.0 Requires-Python "
        ">=3.11.5; 13.1 Requires-Python >=3.11.5\n"
        "ERROR: Could not find a version that satisfies the requirement pymdown-extensions==13.1 (from versions: 12.3)\n"
        "ERROR: No matching distribution found for pymdown-extensions==13.1\n"
    )
    error = wh._no_wheel_error(wh.PipFailed("pip failed", output), "3.11", "manylinux_2_28_x86_64")
    assert isinstance(error, wh.NeedsLaterPython) and error.release == "3.11.5"
    assert str(error).startswith(
        "pymdown-extensions==13.1 needs Python >=3.11.5 (its Requires-Python), and this wheelhouse is for "
        "Python 3.11 (pip reads that as .0): give the room's exact release, e.g. --python-version 3.11.5"
    )


def _make_wheel(directory: Path, name: str, requires_python: str) -> Path:
    """A minimal pure-Python wheel (pip download and install read its METADATA, not its RECORD)."""
    import zipfile

    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "X = 1\n")
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nRequires-Python: {requires_python}\n"
        zf.writestr(f"{name}-1.0.dist-info/METADATA", meta)
        zf.writestr(f"{name}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{name}-1.0.dist-info/RECORD", "")
    return path


def test_python_floor_raised_recorded_and_checked(tmp_path, capsys):
    """`--python-version X.Y` is read by pip as X.Y.0: a wheel needing X.Y.5 raises the floor, which is recorded."""
    links = tmp_path / "links"
    links.mkdir()
    _make_wheel(links, "probe_floor", f">={HOST}.5")
    opts = wh.BuildOptions(
        python_version=HOST,
        requirements=("probe_floor",),
        include_project=False,
        no_index=True,
        find_links=(str(links),),
    )
    manifest = wh.build_wheelhouse(tmp_path / "wh", opts)
    assert manifest["python_at_least"] == f"{HOST}.5" and manifest["python_requested"] == HOST
    assert f"probe-floor needs Python >={HOST}.5: resolved for Python {HOST}.5 instead of {HOST}" in manifest["notes"]
    assert manifest["files"][0]["requires_python"] == f">={HOST}.5"
    out = capsys.readouterr().out
    assert f"requirements for Python {HOST} on " in out and f"requirements for Python {HOST}.5 on " in out
    if sys.version_info[2] >= 5:
        assert wh.check_wheelhouse(tmp_path / "wh").startswith("OK: ")
    else:
        with pytest.raises(wh.WheelhouseError, match=f"need Python {HOST}.5 or a later {HOST} release"):
            wh.check_wheelhouse(tmp_path / "wh")
    # an exact release below the floor is not raised: it is what the room has (on 3.11 the course's
    # own requires-python, >=3.11.5, refuses it first)
    opts.python_version = f"{HOST}.2"
    refused = rf"e\.g\. --python-version {HOST}\.5, if every machine|Python {HOST}\.2 is not supported by the course"
    with pytest.raises(wh.WheelhouseError, match=refused):
        wh.build_wheelhouse(tmp_path / "wh2", opts)


def test_platform_expansion_and_needed_platform():
    tags = wh.expand_platform("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_27_x86_64" in tags  # jaxlib 0.10.2's tag
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert wh.expand_platform("manylinux2014_aarch64")[0] == "manylinux_2_17_aarch64"
    assert wh.expand_platform("macosx_14_0_arm64") == ["macosx_14_0_arm64"]
    names = [
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "jaxlib-0.10.2-cp311-cp311-manylinux_2_27_x86_64.whl",
        "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl",
        "six-1.17.0-py2.py3-none-any.whl",
    ]
    assert wh.needed_platform(names, "fallback") == "manylinux_2_28_x86_64"
    assert wh.needed_platform(names[1:], "fallback") == "manylinux_2_27_x86_64"
    assert wh.needed_platform(names[3:], "fallback") == "fallback"
    assert wh.needed_platform(["x-1-cp311-cp311-linux_x86_64.whl"], "fallback") == "fallback"


def test_pip_failure_is_one_line_with_its_last_lines(tmp_path, monkeypatch):
    for key, value in _no_network({}).items():
        monkeypatch.setenv(key, value)
    opts = wh.BuildOptions(requirements=("not a requirement!!",), include_project=False, no_index=True)
    with pytest.raises(wh.PipFailed) as info:
        wh.build_wheelhouse(tmp_path / "wh", opts)
    message = str(info.value)
    assert message.startswith("pip download for ") and "pip failed (exit 1): " in message
    assert "not a requirement!!" in message and "full output: " in message and "\n" not in message
    assert "not a requirement!!" in (tmp_path / "wh" / wh.PIP_LOG).read_text()


def test_makefile_install_commands(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    checkout = _copy_checkout(tmp_path / "checkout")
    plain = _run(["make", "-n", "install"], dict(os.environ), checkout).stdout
    assert "-m pip install --quiet --disable-pip-version-check -e .\n" in plain and "--no-index" not in plain
    offline = _run(["make", "-n", "install", "WHEELHOUSE=/x y"], dict(os.environ), checkout).stdout
    assert '-m pip install --quiet --disable-pip-version-check --no-index --find-links "/x y" -e .\n' in offline


# --------------------------------------------------------------------------- the small wheelhouse


def test_small_wheelhouse_manifest(small):
    manifest = json.loads((small / wh.MANIFEST).read_text())
    names = [f["name"] for f in manifest["files"]]
    assert manifest["python_version"] == HOST and manifest["platforms"] == [wh.native_platform()]
    assert {n.split("-")[0].lower() for n in names} >= {"efficient_rl_course", "setuptools", "wheel", "six"}
    assert sorted(p.name for p in small.glob("*.whl")) == sorted(names)
    for f in manifest["files"]:
        assert f["size"] == (small / f["name"]).stat().st_size and f["sha256"] == wh.sha256_of(small / f["name"])
    assert manifest["total_size"] == sum(f["size"] for f in manifest["files"]) and manifest["file_count"] == len(names)
    assert manifest["course"]["version"] and manifest["pip"]["version"][0].isdigit() and manifest["created"]
    assert any(f["source"].startswith("built from ") for f in manifest["files"])
    readme = (small / wh.README).read_text()
    assert (
        readme.splitlines()[0]
        == f"python{HOST} -m venv .venv && .venv/bin/pip install --no-index --find-links {small} -e ."
    )


def test_check_passes_then_catches_tampering(small, tmp_path, capsys):
    assert wh.main(["--check", str(small)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK: {small}: ") and "every sha256 matches" in out

    other = _copy(small, tmp_path / "other_python")
    _edit_manifest(other, python_version=OTHER)
    assert wh.main(["--check", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"was built for Python {OTHER}, but this interpreter" in err and f"is Python {sys.version.split()[0]}" in err

    mac = _copy(small, tmp_path / "other_platform")
    _edit_manifest(mac, platforms=["macosx_14_0_arm64"])
    with pytest.raises(
        wh.WheelhouseError, match=r"built for platform macosx_14_0_arm64, but this interpreter installs "
    ):
        wh.check_wheelhouse(mac)

    newer = _copy(small, tmp_path / "newer_micro")
    manifest = json.loads((newer / wh.MANIFEST).read_text())
    manifest["python_at_least"] = f"{HOST}.999"
    manifest["files"][0]["requires_python"] = f">={HOST}.999"
    (newer / wh.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(wh.WheelhouseError) as info:
        wh.check_wheelhouse(newer)
    assert f"2 problem(s): its wheels need Python {HOST}.999 or a later {HOST} release, and this is " in str(info.value)
    assert f"{manifest['files'][0]['name']} needs Python >={HOST}.999, and this interpreter is " in str(info.value)

    damaged = _copy(small, tmp_path / "damaged")
    six = next(damaged.glob("six-*.whl"))
    with six.open("ab") as fh:
        fh.write(b"\0")
    setuptools = next(damaged.glob("setuptools-*.whl"))
    setuptools.unlink()
    (damaged / "stray-1.0-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(wh.WheelhouseError) as info:
        wh.check_wheelhouse(damaged)
    message = str(info.value)
    assert f"3 problem(s): {setuptools.name} is missing; sha256 mismatch for {six.name} (manifest " in message
    assert "stray-1.0-py3-none-any.whl is not in the manifest" in message


def test_offline_install_into_fresh_venv(small, tmp_path):
    """The wheel install and the editable one (`make install`'s) from the small wheelhouse, network cut."""
    env = _offline_env()
    venv.create(tmp_path / "venv", with_pip=True, clear=True)
    py = tmp_path / "venv" / "bin" / "python"
    pip = [py, "-m", "pip", "install", "--no-index", "--find-links", small, "--no-deps"]
    _run([*pip, "efficient-rl-course", "six"], env, tmp_path)
    probe = "import course_lib, six, sys; print(course_lib.__version__, six.__version__, course_lib.__file__)"
    out = _run([py, "-c", probe], env, tmp_path).stdout
    assert out.startswith(f"{wh.load_project().version} 1.") and str(tmp_path / "venv") in out
    verdict = _run([py, "-m", "course_lib.course.wheelhouse", "--check", small], env, tmp_path).stdout
    assert verdict.startswith("OK: ")

    # editable from a checkout: pip builds the course with the backend (setuptools, wheel) from the wheelhouse
    checkout = _copy_checkout(tmp_path / "checkout")
    _run([*pip, "-e", checkout], env, checkout)
    out = _run([py, "-c", probe], env, tmp_path).stdout
    assert str(checkout / "course_lib") in out


# --------------------------------------------------------------------------- the full wheelhouse (opt-in)


@pytest.mark.skipif(os.environ.get("COURSE_TEST_WHEELHOUSE") != "1", reason="set COURSE_TEST_WHEELHOUSE=1 (~2 GB)")
@pytest.mark.timeout(1800)
def test_full_wheelhouse_offline_install_and_doctor(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    if free_gb < 8:
        pytest.skip(f"{free_gb:.1f} GB free under {tmp_path}; the wheelhouse and its venv need about 6 GB")
    directory = tmp_path / "wheelhouse"
    checkout = _copy_checkout(tmp_path / "checkout", with_lessons=True)
    try:
        t0 = time.perf_counter()
        built = _run(
            [sys.executable, "-m", "course_lib.course.wheelhouse", directory], dict(os.environ), tmp_path, 1500
        )
        t_build = time.perf_counter() - t0
        manifest = json.loads((directory / wh.MANIFEST).read_text())
        t0 = time.perf_counter()
        env = _offline_env()
        _run(["make", "install", f"WHEELHOUSE={directory}", f"PYTHON={sys.executable}"], env, checkout, 1500)
        t_install = time.perf_counter() - t0
        course = checkout / ".venv" / "bin" / "course"
        verdict = _run([course, "wheelhouse", "--check", directory], env, checkout).stdout
        doctor = subprocess.run([course, "doctor"], env=env, cwd=checkout, capture_output=True, text=True, timeout=600)
        summary = next((ln for ln in doctor.stdout.splitlines() if ln.startswith("doctor: ")), "(no summary line)")
        print(
            f"\nwheelhouse: {manifest['file_count']} files, {manifest['total_size'] / 1e6:.0f} MB, built in "
            f"{t_build:.0f} s; offline `make install` in {t_install:.0f} s; {summary}\n" + built.stdout + verdict
        )
        assert doctor.returncode == 0 and " 0 FAIL" in summary, doctor.stdout[-4000:] + doctor.stderr[-2000:]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(checkout, ignore_errors=True)
