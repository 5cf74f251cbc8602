"""``opsctl status --all``: one row per container of every selected inventory host.

Hosts are queried in parallel (:mod:`.fanout`: bounded concurrency, a deadline per host), so
the wall time is about the slowest host's, not the sum. Within a host, the first container's
call opens the connection (or finds the host's multiplexer); the host's other containers then
share it, in parallel too. A host that cannot be reached, or does not answer within its
deadline, is a row per container carrying the error and its exit code — never an abort.

Which containers: the ones the inventory lists for the host; a host that lists none is asked
(``pct list``) and its running containers are shown.
"""

from __future__ import annotations

import time
import typing as t
from dataclasses import asdict, dataclass, field

from opsctl.config import inventory as inventory_mod
from opsctl.config.inventory import HostSpec
from opsctl.errors import (
    AgentError,
    ContainerNotRunning,
    DeadlineExceeded,
    FleetIncomplete,
    OpsctlError,
    TransportError,
)
from opsctl.ops import fanout, watch
from opsctl.remote import entry
from opsctl.remote.agent_client import Agent, NoPayload
from opsctl.remote.transport import Remote
from remote_payload.wire import ErrorType

DEFAULT_DEADLINE_S = 20.0
DEFAULT_PARALLEL = 16


@dataclass
class FleetRow:
    """One container: its job's headline, or why there is none, or the error."""

    host: str
    ctid: int | None  # None: the host itself failed before its containers were known
    reachable: bool | None  # None: nothing was sent to the host (no container to ask)
    job_id: str | None = None
    state: str | None = None
    phase: str | None = None
    step: int | None = None
    tok_s: float | None = None
    gpus: int = 0
    gpu_util_pct: float | None = None  # mean over the container's GPUs
    gpu_mem_used_gib: float | None = None  # summed
    diagnosis: str | None = None  # the first diagnosis item's summary
    note: str | None = None  # no job / no payload / stopped: not an error
    error: dict[str, t.Any] | None = None  # {type, message, exit_code, hint}
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, t.Any]:
        return asdict(self)


@dataclass
class FleetReport:
    rows: list[FleetRow]
    hosts: list[str]
    took_s: float
    deadline_s: float
    errors: int = field(init=False)

    def __post_init__(self) -> None:
        self.errors = sum(1 for r in self.rows if r.error is not None)

    def to_dict(self) -> dict[str, t.Any]:
        return {"ok": self.errors == 0, "hosts": self.hosts, "took_s": round(self.took_s, 3),
                "deadline_s": self.deadline_s, "errors": self.errors,
                "rows": [r.to_dict() for r in self.rows]}


def _error(exc: BaseException) -> dict[str, t.Any]:
    if isinstance(exc, OpsctlError):
        d = exc.to_dict()
        return {k: d[k] for k in ("type", "message", "exit_code", "hint")}
    return {"type": type(exc).__name__, "message": str(exc) or type(exc).__name__,
            "exit_code": 1, "hint": "a bug in opsctl: please report it"}


def container_row(host: str, ctid: int, agent: Agent, lines: int = 0) -> FleetRow:
    """Ask one container's agent for its current job and fold the answer into a row."""
    start = time.monotonic()
    row = FleetRow(host, ctid, reachable=True)
    try:
        st = watch.fetch_status(agent, None, lines)
    except NoPayload:
        row.note = "no opsctl payload yet (deploy ships it)"
    except ContainerNotRunning:
        row.note = "container stopped"
    except AgentError as exc:
        if exc.remote_type == ErrorType.NoSuchJob:
            row.note = "no job launched yet"
        else:
            row.error = _error(exc)
    except TransportError:
        raise  # the host's, not this container's: the caller fills every row of the host
    except OpsctlError as exc:
        row.error = _error(exc)
    else:
        step = st["last_step"] or {}
        utils = [u for g in st["gpus"] if (u := g["util_pct"]) is not None]
        mems = [m for g in st["gpus"] if (m := g["mem_used_mib"]) is not None]
        row.job_id, row.state, row.phase = st["job_id"], st["state"], st["phase"]
        row.step = step.get("step") if isinstance(step.get("step"), int) else None
        row.tok_s = step.get("tok_s") if isinstance(step.get("tok_s"), (int, float)) else None
        row.gpus = len(st["gpus"])
        row.gpu_util_pct = round(sum(utils) / len(utils), 1) if utils else None
        row.gpu_mem_used_gib = round(sum(mems) / 1024, 2) if mems else None
        row.diagnosis = st["diagnosis"][0]["summary"] if st["diagnosis"] else None
    row.elapsed_s = round(time.monotonic() - start, 3)
    return row


def _containers(spec: HostSpec, remote: Remote, timeout: float) -> list[int]:
    if spec.direct or spec.containers:
        return sorted(spec.targets())
    res = remote.run(["pct", "list"], timeout=timeout, step="pct list")
    running = []
    for line in res.stdout.decode("utf-8", "replace").splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit() and parts[1] == "running":
            running.append(int(parts[0]))
    return sorted(running)


def host_rows(name: str, spec: HostSpec, *, deadline_s: float, ctids: t.Collection[int] | None,
              max_parallel: int, lines: int = 0) -> list[FleetRow]:
    """Every container row of one host (raises only what concerns the whole host)."""
    quick = spec.model_copy(update={"connect_timeout_s": min(spec.connect_timeout_s, deadline_s)})
    with Remote(quick) as remote:
        asked = not (spec.direct or spec.containers)  # `pct list` ran: the host answered
        wanted = [c for c in _containers(spec, remote, deadline_s) if ctids is None or c in ctids]
        if not wanted:
            note = ("no containers (inventory lists none and none is running)" if ctids is None
                    else "a direct host: no container matches --ct" if spec.direct
                    else "no such container")
            return [FleetRow(name, None, reachable=True if asked else None, note=note)]
        first = container_row(name, wanted[0], Agent(remote, wanted[0], spec.root), lines)
        rest = fanout.run_all(wanted[1:], lambda c: container_row(name, c, Agent(remote, c, spec.root),
                                                                  lines),
                              max_parallel=max_parallel, deadline_s=deadline_s)
    rows = [first]
    for ctid, value in rest.items():
        rows.append(value if isinstance(value, FleetRow)
                    else FleetRow(name, ctid, reachable=not isinstance(value, TransportError),
                                  error=_error(_as_error(name, value))))
    return rows


def _as_error(host: str, exc: BaseException) -> BaseException:
    if isinstance(exc, fanout.Abandoned):
        return DeadlineExceeded(f"{host}: no answer within the {exc.deadline_s:g} s deadline "
                                "(step: status --all)")
    return exc


def fleet_status(pattern: str | None = None, *, ctids: t.Collection[int] | None = None,
                 deadline_s: float = DEFAULT_DEADLINE_S, max_parallel: int = DEFAULT_PARALLEL,
                 lines: int = 0) -> FleetReport:
    """Rows for every container of the hosts ``pattern`` selects (all hosts when None).

    Raises:
        ConfigError: the inventory is invalid, or ``pattern`` selects no host.
        FleetIncomplete: some rows are errors (``report`` holds every row).
    """
    start = time.monotonic()
    inv = inventory_mod.load()
    names = inv.select(pattern)
    specs = {n: inv.resolve(n) for n in names}
    if ctids is not None and all(s.direct for s in specs.values()):
        # --ct filters containers, and no selected host has one: refused, never a quiet row
        entry.check_ct(specs[names[0]], next(iter(ctids)))
    results = fanout.run_all(
        names, lambda n: host_rows(n, specs[n], deadline_s=deadline_s, ctids=ctids,
                                   max_parallel=max_parallel, lines=lines),
        max_parallel=max_parallel, deadline_s=deadline_s)
    rows: list[FleetRow] = []
    for name, value in results.items():
        if isinstance(value, BaseException):
            exc = _as_error(name, value)
            listed: t.Sequence[int | None] = sorted(c for c in specs[name].targets()
                                              if ctids is None or c in ctids)
            rows += [FleetRow(name, c, reachable=isinstance(exc, OpsctlError)
                              and not isinstance(exc, (TransportError, DeadlineExceeded)),
                              error=_error(exc)) for c in (listed or [None])]
        else:
            rows += value
    report = FleetReport(rows, names, time.monotonic() - start, deadline_s)
    if report.errors:
        raise FleetIncomplete(f"{report.errors} of {len(rows)} rows are errors "
                              f"({len(names)} hosts asked)", report=report,
                              hint="each row names its host, container and error")
    return report
