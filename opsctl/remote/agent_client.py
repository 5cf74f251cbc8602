"""Ship the payload and call agent verbs in a container: the one boundary their replies cross.

A container runs third-party code, so its agent's reply is untrusted input. :meth:`Agent.call`
parses the one JSON document a verb prints and validates its ``data`` against the verb's shape
(``remote_payload/wire_shapes.py`` ``REPLY_SHAPES``, value constraints included) before it
returns: its overloads type each verb's result, so no caller holds an unchecked reply.
"""

from __future__ import annotations

import time
import typing as t
from dataclasses import dataclass

from opsctl.errors import (
    AgentError,
    RemoteCommandFailed,
    ReplyShapeError,
    TorchEnvError,
    UnknownJob,
)
from opsctl.remote.command import NOT_KEPT, CommandResult, agent_argv, agent_step
from opsctl.remote.transport import Remote, missing_in_container, save_log
from remote_payload import limits, wire
from remote_payload.wire import ErrorType

if t.TYPE_CHECKING:
    from remote_payload import wire_shapes as ws
    from remote_payload.wire_shapes import AgentReplyDoc

#: what a verb prints on stderr, line by line, while it runs (progress)
OnStderr = t.Callable[[bytes], None] | None


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

    @t.overload
    def call(self, verb: t.Literal["status", "launch"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.StatusDoc: ...
    @t.overload
    def call(self, verb: t.Literal["jobs"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.JobListDoc: ...
    @t.overload
    def call(self, verb: t.Literal["stop"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.StopDoc: ...
    @t.overload
    def call(self, verb: t.Literal["logs"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.LogsChunkDoc: ...
    @t.overload
    def call(self, verb: t.Literal["abort"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.AbortDoc: ...
    @t.overload
    def call(self, verb: t.Literal["envs"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.EnvsDoc: ...
    @t.overload
    def call(self, verb: t.Literal["queue", "queue-move"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.QueueDoc: ...
    @t.overload
    def call(self, verb: t.Literal["queue-add"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.QueueAddDoc: ...
    @t.overload
    def call(self, verb: t.Literal["queue-advance"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.QueueAdvanceDoc: ...
    @t.overload
    def call(self, verb: t.Literal["queue-rm"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.QueueRmDoc: ...
    @t.overload
    def call(self, verb: t.Literal["stacks"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.StacksDoc: ...
    @t.overload
    def call(self, verb: t.Literal["history"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.HistoryReplyDoc: ...
    @t.overload
    def call(self, verb: t.Literal["cache-info"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.CacheInfoDoc: ...
    @t.overload
    def call(self, verb: t.Literal["cache-clear"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.CacheClearDoc: ...
    @t.overload
    def call(self, verb: t.Literal["cache-seed"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.CacheSeedDoc: ...
    @t.overload
    def call(self, verb: t.Literal["swap"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.SwapDoc: ...
    @t.overload
    def call(self, verb: t.Literal["probe"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.ProbeReportDoc: ...
    @t.overload
    def call(self, verb: t.Literal["doctor"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.DoctorDoc: ...
    @t.overload
    def call(self, verb: t.Literal["env"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.EnvDoc: ...
    @t.overload
    def call(self, verb: t.Literal["net"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.NetDoc: ...
    @t.overload
    def call(self, verb: t.Literal["goodput"], *args: str, timeout: float = ...,
             on_stderr: OnStderr = ..., stdin: bytes | None = ...) -> ws.GoodputDoc: ...

    def call(self, verb: str, *args: str, timeout: float = 60, on_stderr: OnStderr = None,
             stdin: bytes | None = None) -> t.Any:
        """Run one verb; returns its reply's ``data``, checked against the verb's shape
        (``wire_shapes.REPLY_SHAPES``) and typed as it: a caller never sees a reply that
        was not validated. ``stdin``: what the verb reads there (secrets: never on the
        command line, which every process of the host can read).

        Raises:
            AgentError (or a family subclass): the agent answered an error document.
            ReplyShapeError: the reply is not the verb's shape (output saved, path in the error).
            RemoteCommandFailed: no valid reply (output saved, path in the error).
            ContainerMissing/ContainerNotRunning/TransportError: from the transport.
        """
        reply_shape(verb)  # a verb without a shape is refused before anything is sent
        result = self.remote.pct_exec(self.ctid, self.argv(verb, *args), timeout=timeout,
                                      step=agent_step(verb), on_stderr=on_stderr, stdin=stdin,
                                      keep_bytes=limits.cap("REPLY_BYTES"))
        data = self.answer(verb, result)
        try:
            within_request(verb, args, data,
                           where=f"{self.remote.host.target_label(self.ctid)}: {verb}")
        except ReplyShapeError as exc:
            exc.log_path = str(save_log(agent_step(verb), result))
            raise
        return data

    def answer(self, verb: str, result: CommandResult) -> t.Any:
        """The checked ``data`` of a verb's finished command (:meth:`call` after the remote
        part).

        Raises:
            as :meth:`call`, except the transport's errors.
        """
        step = agent_step(verb)
        where = f"{self.remote.host.target_label(self.ctid)}: {verb}"
        reply = parse_reply(self.remote.host.target_label(self.ctid), None, step, result)
        if reply["ok"]:
            try:
                return check_reply(verb, reply.get("data"), where=where)
            except ReplyShapeError as exc:
                exc.log_path = str(save_log(step, result))
                raise
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
        message = f"{where}: {text}"
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
        from opsctl.remote import shapes
        from remote_payload.wire_shapes import PayloadManifestDoc

        try:  # a damaged or planted manifest (100k ``[``): ship the payload again
            doc = shapes.parse_doc(PayloadManifestDoc, r.stdout, where="payload manifest",
                                   limit=8 << 20)
        except ReplyShapeError:
            return None
        return str(doc["digest"])

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
        from opsctl.remote import shapes
        from remote_payload.wire_shapes import PayloadUnpackedDoc

        lines = r.stdout.strip().splitlines()
        try:
            doc: PayloadUnpackedDoc = shapes.parse_doc(
                PayloadUnpackedDoc, lines[-1] if lines else b"", where="payload unpack")
        except ReplyShapeError as exc:
            doc = {"ok": False, "error": r.stderr_tail(1) if not lines and r.stderr_tail(1)
                   else "no reply from the unpack step" if not lines else str(exc)}
        if r.rc != 0 or not doc.get("ok") or doc.get("digest") != manifest.digest:
            path = save_log(step, r)
            host = self.remote.host
            hint = None
            if host.direct and "Permission denied" in r.stderr.decode("utf-8", "replace"):
                # a direct host runs nothing as root: the root must be the SSH user's own
                hint = (f"{host.user} cannot write {self.root} on {host.label}: set `root:` in "
                        "the inventory to a directory it owns (a direct host needs no sudo)")
            raise RemoteCommandFailed(
                f"{host.target_label(self.ctid)}: payload transfer failed: "
                f"{doc.get('error') or r.stderr_tail(1)} (previous payload kept)",
                argv=r.argv, rc=r.rc, stderr_tail=r.stderr_tail(), log_path=str(path), hint=hint)
        return PayloadResult(True, manifest.digest, len(manifest.files), len(data),
                             time.monotonic() - start)


def reply_shape(verb: str) -> type:
    """The shape of ``verb``'s reply (``wire_shapes.REPLY_SHAPES``).

    Raises:
        LookupError: a verb without a shape (a bug of opsctl's: no caller may read an
            unchecked reply).
    """
    from remote_payload.wire_shapes import REPLY_SHAPES

    shape = REPLY_SHAPES.get(verb)
    if shape is None:
        raise LookupError(f"agent verb {verb!r} has no reply shape in remote_payload/wire_shapes.py")
    return shape


def check_reply(verb: str, data: t.Any, *, where: str) -> t.Any:
    """``data`` (an ``ok`` reply's) checked against ``verb``'s shape: the same document,
    typed as that shape. Damaged plot data of a ``status``/``launch`` costs the sparklines,
    never the status: a ``history`` that is not a ``HistoryDoc`` becomes None.

    Raises:
        ReplyShapeError: ``data`` is not the verb's shape (one line: the first wrong field).
    """
    from opsctl.remote import shapes

    shape = reply_shape(verb)
    try:
        doc: t.Any = shapes.validate(shape, data, where=where)
    except ReplyShapeError:
        if verb not in ("status", "launch") or not isinstance(data, dict) \
                or data.get("history") is None:
            raise
        doc = shapes.validate(shape, {**data, "history": None}, where=where)
    if verb == "goodput":
        why = goodput_problem(doc, whole=True)
        if why is not None:
            raise ReplyShapeError(f"{where}: the ledger does not add up: {why}",
                                  hint="the container's payload may be damaged or from another "
                                       "opsctl: `opsctl deploy` ships this one's")
    elif verb in ("status", "launch") and doc.get("goodput") is not None \
            and goodput_problem(doc["goodput"], whole=False) is not None:
        doc = {**doc, "goodput": None}  # a brief that does not add up costs its line, never the status
    return doc


def goodput_problem(doc: t.Mapping[str, t.Any], *, whole: bool) -> str | None:
    """Why a goodput ledger (``whole``: a ``goodput`` reply; else a status's brief) is not
    one the agent makes: its causes are every cause and sum to its wall time, its goodput is
    the productive share of it, and (``whole``) the wall time is its start to its end or now.
    None when it adds up. Both sides round each figure to the millisecond."""
    from remote_payload.wire_shapes import GoodputCause

    wall, causes, ratio = doc.get("wall_s"), doc.get("causes"), doc.get("goodput")
    if wall is None or causes is None:
        return None if not whole else "no wall time or causes"
    tol = 0.01 + 1e-9 * wall
    missing = sorted(set(t.get_args(GoodputCause)) - set(causes))
    if missing:
        return f"causes lack {', '.join(missing)}"
    total = sum(causes.values())
    if abs(total - wall) > tol:
        return f"the causes sum to {total:.3f} s, the wall time is {wall:.3f} s"
    # the ratio is rounded to 4 places from the exact figures, and productive and wall reach
    # here rounded to the millisecond: over a young run's short wall time that rounding alone
    # moves productive / wall by up to 1 ms / wall
    if ratio is not None and (wall <= 0 or abs(ratio - causes["productive"] / wall)
                              > 1e-3 + 1e-3 / wall):
        return f"goodput {ratio} is not productive {causes['productive']:.3f} s of {wall:.3f} s"
    if whole:
        end = doc["ended_at"] if doc["ended_at"] is not None else doc["now"]
        if abs(end - doc["started_at"] - wall) > tol:
            return (f"the wall time {wall:.3f} s is not its start {doc['started_at']} to "
                    f"{'its end' if doc['ended_at'] is not None else 'now'} {end}")
    return None


def _asked(args: t.Sequence[str], flag: str, default: int) -> int:
    """The whole number ``args`` gives ``flag`` (``--limit 20``), else ``default`` (what the
    agent takes when the flag is not sent)."""
    for i, word in enumerate(args[:-1]):
        if word == flag and args[i + 1].isdigit():
            return int(args[i + 1])
    return default


def _jobs_bound(args: t.Sequence[str], data: t.Any) -> str | None:
    """``jobs --limit N``: the newest N jobs plus every job still live, so at most N finished
    rows (0: every job, within the shape's own bound), the limit echoed as asked, and never
    more rows than the ``total`` it counts."""
    limit = _asked(args, "--limit", 0)
    rows = data["jobs"]
    if data["limit"] != limit:
        return f"limit {data['limit']} where --limit {limit} was asked"
    if len(rows) > data["total"]:
        return f"{len(rows)} rows, more than the {data['total']} jobs it counts"
    if limit:
        done = sum(1 for r in rows if r.get("state") in _TERMINAL)
        if done > limit:
            return f"{done} finished jobs where the newest {limit} were asked"
    return None


def _status_bound(args: t.Sequence[str], data: t.Any) -> str | None:
    """``status --lines N``: at most N lines of the job's output."""
    lines = _asked(args, "--lines", _DEFAULT_STATUS_LINES)
    if len(data["output_tail"]) > lines:
        return f"{len(data['output_tail'])} output lines where {lines} were asked"
    return None


def _history_bound(args: t.Sequence[str], data: t.Any) -> str | None:
    """``history --points N``: at most N rows of plot data."""
    from remote_payload.wire_shapes import HISTORY_ROWS_MAX

    points = max(1, min(_asked(args, "--points", HISTORY_ROWS_MAX), HISTORY_ROWS_MAX))
    rows = len(data["history"].get("t") or [])
    if rows > points:
        return f"{rows} rows of plot data where {points} were asked"
    return None


def _logs_bound(args: t.Sequence[str], data: t.Any) -> str | None:
    """``logs --max-bytes N``: at most N bytes (as base64: 4 characters per 3 bytes)."""
    most = _asked(args, "--max-bytes", _DEFAULT_LOGS_BYTES)
    if len(data["data_b64"]) > 4 * ((most + 2) // 3):
        return f"{len(data['data_b64'])} base64 characters where {most} bytes were asked"
    return None


_TERMINAL = frozenset(s.value for s in wire.JobState if s.is_terminal())
#: what the agent takes for a flag the CLI did not send (``agent/verbs/jobs.py``; a test
#: holds them equal)
_DEFAULT_STATUS_LINES = 20
_DEFAULT_LOGS_BYTES = 256 * 1024

#: The verbs whose request bounds the answer, and the check of each: a reply carries at most
#: what was asked (a hostile agent's 200,000 rows for ``jobs --limit 20`` are refused at once,
#: never validated row by row, rendered, or printed). tests/unit/test_reply_bounds.py
#: holds the list complete against every verb flag that bounds a count.
REQUEST_BOUNDS: dict[str, t.Callable[[t.Sequence[str], t.Any], str | None]] = {
    "jobs": _jobs_bound,
    "status": _status_bound,
    "history": _history_bound,
    "logs": _logs_bound,
}


def within_request(verb: str, args: t.Sequence[str], data: t.Any, *, where: str) -> None:
    """``data`` (checked against the verb's shape) carries no more than ``args`` asked for.

    Raises:
        ReplyShapeError: it carries more (one line: what came, what was asked).
    """
    bound = REQUEST_BOUNDS.get(verb)
    why = bound(args, data) if bound is not None else None
    if why is not None:
        raise ReplyShapeError(f"{where}: the reply holds more than was asked: {why}",
                              hint="the container's payload may be damaged or from another "
                                   "opsctl: `opsctl deploy` ships this one's")


def parse_reply(host: str, ctid: int | None, step: str, result: CommandResult) -> AgentReplyDoc:
    """Exactly one JSON document, or a clear error with the output saved. ``ctid`` None:
    ``host`` already names the whole target (a direct host's label).

    Raises:
        RemoteCommandFailed: the output is not an agent reply.
    """
    import pydantic

    from opsctl.remote import shapes
    from remote_payload.wire_shapes import AgentReplyDoc

    text = result.stdout.decode("utf-8", "replace").strip()
    last = text.splitlines()[-1] if text else ""
    try:
        return t.cast(AgentReplyDoc, shapes.adapter(AgentReplyDoc).validate_json(last))
    except pydantic.ValidationError as exc:
        not_json = exc.errors(include_url=False)[0]["type"] == "json_invalid"
        problem = shapes.first_problem(exc).removeprefix("(the document): ")
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
    elif not text:
        tail = result.stderr_tail(1)
        reason, hint = f"no output (rc={result.rc})" + (f": {tail}" if tail else ""), None
    else:
        what = "is not JSON" if not_json else "is not an agent reply"
        reason = (f"the reply {what} (rc={result.rc}; {problem}): "
                  f"{shapes.inert(last, 80)}")
        hint = ("the container's payload may be damaged or from another opsctl: "
                "`opsctl deploy` ships this one's; the whole output is in the log")
    where = host if ctid is None else f"{host} ct {ctid}"
    raise cls(f"{where}: {step}: {reason}", argv=result.argv, rc=result.rc,
              stderr_tail=result.stderr_tail(), hint=hint, log_path=str(path))

