"""Every process's Python stacks, on demand: signal each python process of a job, read its own file.

Used by the ``stacks`` verb and by the wrapper's hang check, which takes them itself the moment a
job has been quiet longer than its budget (the user should not have to think of ``opsctl
stacks``). The sitehook points faulthandler at ``procs/<pid>.stacks`` (see
:mod:`remote_payload.wire`), so eight ranks dumping at once never interleave; the trainer
records ``procs/<pid>.json`` (rank, role, GPU), so each dump is labelled with its rank.

A process whose stacks file never appears (a job started by an older payload, whose sitehook
dumped to stderr) is still reported: its dump is looked for in ``output.log``.

Why our own code rather than py-spy: py-spy is not installed in GPU containers, needs ptrace
rights LXC often withholds, and a faulthandler dump needs nothing but the signal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
import typing as t

from remote_payload import boundedread, procfs, procgroup, safe_write, wire
from remote_payload.agent import jobstore as jobs

if t.TYPE_CHECKING:  # checked by mypy, never imported at run time
    from remote_payload.wire_shapes import StackProcessDoc
from remote_payload.probes import stackdump

SETTLE_S = 0.2  # a dump file that has not grown for this long is complete
MAX_DUMP_BYTES = 8 << 20  # of one process's stack dump read (a few KiB per thread)
COLLECTIVES_FILE = "torch/distributed/distributed_c10d.py"
TORCH_DIST = "torch/distributed/"
DUMP_HEADER = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ (?:\[[^\]]*\] )?"
                         r"\(most recent call first\):")
DUMP_LINE = re.compile(r"^(?:  File \".*\", line \d+|  <no Python frame>|  \.\.\.|$)")


@dataclasses.dataclass(frozen=True)
class ProcessStacks:
    """One process's dump, with what it is in the job and where its main thread waits."""

    pid: int | None  # None: a dump found in output.log that no file claimed
    rank: int | None
    role: str | None  # "drafter" | "target" | ... as the process announced itself
    gpu: str | None
    cmd: str
    dump: str
    threads: int
    where: str  # the main thread's innermost frame, "file.py:123 func"
    collective: str | None  # the torch.distributed call it waits in ("all_reduce"), if any
    caller: str | None  # the job's own frame that made that call ("dist.py:86")

    def label(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        if self.collective:
            return f"{who} in {self.collective}" + (f" ({self.caller})" if self.caller else "")
        return f"{who} at {self.where}"

    def to_dict(self) -> StackProcessDoc:
        return {"pid": self.pid, "rank": self.rank, "role": self.role, "gpu": self.gpu,
                "cmd": self.cmd, "dump": self.dump, "threads": self.threads, "where": self.where,
                "collective": self.collective, "caller": self.caller, "label": self.label()}


def armed_pythons(pgid: int | None, start_ticks: int | None) -> tuple[list[int], list[int]]:
    """``(armed, unarmed)`` python processes of the job's group.

    Only processes with a handler are signalled: for any other the default action would kill it.
    """
    members = jobs.group_members(pgid, start_ticks)
    pythons = [p for p in members if jobs.is_python(p)]
    armed = [p for p in pythons if jobs.catches_signal(p, wire.STACKS_SIGNAL)]
    return armed, [p for p in pythons if p not in armed]


def capture(job_dir: str, pids: t.Sequence[int], *, timeout: float) -> list[ProcessStacks]:
    """Signal ``pids`` and return each one's new dump (processes that dumped nothing are left out)."""
    log = os.path.join(job_dir, jobs.OUTPUT)
    log_start = _size(log) or 0
    before = {p: _size(wire.proc_stacks_path(job_dir, p)) for p in pids}
    for p in pids:  # only a process that still has the handler: the default action kills
        procgroup.signal_if(p, wire.STACKS_SIGNAL,
                            lambda pid: jobs.catches_signal(pid, wire.STACKS_SIGNAL))
    texts = _wait_for_files(job_dir, before, timeout)
    out = [_describe(job_dir, p, text) for p, text in texts.items() if text.strip()]
    if any(before[p] is None and p not in texts for p in pids):
        # an older sitehook dumps to stderr, i.e. into output.log
        lines = _dump_lines(_read_from(log, log_start))
        if lines:
            out.append(_describe(job_dir, None, "\n".join(lines)))
    _prune(job_dir)
    out.sort(key=lambda s: (s.rank is None, s.rank if s.rank is not None else 0, s.pid or 0))
    return out


def summary(procs: t.Sequence[ProcessStacks]) -> str:
    """One line: ``all ranks in collectives: rank 1 in new_group (dist.py:86), rank 0 in ...``."""
    if not procs:
        return "no stacks"
    ranked = [p for p in procs if p.rank is not None] or [
        p for p in procs if not (p.role or "").startswith("helper")] or list(procs)
    waiting = [p for p in ranked if p.collective]
    body = ", ".join(p.label() for p in sorted(ranked, key=lambda p: -(p.rank or 0)))
    if waiting and len(waiting) == len(ranked):
        head = "all ranks in collectives" if len(ranked) > 1 else "in a collective"
    elif waiting:
        head = f"{len(waiting)} of {len(ranked)} ranks in collectives"
    else:
        head = "no rank in a collective"
    return f"{head}: {body}"


def save(job_dir: str, procs: t.Sequence[ProcessStacks], stem: str) -> str:
    """Keep the dumps: ``stack-dumps/<stem>.txt``, one section per process, written whole
    (:func:`remote_payload.safe_write.write_text`: never through a link planted there)."""
    path = os.path.join(job_dir, jobs.STACK_DUMPS, f"{stem}.txt")
    safe_write.write_text(path, "".join(
        f"=== pid {p.pid} rank {p.rank} role {p.role} gpu {p.gpu}: {p.cmd}\n"
        + p.dump.rstrip("\n") + "\n\n" for p in procs), make_parents=True)
    return path


# --- one process ------------------------------------------------------------------


def _describe(job_dir: str, pid: int | None, text: str) -> ProcessStacks:
    info = _identity(job_dir, pid) if pid is not None else {}
    dumps = stackdump.parse_dump(text)
    threads = dumps[-1].threads if dumps else ()
    main = _main_thread(threads)
    frames = main.frames if main is not None else ()
    collective, caller = blocked_in(frames)
    where = frames[0].short() if frames else "<no Python frame>"
    rank = info.get("rank")
    return ProcessStacks(
        pid=pid, rank=rank if isinstance(rank, int) else None, role=info.get("role"),
        gpu=info.get("gpu"), cmd=_cmd(pid) if pid is not None else "(from output.log)",
        dump=text.rstrip("\n"), threads=len(threads), where=where, collective=collective,
        caller=caller)


def blocked_in(frames: t.Sequence[stackdump.Frame]) -> tuple[str | None, str | None]:
    """``(collective, caller)`` when the innermost torch.distributed frames are a c10d call.

    Frames are innermost first; the collective is the outermost ``distributed_c10d`` function
    of that first run of torch.distributed frames (``new_group``, not its helpers), and the
    caller is the first frame outside ``torch/`` (``dist.py:86``).
    """
    i = next((k for k, f in enumerate(frames) if TORCH_DIST in f.file), None)
    if i is None or any(_is_job_code(f) for f in frames[:i]):
        return None, None
    collective = None
    k = i
    while k < len(frames) and ("torch/" in frames[k].file or "/torch" in frames[k].file):
        if COLLECTIVES_FILE in frames[k].file and not frames[k].func.startswith("_"):
            collective = frames[k].func
        k += 1
    if collective is None:
        return None, None
    caller = frames[k] if k < len(frames) else None
    where = f"{os.path.basename(caller.file)}:{caller.line}" if caller is not None else None
    return collective, where


def _is_job_code(f: stackdump.Frame) -> bool:
    return "torch/" not in f.file and "/lib/python3" not in f.file


def _main_thread(threads: t.Sequence[stackdump.ThreadStack]) -> stackdump.ThreadStack | None:
    """The thread whose outermost frame is a module body (the script or a spawn child)."""
    for th in threads:
        if th.frames and th.frames[-1].func == "<module>":
            return th
    return next((th for th in threads if th.current), threads[0] if threads else None)


def _identity(job_dir: str, pid: int) -> dict[str, t.Any]:
    """What the process announced; else its rank from the environment torchrun started it with.

    A process below a rank (inductor's compile workers, data loader workers) inherits that
    rank's environment: it is that rank's helper, not the rank (on an H200 one drafter rank had
    33 compile workers, all with RANK=0).
    """
    own = _announced(job_dir, pid)
    if own:
        return own
    for anc in _ancestors(pid):
        rank = _announced(job_dir, anc).get("rank")
        if rank is None:
            rank = _env_rank(anc)
        if rank is not None:
            return {"role": f"helper of rank {rank}"}
    rank = _env_rank(pid)
    return {"rank": rank} if rank is not None else {}


def _announced(job_dir: str, pid: int) -> dict[str, t.Any]:
    try:
        info = json.loads(boundedread.read_regular(wire.proc_info_path(job_dir, pid), 1 << 16))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _env_rank(pid: int) -> int | None:
    rank = _environ(pid).get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def _ancestors(pid: int, limit: int = 8) -> list[int]:
    out = []
    for _ in range(limit):
        st = procfs.stat(pid)
        if st is None:
            break
        pid = st.ppid
        if pid <= 1:
            break
        out.append(pid)
    return out


def _environ(pid: int) -> dict[str, str]:
    return procfs.environ(pid)


def _cmd(pid: int) -> str:
    text = " ".join(jobs.proc_cmdline(pid))
    return text if len(text) <= 160 else text[:157] + "..."


# --- files --------------------------------------------------------------------------


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _read_from(path: str, offset: int) -> str:
    try:
        return boundedread.read_at(path, offset, MAX_DUMP_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def _wait_for_files(job_dir: str, before: dict[int, int | None], timeout: float) -> dict[int, str]:
    """Until every file grew and then stayed still for :data:`SETTLE_S` (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    last: dict[int, tuple[int, float]] = {}
    while True:
        now = time.monotonic()
        for pid, start in before.items():
            size = _size(wire.proc_stacks_path(job_dir, pid))
            if size is not None and size > (start or 0) and last.get(pid, (-1, 0.0))[0] != size:
                last[pid] = (size, now)
        settled = all(pid in last and now - last[pid][1] >= SETTLE_S for pid in before)
        if settled or now >= deadline:
            break
        time.sleep(0.02)
    return {pid: _read_from(wire.proc_stacks_path(job_dir, pid), before[pid] or 0) for pid in last}


def _dump_lines(text: str) -> list[str]:
    """The faulthandler blocks in ``text``, without the job's other output."""
    out: list[str] = []
    inside = False
    for ln in text.splitlines():
        if DUMP_HEADER.match(ln):
            inside = True
            out.append(ln)
        elif inside and DUMP_LINE.match(ln):
            out.append(ln)
        else:
            inside = False
    while out and not out[-1].strip():
        out.pop()
    return out


def _prune(job_dir: str) -> None:
    """Drop empty stacks files of processes that are gone (compile workers come and go)."""
    folder = os.path.join(job_dir, wire.PROCS_DIR)
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            stem, _dot, ext = name.partition(".")
            if ext != "stacks" or not stem.isdigit():
                continue
            path = os.path.join(folder, name)
            if _size(path) == 0 and not procfs.exists(stem):
                with contextlib.suppress(OSError):
                    os.unlink(path)

