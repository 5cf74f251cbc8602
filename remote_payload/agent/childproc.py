"""A child process started now and collected later, read through pipes, without ``subprocess``.

Why: ``status`` (every poll, and the first command of a session) starts two children at
most, ``tmux capture-pane`` (:class:`remote_payload.agent.tmux.PaneCapture`) and, with no GPU
sample on disk, ``nvidia-smi`` (:class:`remote_payload.agent.gpus.GpuQuery`), and needs none
of ``subprocess``'s features (no shell, no text mode, no input); importing it (selectors,
locale, threading) was ~3 ms of the agent's ~20 ms start in the container (docs/benchmarks.md).
This is ``os.posix_spawnp`` and a ``poll`` loop.
"""

from __future__ import annotations

import os
import select
import signal
import time

_READ_SIZE = 65536


class Child:
    """``argv`` started now (stdin /dev/null; stdout and stderr on pipes), found on PATH;
    :meth:`result` collects it.

    Raises:
        OSError: it could not be started (as ``subprocess.Popen``).
    """

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        out_r, out_w = os.pipe()  # close-on-exec; dup2 onto 1 and 2 clears it in the child
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.pid = os.posix_spawnp(argv[0], argv, os.environ if env is None else env,
                                       file_actions=[(os.POSIX_SPAWN_DUP2, null, 0),
                                                     (os.POSIX_SPAWN_DUP2, out_w, 1),
                                                     (os.POSIX_SPAWN_DUP2, err_w, 2)])
        except OSError:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            for fd in (out_w, err_w, null):
                os.close(fd)
        self.out, self.err = out_r, err_r
        self.returncode: int | None = None

    def result(self, timeout: float) -> tuple[int, bytes, bytes]:
        """``(exit code, stdout, stderr)``; the exit code is ``-N`` after signal N, as
        ``subprocess`` reports it.

        Raises:
            TimeoutError: not finished ``timeout`` seconds from now (it is killed and reaped).
        """
        got = {self.out: bytearray(), self.err: bytearray()}
        poller = select.poll()
        for fd in got:
            poller.register(fd, select.POLLIN)
        reading = set(got)
        deadline = time.monotonic() + timeout
        try:
            while reading:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._kill()
                    raise TimeoutError(f"still running after {timeout:g} s")
                for fd, _ in poller.poll(max(1, int(left * 1000))):
                    data = os.read(fd, _READ_SIZE)
                    if data:
                        got[fd] += data
                    else:  # EOF: the child closed it (at its exit)
                        poller.unregister(fd)
                        reading.discard(fd)
        finally:
            os.close(self.out)
            os.close(self.err)
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode, bytes(got[self.out]), bytes(got[self.err])

    def _kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
