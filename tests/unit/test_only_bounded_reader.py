"""Files someone else may have placed are read only through the bounded reader, and ``/proc``
only through the ``/proc`` reader.

A FIFO at ``jobs/current`` once held ``status`` for its whole deadline, a link there put the
linked file into the error message, and "read a regular file up to N bytes" was written six
times with different link handling. So in the code that reads the container's files (the
agent, the GPU facts parsers) and the code that handles what comes back from it
(``opsctl/remote``), every read of a file goes through ``remote_payload/boundedread.py``
(a regular file, never a wait on a FIFO, a cap, links refused unless the caller follows the
user's own) and every ``/proc`` path through ``remote_payload/procfs.py``. Found with
:mod:`ast`, so a new ``open(path)`` fails here until it moves onto the reader or is listed
in :data:`ALLOWED` with the reason it is safe written beside it.

What counts as a read: ``open()`` / ``io.open()`` / ``os.fdopen()`` without a write mode,
``os.open()`` without a write or create flag, ``os.read()``, ``.read_bytes()`` and
``.read_text()``; and any string that starts with ``/proc``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the folders whose reads are guarded (a module in them is ``remote_payload.agent.x``)
SCOPE = ("remote_payload/agent", "remote_payload/gpufacts", "opsctl/remote")
#: where the primitives belong: the mechanisms themselves
MECHANISMS = ("remote_payload.boundedread", "remote_payload.procfs",
              # the receiver of pulled files opens directories (O_DIRECTORY | O_NOFOLLOW) to
              # write under them: no file content is read there
              "opsctl.remote.receiver")
#: never read: third-party code kept in the tree
SKIP_PARTS = frozenset({"vendor", "wheels"})

#: ``module:function`` (``<module>`` for top-level code, ``Class.method`` for a method) ->
#: why that read needs no bounded reader
ALLOWED: dict[str, str] = {
    "remote_payload.agent.doctor:<module>":
        "the /proc/driver/nvidia paths are constants; doctor._read reads them through "
        "boundedread",
    "remote_payload.agent.execguard:start":
        "os.read of its own close-on-exec pipe to the child it forked (the exec's errno)",
    "remote_payload.agent.wrapper:Wrapper.between_attempts":
        "os.read of the wrapper's own wake-up pipe, 512 bytes a read",
    "remote_payload.agent.wrapper:Wrapper.pump":
        "os.read of the job's output pipe, CHUNK bytes a read (a stream the wrapper tees "
        "to output.log, not a file)",
    "opsctl.remote.command:_payload_text":
        "this checkout's own source (execguard and the shared readers sent as -c text)",
    "opsctl.remote.payload:build_manifest":
        "this checkout's own remote_payload files, hashed into the manifest",
    "opsctl.remote.tarcopy:<module>":
        "this checkout's own tarsync.py, sent as -c text",
    "opsctl.remote.hostfacts:gpus":
        "a /proc path in the argv of `cat` run on the Proxmox host (a command, not a local "
        "read)",
    "opsctl.remote.stdinfeed:chunks":
        "os.read of the user's own stdin, CHUNK bytes a read, forwarded to the container",
    "opsctl.remote.transfer:run_piped":
        "os.fdopen of its own child's stdout and stderr pipes (rsync or the tar stream's ssh)",
    "opsctl.remote.wheelhouse:push_wheels":
        "os.fdopen of its own pipe's read end (the tar stream of the user's wheels)",
}

_WRITE_MODE = frozenset("wax+")
_WRITE_FLAGS = frozenset({"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_DIRECTORY"})


def _mode(call: ast.Call) -> str | None:
    """The mode string of an ``open``-like call ('r' when none is given; None when it is not
    a constant)."""
    node = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    if node is None:
        return "r"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _reads_by_mode(call: ast.Call) -> bool:
    mode = _mode(call)
    return mode is None or not (_WRITE_MODE & set(mode))


def read_kind(node: ast.AST) -> str | None:
    """What kind of read ``node`` is, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) \
            and node.value.startswith("/proc"):
        return "a /proc path"
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id == "open":
        return "open() for reading" if _reads_by_mode(node) else None
    if not isinstance(func, ast.Attribute):
        return None
    owner = func.value.id if isinstance(func.value, ast.Name) else None
    if owner == "io" and func.attr == "open":
        return "io.open() for reading" if _reads_by_mode(node) else None
    if owner == "os" and func.attr == "fdopen":
        return "os.fdopen() for reading" if _reads_by_mode(node) else None
    if owner == "os" and func.attr == "open":
        flags = node.args[1] if len(node.args) > 1 else None
        names = {n.attr for n in ast.walk(flags) if isinstance(n, ast.Attribute)} \
            if flags is not None else set()
        return None if names & _WRITE_FLAGS else "os.open() for reading"
    if owner == "os" and func.attr == "read":
        return "os.read()"
    if func.attr in ("read_bytes", "read_text"):
        return f".{func.attr}()"
    return None


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def reads_in(source: str, module: str) -> list[tuple[str, str, int]]:
    """``(module:function, kind, line)`` of every read in ``source``."""
    found: list[tuple[str, str, int]] = []

    def walk(node: ast.AST, where: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                walk(child, [*where, child.name])
                continue
            kind = read_kind(child)
            if kind is not None:
                found.append((f"{module}:{'.'.join(where) or '<module>'}", kind,
                              getattr(child, "lineno", 0)))
            walk(child, where)

    walk(ast.parse(source), [])
    return found


def all_reads() -> list[tuple[str, str, int]]:
    found = []
    for folder in SCOPE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if SKIP_PARTS & set(path.relative_to(ROOT).parts):
                continue
            module = _module(path)
            if module in MECHANISMS:
                continue
            found += reads_in(path.read_text(encoding="utf-8"), module)
    return found


def test_files_and_proc_are_read_only_through_their_readers_or_a_listed_exception():
    offenders = sorted(f"{where} ({kind}, line {line})" for where, kind, line in all_reads()
                       if where not in ALLOWED)
    assert offenders == [], (
        "read it with remote_payload.boundedread (a file) or remote_payload.procfs (/proc), "
        "or list it in ALLOWED with the reason it is safe:\n" + "\n".join(offenders))


def test_every_listed_exception_is_still_there_and_says_why():
    there = {where for where, _, _ in all_reads()}
    stale = sorted(set(ALLOWED) - there)
    assert stale == [], f"listed but no longer reading: {stale}"
    assert all(len(reason.split()) >= 4 for reason in ALLOWED.values())


def test_the_mechanisms_exist_where_the_guard_says():
    for module in MECHANISMS:
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module


@pytest.mark.parametrize(("source", "kind"), [
    ("open(p)", "open() for reading"),
    ("open(p, 'rb')", "open() for reading"),
    ("open(p, mode=m)", "open() for reading"),
    ("os.open(p, os.O_RDONLY)", "os.open() for reading"),
    ("os.read(fd, 10)", "os.read()"),
    ("p.read_text()", ".read_text()"),
    ("p.read_bytes()", ".read_bytes()"),
    ("os.fdopen(fd, 'rb')", "os.fdopen() for reading"),
    ("x = f'/proc/{pid}/stat'", "a /proc path"),
    ("x = '/proc/self/mountinfo'", "a /proc path"),
])
def test_the_guard_sees_each_kind_of_read(source, kind):
    assert [k for _, k, _ in reads_in(source, "m")] == [kind]


@pytest.mark.parametrize("source", ["open(p, 'w')", "open(p, 'ab')", "open(p, 'r+')",
                                    "os.open(p, os.O_WRONLY | os.O_CREAT)",
                                    "os.open(p, os.O_RDONLY | os.O_DIRECTORY)",
                                    "os.fdopen(fd, 'wb')", "x = 'proc'"])
def test_the_guard_leaves_writes_alone(source):
    assert reads_in(source, "m") == []
