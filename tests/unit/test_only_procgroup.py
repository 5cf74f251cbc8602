"""Children are started and processes signalled only in ``remote_payload/procgroup.py``, the
one mechanism that puts a child in a session of its own, marks it, bounds its output, keeps
its deadline and ends its whole tree (pidfd-held signals, so a reused number is never hit).
Anywhere else a spawn or a signal is a bypass, unless :data:`ALLOWED` lists the place with
the reason it cannot go through procgroup.

What counts, whatever name it was imported under (``import subprocess as sp``, ``from os
import kill``):

- spawning: any call into ``subprocess`` (``run``, ``Popen``, ``call``…), ``os.fork``,
  ``os.forkpty``, ``os.spawn*``, ``os.exec*``, ``os.posix_spawn*``, ``os.system``,
  ``os.popen``, ``pty.spawn``, ``pty.fork``, ``asyncio.create_subprocess_*``, any call into
  ``multiprocessing`` or ``torch.multiprocessing``, ``ProcessPoolExecutor``;
- signalling: ``os.kill``, ``os.killpg``, ``signal.pthread_kill``,
  ``signal.pidfd_send_signal``, ``signal.raise_signal``, and any ``.kill()``,
  ``.terminate()`` or ``.send_signal()`` method call (``subprocess.Popen``'s and psutil's).

Every ``.py`` under ``opsctl/`` and ``remote_payload/`` is walked, the vendored
``remote_payload/wheels`` excepted (third-party code, not this project's). ``benchmarks/`` and
``scripts/`` are not: they are the developer's measuring and setup tools, run by hand, which
time the CLI and its children as a user's shell runs them.

An entry of :data:`ALLOWED` is ``"path"`` (the whole module) or ``"path:Qual.name"`` (that
function, and functions nested in it); each one must still match something, so a place that
moved onto procgroup takes its entry with it.
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from tests.paths import REPO

#: The mechanism: the one module where spawning and signalling are its job.
MECHANISM = "remote_payload/procgroup.py"
ROOTS = ("opsctl", "remote_payload")
SKIPPED = ("remote_payload/wheels/",)

#: The places that spawn or signal outside procgroup, each with why it cannot use it.
ALLOWED: dict[str, str] = {
    "opsctl/ops/interactive.py:run_tty":
        "hands this terminal to `ssh -t`: ssh must stay in the terminal's foreground process "
        "group to read keys and get Ctrl-C, which a session of its own would leave",
    "opsctl/interrupts.py:die_of_sigpipe":
        "ends this process itself by SIGPIPE (after procgroup.end_all), so the shell sees the "
        "exit status of a closed pipe",
    "opsctl/remote/mux_client.py:spawn":
        "starts the connection multiplexer daemon, which must outlive this process: a procgroup "
        "child is ended with its parent's Ctrl-C, SIGTERM and exit",
    "opsctl/sandbox/host.py":
        "the sandbox's builder (root-run useradd, sshd, lxc tools, its own deadlines): test "
        "infrastructure standing in for a Proxmox host, never run by the CLI for a user",
    "opsctl/sandbox/pct.py":
        "the sandbox's `pct` stand-in: it runs lxc tools and becomes `lxc-attach` (exec), as "
        "the real pct does",
    "remote_payload/agent/execguard.py":
        "`opsctl exec`'s guard runs in the container from its own text before any payload "
        "exists, so it cannot import procgroup; it keeps the same rule (own group, marker, "
        "SIGTERM then SIGKILL of the tree)",
    "remote_payload/agent/spawn.py:main":
        "the job's spawn helper: joins the job's cgroup, then becomes the job's program (exec)",
    "remote_payload/agent/wrapper.py:Wrapper.start_attempt":
        "starts the job itself: a job outlives every agent call, and its tree is ended by "
        "jobstore.escalate (its group, marker and cgroup), which signals through procgroup",
    "remote_payload/agent/wrapper.py:Wrapper.handle_signals":
        "passes Ctrl-C/SIGTERM from the pane to the job's group while the job is the "
        "wrapper's unreaped child, so its group number cannot have been reused",
    "remote_payload/agent/notify.py:notify_lost":
        "starts the detached lost-job notifier, which must outlive the agent's one call",
    "remote_payload/trainer/train.py:spawn":
        "starts the local ranks with torch.multiprocessing (torch joins them and ends the rest "
        "when one fails) and forwards SIGINT/SIGTERM to them: its own unreaped children, whose "
        "numbers cannot be reused",
    "remote_payload/probes/_race_child.py:simulated_workload":
        "the compile-race probe's simulated crash: the child kills itself by the signal it "
        "simulates",
}

_SPAWN_OS = {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp"}
_SPAWN_PREFIXES = ("os.spawn", "os.exec", "asyncio.create_subprocess_", "multiprocessing.",
                   "torch.multiprocessing.", "concurrent.futures.ProcessPoolExecutor")
_NAMED = {"os.kill", "os.killpg", "signal.pthread_kill", "signal.pidfd_send_signal",
          "signal.raise_signal", "pty.spawn", "pty.fork"}
_METHODS = {"kill", "terminate", "send_signal"}


def _banned(dotted: str) -> bool:
    if dotted.startswith("subprocess.") or dotted in _NAMED:
        return True
    if dotted.startswith("os.") and dotted[3:] in _SPAWN_OS:
        return True
    return dotted.startswith(_SPAWN_PREFIXES)


class _Finder(ast.NodeVisitor):
    """Spawning and signalling calls of one module: ``(qualified function name, line, what)``."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted name it stands for
        self.scope: list[str] = []
        self.found: list[tuple[str, int, str]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                self.aliases[a.name.split(".")[0]] = a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for a in node.names:
            if node.module and node.level == 0:
                self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _dotted(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Call(self, node: ast.Call) -> None:
        what = self._dotted(node.func)
        if what is not None and _banned(what):
            self._add(node, what)
        elif (isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS
              and not (what or "").startswith("remote_payload.procgroup.")):
            self._add(node, f".{node.func.attr}()")
        self.generic_visit(node)

    def _add(self, node: ast.Call, what: str) -> None:
        self.found.append((".".join(self.scope) or "<module>", node.lineno, what))


def calls_in(source: str) -> list[tuple[str, int, str]]:
    finder = _Finder()
    finder.visit(ast.parse(source))
    return finder.found


def _files() -> list[str]:
    found = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith(SKIPPED):
                found.append(rel)
    return found


def _findings() -> list[tuple[str, str, int, str]]:
    """Every spawn and signal outside the mechanism: ``(path, function, line, what)``."""
    out = []
    for rel in _files():
        if rel == MECHANISM:
            continue
        for qual, line, what in calls_in((REPO / rel).read_text(encoding="utf-8")):
            out.append((rel, qual, line, what))
    return out


def _entry_for(rel: str, qual: str) -> str | None:
    if rel in ALLOWED:
        return rel
    for key in ALLOWED:
        path, _, name = key.partition(":")
        if path == rel and name and (qual == name or qual.startswith(name + ".")):
            return key
    return None


def test_children_are_started_and_processes_signalled_only_through_procgroup() -> None:
    bypasses = [f"{rel}:{line} in {qual}: {what}" for rel, qual, line, what in _findings()
                if _entry_for(rel, qual) is None]
    assert not bypasses, ("start it with remote_payload.procgroup (Group, run, stream) or "
                          "signal through procgroup.signal_if; or list the place in ALLOWED "
                          "with its reason:\n" + "\n".join(bypasses))


def test_every_allowed_place_still_spawns_or_signals() -> None:
    used = {_entry_for(rel, qual) for rel, qual, _, _ in _findings()}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries with nothing left to allow (remove them): {stale}"


@pytest.mark.parametrize("key", sorted(ALLOWED))
def test_every_allowed_place_names_a_module_and_says_why(key: str) -> None:
    path = key.partition(":")[0]
    assert (REPO / path).is_file(), key
    assert len(ALLOWED[key].split()) >= 6, f"{key}: say why it cannot use procgroup"


def test_the_mechanism_is_walked_too_so_it_really_is_where_processes_start() -> None:
    assert MECHANISM in _files()
    kinds = {what for _, _, what in calls_in((REPO / MECHANISM).read_text(encoding="utf-8"))}
    assert {"os.posix_spawnp", "subprocess.Popen", "os.killpg"} <= kinds


SAMPLE = textwrap.dedent("""\
    import os, signal, subprocess as sp, pty, asyncio, multiprocessing
    from os import kill as k, execvp
    from subprocess import Popen
    import psutil
    from remote_payload import procgroup

    def f(proc):
        sp.run(["x"])
        Popen(["x"])
        k(1, 9)
        execvp("x", ["x"])
        os.killpg(1, 9)
        os.posix_spawnp("x", ["x"], {})
        os.spawnvp(os.P_WAIT, "x", ["x"])
        os.fork()
        os.system("x")
        pty.spawn(["x"])
        asyncio.create_subprocess_exec("x")
        multiprocessing.Process(target=f).start()
        signal.pthread_kill(1, 9)
        psutil.Process(1).terminate()
        proc.kill()
        proc.send_signal(9)

    class C:
        def g(self):
            def inner():
                os.kill(1, 9)
            procgroup.run(["x"], 1)
            procgroup.terminate(15, None)
            os.getpid()
            signal.signal(15, None)
    """)


def test_the_guard_sees_every_form_under_any_name_and_not_procgroups_own_api() -> None:
    found = calls_in(SAMPLE)
    assert [w for _, _, w in found] == [
        "subprocess.run", "subprocess.Popen", "os.kill", "os.execvp", "os.killpg",
        "os.posix_spawnp", "os.spawnvp", "os.fork", "os.system", "pty.spawn",
        "asyncio.create_subprocess_exec", "multiprocessing.Process", "signal.pthread_kill",
        ".terminate()", ".kill()", ".send_signal()", "os.kill"]
    assert found[-1][0] == "C.g.inner"
    assert {q for q, _, _ in found[:-1]} == {"f"}
