"""course_lib.runtime.netns: commands in a network namespace where only loopback is up.

Real namespaces, real sockets, real signals. The tests hold both outside the namespace and
inside it (``make test`` runs the whole suite inside one); the few that need the machine's
own network say so and skip inside.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from course_lib.course.notebooks import execute
from course_lib.course.notebooks.source import Target
from course_lib.runtime import netns

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
OUTSIDE = not netns.in_loopback_namespace()
needs_outside = pytest.mark.skipif(
    not OUTSIDE, reason="checks what happens outside a loopback-only namespace: run it outside one"
)

#: run inside the namespace: what the network looks like there, as JSON
REPORT = textwrap.dedent(
    """
    import errno, json, socket, sys
    import psutil
    from course_lib.runtime.netns import in_loopback_namespace

    ips = {n: sorted(a.address for a in v if a.family in (socket.AF_INET, socket.AF_INET6))
           for n, v in psutil.net_if_addrs().items()}
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname(), timeout=5)
    conn, _ = server.accept()
    client.sendall(b"ping")
    echoed = conn.recv(4)
    def reach(host, port):
        try:
            socket.create_connection((host, port), timeout=3).close()
            return "connected"
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc))
    print(json.dumps({"ips": {n: v for n, v in ips.items() if v}, "loopback": in_loopback_namespace(),
                      "echo": echoed.decode(), "targets": {h: reach(h, int(p)) for h, p in
                      (arg.split(":") for arg in sys.argv[1:])}}))
    """
)


def _run(argv: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, **kwargs)


def _host_ipv4() -> list[str]:
    return [
        a.address
        for name, entries in psutil.net_if_addrs().items()
        if name != "lo"
        for a in entries
        if a.family == socket.AF_INET
    ]


# --------------------------------------------------------------------------- the namespace itself


def test_command_is_the_wrapped_argv():
    assert netns.command(["prog", "a b"]) == [PY, "-m", "course_lib.runtime.netns", "--require", "--", "prog", "a b"]
    assert netns.command(["prog"], require=False) == [PY, "-m", "course_lib.runtime.netns", "--", "prog"]
    with pytest.raises(ValueError, match="empty"):
        netns.command([])


def test_only_loopback_inside_and_nothing_reaches_out():
    """Inside: only lo has addresses, TCP on 127.0.0.1 works, other addresses are unreachable.
    Outside, a server listening on 0.0.0.0 at this machine's own address is not reachable from inside."""
    targets = ["192.0.2.1:9"]  # TEST-NET-1
    server = None
    if OUTSIDE and _host_ipv4():
        server = socket.create_server(("0.0.0.0", 0))
        targets.append(f"{_host_ipv4()[0]}:{server.getsockname()[1]}")
    try:
        done = _run(netns.command([PY, "-c", REPORT, *targets]))
    finally:
        if server is not None:
            server.close()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["ips"]) == {"lo"} and "127.0.0.1" in report["ips"]["lo"], report
    assert report["loopback"] is True and report["echo"] == "ping"
    assert set(report["targets"].values()) == {"ENETUNREACH"}, report["targets"]
    assert done.stderr == ""  # no warning: a namespace was made (or this is one)


def test_in_loopback_namespace_reads_this_process_network():
    ip = (socket.AF_INET, socket.AF_INET6)
    addresses = psutil.net_if_addrs()
    others = [n for n, v in addresses.items() if n != "lo" and any(a.family in ip for a in v)]
    lo_up = any(a.address == "127.0.0.1" for a in addresses.get("lo", []))
    assert netns.in_loopback_namespace() is (lo_up and not others)


def test_lo_is_down_until_the_ioctl_brings_it_up():
    """A fresh namespace has lo down (no address): the --inside stage's SIOCSIFFLAGS is what
    brings it up, with no iproute2."""
    found = netns.probe()
    assert found.ok, found.reason
    check = "from course_lib.runtime.netns import in_loopback_namespace as f; print(f())"
    bare = _run([*found.prefix, PY, "-c", check])
    assert (bare.returncode, bare.stdout.strip()) == (0, "False"), bare.stderr
    wrapped = _run([*found.prefix, PY, "-m", "course_lib.runtime.netns", "--inside", "--", PY, "-c", check])
    assert (wrapped.returncode, wrapped.stdout.strip()) == (0, "True"), wrapped.stderr


def test_user_namespace_path_works(monkeypatch):
    """`unshare -rn` (what a non-root user gets) makes a loopback-only namespace too."""
    monkeypatch.setattr(netns, "_attempts", lambda: [["-rn"]])
    found = netns.probe()
    assert found.ok and found.prefix[1:] == ("-rn",), found.reason
    check = "import os; from course_lib.runtime.netns import in_loopback_namespace as f; print(os.getuid(), f())"
    done = _run([*found.prefix, PY, "-m", "course_lib.runtime.netns", "--inside", "--", PY, "-c", check])
    assert (done.returncode, done.stdout.split()) == (0, ["0", "True"]), done.stderr


def test_exit_code_and_environment_and_cwd_pass_through(tmp_path):
    code = "import os, sys; print(os.environ['NETNS_PROBE'], os.getcwd()); sys.exit(7)"
    done = subprocess.run(
        netns.command([PY, "-c", code]),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "NETNS_PROBE": "kept"},
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout.split() == ["kept", str(tmp_path)]


def test_missing_command_exits_127():
    done = _run(netns.command(["/nonexistent/program", "x"]))
    assert done.returncode == 127
    assert "netns: /nonexistent/program: command not found" in done.stderr


def test_usage_errors_exit_2():
    for args in ([], ["--require"], ["--require", "--"], ["--bogus", "--", "true"]):
        done = _run([PY, "-m", "course_lib.runtime.netns", *args])
        assert done.returncode == netns.EXIT_UNAVAILABLE and "usage:" in done.stderr, (args, done.stderr)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_reach_the_command_and_nothing_is_left(sig):
    """Every stage is an exec: CMD keeps the wrapper's pid, so a signal to the wrapper is a
    signal to CMD, and there is no other process to leave behind."""
    code = textwrap.dedent(
        """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(3)))
        print(os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(netns.command([PY, "-c", code]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert int(proc.stdout.readline()) == proc.pid  # CMD is the wrapper's process
        assert psutil.Process(proc.pid).children(recursive=True) == []
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGTERM:
        assert (proc.returncode, out.strip()) == (3, "got SIGTERM"), err
    else:
        assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err


def test_nested_wrapper_just_runs_the_command():
    code = "import os; print(os.getpid())"
    proc = subprocess.Popen(netns.command(netns.command([PY, "-c", code])), stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and int(out) == proc.pid


# --------------------------------------------------------------------------- when no namespace can be made


def _fake_unshare(folder: Path, message: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fake = folder / "unshare"
    fake.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    fake.chmod(0o755)


def _outside(monkeypatch, path: str) -> list[list[str]]:
    """Act as if outside any namespace, with PATH=path; records what would be exec'd."""
    execs: list[list[str]] = []
    monkeypatch.setattr(netns, "in_loopback_namespace", lambda: False)
    monkeypatch.setenv("PATH", path)

    def record(cmd: list[str]) -> int:
        execs.append(cmd)
        return 0

    monkeypatch.setattr(netns, "_exec", record)
    return execs


def test_require_without_unshare_exits_2_naming_the_fix(monkeypatch, tmp_path, capsys):
    execs = _outside(monkeypatch, str(tmp_path))
    assert netns.main(["--require", "--", "true"]) == netns.EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith("netns: cannot make a loopback-only network namespace: `unshare` is not on PATH")
    assert "util-linux" in err and execs == []


def test_without_require_runs_the_command_after_one_warning(monkeypatch, tmp_path, capsys):
    execs = _outside(monkeypatch, str(tmp_path))
    assert netns.main(["--", "prog", "arg"]) == 0
    err = capsys.readouterr().err
    assert execs == [["prog", "arg"]]
    assert len(err.splitlines()) == 1 and err.startswith("netns: warning: no loopback-only network namespace")
    assert "`unshare` is not on PATH" in err and "running prog arg with this machine's network" in err


@pytest.mark.parametrize(
    ("euid", "tried", "fix"),
    [
        (1000, "`unshare -rn` failed", "kernel.apparmor_restrict_unprivileged_userns=1"),
        (0, "`unshare -n` and `unshare -rn` failed", "CAP_SYS_ADMIN"),
    ],
)
def test_eperm_names_why_and_how_to_fix(monkeypatch, tmp_path, capsys, euid, tried, fix):
    """unshare refused (EPERM): the message quotes it and gives the fix for this user."""
    _fake_unshare(tmp_path, "unshare: unshare failed: Operation not permitted")
    execs = _outside(monkeypatch, str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    assert netns.main(["--require", "--", "true"]) == netns.EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert f"{tried}: unshare: unshare failed: Operation not permitted; " in err and fix in err, err
    assert ("sudo" in err) == (euid != 0) and execs == []


@needs_outside
def test_require_failure_as_a_real_process(tmp_path):
    """The same as a user meets it: PATH without unshare."""
    done = _run(netns.command([PY, "-c", "print('ran')"]), env={**os.environ, "PATH": str(tmp_path)})
    assert (done.returncode, done.stdout) == (netns.EXIT_UNAVAILABLE, "")
    assert "`unshare` is not on PATH" in done.stderr
    done = _run(netns.command([PY, "-c", "print('ran')"], require=False), env={**os.environ, "PATH": str(tmp_path)})
    assert (done.returncode, done.stdout) == (0, "ran\n") and done.stderr.startswith("netns: warning:")


# --------------------------------------------------------------------------- pytest: the ray marker and lesson 12


@pytest.mark.ray
def test_ray_items_run_only_in_a_loopback_namespace():
    assert netns.in_loopback_namespace()


def _notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(6 * 7)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    cell.execution_count = 1
    nb.cells = [cell]
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _pytest_items(tmp_path: Path, wrap: bool) -> dict[str, tuple[str, str]]:
    """A pytest run (tests/conftest.py loaded) over a ray-marked test, a lesson-12 notebook
    and an exercise notebook of lesson 12; outcome and skip reason per item."""
    lesson = _notebook(tmp_path / "lessons" / "12_capstone_ray.ipynb")
    exercise = _notebook(tmp_path / "exercises" / "12_capstone_ray.ipynb")
    record = tmp_path / "outcomes.jsonl"
    plugin = tmp_path / "record_outcomes.py"
    plugin.write_text(
        "import json, pathlib, pytest\n"
        "@pytest.hookimpl(wrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    report = yield\n"
        "    if report.when == 'call' or report.skipped:\n"
        "        where = '/'.join(pathlib.Path(item.path).parts[-2:]) + '::' + item.name\n"
        "        reason = report.longrepr[2] if report.skipped else ''\n"
        f"        with open({str(record)!r}, 'a') as f:\n"
        "            f.write(json.dumps([where, report.outcome, reason]) + '\\n')\n"
        "    return report\n"
    )
    argv = [PY, "-m", "pytest", "-q", "-c", "pyproject.toml", "--rootdir", ".", "-p", "record_outcomes"]
    argv += ["--nbval", "--nbval-current-env"]
    argv += ["tests/test_netns.py::test_ray_items_run_only_in_a_loopback_namespace", str(lesson), str(exercise)]
    done = _run(
        netns.command(argv) if wrap else argv,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    return {where: (outcome, reason) for where, outcome, reason in rows}


@needs_outside
def test_outside_ray_tests_and_lesson_12_are_skipped_with_the_command(tmp_path):
    items = _pytest_items(tmp_path, wrap=False)
    from conftest import RAY_SKIP_REASON

    assert "python -m course_lib.runtime.netns -- python -m pytest" in RAY_SKIP_REASON
    assert items == {
        "tests/test_netns.py::test_ray_items_run_only_in_a_loopback_namespace": (
            "skipped",
            f"Skipped: {RAY_SKIP_REASON}",
        ),
        "lessons/12_capstone_ray.ipynb::Cell 0": ("skipped", f"Skipped: {RAY_SKIP_REASON}"),
        "exercises/12_capstone_ray.ipynb::Cell 0": ("passed", ""),  # lesson 12's exercises do not start Ray
    }


def test_inside_ray_tests_and_lesson_12_run(tmp_path):
    items = _pytest_items(tmp_path, wrap=True)
    assert len(items) == 3 and {outcome for outcome, _ in items.values()} == {"passed"}, items


# --------------------------------------------------------------------------- course build: lesson 12 in the namespace

CHECK_CELL = (
    "from course_lib.runtime.netns import in_loopback_namespace\nprint('loopback only:', in_loopback_namespace())"
)


def test_only_lesson_12s_lesson_notebook_needs_isolation():
    def target(lesson_id, kind):
        return Target(lesson_id, kind, Path("x.py"), Path("x.ipynb"))

    assert sorted(execute.ISOLATED_LESSONS) == ["12_capstone_ray"]
    assert execute.needs_isolation(target("12_capstone_ray", "lesson"))
    assert not execute.needs_isolation(target("12_capstone_ray", "exercise"))
    assert not execute.needs_isolation(target("12_capstone_ray", "solution"))
    assert not execute.needs_isolation(target("11_capstone", "lesson"))


def test_course_build_executes_lesson_12_in_the_namespace(tmp_path):
    """`course build`'s own build() on a checkout whose lesson 12 prints where it ran."""
    from course_lib.course.notebooks.build import build

    source = tmp_path / "lessons" / "12_capstone_ray.py"
    source.parent.mkdir()
    source.write_text(f"# %% [markdown]\n# A lesson that starts Ray\n\n# %%\n{CHECK_CELL}\n")
    start = time.perf_counter()
    ((path, seconds),) = build(["12_capstone_ray"], tmp_path)
    assert path == "lessons/12_capstone_ray.ipynb" and 0 < seconds < time.perf_counter() - start
    nb = nbformat.read(tmp_path / path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [o["text"] for o in code[0].outputs] == ["loopback only: True\n"]
    assert nb.metadata["course"] == {"lesson": "12_capstone_ray", "kind": "lesson"}
    assert nb.metadata["language_info"] == {"name": "python"} and code[0].execution_count == 1


def test_a_failing_cell_in_the_namespace_is_a_cell_execution_error(tmp_path):
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("raise ValueError('planted in the namespace')")]
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    with pytest.raises(CellExecutionError, match="planted in the namespace"):
        execute.execute_notebook(nb, tmp_path, isolate_network=True, cell_timeout=60)


@needs_outside
def test_no_namespace_is_a_clear_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(1)")]
    with pytest.raises(execute.IsolationError, match=r"starts Ray and must run loopback-only: netns: .*`unshare`"):
        execute.execute_notebook(nb, tmp_path, isolate_network=True)
    assert nb.cells[0].outputs == []
