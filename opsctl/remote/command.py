"""How a remote command is spelled: an argv list, the one string sshd runs for it, and what
it did.

This is the one place in opsctl that calls ``shlex.join`` (:func:`shell_line`): every remote
command is an argv list, joined once, with its deadlines inside it (:func:`host_command`,
:func:`pct_argv`), whichever way it then travels (paramiko in :mod:`.transport`, directly or
through the mux in :mod:`.mux_client`; the OpenSSH client for a terminal, a port or rsync).
Untrusted text never reaches a shell unquoted.

Why a module apart from :mod:`.transport` (the connection): the spelling is pure text, shared by
the transport and the OpenSSH uses (:mod:`.sshclient`, :mod:`.rsync`), and tested on its own.
"""

from __future__ import annotations

import re
import shlex
import typing as t

from opsctl.errors import ConfigError

if t.TYPE_CHECKING:
    from opsctl.config.inventory import HostSpec

#: Grace between the inner (container) and outer (host) deadline, and the local one.
_OUTER_GRACE_S = 3
_LOCAL_GRACE_S = 6


class CommandResult(t.NamedTuple):
    """What one remote command did."""

    argv: tuple[str, ...]
    command: str  # the exact string sent to the SSH server
    rc: int
    stdout: bytes
    stderr: bytes
    elapsed_s: float
    via: str = "ssh"  # "ssh": the command's own connection; "mux": a kept one (mux_client.py)

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def stderr_tail(self, lines: int = 5) -> str:
        text = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return "\n".join(text[-lines:])


def shell_line(argv: t.Sequence[str]) -> str:
    """``argv`` as one shell command line (the only ``shlex.join`` in opsctl)."""
    return shlex.join(argv)


def local_deadline(timeout: float | None) -> float | None:
    """How long the client waits for a command with remote deadline ``timeout``."""
    return None if timeout is None else timeout + _OUTER_GRACE_S + _LOCAL_GRACE_S


def known_hosts_name(address: str, port: int) -> str:
    """The host's name in a known_hosts file (``[address]:port`` off port 22)."""
    return address if port == 22 else f"[{address}]:{port}"


def prepare(host: HostSpec, argv: t.Sequence[t.Any], *, timeout: float | None,
            step: str = "") -> tuple[list[str], str]:
    """``argv`` as strings and the one command string sent for it (the first half of
    :meth:`opsctl.remote.transport.Remote.run`).

    Raises:
        ConfigError: as :func:`check_command`.
    """
    args = [str(a) for a in argv]
    command = host_command(args, timeout=timeout, sudo=host.sudo, pct_path=host.pct_path)
    check_command(host.label, step or args[0], args, command)
    return args, command


#: Largest command string sent to sshd (bytes). The binding limits: sshd runs the command as
#: ONE argument of ``$SHELL -c``, and Linux caps a single argument at MAX_ARG_STRLEN = 128 KiB
#: (32 pages); OpenSSH drops the whole connection (``Bad packet length``) when a packet exceeds
#: 256 KiB, which kills every other command multiplexed on it. 100 KiB keeps
#: a margin for ``sudo``/``timeout``/``pct exec`` words and the channel-request framing. Bigger
#: inputs go on stdin.
MAX_COMMAND_BYTES = 100 * 1024


def check_command(host: str, what: str, argv: t.Sequence[str], command: str) -> None:
    """Refuse, locally, what the remote side cannot take (nothing is sent).

    Raises:
        ConfigError: a NUL byte in an argument, or a command over :data:`MAX_COMMAND_BYTES`.
    """
    nul = [i for i, a in enumerate(argv) if "\0" in a]
    if nul:
        raise ConfigError(f"{host}: {what}: argument {nul[0]} contains a NUL byte, which no "
                          "process can receive; nothing was sent")
    size = len(command.encode("utf-8", "surrogateescape"))
    if size > MAX_COMMAND_BYTES:
        raise ConfigError(f"{host}: {what}: the command is {size} bytes, over the "
                          f"{MAX_COMMAND_BYTES} bytes a remote command line may have; nothing "
                          "was sent", hint="pass large input on stdin or in a file instead")


def pct_argv(ctid: int, argv: t.Sequence[str], *, timeout: float | None = None,
             keep_env: bool = False, guard: bool = False) -> list[str]:
    """``pct exec <ct> --keep-env 0|1 -- [timeout …] argv`` (the container-side deadline).

    ``guard``: the command runs under :func:`guard_argv` instead of ``timeout`` (``opsctl
    exec``: the deadline, the client going away and the reader closing end its whole tree).
    """
    inner = [str(a) for a in argv]
    if guard:
        inner = guard_argv(inner, timeout)
    elif timeout is not None:
        inner = ["timeout", "-k", "2", f"{timeout:g}", *inner]
    return ["pct", "exec", str(ctid), "--keep-env", "1" if keep_env else "0", "--", *inner]


#: The container's python that runs the guard (the agent's python is python3 as well).
GUARD_PREFIX = ("python3", "-S", "-c")
_guard_source: list[str] = []

#: The shared modules a self-contained program may use, in the order they are defined (each
#: imports only those before it): the caps, the bounded reader, the ``/proc`` reader.
STANDALONE_MODULES = ("limits", "boundedread", "procfs")

_STANDALONE_PRELUDE = """\
import sys as _sys, types as _types
_pkg = _types.ModuleType("remote_payload")
_pkg.__path__ = []
_sys.modules["remote_payload"] = _pkg
for _name, _text in _MODULES:
    _mod = _types.ModuleType("remote_payload." + _name)
    _mod.__file__ = "remote_payload/" + _name + ".py"
    _sys.modules[_mod.__name__] = _mod
    setattr(_pkg, _name, _mod)
    exec(compile(_text, _mod.__file__, "exec"), _mod.__dict__)
exec(compile(_MAIN, _MAIN_FILE, "exec"), {"__name__": "__main__", "__file__": _MAIN_FILE})
"""


def _payload_text(relative: str) -> str:
    from opsctl.config import paths

    return (paths.payload_source() / relative).read_text(encoding="utf-8")


def standalone(main: str, main_file: str) -> str:
    """Python text for ``python3 -c`` that runs ``main`` in a container with no payload (or
    another one): the shared modules of :data:`STANDALONE_MODULES` are defined first, from
    this checkout's own source, as ``remote_payload.<name>``, so ``main`` imports them as
    the agent does (``from remote_payload import procfs``) and both run one ``/proc`` reader
    and one bounded reader."""
    modules = tuple((name, _payload_text(f"{name}.py")) for name in STANDALONE_MODULES)
    return (f"_MODULES = {modules!r}\n_MAIN = {main!r}\n_MAIN_FILE = {main_file!r}\n"
            + _STANDALONE_PRELUDE)


def guard_argv(argv: t.Sequence[str], timeout: float | None) -> list[str]:
    """``python3 -S -c <remote_payload/agent/execguard.py> DEADLINE|- argv``: the command as
    one tree that its deadline ends, setsid'd children included (that file says how), run
    :func:`standalone` (it needs no payload in the container)."""
    if not _guard_source:
        _guard_source.append(standalone(_payload_text("agent/execguard.py"),
                                        "remote_payload/agent/execguard.py"))
    return [*GUARD_PREFIX, _guard_source[0], "-" if timeout is None else f"{timeout:g}", *argv]


def guarded(argv: t.Sequence[str]) -> bool:
    """Did :func:`pct_argv` put the guard in front of the container command?"""
    args = list(argv)
    rest = args[args.index("--") + 1:] if "--" in args else []
    return tuple(rest[:3]) == GUARD_PREFIX


def check_argv(host: str, what: str, argv: t.Sequence[str]) -> list[str]:
    """``argv`` as a list when a container can run it: refused locally otherwise.

    Raises:
        ConfigError: no argv, an empty program name (``exec -- ''``), or a NUL byte.
    """
    args = [str(a) for a in argv]
    if not args:
        raise ConfigError(f"{host}: {what}: nothing to run; nothing was sent",
                          hint="give the command after --")
    if not args[0]:
        raise ConfigError(f"{host}: {what}: the program name (argument 0) is empty; nothing "
                          "was sent")
    nul = [i for i, a in enumerate(args) if "\0" in a]
    if nul:
        raise ConfigError(f"{host}: {what}: argument {nul[0]} contains a NUL byte, which no "
                          "process can receive; nothing was sent")
    return args


class OutputClosed(Exception):
    """Raised by an output callback when its reader is gone (``opsctl exec … | head -c 10``).

    Not an ``OSError``: the transport passes it through (closing the channel, which ends the
    remote command) instead of reporting a lost connection.
    """


#: The line :meth:`Kept.value` puts before what it kept when it dropped the start.
NOT_KEPT = re.compile(r"\[… \d+ earlier bytes not kept …\]\n")


class Kept:
    """What a command printed, kept for its :class:`CommandResult`: all of it, or with
    ``limit`` only the last ``limit`` bytes behind a ``[… N earlier bytes not kept …]`` line
    (``opsctl exec`` streams gigabytes through its callbacks in constant memory)."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        self.parts.append(chunk)
        self.size += len(chunk)
        if self.limit is not None and self.size > 2 * self.limit:
            self._trim(self.limit)

    def _trim(self, limit: int) -> None:
        data = b"".join(self.parts)
        cut = max(0, len(data) - limit)
        self.dropped += cut
        self.parts, self.size = [data[cut:]], len(data) - cut

    def value(self) -> bytes:
        if self.limit is not None and self.size > self.limit:
            self._trim(self.limit)
        data = b"".join(self.parts)
        return f"[… {self.dropped} earlier bytes not kept …]\n".encode() + data if self.dropped else data


#: Real pct decodes every argument with the session's locale before it execs lxc-attach
#: (pve-common JSONSchema.pm get_options: ``decode('locale', ...)``): under LANG=C each
#: non-ASCII byte becomes U+FFFD. C.UTF-8 is built into glibc >= 2.35 and every Debian, so
#: it makes the round trip byte-exact whatever locale the SSH session has.
HOST_LOCALE = ("env", "LC_ALL=C.UTF-8")


def host_command(argv: t.Sequence[str], *, timeout: float | None = None, sudo: bool = False,
                 pct_path: str = "/usr/sbin/pct") -> str:
    """The one string sent to sshd, joined once by shlex.

    ``env LC_ALL=C.UTF-8 [timeout -k 2 T] [sudo -n <pct_path>|pct] args``: only pct runs
    under sudo (the usual sudoers rule allows ``/usr/sbin/pct`` alone; allowing ``timeout``
    would be allowing everything), and by the exact path such a rule names.
    """
    wrapped = [str(a) for a in argv]
    if sudo and wrapped[:1] == ["pct"]:
        wrapped = ["sudo", "-n", pct_path, *wrapped[1:]]
    if timeout is not None:
        wrapped = ["timeout", "-k", "2", f"{timeout + _OUTER_GRACE_S:g}", *wrapped]
    return shell_line([*HOST_LOCALE, *wrapped])


# --- agent verbs ---------------------------------------------------------------------------

#: Verbs that need nothing but the standard library and the payload: their python starts with
#: ``-S`` (no ``site``: no site-packages scan, no ``.pth`` files, no Debian sitecustomize), a
#: few ms of every ``status`` poll. The payload comes from PYTHONPATH, which ``-S`` keeps.
STDLIB_ONLY_VERBS = frozenset({"status"})


def agent_argv(root: str, verb: str, *args: str, python: str = "python3") -> list[str]:
    """The container command that runs one agent verb (its one JSON reply on stdout)."""
    flags = ["-S"] if verb in STDLIB_ONLY_VERBS else []
    return ["env", f"PYTHONPATH={root}/payload", python, *flags, "-m", "remote_payload.agent",
            "--root", root, verb, *args, "--json"]


def agent_step(verb: str) -> str:
    """A verb's step name in errors and saved logs."""
    return f"agent {verb}"
