"""``opsctl exec``: one command in a container, output streamed, exit code passed through.

The command runs under the container-side guard (``remote_payload/agent/execguard.py``): its
deadline, the client going away and a reader that closed early end its whole process tree,
``setsid`` children included. Output reaches the callbacks chunk by chunk as it arrives and
only the last :data:`KEEP_BYTES` of each stream stay in memory (for error messages and the
saved log), so 500 MB of output costs no more memory than 5 KB.
"""

from __future__ import annotations

import typing as t

from opsctl.errors import DeadlineExceeded
from opsctl.remote.command import check_argv, shell_line

if t.TYPE_CHECKING:
    from opsctl.ops.jobs import Target

#: How much of each stream the result keeps (the rest only passed through the callbacks).
KEEP_BYTES = 64 * 1024
#: How much of the command an error message quotes.
QUOTE_CHARS = 200

Output = t.Callable[[bytes], None]


def check(tgt: Target, argv: t.Sequence[str]) -> list[str]:
    """``argv`` when a container can run it.

    Raises:
        ConfigError: nothing to run, an empty program name or a NUL byte (nothing is sent).
    """
    return check_argv(tgt.label, "exec", argv)


def run(tgt: Target, argv: t.Sequence[str], *, timeout: float | None,
        stdin: bytes | t.BinaryIO | None, on_stdout: Output, on_stderr: Output) -> int:
    """Run ``argv`` in the target container; its exit code.

    Raises:
        ConfigError: as :func:`check`.
        DeadlineExceeded: ``timeout`` fired; every process the command started was ended.
        OutputClosed: ``on_stdout`` said its reader is gone (the remote command is ended).
        TransportError, ContainerError, HostSetupError: as ``Remote.pct_exec``.
    """
    args = check(tgt, argv)
    try:
        res = tgt.remote.pct_exec(tgt.ctid, args, timeout=timeout, stdin=stdin,
                                  on_stdout=on_stdout, on_stderr=on_stderr, step="exec",
                                  guard=True, keep_bytes=KEEP_BYTES)
    except DeadlineExceeded as exc:
        if timeout is None or exc.rc is None:  # the local deadline: its own words
            raise
        command = shell_line(args)
        if len(command) > QUOTE_CHARS:
            command = command[:QUOTE_CHARS] + "…"
        raise DeadlineExceeded(
            f"{tgt.label}: exec `{command}` ran past its "
            f"{timeout:g} s deadline; it and every process it started were ended",
            argv=exc.argv, rc=exc.rc, stderr_tail=exc.stderr_tail, log_path=exc.log_path,
            hint="give it a longer --timeout, or run it as a job (opsctl deploy)") from None
    return res.rc
