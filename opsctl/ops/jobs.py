"""A container's job: the resolved target, logs and stop (deploy: :mod:`.deploy`; status: :mod:`.watch`).

Kept free of click and rich so tests and other tools can call them directly.
"""

from __future__ import annotations

import base64
import time
import typing as t
from dataclasses import dataclass

from opsctl.config import inventory as inventory_mod
from opsctl.config.ctid import check_ctid
from opsctl.config.inventory import HostSpec, Inventory
from opsctl.errors import AuthError, DeadlineExceeded, HostKeyError, ReplyShapeError, TransportError
from opsctl.remote import entry
from opsctl.remote.agent_client import Agent
from opsctl.remote.transport import Remote
from opsctl.state import last_target as target_mod
from remote_payload.wire_shapes import JobListDoc, LogsChunkDoc, StopDoc


@dataclass
class Target:
    """A resolved host + container, with its connection and agent."""

    name: str  # what the user typed (inventory name or address)
    host: HostSpec
    ctid: int
    remote: Remote
    agent: Agent
    inventory: Inventory  # loaded once per command, here

    @property
    def label(self) -> str:
        """``pve1 ct 200``, or a direct host's own name (it has no container)."""
        return self.host.target_label(self.ctid)

    @property
    def flags(self) -> list[str]:
        """The target as a command line says it: ``--host NAME [--ct N]`` (a direct host
        takes no ``--ct``)."""
        return ["--host", self.name, *([] if self.host.direct else ["--ct", str(self.ctid)])]

    def close(self) -> None:
        self.remote.close()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_target(host: str | None, ctid: int | None, *, accept_new_host_key: bool = False) -> Target:
    """Resolve flags (or the remembered target) to a :class:`Target`; connects lazily.

    Raises:
        ConfigError: unknown host, no target, a container id the host does not list, or
            one given for a direct host (``enter: direct``).
    """
    inv = inventory_mod.load()
    remembered = target_mod.load()
    name = host if host is not None else (remembered.host if remembered is not None else None)
    if name is not None and inv.resolve(name).direct:
        ctid = entry.check_ct(inv.resolve(name), ctid)  # a --ct is refused, never ignored
    last = target_mod.resolve(host, ctid)
    spec = inv.resolve(last.host)
    target_mod.check_address(last.host, last.address, spec.ssh_label(), inv.origins.get(last.host))
    if spec.direct:
        entry.check_ct(spec, last.ctid)
    else:
        check_ctid(last.ctid)  # a remembered target is checked like --ct
    remote = Remote(spec, accept_new_host_key=accept_new_host_key)
    return Target(last.host, spec, last.ctid, remote, Agent(remote, last.ctid, spec.root), inv)


# --- jobs / logs / stop -----------------------------------------------------------------

#: ``opsctl jobs`` without ``--all``: the newest this many jobs, plus every job still live.
RECENT_JOBS = 20


def list_jobs(tgt: Target, *, all_jobs: bool = False, timeout: float = 60) -> JobListDoc:
    """The container's jobs, newest first (the window: :data:`RECENT_JOBS`)."""
    limit = 0 if all_jobs else RECENT_JOBS
    return tgt.agent.call("jobs", "--limit", str(limit), timeout=timeout)


def read_logs(tgt: Target, job_id: str | None, offset: int, max_bytes: int = 1 << 20, *,
              tail: int | None = None, since_s: float | None = None) -> tuple[bytes, LogsChunkDoc]:
    args = ["--offset", str(offset), "--max-bytes", str(max_bytes)]
    if tail is not None:
        args += ["--tail", str(tail)]
    if since_s is not None:
        args += ["--since-s", f"{since_s:g}"]
    if job_id:
        args += ["--job", job_id]
    chunk = tgt.agent.call("logs", *args, timeout=30)
    where = f"{tgt.label}: logs"
    try:
        data = base64.b64decode(chunk["data_b64"], validate=True)
    except ValueError:  # binascii.Error
        raise _bad_chunk(where, "data_b64 is not base64") from None
    if chunk["next_offset"] != chunk["offset"] + len(data):
        raise _bad_chunk(where, f"next_offset {chunk['next_offset']} is not offset {chunk['offset']} "
                                f"+ the {len(data)} bytes it carries")
    if len(data) > max_bytes:
        raise _bad_chunk(where, f"{len(data)} bytes where at most {max_bytes} were asked")
    if tail is None and since_s is None and chunk["offset"] != offset:
        raise _bad_chunk(where, f"the chunk is from byte {chunk['offset']}, byte {offset} was asked")
    if job_id and chunk["job_id"] != job_id:
        raise _bad_chunk(where, f"the chunk is job {chunk['job_id']}'s, job {job_id}'s was asked")
    return data, chunk


def _bad_chunk(where: str, why: str) -> ReplyShapeError:
    return ReplyShapeError(f"{where}: the reply is not a chunk of the log asked for: {why}",
                           hint="the container's payload may be damaged or from another opsctl: "
                                "`opsctl deploy` ships this one's")


#: ``logs -f`` after a dropped connection: first retry after this long, doubling up to the cap.
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 10.0


def follow_logs(tgt: Target, job_id: str | None, write: t.Callable[[bytes], None], *,
                follow: bool, offset: int = 0, tail: int | None = None,
                since_s: float | None = None, poll_s: float = 1.0,
                on_notice: t.Callable[[str], None] | None = None,
                sleep: t.Callable[[float], None] = time.sleep) -> LogsChunkDoc:
    """Stream output.log from ``offset`` (or the last ``tail`` lines, or the last
    ``since_s`` seconds); with ``follow`` until the job ends. Returns the last chunk, whose
    ``state``/``exit_code`` are the job's final ones when it ended.

    Bound to one job: without ``job_id`` the first chunk names the current job and
    every later read asks for it by id, so another job launched meanwhile is never
    spliced into this stream.

    Survives a dropped connection or a laptop's sleep while following: after the first
    successful read, a lost connection (or a call that ran past its deadline) is retried
    with backoff (:data:`RECONNECT_FIRST_S` doubling to :data:`RECONNECT_MAX_S`, forever,
    each retry announced through ``on_notice``), at the byte offset it had. Bytes are
    written only from complete replies, and a reply is for exactly the offset asked, so
    nothing is lost or written twice. Authentication and host-key failures are not retried.

    Raises:
        TransportError, DeadlineExceeded: on the first read, or without ``follow``.
    """
    backoff = RECONNECT_FIRST_S
    first = True
    outage = False
    while True:
        try:
            data, chunk = read_logs(tgt, job_id, offset, tail=tail if first else None,
                                    since_s=since_s if first else None)
        except (TransportError, DeadlineExceeded) as exc:
            if first or not follow or isinstance(exc, (AuthError, HostKeyError)):
                raise
            tgt.remote.close()  # a fresh connection next time (the mux, if any, died with it)
            if on_notice is not None:
                on_notice(f"connection lost ({exc.message}); retrying in {backoff:g} s "
                          f"from byte {offset}")
            sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)
            outage = True
            continue
        if outage and on_notice is not None:
            on_notice(f"reconnected; resuming at byte {offset}")
        outage, backoff = False, RECONNECT_FIRST_S
        if first and chunk["since_indexed"] is False and on_notice is not None:
            on_notice(f"job {chunk['job_id']} has no output time index (launched by an older "
                      "opsctl): showing all of its output")
        first = False
        job_id = chunk["job_id"]
        if data:
            write(data)
        if not chunk["eof"] and not data:
            raise ReplyShapeError(
                f"{tgt.label}: logs: the reply's next_offset {chunk['next_offset']} does not "
                f"advance past byte {offset}, and it says more follows (eof false): stopped "
                "rather than ask for the same bytes again",
                hint="the container's payload may be damaged or from another opsctl: "
                     "`opsctl deploy` ships this one's")
        offset = chunk["next_offset"]
        if not chunk["eof"]:
            continue
        if not follow or chunk["terminal"]:
            return chunk
        sleep(poll_s)


def stop(tgt: Target, job_id: str | None, grace_s: float) -> StopDoc:
    """The agent's ``stop`` of ``job_id`` (None: the current job).

    Raises:
        Interrupted: Ctrl-C, SIGTERM or SIGHUP while it ran. The agent's stop, once begun,
            goes on to its end on the target (no signal of this side reaches it), so the job
            is still ended; the message says so and how to see it, never that it keeps running.
    """
    import signal

    from opsctl.errors import Interrupted
    from remote_payload import procgroup

    args = ["--grace", f"{grace_s:g}"]
    if job_id:
        args += ["--job", job_id]
    try:
        return tgt.agent.call("stop", *args, timeout=grace_s + 30)
    except (KeyboardInterrupt, procgroup.Terminated) as exc:
        signum = exc.signum if isinstance(exc, procgroup.Terminated) else None
        how = "interrupted" if signum is None else f"terminated by {signal.Signals(signum).name}"
        which = f"job {job_id}" if job_id else "the current job"
        raise Interrupted(f"{tgt.label}: stop {how}: a stop the target already began goes on "
                          f"there to its end ({which}: SIGINT, then SIGTERM, then SIGKILL); "
                          "`opsctl status` shows when it has ended",
                          hint="opsctl status", signum=signum) from None
