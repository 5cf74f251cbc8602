"""``opsctl deploy --nodes``: one training run across containers (and hosts), through torchrun.

A run is one agent job per node, all with the same job id, each running torchrun with the
same c10d rendezvous (:mod:`opsctl.ops.torchrun`). Every node's job spec carries the run's
membership (``wire.RUN_FIELD``: the run id, the node's index, the node count), so
``status``/``stop --nodes`` act only on that run's jobs and refuse (exit 2) a node list whose
jobs are not one run; a node that could not be asked makes the answer incomplete (``"ok":
false``, exit 27), never a run that "was stopped". Before anything is contacted every node is
resolved to the container it names (address, port, jump host, ct): the same container named
two ways (``127.0.0.1:2222:201`` and ``sandbox:201``) is refused (exit 2). opsctl
schedules nothing itself: torchrun starts and numbers the ranks, and when one node's agent
or rank dies the others' rendezvous or collectives fail, so their jobs end too. opsctl's part:

1. prepare every node as a single-node deploy does (refuse a running job unless
   ``--replace``, ship the payload, the playbook's torch build and cache), one node after
   the other (the torch install is the container's own work; in parallel they only compete);
2. ask every node's agent for its network facts (``net``); when every node is a container
   of the same host *and* they share one network namespace (the sandbox: LXC containers on
   the host's network), the rendezvous runs on 127.0.0.1; otherwise each node announces its
   own address (the inventory's ``socket_ifname`` interface, else its first non-loopback
   one) and node 0 hosts the store on a port free there;
3. launch node 0 (it hosts the store), then the others; a launch that fails stops the
   nodes already launched;
4. watch every node until all are healthy, one has failed (the run failed: the node that
   failed first is named, by its job's end time), or the playbook's ``timeout_s``.

Fan-out over the nodes (status, stop, network facts) runs in threads, one connection per
node (a kept multiplexed one when the mux is on), and returns a row per node: an
unreachable node is a row with its error, never an abort.
"""

from __future__ import annotations

import contextlib
import time
import typing as t
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from opsctl.config.nodes import NodeRef, parse_nodes
from opsctl.errors import (
    ConfigError,
    FleetIncomplete,
    Interrupted,
    JobFailed,
    JobUnhealthy,
    OpsctlError,
    RemoteCommandFailed,
    UnknownJob,
)
from opsctl.ops import jobs, torchrun, watch
from opsctl.ops.jobs import Target
from opsctl.ops.watch import is_terminal
from opsctl.state import last_target as target_mod
from remote_payload import wire
from remote_payload.wire_shapes import NetDoc, StatusDoc, StopDoc

if t.TYPE_CHECKING:  # deploy (playbooks, payload) is imported by deploy only: status stays light
    from opsctl.config.playbook import Playbook

R = t.TypeVar("R")
Progress = t.Callable[[str], None]
#: Called after each poll of every node with the rows and the seconds since the watch began.
OnPoll = t.Callable[[list["NodeRow"], float], None]
#: At most this many nodes are asked at once (each holds an SSH channel while it waits).
MAX_PARALLEL = 8
SHARED_NETWORK_ADDRESS = "127.0.0.1"


@dataclass
class Node:
    """One opened node of a run: its index (node 0 hosts the rendezvous) and target."""

    index: int
    ref: NodeRef
    target: Target

    @property
    def label(self) -> str:
        return f"node {self.index} ({self.target.label})"


@dataclass
class NodeRow:
    """What one node said: its job status, or the error that stood in the way."""

    index: int
    node: str  # HOST:CT as given
    label: str  # the host's inventory label and ct
    status: StatusDoc | None = None
    stop: StopDoc | None = None
    error: str | None = None
    error_exit_code: int | None = None  # the error's exit code (26: the node has no such job)
    address: str | None = None  # what it announced to the rendezvous (deploy only)

    def to_dict(self) -> dict[str, t.Any]:
        return {"index": self.index, "node": self.node, "label": self.label,
                "address": self.address, "error": self.error,
                "error_exit_code": self.error_exit_code,
                "status": self.status, "stop": self.stop}


@dataclass
class RunReport:
    """A multi-node run as one document: per-node rows plus the run's verdict."""

    job_id: str
    nodes: list[NodeRow]
    playbook: str | None = None
    outcome: str = ""  # deploy: healthy | terminal | timeout | launched; status: the run state
    rendezvous: str | None = None  # host:port
    elapsed_s: float = 0.0
    failed_node: int | None = None  # the node whose job ended unsuccessfully first
    summary: str = ""
    steps: list[dict[str, t.Any]] = field(default_factory=list)

    @property
    def state(self) -> str:
        return run_state(self.nodes)

    @property
    def complete(self) -> bool:
        """Every node answered (a run is never "ok" while a node could not be asked)."""
        return not any(r.error for r in self.nodes)

    def to_dict(self) -> dict[str, t.Any]:
        return {"job_id": self.job_id, "playbook": self.playbook, "state": self.state,
                "complete": self.complete,
                "outcome": self.outcome, "rendezvous": self.rendezvous,
                "elapsed_s": round(self.elapsed_s, 3), "failed_node": self.failed_node,
                "summary": self.summary, "nodes": [n.to_dict() for n in self.nodes],
                "steps": self.steps}


# --- fan-out ------------------------------------------------------------------------------


def fan_out(nodes: t.Sequence[Node], fn: t.Callable[[Node], R]) -> list[R | OpsctlError]:
    """``fn`` on every node in parallel; each slot holds the result or the node's error.

    Only :class:`OpsctlError` is caught (a node that is down is data); anything else is a
    bug and propagates.
    """
    def one(node: Node) -> R | OpsctlError:
        try:
            return fn(node)
        except OpsctlError as exc:
            return exc

    if len(nodes) == 1:
        return [one(nodes[0])]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(nodes))) as pool:
        return list(pool.map(one, nodes))


def open_nodes(refs: t.Sequence[NodeRef], *, accept_new_host_key: bool = False) -> list[Node]:
    """Resolve every ``HOST:CT`` (connections open lazily; close with :func:`close_nodes`).

    Raises:
        ConfigError: an unknown host or an invalid container id (nothing was contacted).
    """
    out: list[Node] = []
    try:
        for i, ref in enumerate(refs):
            out.append(Node(i, ref, jobs.open_target(ref.host, ref.ctid,
                                                     accept_new_host_key=accept_new_host_key)))
        refuse_duplicates(out)
    except BaseException:
        close_nodes(out)
        raise
    return out


def container_key(node: Node) -> tuple[str, int, str | None, int]:
    """What identifies the container a node names, however it was written: the host's
    resolved address and port, the jump host it is reached through, and the ct.

    The user is left out on purpose: ``root@H:200`` and ``admin@H:200`` are one container.
    """
    host = node.target.host
    return host.address, host.port, host.proxy_jump, node.target.ctid


def refuse_duplicates(nodes: t.Sequence[Node]) -> None:
    """Refuse a node list that names one container twice (nothing was contacted yet).

    Raises:
        ConfigError: two items resolve to the same container; the message names both.
    """
    seen: dict[tuple[str, int, str | None, int], Node] = {}
    for node in nodes:
        first = seen.setdefault(container_key(node), node)
        if first is not node:
            raise ConfigError(f"--nodes: {first.ref} and {node.ref} are the same container "
                              f"({node.target.host.ssh_label()} ct {node.target.ctid}): one job "
                              "per container", hint="list each container once")


def close_nodes(nodes: t.Iterable[Node]) -> None:
    for node in nodes:
        node.target.close()


@contextlib.contextmanager
def opened(refs: t.Sequence[NodeRef], *, accept_new_host_key: bool = False) -> t.Iterator[list[Node]]:
    nodes = open_nodes(refs, accept_new_host_key=accept_new_host_key)
    try:
        yield nodes
    finally:
        close_nodes(nodes)


def remembered_run(nodes_text: str | None,
                   job_id: str | None) -> tuple[tuple[NodeRef, ...], str | None] | None:
    """The nodes (and job) ``status``/``stop`` address: ``--nodes``, else the last
    multi-node deploy's; None when neither (a single-container command).

    Raises:
        ConfigError: ``--nodes`` does not parse.
    """
    last = target_mod.load()
    if nodes_text is not None:
        refs = parse_nodes(nodes_text)
        if job_id is None and last is not None and last.nodes == tuple(map(str, refs)):
            job_id = last.job_id
        return refs, job_id
    if last is None or not last.nodes:
        return None
    return parse_nodes(",".join(last.nodes)), job_id or last.job_id


# --- the run's state and its first failure ------------------------------------------------


def run_state(rows: t.Sequence[NodeRow]) -> str:
    """FAILED when any node's job failed or was lost; CANCELLED when the unsuccessful ones were
    all stopped (``opsctl stop``); SUCCEEDED when all succeeded; UNKNOWN when a node could not
    be asked; else the least advanced live state."""
    states = [r.status["state"] if r.status else None for r in rows]
    if any(s in ("FAILED", "LOST") for s in states):
        return "FAILED"
    if "CANCELLED" in states:
        return "CANCELLED"
    if None in states:
        return "UNKNOWN"
    if all(s == "SUCCEEDED" for s in states):
        return "SUCCEEDED"
    order = ("PENDING", "SETTING_UP", "COMPILING", "RUNNING", "SUCCEEDED")
    return min((s for s in states if s in order), key=order.index, default="UNKNOWN")


def first_failure(rows: t.Sequence[NodeRow]) -> NodeRow | None:
    """The node whose job ended unsuccessfully first (its end time; node order breaks ties).

    When one node dies, torchrun on the others fails moments later with a rendezvous or
    collective error, which says nothing about the cause: the first to end is the cause.
    """
    failed = [r for r in rows if r.status is not None and is_terminal(r.status)
              and r.status["state"] != "SUCCEEDED"]
    if not failed:
        return None
    return min(failed, key=lambda r: (r.status["ended_at"] if r.status and r.status["ended_at"]
                                      else float("inf"), r.index))


def failure_summary(row: NodeRow) -> str:
    """``node 1 (sandbox ct 202) FAILED (SIGKILL): <its first diagnosis>``."""
    st = row.status
    if st is None:
        return f"node {row.index} ({row.label}): {row.error}"
    why = f"exit code {st['exit_code']}" if st["exit_code"] is not None else (st["signal"] or "")
    first = st["diagnosis"][0]["summary"] if st["diagnosis"] else \
        (st["output_tail"][-1] if st["output_tail"] else "")
    return (f"node {row.index} ({row.label}) {st['state']}{' (' + why + ')' if why else ''}"
            f"{': ' + first if first else ''}")


def _verdict(report: RunReport) -> None:
    bad = first_failure(report.nodes)
    if bad is not None:
        report.failed_node = bad.index
    unreached = "; ".join(f"node {r.index} ({r.label}) not reached: {r.error}"
                          for r in report.nodes if r.error)
    if bad is not None and report.state == "CANCELLED":
        report.summary = (f"run {report.job_id} was stopped" if not unreached else
                          f"run {report.job_id} was stopped on the nodes reached; {unreached}")
    elif bad is not None:
        others = [r for r in report.nodes if r is not bad]
        tail = "; ".join(f"node {r.index}: {r.status['state'] if r.status else r.error}"
                         for r in others)
        report.summary = (f"run {report.job_id} failed: {failure_summary(bad)}"
                          f"{' — then ' + tail if tail else ''}")
    elif any(r.error for r in report.nodes):
        report.summary = "; ".join(f"node {r.index} ({r.label}): {r.error}"
                                   for r in report.nodes if r.error)


# --- status and stop ----------------------------------------------------------------------


def status(refs: t.Sequence[NodeRef], job_id: str | None, *, lines: int = 20,
           accept_new_host_key: bool = False) -> RunReport:
    """Every node's job of one run, asked in parallel.

    Raises:
        ConfigError: an unknown host or a duplicate container in the node list, or the
            nodes' jobs are not one run (:func:`one_run`).
        FleetIncomplete: a node could not be asked; ``report`` holds every row (exit 27).
    """
    with opened(refs, accept_new_host_key=accept_new_host_key) as nodes:
        _check_remembered(nodes)
        rows = _poll(nodes, job_id, lines)
    report = RunReport(one_run(rows, job_id) or job_id or "", rows, outcome="")
    report.outcome = report.state
    _verdict(report)
    _refuse_incomplete(report, "status")
    return report


def stop(refs: t.Sequence[NodeRef], job_id: str | None, grace_s: float, *,
         accept_new_host_key: bool = False) -> RunReport:
    """Stop the run's job on every node at once (their grace periods overlap).

    Each node's job is looked up first and checked to be one of the run's (:func:`one_run`);
    then exactly those jobs are stopped, by their ids. A node that could not be asked keeps
    its error row: the nodes reached are stopped, and the report is incomplete.

    Raises:
        ConfigError: an unknown host or a duplicate container in the node list, or the
            nodes' jobs are not one run (nothing was stopped).
        FleetIncomplete: a node could not be reached; ``report`` holds every row (exit 27).
    """
    with opened(refs, accept_new_host_key=accept_new_host_key) as nodes:
        _check_remembered(nodes)
        found = _poll(nodes, job_id, 0)
        run_id = one_run(found, job_id)
        ids = {r.index: r.status["job_id"] for r in found if r.status is not None}
        reached = [n for n in nodes if n.index in ids]
        stopped = _rows(reached, fan_out(reached, lambda n: jobs.stop(n.target, ids[n.index],
                                                                      grace_s)), "stop")
    by_index = {r.index: r for r in stopped}
    rows = [by_index.get(r.index, r) for r in found]
    report = RunReport(run_id or job_id or "", rows, outcome="stopped")
    if not report.complete:
        report.summary = "; ".join(f"node {r.index} ({r.label}) not reached: {r.error}"
                                   for r in rows if r.error)
    _refuse_incomplete(report, "stop")
    return report


def _check_remembered(nodes: t.Sequence[Node]) -> None:
    """The remembered run's node list (the same ``HOST:CT`` text) must still resolve where
    its deploy went: a redefined name is refused, not followed (nothing contacted yet).

    Raises:
        ConfigError: a node's name now resolves to another address than at the deploy.
    """
    last = target_mod.load()
    if last is None or last.nodes != tuple(str(n.ref) for n in nodes):
        return
    for node, then in zip(nodes, last.node_addresses, strict=False):
        target_mod.check_address(node.ref.host, then, node.target.host.ssh_label(),
                                 node.target.inventory.origins.get(node.ref.host))


def one_run(rows: t.Sequence[NodeRow], job_id: str | None) -> str | None:
    """The run id every answering node's job carries, or None when no node answered.

    The nodes' jobs are one run when each answering node's job carries the same run
    membership (``wire.RUN_FIELD``), the run has exactly as many nodes as the list, and no
    node index appears twice. A node that answered "no such job" (exit 26) is not the run's.

    Raises:
        ConfigError: the nodes' jobs are not one run; the message shows each node's job.
    """
    answered = [r for r in rows if r.status is not None]
    missing = [r for r in rows if r.error_exit_code == UnknownJob.exit_code]
    runs = {r.status["run"]["id"] if r.status and r.status["run"] else None for r in answered}
    counts = {r.status["run"]["nodes"] for r in answered if r.status and r.status["run"]}
    indices = [r.status["run"]["node"] for r in answered if r.status and r.status["run"]]
    if not missing and len(runs) <= 1 and None not in runs and counts <= {len(rows)} \
            and len(set(indices)) == len(indices):
        return next(iter(runs), None)

    def shown(r: NodeRow) -> str:
        if r.status is None:
            return f"node {r.index} ({r.node}): {r.error}"
        run = r.status["run"]
        member = (f"node {run['node']} of {run['nodes']} of run {run['id']}" if run else
                  "not part of a multi-node run")
        return f"node {r.index} ({r.node}): job {r.status['job_id']}, {member}"

    which = f"job {job_id}" if job_id else "current jobs"
    raise ConfigError(f"--nodes: the nodes' {which} are not one run (nothing was changed): "
                      + "; ".join(shown(r) for r in rows),
                      hint="name the run's nodes (as `deploy --nodes` did) and its id: "
                           "--nodes H:CT,... --job RUN_ID")


def _refuse_incomplete(report: RunReport, verb: str) -> None:
    if not report.complete:
        bad = ", ".join(f"node {r.index} ({r.node})" for r in report.nodes if r.error)
        raise FleetIncomplete(f"{verb} --nodes: {bad} could not be asked; the answer is "
                              "incomplete", report=report,
                              hint="check the node (opsctl hosts --check), then run it again")


def _poll(nodes: t.Sequence[Node], job_id: str | None, lines: int) -> list[NodeRow]:
    return _rows(nodes, fan_out(nodes, lambda n: watch.fetch_status(n.target.agent, job_id, lines)),
                 "status")


def _rows(nodes: t.Sequence[Node], results: t.Sequence[t.Any], field: str) -> list[NodeRow]:
    """One row per node: the fan-out's answer in ``field`` (``status``/``stop``), or its error."""
    rows = []
    for node, res in zip(nodes, results, strict=True):
        row = NodeRow(node.index, str(node.ref), node.target.label)
        if isinstance(res, OpsctlError):
            row.error, row.error_exit_code = res.message, res.exit_code
        else:
            setattr(row, field, res)
        rows.append(row)
    return rows


# --- deploy -------------------------------------------------------------------------------


def deploy(refs: t.Sequence[NodeRef], playbook_name: str | None, *, replace: bool = False,
           wait: bool = True, poll_s: float = watch.DEFAULT_POLL_S, on_step: Progress | None = None,
           on_poll: OnPoll | None = None, force_payload: bool = False, force_gpus: bool = False,
           accept_new_host_key: bool = False) -> RunReport:
    """Launch ``playbook`` on every node under torchrun and watch until all are healthy.

    Raises:
        ConfigError: a bad node list or playbook (nothing remote was done).
        JobFailed: a node's job failed (the run failed; the node that failed first is named).
        JobUnhealthy: not every node healthy after the playbook's ``timeout_s``.
        Interrupted: Ctrl-C; says which nodes were launched.
        (and transport/container/agent errors from the steps, naming the node)
    """
    from opsctl.ops import deploy as deploy_ops

    if not refs:
        raise ConfigError("--nodes: no nodes given")
    start = time.monotonic()
    steps, step = deploy_ops.step_recorder(on_step)

    with opened(refs, accept_new_host_key=accept_new_host_key) as nodes:
        book = deploy_ops.load_playbook(nodes[0].target, playbook_name)
        if book.secret_names() or book.files:  # said, not dropped: not built per node yet
            raise ConfigError("deploy --nodes: the playbook's `secrets:`/`files:` (and `env:` "
                              "entries holding credentials, sent as secrets) are not supported "
                              "across nodes yet; push files with `opsctl push` to each node")
        plan = [(n, torchrun.nproc_per_node(_gpus(n), book.command)) for n in nodes]
        job_id = book.new_job_id()
        launched: list[Node] = []
        try:
            for node in nodes:
                _prepare(node, book, step, steps, replace=replace, force_payload=force_payload)
            step("rendezvous")
            rdzv, addresses = _rendezvous(nodes, job_id)
            step("rendezvous-done", endpoint=rdzv.endpoint)
            for node, nproc in plan:
                spec = _node_spec(node, book, job_id, rdzv, addresses[node.index], nproc, replace)
                step("launch", node=node.index, job_id=job_id)
                try:
                    deploy_ops._launch(node.target, spec, replace, force_gpus, secrets={})
                except OpsctlError:
                    _stop_quietly(launched, job_id)
                    raise
                launched.append(node)
        except KeyboardInterrupt:
            _stop_quietly(launched, job_id)
            done = [s["step"] for s in steps if not s["step"].endswith("-done")]
            what = (f"{len(launched)} of {len(nodes)} nodes had been launched and were sent the "
                    "stop signal") if launched else "no node was launched"
            raise Interrupted(f"deploy --nodes interrupted during {done[-1] if done else 'start'}; "
                              f"{what}", hint="opsctl status") from None
        labels = tuple(n.target.host.ssh_label() for n in nodes)
        target_mod.save(target_mod.LastTarget(refs[0].host, refs[0].ctid, job_id,
                                              nodes=tuple(map(str, refs)), address=labels[0],
                                              node_addresses=labels))
        report = RunReport(job_id, [NodeRow(n.index, str(n.ref), n.target.label,
                                            address=addresses[n.index]) for n in nodes],
                           playbook=book.name, outcome="launched", rendezvous=rdzv.endpoint,
                           steps=steps)
        if wait:
            step("watch")
            try:
                report.nodes, report.outcome = _watch(nodes, job_id, book.timeout_s, poll_s, on_poll,
                                                      addresses)
            except KeyboardInterrupt:
                raise Interrupted(f"deploy --nodes interrupted while watching: run {job_id} was "
                                  f"launched on {len(nodes)} nodes and keeps running",
                                  hint="opsctl status  ·  opsctl stop") from None
    report.elapsed_s = time.monotonic() - start
    _verdict(report)
    _check(report, book)
    return report


def _gpus(node: Node) -> int:
    spec = node.target.host.target_spec(node.target.ctid)
    return spec.gpus if spec is not None else 0


def _ifname(node: Node) -> str | None:
    spec = node.target.host.target_spec(node.target.ctid)
    return (spec.socket_ifname if spec is not None else None) or node.target.host.socket_ifname


def _prepare(node: Node, book: Playbook, step: t.Callable[..., None],
             steps: list[dict[str, t.Any]], *, replace: bool, force_payload: bool) -> None:
    """What a single-node deploy does before its launch: refusal, payload, torch build."""
    from opsctl.ops import deploy as deploy_ops

    tgt = node.target
    if not replace:
        step("check", node=node.index)
        deploy_ops.refuse_if_running(tgt)
    step("payload", node=node.index)
    pay = tgt.agent.ensure_payload(force=force_payload)
    step("payload-done", node=node.index, sent=pay.sent, digest=pay.digest[:12])
    if deploy_ops.needs_torch_work(book):
        step("prepare", node=node.index)
        deploy_ops._prepare_torch(tgt, book, steps, None, replace)


def _rendezvous(nodes: t.Sequence[Node], job_id: str) -> tuple[torchrun.Rendezvous, dict[int, str]]:
    """Node 0's address and free port, and the address each node announces.

    Raises:
        RemoteCommandFailed: a node's ``net`` failed, or a node has no usable address.
    """
    def net(node: Node) -> NetDoc:
        ifname = _ifname(node)
        args = ["--ifname", ifname] if ifname else []
        return node.target.agent.call("net", *args, timeout=30)

    facts = fan_out(nodes, net)
    for res in facts:
        if isinstance(res, OpsctlError):
            raise res
    docs = t.cast(list[NetDoc], facts)
    hosts = {(n.target.host.address, n.target.host.port) for n in nodes}
    netns = {d["netns"] for d in docs}
    if len(hosts) == 1 and len(netns) == 1 and None not in netns:
        addresses = {n.index: SHARED_NETWORK_ADDRESS for n in nodes}
    else:
        addresses = {}
        for node, doc in zip(nodes, docs, strict=True):
            address = doc["address"]
            if not address:
                have = ", ".join(f"{i['name']} {i['address']}" for i in doc["interfaces"])
                wanted = f"interface {_ifname(node)}" if _ifname(node) else "non-loopback IPv4 address"
                raise RemoteCommandFailed(
                    f"{node.label}: rendezvous: no {wanted} to announce to the other nodes "
                    f"(has: {have or 'none'})",
                    hint="set socket_ifname for this container (or host) in the inventory")
            addresses[node.index] = address
    port = docs[0]["free_port"]
    return torchrun.Rendezvous(addresses[0], port, job_id, len(nodes)), addresses


def _node_spec(node: Node, book: Playbook, job_id: str, rdzv: torchrun.Rendezvous,
               address: str, nproc: int, replace: bool) -> dict[str, t.Any]:
    spec = book.job_spec(job_id, root=node.target.host.root, replace=replace)
    spec[wire.RUN_FIELD] = {"id": job_id, "node": node.index, "nodes": rdzv.nnodes}
    spec["command"] = torchrun.launcher_command(book.command, rdzv, node_index=node.index,
                                                nproc=nproc, local_addr=address)
    spec["env"] = {**spec["env"], **torchrun.socket_env(_ifname(node))}
    return spec


def _stop_quietly(nodes: t.Sequence[Node], job_id: str) -> None:
    """Best effort after a failed or interrupted launch: the launched nodes would otherwise
    wait for the missing ones until the rendezvous timeout."""
    fan_out(nodes, lambda n: n.target.agent.call("stop", "--job", job_id, "--grace", "0",
                                                 timeout=60))


def _watch(nodes: t.Sequence[Node], job_id: str, timeout_s: float, poll_s: float,
           on_poll: OnPoll | None, addresses: dict[int, str]) -> tuple[list[NodeRow], str]:
    start = time.monotonic()
    last_ok = start
    while True:
        loop_start = time.monotonic()
        rows = _poll(nodes, job_id, 20)
        for row in rows:
            row.address = addresses.get(row.index)
        elapsed = time.monotonic() - start
        if on_poll is not None:
            on_poll(rows, elapsed)
        if all(r.status is not None for r in rows):
            last_ok = time.monotonic()
        elif time.monotonic() - last_ok > watch.MAX_OUTAGE_S:
            bad = next(r for r in rows if r.status is None)
            raise RemoteCommandFailed(f"node {bad.index} ({bad.label}): no status for "
                                      f"{watch.MAX_OUTAGE_S:.0f} s: {bad.error}",
                                      hint="opsctl status  ·  opsctl stop")
        statuses = [r.status for r in rows if r.status is not None]
        if first_failure(rows) is not None:
            return rows, "terminal"
        if len(statuses) == len(rows):
            if all(is_terminal(s) for s in statuses):
                return rows, "terminal"
            if all(s["healthy"] or is_terminal(s) for s in statuses):
                return rows, "healthy"
        if elapsed >= timeout_s:
            return rows, "timeout"
        time.sleep(max(0.0, poll_s - (time.monotonic() - loop_start)))


def _check(report: RunReport, book: Playbook) -> None:
    if report.failed_node is not None:
        bad = report.nodes[report.failed_node]
        raise JobFailed(report.summary, hint="opsctl status  (every node's row) · opsctl logs "
                        f"--host {bad.node.rpartition(':')[0]} --ct {bad.node.rpartition(':')[2]}",
                        log_path=bad.status["output_log"] if bad.status else None, report=report)
    if report.outcome == "timeout":
        waiting = [f"node {r.index} {r.status['state'] if r.status else r.error}"
                   for r in report.nodes if not (r.status and r.status["healthy"])]
        raise JobUnhealthy(f"run {report.job_id}: not healthy on every node after "
                           f"{book.timeout_s:.0f} s ({', '.join(waiting)})",
                           hint="opsctl status  ·  opsctl stacks --host H --ct C", report=report)

