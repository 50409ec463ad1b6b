"""``course lab``: open JupyterLab on the course checkout (what ``make lab`` runs).

The server runs as ``python -m jupyterlab`` with the interpreter running this code, so
the kernel sees the same environment (and ``course_lib``) as the command. It listens on
127.0.0.1 with a random token, its root is the course checkout, and the banner names
the URL of lesson 00. Ctrl-C stops the server and its kernels.

:func:`serve_lab` is the same launch as a context manager; the browser test uses it::

    with serve_lab(port=None, token=None) as (url_base, token, process):
        url = lab_url(url_base, token, "lessons/00_welcome.ipynb")

Module-level imports stay light (``course --help`` imports this module).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from course_lib.runtime.processes import free_port, port_is_free

DEFAULT_PORT = 8888
DEFAULT_IP = "127.0.0.1"
DEFAULT_NOTEBOOK = "lessons/00_welcome.ipynb"
STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 15.0
# Plugin that asks "Would you like to get notified about official Jupyter news?" and
# checks for JupyterLab updates; the course pins its versions, so both are noise.
ANNOUNCEMENTS_PLUGIN = "@jupyterlab/apputils-extension:announcements"
#: what the file browser hides: Jupyter's defaults, the lessons' and exercises' text sources
#: (``lessons/NN_topic.py``, ``exercises/src/NN_topic.py``: a learner opens the notebook beside
#: each, so every lesson is listed once) and the install's metadata folder
HIDE_GLOBS = ("__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", "[0-9][0-9]_*.py", "*.egg-info")


class LabStartError(RuntimeError):
    """JupyterLab did not start (port taken, crashed, or not ready in time)."""


def _url_host(ip: str) -> str:
    if ip in ("", "0.0.0.0", "::", "*"):
        return "127.0.0.1"
    return f"[{ip}]" if ":" in ip else ip


def lab_url(url_base: str, token: str, path: str | None = DEFAULT_NOTEBOOK) -> str:
    """URL that opens ``path`` (relative to the server root) in JupyterLab, logged in."""
    from urllib.parse import quote

    page = f"/lab/tree/{quote(path.lstrip('/'))}" if path else "/lab"
    return f"{url_base.rstrip('/')}{page}?token={quote(token)}"


# --------------------------------------------------------------------------- server


def lab_command(
    port: int,
    ip: str = DEFAULT_IP,
    root_dir: Path | str | None = None,
    extra_args: Sequence[str] = (),
    log_level: str = "WARN",
) -> list[str]:
    """The argv that starts the server (the token travels in ``JUPYTER_TOKEN``)."""
    if root_dir is None:
        from course_lib.course.paths import repo_root

        root_dir = repo_root()
    root_flag = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        *root_flag,  # containers and CI run as root; the server refuses without it
        f"--ServerApp.ip={ip}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root_dir}",
        f"--log-level={log_level}",
        # no news feed, no "get notified about news?" prompt, no update check
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--ContentsManager.hide_globs={list(HIDE_GLOBS)!r}",
        *extra_args,
    ]


def _write_page_config(config_dir: Path) -> None:
    """A Jupyter config dir whose page_config disables the announcements plugin."""
    import json

    labconfig = config_dir / "labconfig"
    labconfig.mkdir(parents=True, exist_ok=True)
    (labconfig / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {ANNOUNCEMENTS_PLUGIN: True}}, indent=1) + "\n",
        encoding="utf-8",
    )


def _parent_death_signal() -> Callable[[], None] | None:
    """Linux: a ``preexec_fn`` that makes the server get SIGTERM when the thread that
    started it dies (so even a SIGKILLed ``course lab`` leaves no server behind).

    libc is looked up here, in the parent: the child must not import after fork.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        import signal

        prctl = ctypes.CDLL(None, use_errno=True).prctl
        sigterm = int(signal.SIGTERM)
    except (OSError, AttributeError):
        return None

    def preexec() -> None:  # pragma: no cover - runs in the child before exec
        prctl(1, sigterm)  # PR_SET_PDEATHSIG

    return preexec


def _log_tail(log_path: Path | None, n: int = 30) -> str:
    if log_path is None or not log_path.exists():
        return ""
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
    return "\n--- server log (last lines) ---\n" + "\n".join(lines) if lines else ""


def wait_until_ready(
    url_base: str,
    token: str,
    process: subprocess.Popen | None = None,
    timeout: float = STARTUP_TIMEOUT_S,
    log_path: Path | None = None,
) -> float:
    """Poll ``/api/status`` with the token until it answers 200; return seconds waited.

    Raises:
        LabStartError: the process exited, or no answer within ``timeout`` seconds.
    """
    import json
    import urllib.error
    import urllib.request

    start = time.monotonic()
    request = urllib.request.Request(f"{url_base.rstrip('/')}/api/status", headers={"Authorization": f"token {token}"})
    last_error = "no answer"
    while True:
        if process is not None and process.poll() is not None:
            raise LabStartError(
                f"JupyterLab exited with code {process.returncode} before it answered at "
                f"{url_base} (is the port taken? is jupyterlab installed in {sys.executable}?)" + _log_tail(log_path)
            )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    json.loads(response.read() or b"{}")
                    return time.monotonic() - start
                last_error = f"HTTP {response.status}"
        except urllib.error.HTTPError as e:
            last_error = f"HTTP {e.code}"
        except (OSError, ValueError) as e:
            last_error = str(e)
        if time.monotonic() - start > timeout:
            raise LabStartError(
                f"JupyterLab did not answer at {url_base}/api/status within {timeout:.0f} s "
                f"(last: {last_error})" + _log_tail(log_path)
            )
        time.sleep(0.2)


def stop_server(process: subprocess.Popen, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Stop the server and everything it started (kernels run in their own sessions).

    SIGTERM lets the server shut its kernels down; whatever is left after ``timeout``
    seconds (server or descendants) is killed.
    """
    import psutil

    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    alive = [p for p in descendants if p.is_running()]
    if alive:
        _, alive = psutil.wait_procs(alive, timeout=3)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    if alive:
        psutil.wait_procs(alive, timeout=3)


@contextlib.contextmanager
def serve_lab(
    port: int | None = None,
    token: str | None = None,
    extra_args: Sequence[str] = (),
    *,
    ip: str = DEFAULT_IP,
    root_dir: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    log_path: Path | str | None = None,
    log_level: str = "WARN",
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> Iterator[tuple[str, str, subprocess.Popen]]:
    """Run JupyterLab on the course checkout; yield ``(url_base, token, process)``.

    Args:
        port: port to listen on; ``None`` takes 8888 if free, else any free port. An
            explicit port that is taken raises :class:`LabStartError` naming it.
        token: login token; ``None`` makes a random one (``secrets``).
        extra_args: more ``jupyter lab`` arguments (e.g. ``--LabApp.user_settings_dir=``).
        ip: interface to listen on (127.0.0.1: this machine only).
        root_dir: server root; the course checkout (``paths.repo_root()``) by default.
        env: environment for the server (default: this process's); ``JUPYTER_TOKEN``
            and ``JUPYTER_CONFIG_PATH`` are set on top of it.
        log_path: file for the server's output; ``None`` leaves it on this terminal.
        log_level: the server's log level (WARN keeps the terminal quiet).
        startup_timeout: seconds to wait for ``/api/status`` to answer.

    ``url_base`` is ``http://HOST:PORT`` with no trailing slash; :func:`lab_url` builds
    page URLs. On exit (also on errors and Ctrl-C) the server and its kernels are stopped.

    Raises:
        LabStartError: port taken, server exited, or not ready in time.
    """
    import secrets
    import tempfile

    if token is None:
        token = secrets.token_hex(24)
    port = _listen_port(port, ip)
    url_base = f"http://{_url_host(ip)}:{port}"
    log = Path(log_path) if log_path is not None else None

    with tempfile.TemporaryDirectory(prefix="course-lab-config-") as config_dir, _server_log(log) as log_file:
        _write_page_config(Path(config_dir))
        process = None
        try:
            process = subprocess.Popen(
                lab_command(port, ip, root_dir, extra_args, log_level),
                env=_server_env(env, token, config_dir),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT if log_file is not None else None,
                # own session: the terminal's Ctrl-C reaches us, not the server (which
                # would ask "Shutdown this Jupyter server (y/[n])?")
                start_new_session=True,
                preexec_fn=_parent_death_signal(),
            )
            wait_until_ready(url_base, token, process, startup_timeout, log)
            yield url_base, token, process
        finally:
            if process is not None:
                stop_server(process)


def _listen_port(port: int | None, ip: str) -> int:
    """``port`` if it is free (else :class:`LabStartError` naming it); for ``None``, 8888 if
    free, else any free port."""
    if port is None:
        return free_port(ip, preferred=range(DEFAULT_PORT, DEFAULT_PORT + 10))
    if not port_is_free(port, ip):
        raise LabStartError(
            f"port {port} on {ip} is already in use (another JupyterLab?); "
            f"pick another with --port, or leave --port out to take a free one"
        )
    return port


def _server_env(env: Mapping[str, str] | None, token: str, config_dir: str) -> dict[str, str]:
    """The server's environment: ``env`` (default: this process's) with the login token set
    and ``config_dir`` (the page config) first on ``JUPYTER_CONFIG_PATH``."""
    server_env = dict(os.environ if env is None else env)
    server_env["JUPYTER_TOKEN"] = token
    server_env.pop("JUPYTER_TOKEN_FILE", None)
    server_env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        p for p in (config_dir, server_env.get("JUPYTER_CONFIG_PATH", "")) if p
    )
    server_env.setdefault("PYTHONUNBUFFERED", "1")
    return server_env


@contextlib.contextmanager
def _server_log(log: Path | None) -> Iterator[BinaryIO | None]:
    """``log`` opened for appending (its folder made), closed on exit; None for no log file."""
    if log is None:
        yield None
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as log_file:
        yield log_file


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port to listen on (default: {DEFAULT_PORT}, or a free one if it is taken)",
    )
    parser.add_argument("--no-browser", action="store_true", help="print the URL but do not open a browser")
    parser.add_argument("--token", default=None, help="login token (default: a random one)")
    parser.add_argument(
        "--ip",
        default=DEFAULT_IP,
        help=f"interface to listen on (default: {DEFAULT_IP}, this machine only)",
    )


def _banner(url: str, root: Path, notebook_exists: bool) -> str:
    rule = "=" * max(60, min(len(url) + 4, 120))
    lines = [
        "",
        rule,
        "  JupyterLab is running on the course. Open this URL in your browser:",
        "",
        f"    {url}",
        "",
        f"  root: {root}",
    ]
    if not notebook_exists:
        lines.append(f"  note: {DEFAULT_NOTEBOOK} is missing; the URL opens the file browser")
    lines += ["  Press Ctrl-C to stop the server (and its kernels).", rule, ""]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import signal

    from course_lib.course.paths import repo_root

    try:
        root = repo_root()
    except FileNotFoundError as e:
        print(f"course lab: {e}", file=sys.stderr)
        return 1

    def _stop(signum: int, frame: object) -> None:  # SIGTERM/SIGHUP (e.g. make killed): clean up like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _stop)

    if args.port is None and not port_is_free(DEFAULT_PORT, args.ip):
        print(f"course lab: port {DEFAULT_PORT} is in use; taking a free one", file=sys.stderr)
    print(f"course lab: starting JupyterLab ({sys.executable} -m jupyterlab) ...", flush=True)
    try:
        with serve_lab(port=args.port, token=args.token, ip=args.ip, root_dir=root) as (url_base, token, process):
            notebook_exists = (root / DEFAULT_NOTEBOOK).exists()
            url = lab_url(url_base, token, DEFAULT_NOTEBOOK if notebook_exists else None)
            print(_banner(url, root, notebook_exists), flush=True)
            if not args.no_browser:
                _open_browser(url)
            try:
                code = process.wait()
            except KeyboardInterrupt:
                # a second Ctrl-C must not cut the shutdown short (orphan kernels)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                print("\ncourse lab: stopping JupyterLab and its kernels ...", file=sys.stderr)
                code = None
        if code is None:
            print("course lab: stopped", file=sys.stderr)
            return 0
        print(f"course lab: JupyterLab exited with code {code}", file=sys.stderr)
        return code
    except LabStartError as e:
        print(f"course lab: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # during startup; serve_lab has stopped the server
        print("\ncourse lab: interrupted; server stopped", file=sys.stderr)
        return 130


def _open_browser(url: str) -> None:
    """Open ``url`` in the desktop browser; on a headless Linux box just say so."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        print("course lab: no display found; open the URL above yourself", file=sys.stderr)
        return
    import webbrowser

    try:
        opened = webbrowser.open(url)
    except Exception:
        opened = False
    if not opened:
        print("course lab: could not open a browser; open the URL above yourself", file=sys.stderr)
