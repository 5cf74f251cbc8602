"""Looking inside a running container: every process's stacks, and the compile-race probe."""

from __future__ import annotations

import typing as t

from remote_payload import wire_shapes as ws

if t.TYPE_CHECKING:
    from opsctl.ops.jobs import Target


def stacks(tgt: Target, job_id: str | None, timeout_s: float) -> ws.StacksDoc:
    """The job's stacks, rank by rank (the agent's ``stacks`` reply)."""
    args = ["--timeout", f"{timeout_s:g}"]
    if job_id:
        args += ["--job", job_id]
    return tgt.agent.call("stacks", *args, timeout=timeout_s + 30)


def compile_race(tgt: Target, *, threads: int, timeout_s: float, backward: bool, device: str,
                 modes: str, on_start: t.Callable[[], None] | None = None) -> ws.ProbeReportDoc:
    """Run the compile-race probe with the current payload; its report, whatever the verdict."""
    n_modes = len([m for m in modes.split(",") if m.strip()])
    deadline = n_modes * (timeout_s + 15) + 60
    tgt.agent.ensure_payload()
    if on_start is not None:
        on_start()
    return tgt.agent.call(
        "probe", "--threads", str(threads), "--timeout", f"{timeout_s:g}", "--device", device,
        "--backward" if backward else "--no-backward", "--modes", modes,
        "--deadline", f"{deadline:g}", timeout=deadline + 30)
