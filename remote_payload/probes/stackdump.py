"""Parse ``faulthandler`` thread dumps into per-thread frames.

Why: a hung compile shows up only as a wall of ``File "...", line N in f``
lines. The probe (and ``status`` diagnosis) turn that into one short line per
thread ("where is it blocked") so a human sees the answer without reading 200
frames. Stdlib only; handles the watchdog (``Timeout (0:01:40)!``), the
fatal-signal (``Fatal Python error: ...``) and the plain all-threads formats.
"""

from __future__ import annotations

import dataclasses
import re
import typing as t

_THREAD_RE = re.compile(
    r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-fA-F]+)"
    r"(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):\s*$"
)
_STACK_RE = re.compile(r"^Stack \(most recent call first\):\s*$")
_FRAME_RE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<func>.*?)\s*$')
_TIMEOUT_RE = re.compile(r"^Timeout \((?P<after>[0-9:.]+)\)!\s*$")

# Path prefixes that carry no information for a reader ("where is it stuck").
_SHORTEN = ("site-packages/", "dist-packages/")
_STDLIB_HINT = re.compile(r"/lib/python3\.\d+/")

# (file substring, function) pairs worth naming in a one-line summary of a
# compile hang: they say which stage of torch.compile a thread is in.
LANDMARKS: tuple[tuple[str, str, str], ...] = (
    ("fx/_symbolic_trace.py", "trace", "fx Tracer.trace"),
    ("_inductor/compile_fx.py", "compile_fx_backward", "inductor backward compile"),
    ("_inductor/compile_fx.py", "compile_fx_inner", "inductor compile"),
    ("_higher_order_ops/flex_attention.py", "create_fw_bw_graph", "flex_attention joint trace"),
    ("_dynamo/convert_frame.py", "_compile", "dynamo compile"),
    ("_dynamo/eval_frame.py", "compile_wrapper", "compiled call"),
    ("autograd/graph.py", "_engine_run_backward", "autograd backward"),
    ("compile_worker/subproc_pool.py", "_recv_msg", "compile worker pool"),
    ("threading.py", "_wait_for_tstate_lock", "thread join"),
    ("compile_guard.py", "serialized_compile", "waiting for the compile lock"),
)

# Frames that mean "this thread is inside torch.compile machinery".
COMPILE_MARKERS = (
    "torch/_dynamo/",
    "torch/_inductor/",
    "torch/_functorch/",
    "torch/fx/",
    "torch/_higher_order_ops/",
)


@dataclasses.dataclass(frozen=True)
class Frame:
    file: str
    line: int | None
    func: str

    def short(self) -> str:
        """``torch/_inductor/compile_fx.py:2418 compile_fx_backward``."""
        line = "?" if self.line is None else str(self.line)
        return f"{shorten_path(self.file)}:{line} {self.func}"


@dataclasses.dataclass(frozen=True)
class ThreadStack:
    ident: str  # "0x00007f3b3b4ff6c0", as faulthandler prints it
    current: bool  # the thread that wrote the dump
    frames: tuple[Frame, ...]  # most recent call first
    name: str | None = None

    @property
    def in_compile(self) -> bool:
        return any(m in f.file for f in self.frames for m in COMPILE_MARKERS)

    def where(self, *, prefer: t.Sequence[str] = ()) -> str:
        """One line: the top frame, plus the outermost frame from ``prefer`` files.

        ``prefer`` names files (substrings) whose frames say *who* the thread is
        (e.g. the probe's worker), so the line reads "blocked in X (from Y)".
        """
        if not self.frames:
            return "<no Python frame>"
        top = self.frames[0].short()
        owner = next((f for f in reversed(self.frames) if any(p in f.file for p in prefer)), None)
        if owner is not None and owner != self.frames[0]:
            return f"{top} (from {owner.short()})"
        return top

    def landmarks(self) -> list[str]:
        """Known stages on this stack, innermost first, each named once."""
        seen: list[str] = []
        for f in self.frames:
            for file_part, func, label in LANDMARKS:
                if f.func == func and file_part in f.file and label not in seen:
                    seen.append(label)
        return seen

    def to_dict(self, *, max_frames: int = 12, prefer: t.Sequence[str] = ()) -> dict[str, t.Any]:
        return {
            "ident": self.ident,
            "name": self.name,
            "current": self.current,
            "in_compile": self.in_compile,
            "depth": len(self.frames),
            "where": self.where(prefer=prefer),
            "landmarks": self.landmarks(),
            "top": [f.short() for f in self.frames[:max_frames]],
        }


@dataclasses.dataclass(frozen=True)
class Dump:
    timeout_after: str | None  # "0:01:40" for a dump_traceback_later watchdog
    threads: tuple[ThreadStack, ...]


def shorten_path(path: str) -> str:
    for marker in _SHORTEN:
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    m = _STDLIB_HINT.search(path)
    if m:
        return path[m.end():]
    return path


def parse_dump(text: str | t.Iterable[str]) -> list[Dump]:
    """Every faulthandler dump in ``text`` (a log may hold several), in order."""
    lines = text.splitlines() if isinstance(text, str) else [ln.rstrip("\n") for ln in text]
    dumps: list[Dump] = []
    threads: list[ThreadStack] = []
    timeout: str | None = None
    cur: dict[str, t.Any] | None = None

    def close_thread() -> None:
        nonlocal cur
        if cur is not None:
            threads.append(ThreadStack(cur["ident"], cur["current"], tuple(cur["frames"]),
                                       cur["name"]))
            cur = None

    def close_dump() -> None:
        nonlocal threads, timeout
        close_thread()
        if threads:
            dumps.append(Dump(timeout, tuple(threads)))
        threads, timeout = [], None

    for line in lines:
        m = _TIMEOUT_RE.match(line)
        if m:
            close_dump()
            timeout = m.group("after")
            continue
        m = _THREAD_RE.match(line)
        if m:
            # A thread id seen twice means a second dump started without a header.
            if any(th.ident == m.group("ident") for th in threads):
                close_dump()
            close_thread()
            cur = {"ident": m.group("ident"), "current": m.group("current") == "Current thread",
                   "name": m.group("name"), "frames": []}
            continue
        if _STACK_RE.match(line):
            close_thread()
            cur = {"ident": "current", "current": True, "name": None, "frames": []}
            continue
        m = _FRAME_RE.match(line)
        if m and cur is not None:
            ln = m.group("line")
            cur["frames"].append(Frame(m.group("file"), None if ln == "???" else int(ln),
                                       m.group("func")))
            continue
        if cur is not None and line.strip() in ("", "...", "<no Python frame>"):
            if line.strip() == "":
                close_thread()
            continue
        if cur is not None:
            close_thread()
    close_dump()
    return dumps


def looks_like_dump(lines: t.Iterable[str]) -> bool:
    """Cheap check used by diagnosis before parsing."""
    return any(_THREAD_RE.match(ln) or _STACK_RE.match(ln) for ln in lines)


def summarize(dump: Dump, *, names: t.Mapping[str, str] | None = None,
              prefer: t.Sequence[str] = (), max_frames: int = 12) -> list[dict[str, t.Any]]:
    """Per-thread summaries, labelled with ``names`` (ident -> thread name) when known."""
    out = []
    for th in dump.threads:
        d = th.to_dict(max_frames=max_frames, prefer=prefer)
        if names and d["name"] is None:
            try:
                d["name"] = names.get(normalize_ident(th.ident))
            except ValueError:  # "current" (a single-thread "Stack" dump)
                pass
        out.append(d)
    return out


def normalize_ident(ident: str | int) -> str:
    """Canonical form of a thread id, so ``threading.get_ident()`` matches the dump."""
    value = int(ident, 16) if isinstance(ident, str) else ident
    return f"0x{value:016x}"
