"""Files a user keeps are written by one module: remote_payload/safe_write.py.

Every ``.py`` under ``opsctl/`` and ``remote_payload/`` (the vendored ``remote_payload/wheels``
aside) is parsed, and each call that writes, replaces or removes a file or a directory must
be in ``remote_payload/safe_write.py``, or inside a ``with safe_write.new_directory(...) as
tmp:`` block aimed at a path built from ``tmp`` (the temporary directory that module swaps in
whole), or in a function listed in :data:`ALLOWED` with the reason it may.

Counted as a write:

- ``open(...)``, ``io.open``, ``Path.open`` and any other ``*.open`` with a mode that writes,
  appends, creates or updates (``w``, ``a``, ``x``, ``+``), or a mode that is not a literal;
- ``os.open`` with ``O_CREAT``, ``O_TRUNC`` or ``O_APPEND`` in its flags, or with flags
  that are not spelled out (a variable);
- ``*.write_text``, ``*.write_bytes``;
- ``os.replace``, ``os.rename``, ``os.renames``, ``Path.replace``/``Path.rename`` (a call
  with one positional argument), ``shutil.move``, ``shutil.rmtree``, ``shutil.copy``,
  ``copy2``, ``copyfile`` and ``copytree``.

Not counted, and why: removing one file (``os.unlink``/``os.remove``, ``Path.unlink``), which
opsctl does to its own sockets, locks, pid files and markers, never to a user's file (a
sync's ``--delete`` is the receiver's rule); making a directory or a link; and writes to an
already open descriptor (``os.write``), whose opening is what is counted here.

An entry of :data:`ALLOWED` that no longer matches a write fails too, so the list stays
as short as the code needs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.paths import REPO

PACKAGES = ("opsctl", "remote_payload")
SKIPPED = ("remote_payload/wheels/",)
WRITER = "remote_payload/safe_write.py"

_SANDBOX = ("the test sandbox's builder: writes only under OPSCTL_TEST_SANDBOX_HOME and the "
            "sandbox's own container roots, nothing a user keeps")
_LOCK = "opens a lock file (a+) to flock it; nothing is written into it"
_SCRATCH = "a scratch file in a temporary directory of its own, removed after"
_LOG = "appends to a log opsctl created for this run (not a file a user keeps)"

#: "path::function" -> why that function may write without safe_write.
ALLOWED: dict[str, str] = {
    # --- opsctl, on the user's machine
    "opsctl/config/paths.py::new_log": "creates a log of this run, 0600, in opsctl's own "
                                       "OPSCTL_HOME/logs",
    "opsctl/ops/wheelhouse.py::prepare_wheelhouse": "pip download's log, a new file in the "
                                                    "wheelhouse opsctl makes",
    "remote_payload/boundedread.py::open_regular": "opens for reading only (O_RDONLY, with "
                                                   "O_NOFOLLOW unless asked; the flags are "
                                                   "built in a variable)",
    "opsctl/remote/mux_client.py::_lock_free": _LOCK.replace("(a+)", "(O_CREAT)"),
    "opsctl/remote/mux_server.py::serve_main": "the multiplexer's lock file (flocked) and its "
                                               "one-line error log, opsctl's own state",
    "opsctl/remote/sshclient.py::__init__": _SCRATCH + " (an ssh config for one call)",
    "opsctl/remote/sshclient.py::__exit__": _SCRATCH + " (that directory removed)",
    "opsctl/sandbox/host.py": _SANDBOX,
    "opsctl/sandbox/pct.py::create_file": _SANDBOX + " (the pct stand-in's container files)",
    "opsctl/state/pulled.py::_locked": _LOCK,
    "remote_payload/trainer/checkpoint.py::save_torch": (
        "writes optim.pt into the temporary directory safe_write.new_directory made for the "
        "checkpoint (fsynced and renamed into place whole), through a Python file so that "
        "torch's zip writer raises the OSError a full disk is"),
    # --- the agent, in the container (its own state under the opsctl root)
    "remote_payload/agent/jobqueue.py::migrate_legacy": "moves the queue's own records into "
                                                        "their folder, under the queue lock",
    "remote_payload/agent/jobqueue.py::settle_staging": "publishes or drops a queue entry "
                                                        "staged under the queue lock (its own "
                                                        "directory, renamed in)",
    "remote_payload/agent/jobqueue.py::set_hint": "an empty hint file, created; its presence "
                                                  "is the hint",
    "remote_payload/agent/jobqueue.py::locked": _LOCK,
    "remote_payload/agent/jobstore.py::launch_lock": _LOCK,
    "remote_payload/agent/jobstore.py::mark_cancelled": "an empty marker file, created; its "
                                                        "presence is the mark",
    "remote_payload/agent/jobsecrets.py::store": "a job's secrets: created 0600 with O_EXCL, "
                                                 "never a replaced file (secrets never pass "
                                                 "through a temporary name)",
    "remote_payload/agent/launching.py::write_launch_files": "a new job directory's empty "
                                                             "output log; that directory, made "
                                                             "here, removed when the launch "
                                                             "fails",
    "remote_payload/agent/notify.py::notify_lost": "the job's lost marker, created O_EXCL "
                                                   "(its presence is the mark)",
    "remote_payload/agent/outindex.py::note": _LOG + " (the output index, append only)",
    "remote_payload/agent/torchenv/caches.py::remove_tree": "removes a cache directory opsctl "
                                                            "made (renamed aside, then removed)",
    "remote_payload/agent/torchenv/caches.py::touch_last_used": "an empty last-used stamp",
    "remote_payload/agent/torchenv/layout.py::locked": _LOCK,
    "remote_payload/agent/torchenv/procs.py::run_logged": _LOG + " (an install step's log)",
    "remote_payload/agent/torchenv/seed.py::seed": "the compile cache seeded in a scratch "
                                                   "directory and its artifact renamed in "
                                                   "(opsctl's own state, under the envs lock)",
    "remote_payload/agent/torchenv/swap.py::_install": "builds a torch env under .building-* "
                                                       "and renames it in under the envs lock; "
                                                       "its scratch constraints and log",
    "remote_payload/agent/torchenv/swap.py::_remove_stale_builds": "removes .building-* a killed "
                                                                   "install left and puts a "
                                                                   ".trash-* build back (held "
                                                                   "lock: none is running)",
    "remote_payload/agent/verbs/probe.py::run_probe_process": _LOG + " (a probe's output)",
    "remote_payload/agent/verbs/queue.py::_stage_and_publish": "stages a queue entry in its own "
                                                               "new directory, renamed in",
    "remote_payload/agent/wrapper.py::__init__": _LOG + " (the job's output.log and "
                                                 "events.jsonl, opened once by its wrapper)",
    "remote_payload/agent/wrapper.py::_reserve": "the job directory's disk-space reserve "
                                                 "(fallocated, given back on a full disk)",
    "remote_payload/agent/wrapper.py::main": "a wrapper bug's traceback, last words in the job "
                                             "directory, written when all else failed",
    "remote_payload/agent/wrapper.py::advance_queue": "the queue step's traceback, last words "
                                                      "in the job directory",
    "remote_payload/probes/_race_child.py::run": _SCRATCH + " (the probe's own files)",
    "remote_payload/probes/compile_race.py::__init__": _LOG + " (the probe's child log)",
    "remote_payload/probes/compile_race.py::run_child": _LOG + " (the probe's child log)",
    "remote_payload/probes/compile_race.py::run_probe": _SCRATCH + " (the probe's work "
                                                        "directory)",
    "remote_payload/sitehook/sitecustomize.py::_dump_target": _LOG + " (a stack dump's file, "
                                                              "new per signal)",
    "remote_payload/tarsync.py::__init__": "the container side of a push: a part file "
                                           "beside each file the user sent, renamed in by "
                                           "commit (the user's own files, into the data "
                                           "directory the push names)",
    "remote_payload/tarsync.py::commit": "renames a push's part file over its target (see "
                                         "__init__)",
    "opsctl/remote/receiver.py": "the one receiver of files that come back from the "
                                 "container: every write relative to a directory opened "
                                 "O_NOFOLLOW, part files O_EXCL, modes the user's; its own "
                                 "rules (tests/unit/test_receiver.py)",
    "remote_payload/trainer/bytecode.py::prime": "the bytecode cache's lock file (flocked)",
    "remote_payload/trainer/regenerate.py::run": "a regenerated shard grows as .part "
                                                 "(resumable: a torn last line dropped) and is "
                                                 "renamed in whole",
    "remote_payload/trainer/serving.py::carry_user_readme": "copies the user's README.md into "
                                                            "the export's new_directory (kept, "
                                                            "not written)",
}

_MODE = re.compile(r"^[rwxabt+U]+$")
_PATH_CALLS = {"os.replace", "os.rename", "os.renames", "shutil.move", "shutil.rmtree",
               "shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree"}
_TWO_PATHS = {"os.replace", "os.rename", "os.renames", "shutil.move", "shutil.copy",
              "shutil.copy2", "shutil.copyfile", "shutil.copytree"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _writes_mode(mode: ast.expr | None) -> bool:
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(set(mode.value) & set("wax+"))
    return True  # a mode that is not a literal may write


def _mode_arg(call: ast.Call, position: int) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == "mode":
            return kw.value
    return call.args[position] if len(call.args) > position else None


def _write_target(call: ast.Call) -> ast.expr | bool | None:
    """The destination expression of a counted write (True when it has none to name), or
    None when ``call`` is not a counted write."""
    f = call.func
    name = _dotted(f)
    first = call.args[0] if call.args else None
    if (isinstance(f, ast.Name) and f.id == "open") or name == "io.open":
        return first if _writes_mode(_mode_arg(call, 1)) else None
    if name == "os.open":
        flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
        literal = "O_" in flags  # flags held in a variable may create: counted
        return first if re.search(r"O_(CREAT|TRUNC|APPEND)\b", flags) or not literal else None
    if name in _PATH_CALLS:
        if name in _TWO_PATHS:
            return call.args[1] if len(call.args) > 1 else True
        return first or True
    if not isinstance(f, ast.Attribute):
        return None
    if name.startswith("safe_write."):
        return None  # the writer itself
    if f.attr in ("write_text", "write_bytes"):
        return f.value
    if f.attr == "open" and any(kw.arg == "fileobj" for kw in call.keywords):
        return None  # tarfile.open(fileobj=...): a stream already open, no path
    if f.attr == "open" and name not in ("os.open", "webbrowser.open"):
        if first is not None and isinstance(first, ast.Constant) and isinstance(first.value, str) \
                and _MODE.match(first.value):
            return f.value if _writes_mode(first) else None  # Path.open(mode)
        return (first or f.value) if _writes_mode(_mode_arg(call, 1)) else None
    if f.attr in ("replace", "rename") and len(call.args) == 1 and not call.keywords \
            and not name.startswith(("os.", "str.")):
        return f.value  # Path.replace(target) / Path.rename(target): str.replace takes two
    return None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class _Finder(ast.NodeVisitor):
    """The counted writes of one module, each with its enclosing function's name, less the
    writes into a ``safe_write.new_directory`` block's temporary directory."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, str]] = []
        self._func: list[str] = []
        self._staging: list[str] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._func.append(node.name)
        self.generic_visit(node)
        self._func.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_With(self, node: ast.With) -> None:
        staged = [item.optional_vars.id for item in node.items
                  if isinstance(item.context_expr, ast.Call)
                  and _dotted(item.context_expr.func).endswith("new_directory")
                  and isinstance(item.optional_vars, ast.Name)]
        for item in node.items:
            self.visit(item)
        self._staging += staged
        for stmt in node.body:
            self.visit(stmt)
        del self._staging[len(self._staging) - len(staged):]

    def visit_Call(self, node: ast.Call) -> None:
        target = _write_target(node)
        if target is not None:
            inside = isinstance(target, ast.AST) and bool(_names(target) & set(self._staging))
            if not inside:
                where = self._func[-1] if self._func else "<module>"
                self.found.append((node.lineno, where, ast.unparse(node.func)))
        self.generic_visit(node)


def _sources() -> list[Path]:
    files = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith(SKIPPED) and rel != WRITER:
                files.append(path)
    return files


def _writes() -> dict[str, list[tuple[int, str, str]]]:
    found: dict[str, list[tuple[int, str, str]]] = {}
    for path in _sources():
        finder = _Finder()
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if finder.found:
            found[path.relative_to(REPO).as_posix()] = finder.found
    return found


def _allowed(rel: str, func: str) -> str | None:
    return ALLOWED.get(f"{rel}::{func}") or ALLOWED.get(rel)


def test_files_are_written_only_by_safe_write_or_a_listed_exception():
    bypasses = [f"{rel}:{line} {call}(...) in {func}()"
                for rel, hits in _writes().items() for line, func, call in hits
                if _allowed(rel, func) is None]
    assert not bypasses, (
        "write through remote_payload/safe_write.py (write_text/write_bytes/write_with, "
        "append_text/append_line, write_link, new_directory), or list the function in "
        "ALLOWED with the reason it may not:\n  " + "\n  ".join(bypasses))


def test_every_exception_still_matches_a_write_and_says_why():
    hits = _writes()
    used = {f"{rel}::{func}" for rel, found in hits.items() for _line, func, _call in found}
    stale = sorted(k for k in ALLOWED if k not in used and k not in hits)
    assert not stale, f"ALLOWED entries that match no write any more (remove them): {stale}"
    assert all(len(reason) > 20 for reason in ALLOWED.values()), "each entry names its reason"


def _finds(source: str) -> list[tuple[int, str, str]]:
    finder = _Finder()
    finder.visit(ast.parse(source))
    return finder.found


def test_the_guard_sees_each_kind_of_write():
    source = "\n".join([
        "def f(p, q, m):",
        "    open(p, 'w')",
        "    open(p, mode='ab')",
        "    open(p, m)",
        "    p.open('w')",
        "    p.write_text('x')",
        "    p.write_bytes(b'x')",
        "    os.open(p, os.O_WRONLY | os.O_CREAT)",
        "    os.open(p, flags)",
        "    os.replace(p, q)",
        "    os.rename(p, q)",
        "    p.replace(q)",
        "    shutil.rmtree(p)",
        "    shutil.move(p, q)",
        "    shutil.copy2(p, q)",
    ])
    assert len(_finds(source)) == 14


def test_the_guard_lets_reads_and_a_new_directorys_own_files_pass():
    source = "\n".join([
        "def f(p, q, out):",
        "    open(p)",
        "    open(p, 'rb')",
        "    p.open()",
        "    os.open(p, os.O_RDONLY)",
        "    'a'.replace('b', 'c')",
        "    with safe_write.new_directory(out, kind='k') as tmp:",
        "        (tmp / 'x').write_text('y')",
        "        with open(tmp / 'y', 'wb') as f:",
        "            pass",
        "    (out / 'x').write_text('y')",
    ])
    assert [call for _line, _func, call in _finds(source)] == ["(out / 'x').write_text"]
