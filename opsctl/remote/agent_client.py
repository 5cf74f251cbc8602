"""Ship the payload and call agent verbs in a container; parse their one JSON reply."""

from __future__ import annotations

import json
import time
import typing as t
from dataclasses import dataclass

from opsctl.errors import AgentError, RemoteCommandFailed, TorchEnvError, UnknownJob
from opsctl.remote.command import NOT_KEPT, CommandResult, agent_argv, agent_step
from opsctl.remote.transport import Remote, missing_in_container, save_log
from remote_payload import limits, wire
from remote_payload.wire import ErrorType

if t.TYPE_CHECKING:
    from remote_payload.wire_shapes import AgentReplyDoc


class TorchAgentError(AgentError, TorchEnvError):
    exit_code = TorchEnvError.exit_code


class NoPayload(RemoteCommandFailed):
    """The container has no opsctl payload yet (deploy ships it)."""


#: The local family (and so the exit code) of every error type the agent can answer with.
#: Complete by contract: tests/unit/test_error_contract.py fails when the agent gains a type that
#: is not listed here. A type from a newer agent that this opsctl does not know is an AgentError.
ERROR_FAMILIES: dict[ErrorType, type[AgentError]] = {
    **{e: AgentError for e in ErrorType},  # REMOTE_FAILED (25)
    ErrorType.TorchInstallFailed: TorchAgentError,  # TORCH_ENV (30): install or verify failed
    ErrorType.CacheSeedFailed: TorchAgentError,
    ErrorType.NoSuchJob: UnknownJob,  # UNKNOWN_JOB (26)
}

_HINTS: dict[ErrorType, str] = {
    ErrorType.JobAlreadyRunning: "stop it first (`opsctl stop`) or deploy with --replace",
    ErrorType.NoSuchJob: "`opsctl jobs` lists the container's jobs (nothing launched yet: opsctl deploy)",
    ErrorType.JobRunning: "`opsctl stop` it first, or deploy with --replace",
    ErrorType.PayloadMismatch: "run `opsctl deploy` to ship the current payload",
    ErrorType.GpusBusy: "free them (`opsctl exec -- nvidia-smi` shows what runs) or deploy with --force",
    ErrorType.DiskFull: "free space in the container (df -h; old jobs/ dirs, caches), then retry",
    ErrorType.LaunchAborted: "the deploy was interrupted; run it again",
    ErrorType.PreflightFailed: "apply the fix the row names (opsctl doctor shows every check), "
                               "or deploy with --force",
    ErrorType.QueueRefused: "`opsctl queue` shows the queue, `opsctl jobs` every job",
    ErrorType.DamagedRecord: "read or move the file it names; `opsctl jobs` lists every damaged "
                             "record and shows the others",
}


def error_type(name: str) -> ErrorType | str:
    """The wire name as an :class:`ErrorType` (a name this opsctl does not know stays a str)."""
    try:
        return ErrorType(name)
    except ValueError:
        return name


@dataclass(frozen=True)
class PayloadResult:
    sent: bool
    digest: str
    files: int
    bytes_sent: int
    elapsed_s: float


@dataclass
class Agent:
    """Agent verbs in one container, over one :class:`Remote`."""

    remote: Remote
    ctid: int
    root: str = wire.DEFAULT_ROOT
    python: str = "python3"

    def argv(self, verb: str, *args: str) -> list[str]:
        return agent_argv(self.root, verb, *args, python=self.python)

    def call(self, verb: str, *args: str, timeout: float = 60,
             on_stderr: t.Callable[[bytes], None] | None = None,
             stdin: bytes | None = None) -> t.Any:
        """Run one verb; returns its ``data``. ``stdin``: what the verb reads there (secrets:
        never on the command line, which every process of the host can read).

        Raises:
            AgentError (or a family subclass): the agent answered an error document.
            RemoteCommandFailed: no valid reply (output saved, path in the error).
            ContainerMissing/ContainerNotRunning/TransportError: from the transport.
        """
        result = self.remote.pct_exec(self.ctid, self.argv(verb, *args), timeout=timeout,
                                      step=agent_step(verb), on_stderr=on_stderr, stdin=stdin,
                                      keep_bytes=limits.cap("REPLY_BYTES"))
        return self.answer(verb, result)

    def answer(self, verb: str, result: CommandResult) -> t.Any:
        """The ``data`` of a verb's finished command (:meth:`call` after the remote part).

        Raises:
            as :meth:`call`, except the transport's errors.
        """
        step = agent_step(verb)
        reply = parse_reply(self.remote.host.label, self.ctid, step, result)
        if reply["ok"]:
            return reply.get("data")
        err: dict[str, t.Any] = dict(reply.get("error") or {})
        etype = error_type(str(err.get("type", "AgentError")))
        fields = dict(err.get("fields") or {})
        cls = ERROR_FAMILIES.get(etype, AgentError) if isinstance(etype, ErrorType) else AgentError
        log_path = fields.get("log_path")
        # one line: the full text is in the log the error points to
        first = str(err.get("message", etype)).strip().splitlines() or [etype]
        text = first[0] if len(first[0]) <= 300 else first[0][:297] + "..."
        if len(first) > 1:
            text += " […]"
        message = f"{self.remote.host.label} ct {self.ctid}: {verb}: {text}"
        if etype == ErrorType.AgentCrashed:
            log_path = str(save_log(step, result))
        hint = _HINTS.get(etype) if isinstance(etype, ErrorType) else None
        raise cls(message, remote_type=etype, fields=fields, hint=hint,
                  log_path=log_path)

    # --- payload ------------------------------------------------------------------

    def remote_digest(self) -> str | None:
        r = self.remote.pct_exec(self.ctid, ["cat", f"{self.root}/payload/MANIFEST.json"],
                                 timeout=20, step="read payload manifest")
        if r.rc != 0:
            return None
        try:
            return str(json.loads(r.stdout)["digest"])
        except (ValueError, KeyError, TypeError):
            return None

    def ensure_payload(self, *, force: bool = False) -> PayloadResult:
        """Send ``remote_payload/`` unless the container already has this exact digest.

        Raises:
            RemoteCommandFailed: transfer or verification failed (old payload kept).
        """
        from opsctl.remote import payload  # deploy only: keeps tarfile/hashing off the status path

        start = time.monotonic()
        manifest = payload.build_manifest()
        if not force and self.remote_digest() == manifest.digest:
            return PayloadResult(False, manifest.digest, len(manifest.files), 0,
                                 time.monotonic() - start)
        data = payload.tar_bytes(manifest)
        step = "payload transfer"
        r = self.remote.pct_exec(
            self.ctid, [self.python, "-c", payload.UNPACK_SCRIPT, self.root],
            timeout=120, stdin=data, step=step)
        try:
            doc = json.loads(r.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            doc = {"ok": False, "error": "no reply from the unpack step"}
        if r.rc != 0 or not doc.get("ok") or doc.get("digest") != manifest.digest:
            path = save_log(step, r)
            raise RemoteCommandFailed(
                f"{self.remote.host.label} ct {self.ctid}: payload transfer failed: "
                f"{doc.get('error') or r.stderr_tail(1)} (previous payload kept)",
                argv=r.argv, rc=r.rc, stderr_tail=r.stderr_tail(), log_path=str(path))
        return PayloadResult(True, manifest.digest, len(manifest.files), len(data),
                             time.monotonic() - start)


def parse_reply(host: str, ctid: int, step: str, result: CommandResult) -> AgentReplyDoc:
    """Exactly one JSON document, or a clear error with the output saved.

    Raises:
        RemoteCommandFailed: the output is not an agent reply.
    """
    import pydantic

    from opsctl.remote import shapes
    from remote_payload.wire_shapes import AgentReplyDoc

    text = result.stdout.decode("utf-8", "replace").strip()
    try:
        return t.cast(AgentReplyDoc, shapes.adapter(AgentReplyDoc).validate_json(
            text.splitlines()[-1] if text else ""))
    except (pydantic.ValidationError, IndexError):
        pass
    path = save_log(step, result)
    stderr = result.stderr.decode("utf-8", "replace")
    cls = RemoteCommandFailed
    if "No module named remote_payload" in stderr or "No module named 'remote_payload" in stderr:
        reason, hint = "no opsctl payload in the container", "run `opsctl deploy` first"
        cls = NoPayload
    elif (missing := missing_in_container(result)) is not None:
        package = {"timeout": "coreutils", "env": "coreutils"}.get(missing, missing)
        state = "not found" if result.rc == 127 else "not executable"  # execvp ENOENT / EACCES
        reason, hint = f"`{missing}` {state} in the container", f"install {package} in the container"
    elif NOT_KEPT.match(text):
        reason = f"the reply is over the {limits.cap('REPLY_BYTES')} bytes a reply may have"
        hint = ("the container's payload may be damaged or from another opsctl: "
                "`opsctl deploy` ships this one's")
    else:
        reason, hint = f"no valid reply (rc={result.rc}): {result.stderr_tail(1) or 'no output'}", None
    raise cls(f"{host} ct {ctid}: {step}: {reason}", argv=result.argv, rc=result.rc,
              stderr_tail=result.stderr_tail(), hint=hint, log_path=str(path))
