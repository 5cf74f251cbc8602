"""One exception tree for opsctl; only the CLI (``opsctl.cli.app.OpsctlGroup``) turns these
into exit codes.

Every error builds its own one-line message from typed fields and may carry a
``hint`` (the next command to run) and a ``log_path`` (where the full output was
saved), so that no failure is ever silent. The docs' exit-code page
(``docs/hooks/generated.py``) and ``opsctl help exit-codes`` are both made from
:data:`EXIT_CODES` and :data:`PASSED_THROUGH`, so they cannot disagree.
"""

from __future__ import annotations

import typing as t

if t.TYPE_CHECKING:
    from remote_payload.wire import ErrorType

# Exit codes, one per family (the docs' exit-code page is generated from EXIT_CODES).
OK = 0
INTERNAL = 1
USAGE = 2
TRANSPORT = 10
AUTH = 11
HOST_KEY = 12
CONTAINER_MISSING = 20
CONTAINER_NOT_RUNNING = 21
HOST_SETUP = 22
PCT_TOO_OLD = 23
REMOTE_FAILED = 25
UNKNOWN_JOB = 26
FLEET_INCOMPLETE = 27
DOCTOR_FAILED = 28
TORCH_ENV = 30
JOB_FAILED = 40
JOB_UNHEALTHY = 41
HANGUP = 129
INTERRUPTED = 130
TERMINATED = 143

EXIT_CODES: dict[int, str] = {
    OK: "success (job healthy / finished / command done)",
    INTERNAL: "a bug in opsctl (traceback printed)",
    USAGE: "usage or configuration error (bad flag, inventory or playbook; nothing was done remotely), "
           "or a destination on this machine refused or unwritable (a link, the current directory, "
           "a home, files opsctl did not write without `--force`, a full or read-only disk; the "
           "previous copy is kept)",
    TRANSPORT: "cannot connect to the host (refused, timeout, DNS, connection lost)",
    AUTH: "SSH authentication failed",
    HOST_KEY: "host key unknown or changed (never accepted silently; `opsctl host trust`)",
    CONTAINER_MISSING: "container does not exist",
    CONTAINER_NOT_RUNNING: "container exists but is not running",
    HOST_SETUP: "the host cannot run pct for opsctl: `pct`, coreutils `timeout` or the sudoers line "
                "is missing (the error names which, e.g. the sudoers rule for `pct exec`, `status`, "
                "`config`, `list`)",
    PCT_TOO_OLD: "the host's pve-container is older than 5.0.9 (no `pct exec --keep-env`): "
                 "`apt install pve-container`",
    REMOTE_FAILED: "a remote step failed (agent, payload transfer, deadline, job already running, GPUs "
                   "the job needs are busy: `deploy --force`, disk full in the container, a process "
                   "that survived `stop`)",
    UNKNOWN_JOB: "no such job in the container: an unknown id or prefix, a prefix that several jobs "
                 "share (they are listed), or nothing launched yet (`opsctl jobs` lists them)",
    FLEET_INCOMPLETE: "`status --all`: every host answered or timed out, and some rows are errors "
                      "(each row carries its own error and exit code); `status --nodes`/`stop "
                      "--nodes`: a node could not be asked (`\"ok\": false`; `stop` stopped the "
                      "run's job on the nodes it reached)",
    DOCTOR_FAILED: "`opsctl doctor` found a failing check (each row names its evidence and fix), "
                   "or its --deadline left no time for some checks (the `deadline` row names "
                   "them): an incomplete doctor is never a clean bill",
    TORCH_ENV: "torch build install / verify / swap failed (previous build kept)",
    JOB_FAILED: "the job failed, was cancelled or lost (also `logs -f` and `status --follow` when the "
                "job they followed ended so)",
    JOB_UNHEALTHY: "the job did not become healthy before the playbook's `timeout_s`",
    INTERRUPTED: "interrupted (Ctrl-C, or a confirmation of `stop`/`deploy --replace` answered no; the "
                 "remote job keeps running; an interrupted deploy never launches its job later and "
                 "says what it already did)",
    HANGUP: "the terminal went away (SIGHUP): every process opsctl had started here was ended "
            "first (a `forward` tunnel, an ssh); the remote job keeps running (a deploy or "
            "queue add says what it launched or queued, and the command that stops it)",
    TERMINATED: "ended by SIGTERM: every process opsctl had started here was ended first (a "
                "`forward` tunnel, an ssh); the remote job keeps running (a deploy or queue add "
                "says what it launched or queued, and the command that stops it)",
}

#: Exit statuses opsctl passes on rather than chooses: the table's last row.
PASSED_THROUGH = ("`opsctl exec` and `opsctl shell`: the remote command's (shell's) own exit code; "
                  "`opsctl attach`: tmux's. Any command whose reader closed early "
                  "(`opsctl exec … | head -c 10`, `opsctl help exit-codes | head -1`) ends as "
                  "`cat` does: killed by SIGPIPE, quietly (a shell shows 141), every child it "
                  "started (`exec`'s remote command) ended first")


class OpsctlError(Exception):
    """Root of every error opsctl renders nicely; anything else is a bug."""

    exit_code: int = INTERNAL
    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, log_path: str | None = None):
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint
        self.log_path = log_path

    def to_dict(self) -> dict[str, t.Any]:
        return {
            "type": type(self).__name__,
            "message": self.message,
            "exit_code": self.exit_code,
            "hint": self.hint,
            "log_path": self.log_path,
        }


class ConfigError(OpsctlError, ValueError):
    """Bad inventory, playbook or flag: nothing was done remotely."""

    exit_code = USAGE


class DeleteRefused(ConfigError):
    """``push``/``pull --delete`` aimed at ``/``, a system directory, a home, the current
    directory or a directory containing one (``rule`` says which); nothing was sent or deleted."""

    def __init__(self, message: str, *, path: str, rule: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.path = path
        self.rule = rule

    def to_dict(self) -> dict[str, t.Any]:
        return {**super().to_dict(), "path": self.path, "rule": self.rule}


class LocalWriteError(ConfigError):
    """A file or directory on this machine was refused (a link, a protected place, files
    opsctl did not write) or the OS refused the write (full disk, read-only, permission);
    the previous content is kept. Built from :mod:`remote_payload.safe_write`'s errors."""

    def __init__(self, message: str, *, path: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.path = path

    @classmethod
    def of(cls, exc: OSError) -> LocalWriteError:
        """The opsctl error of a :class:`remote_payload.safe_write.DestinationError`."""
        path = str(getattr(exc, "path", None) or exc.filename or "")
        return cls(str(exc), path=path)


class TransportError(OpsctlError):
    """The SSH hop to the Proxmox host failed."""

    exit_code = TRANSPORT


class AuthError(TransportError):
    exit_code = AUTH


class HostKeyError(TransportError):
    """Unknown or changed host key; never silently accepted."""

    exit_code = HOST_KEY


class ContainerError(OpsctlError):
    """The container is missing or in the wrong state."""

    exit_code = CONTAINER_MISSING


class ContainerMissing(ContainerError):
    exit_code = CONTAINER_MISSING


class ContainerNotRunning(ContainerError):
    exit_code = CONTAINER_NOT_RUNNING


class HostSetupError(OpsctlError):
    """The Proxmox host cannot run ``pct`` for opsctl; nothing ran in the container.

    ``missing`` names the one thing to add: ``pct``, ``timeout`` (coreutils), ``sudo`` or the
    exact sudoers line.
    """

    exit_code = HOST_SETUP

    def __init__(self, message: str, *, missing: str, hint: str | None = None,
                 log_path: str | None = None):
        super().__init__(message, hint=hint, log_path=log_path)
        self.missing = missing

    def to_dict(self) -> dict[str, t.Any]:
        return {**super().to_dict(), "missing": self.missing}


class PctTooOld(HostSetupError):
    """pve-container before 5.0.9 has no ``pct exec --keep-env`` (PVE 7, PVE 8.0/8.1)."""

    exit_code = PCT_TOO_OLD


class RemoteCommandFailed(OpsctlError):
    """A command in the container exited non-zero or ran past its deadline."""

    exit_code = REMOTE_FAILED

    def __init__(
        self,
        message: str,
        *,
        argv: t.Sequence[str] = (),
        rc: int | None = None,
        stderr_tail: str = "",
        hint: str | None = None,
        log_path: str | None = None,
    ):
        super().__init__(message, hint=hint, log_path=log_path)
        self.argv = list(argv)
        self.rc = rc
        self.stderr_tail = stderr_tail


class SourceChanged(RemoteCommandFailed):
    """A file changed while ``push``/``pull`` sent it, again on the one re-send; ``files``
    names them. A copy read while it changed would match neither version, so it is never
    reported as a success."""

    def __init__(self, message: str, *, files: t.Sequence[str], hint: str | None = None):
        super().__init__(message, hint=hint)
        self.files = list(files)

    def to_dict(self) -> dict[str, t.Any]:
        return {**super().to_dict(), "files": self.files}


class EntriesRefused(RemoteCommandFailed):
    """What came back from a container held entries this machine does not create (a device,
    FIFO or socket; a link leaving the copy) or broke the receiver's rules (a name leaving
    the destination, a write through a link, more bytes than the cap): ``refused`` names them
    as ``[name, why]``. Everything else that arrived is in place."""

    def __init__(self, message: str, *, refused: t.Sequence[t.Sequence[str]] = (),
                 hint: str | None = None):
        super().__init__(message, hint=hint)
        self.refused = [list(r) for r in refused]

    def to_dict(self) -> dict[str, t.Any]:
        return {**super().to_dict(), "refused": self.refused}


class ReplyShapeError(RemoteCommandFailed):
    """The agent answered valid JSON that is not the shape ``remote_payload/wire_shapes.py``
    defines for the verb (a payload from another opsctl version, or a damaged reply)."""


class DeadlineExceeded(RemoteCommandFailed):
    """The per-call deadline fired; the remote process group was killed."""


class AgentError(RemoteCommandFailed):
    """The container agent answered with an error document (rebuilt from the wire)."""

    def __init__(self, message: str, *, remote_type: ErrorType | str,
                 fields: dict[str, t.Any] | None = None, hint: str | None = None,
                 log_path: str | None = None):
        super().__init__(message, hint=hint, log_path=log_path)
        #: the wire ``error.type``; a str only for a type this opsctl does not know
        self.remote_type = remote_type
        self.fields = fields or {}


class UnknownJob(AgentError):
    """The container has no job of that id (or the prefix names several, or none was launched)."""

    exit_code = UNKNOWN_JOB
class FleetIncomplete(OpsctlError):
    """``status --all``: every row was answered, some with an error; ``status``/``stop --nodes``:
    a node could not be asked. ``report`` holds every row."""

    exit_code = FLEET_INCOMPLETE

    def __init__(self, message: str, *, report: t.Any = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.report = report


class DoctorFailed(OpsctlError):
    """``opsctl doctor`` answered, and at least one check failed (the rows say which)."""

    exit_code = DOCTOR_FAILED


class TorchEnvError(OpsctlError, ValueError):
    """Installing, verifying or switching a torch build failed; the old build stays."""

    exit_code = TORCH_ENV


class DeployOutcomeError(OpsctlError):
    """A deploy whose job did not become healthy; ``report`` is what the deploy saw.

    The report is the deploy's (``opsctl.ops.deploy.DeployReport``), so ``deploy --json``
    still prints it with the error, and the status goes to stderr otherwise.
    """

    def __init__(self, message: str, *, report: t.Any = None, hint: str | None = None,
                 log_path: str | None = None):
        super().__init__(message, hint=hint, log_path=log_path)
        self.report = report


class JobFailed(DeployOutcomeError):
    """The job ended FAILED, CANCELLED or LOST."""

    exit_code = JOB_FAILED


class JobUnhealthy(DeployOutcomeError):
    """The job is alive but did not become healthy before the playbook's timeout."""

    exit_code = JOB_UNHEALTHY


class Declined(OpsctlError):
    """A confirmation question was answered no; nothing was done (the Ctrl-C code)."""

    exit_code = INTERRUPTED


class Interrupted(OpsctlError):
    """Ctrl-C, SIGTERM or SIGHUP during a remote operation; the message says what was already
    done and how to undo it. ``signum``: the signal (None: Ctrl-C), whose exit code it takes
    (:data:`TERMINATED`, :data:`HANGUP`)."""

    exit_code = INTERRUPTED

    def __init__(self, message: str, *, hint: str | None = None, log_path: str | None = None,
                 signum: int | None = None):
        super().__init__(message, hint=hint, log_path=log_path)
        self.signum = signum
        if signum is not None:
            self.exit_code = signal_exit_code(signum)


def signal_exit_code(signum: int) -> int:
    """The exit code of a run ended by SIGTERM or SIGHUP (a shell's 128 + n for any other)."""
    import signal

    codes: dict[int, int] = {signal.SIGTERM: TERMINATED, signal.SIGHUP: HANGUP}
    return codes.get(signum, 128 + signum)
