"""Run a command where every socket is loopback-only: a new network namespace with only ``lo`` up.

Ray takes the machine's interface address as its node address and listens on every
interface, whatever address it is given (``../shared/GOTCHAS.md``, Ray). In a network
namespace of its own, where the only interface is ``lo``, it finds no route out and uses
127.0.0.1 for everything. The course's CI runs the tests and lesson 12's notebook there::

    python -m course_lib.runtime.netns [--require] -- CMD ARGS...

How: ``unshare -n`` as root, else ``unshare -rn`` (a user namespace that maps the caller
to root in it, so it may configure its own network), then ``lo`` brought up with one
``SIOCSIFFLAGS`` ioctl (no iproute2 needed), then ``exec`` of CMD with the same
environment and working directory. Every step is an ``exec`` in the same process, so CMD
keeps the wrapper's pid: a Ctrl-C or a SIGTERM sent to the wrapper reaches CMD itself, the
exit status is CMD's, and nothing is left waiting. Under ``unshare -rn`` CMD sees itself as
uid 0 (files it writes still belong to the caller).

When no namespace can be made here (no ``unshare``; unprivileged user namespaces disabled,
as by Ubuntu's ``kernel.apparmor_restrict_unprivileged_userns=1``; a container without
``CAP_SYS_ADMIN``): with ``--require`` the wrapper exits 2 naming why and how to fix it;
without, it runs CMD as is after one warning line on stderr. Already inside such a
namespace (``docker run --network none`` is one), it just runs CMD.

For other code: :func:`in_loopback_namespace`, :func:`command` (the wrapped argv) and
:func:`probe` (whether a namespace can be made here, and if not why).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

MODULE = "course_lib.runtime.netns"
#: exit status when ``--require`` is given and no namespace can be made (or usage is wrong)
EXIT_UNAVAILABLE = 2
#: how to run the tests that need the namespace (the skip reason of ``@pytest.mark.ray`` tests)
HOW_TO_RUN = "`python -m course_lib.runtime.netns -- python -m pytest ...` (as `make test` does)"
_PROBE_TIMEOUT_S = 30.0
_INSIDE = "--inside"  # internal: the stage that runs in the new namespace

# <linux/sockios.h>, <net/if.h>: read and set an interface's flags; struct ifreq is 40 bytes
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ_SIZE = 40


def in_loopback_namespace() -> bool:
    """Whether this process's network is loopback only: ``lo`` is up (127.0.0.1) and no other
    interface has an IPv4 or IPv6 address.

    True inside the namespace this module makes, and in any other network-less one
    (``docker run --network none``). Interfaces without addresses (the tunnel devices some
    kernels add to every new namespace, all down) carry nothing and are ignored.
    """
    import psutil

    ip_families = (socket.AF_INET, socket.AF_INET6)
    addresses = psutil.net_if_addrs()
    with_ip = {name for name, entries in addresses.items() if any(a.family in ip_families for a in entries)}
    if with_ip != {"lo"}:
        return False
    return any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addresses["lo"])


def command(cmd: Sequence[str], *, require: bool = True) -> list[str]:
    """The argv that runs ``cmd`` in a loopback-only network namespace (see the module's doc)."""
    if not cmd:
        raise ValueError("command: cmd is empty; give the program and its arguments")
    return [sys.executable, "-m", MODULE, *(["--require"] if require else []), "--", *cmd]


@dataclass(frozen=True)
class Probe:
    """Whether a namespace can be made here.

    Attributes:
        prefix: the ``unshare`` argv that makes one (empty if none can be made).
        reason: why none can be made, and how to fix it (empty if one can).
    """

    prefix: tuple[str, ...]
    reason: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.prefix)


def _attempts() -> list[list[str]]:
    """``unshare`` flags to try, in order: as root a plain network namespace first."""
    return [["-n"], ["-rn"]] if os.geteuid() == 0 else [["-rn"]]


def _fix(root: bool) -> str:
    if root:
        return (
            "as root this needs CAP_SYS_ADMIN: in a container, add it (`--cap-add SYS_ADMIN`) or run it with "
            "`--network none` (loopback only already: then this wrapper just runs CMD)"
        )
    return (
        "unprivileged user namespaces are disabled here (Ubuntu 23.10+: kernel.apparmor_restrict_unprivileged_userns=1; "
        "elsewhere user.max_user_namespaces=0): run it as root (sudo), or allow them: "
        "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`"
    )


def probe() -> Probe:
    """Try to make a namespace (a short child that brings ``lo`` up and checks the result)."""
    if not sys.platform.startswith("linux"):
        return Probe((), f"network namespaces are a Linux feature; this is {sys.platform}")
    unshare = shutil.which("unshare")
    if unshare is None:
        return Probe((), "`unshare` is not on PATH: install util-linux (Debian/Ubuntu: `apt-get install util-linux`)")
    tried: list[str] = []
    errors: list[str] = []
    for flags in _attempts():
        prefix = (unshare, *flags)
        check = [*prefix, sys.executable, "-m", MODULE, _INSIDE, "--", sys.executable, "-c", ""]
        tried.append(f"`unshare {' '.join(flags)}`")
        try:
            done = subprocess.run(check, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            errors.append(f"did not finish within {_PROBE_TIMEOUT_S:g} s")
            continue
        if done.returncode == 0:
            return Probe(prefix)
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        errors.append(lines[-1] if lines else f"exit code {done.returncode}")
    if len(set(errors)) == 1:
        why = f"{' and '.join(tried)} failed: {errors[0]}"
    else:
        why = "; ".join(f"{how} failed: {error}" for how, error in zip(tried, errors))
    return Probe((), f"{why}; {_fix(os.geteuid() == 0)}")


def bring_loopback_up() -> None:
    """Set ``IFF_UP`` on ``lo`` in this namespace (``ip link set lo up`` without iproute2).

    Raises:
        OSError: e.g. EPERM without CAP_NET_ADMIN in this namespace.
    """
    import fcntl

    name = b"lo".ljust(16, b"\0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", name, 0).ljust(_IFREQ_SIZE, b"\0")
        (flags,) = struct.unpack_from("h", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request), 16)
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sh", name, flags | _IFF_UP).ljust(_IFREQ_SIZE, b"\0"))


def _exec(cmd: list[str]) -> int:
    """Replace this process with ``cmd``; returns only if it cannot be started (126/127, as a shell)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(cmd[0], cmd)
    except FileNotFoundError:
        print(f"netns: {cmd[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"netns: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 126


def _inside(cmd: list[str]) -> int:
    """The stage run by ``unshare`` in the new namespace: ``lo`` up, checked, then CMD."""
    try:
        bring_loopback_up()
    except OSError as exc:
        print(f"netns: cannot bring lo up in the new namespace: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if not in_loopback_namespace():
        print(
            "netns: the new namespace is not loopback-only (an interface other than lo has an address)", file=sys.stderr
        )
        return EXIT_UNAVAILABLE
    return _exec(cmd)


USAGE = f"usage: python -m {MODULE} [--require] -- CMD [ARGS...]"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    require = inside = False
    while args and args[0] != "--" and args[0].startswith("-"):
        option = args.pop(0)
        if option == "--require":
            require = True
        elif option == _INSIDE:
            inside = True
        elif option in ("-h", "--help"):
            print(f"{USAGE}\n\n{__doc__}")
            return 0
        else:
            print(f"netns: unknown option {option!r}\n{USAGE}", file=sys.stderr)
            return EXIT_UNAVAILABLE
    if args and args[0] == "--":
        args.pop(0)
    if not args:
        print(f"netns: no command given\n{USAGE}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if inside:
        return _inside(args)
    if in_loopback_namespace():
        return _exec(args)
    found = probe()
    if not found.ok:
        if require:
            print(f"netns: cannot make a loopback-only network namespace: {found.reason}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        print(
            f"netns: warning: no loopback-only network namespace ({found.reason.split(';')[0]}); "
            f"running {shlex.join(args[:3])}{' ...' if len(args) > 3 else ''} with this machine's network",
            file=sys.stderr,
        )
        return _exec(args)
    return _exec([*found.prefix, sys.executable, "-m", MODULE, _INSIDE, "--", *args])


if __name__ == "__main__":
    raise SystemExit(main())
