"""``opsctl doctor``: the GPU chain of one container, seen from the host and from inside.

One row per check (:func:`remote_payload.wire.doctor_row`): the host side runs here, one host
command per fact (:mod:`opsctl.remote.hostfacts`); the container side is the agent's
``doctor`` verb (:mod:`remote_payload.agent.doctor`), whose device-node, ``/dev/shm``, disk and
leftover checks are the very ones a launch refuses on. The whole run has one deadline: a host
that stops answering ends it with the remaining rows ``skip`` and the reason.

Also here: the host kernel's Xid and OOM lines of a job's time window as diagnosis entries
(:func:`kernel_diagnosis`), for a failed, lost or hung job.
"""

from __future__ import annotations

import math
import shlex
import time
import typing as t
from dataclasses import dataclass, field

from opsctl.errors import (
    ContainerMissing,
    ContainerNotRunning,
    DeadlineExceeded,
    HostSetupError,
    OpsctlError,
    TransportError,
)
from opsctl.remote import entry, hostfacts
from remote_payload.gpufacts import kernlog, pctconf
from remote_payload.wire import DEADLINE_SKIP, doctor_row

if t.TYPE_CHECKING:
    from opsctl.ops.jobs import Target
    from remote_payload.wire_shapes import DiagnosisDoc, StatusDoc

Row = dict[str, str]
NO_DRIVER = "no NVIDIA driver on the host"
DEFAULT_DEADLINE_S = 180.0
XID_LOOKBACK_S = 24 * 3600.0
#: The container-side rows, in the agent's order: skipped together when it cannot run.
AGENT_ROWS = ("container-libraries", "container-device-nodes", "gpu-count", "persistence-mode",
              "dev-shm", "disk-free", "torch-matmul", "leftover-gpu-processes")


@dataclass
class DoctorReport:
    target: str
    rows: list[Row] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r["status"] == "fail"]

    def to_dict(self) -> dict[str, t.Any]:
        return {"ok": not self.failed, "target": self.target, "elapsed_s": round(self.elapsed_s, 3),
                "rows": self.rows}


#: How long a remote step may run past its timeout: coreutils ``timeout -k 2`` (host and
#: container side, :mod:`opsctl.remote.command`) kills a group that ignores SIGTERM 2 s later.
KILL_GRACE_S = 2.0
#: The round trip around a step: opening its channel, pct exec starting the command.
STEP_MARGIN_S = 1.0
#: Kept back from the agent's own deadline: its python's start and its reply's way back.
AGENT_MARGIN_S = 1.5
#: Kept for the host's kernel log (the xid-events row) after the agent's checks.
XID_RESERVE_S = 3.0
#: The least time the container's checks can run in, after the host's: one agent step
#: (killed at its timeout), the agent's margin and the kernel log's share.
CONTAINER_MIN_S = KILL_GRACE_S + STEP_MARGIN_S + AGENT_MARGIN_S + XID_RESERVE_S + 1.0
#: What shipping the payload may take: the agent client's transfer timeout and its grace.
PAYLOAD_SHIP_S = 120.0 + KILL_GRACE_S + STEP_MARGIN_S
#: The most of the container's payload manifest read back (it is the container's text).
MANIFEST_BYTES = 64 << 10


class _Clock:
    """The whole run's deadline, shared out to its steps so that each one, killed at its
    timeout, still ends inside it."""

    def __init__(self, total: float):
        self.total = total
        self.end = time.monotonic() + total

    def left(self) -> float:
        return self.end - time.monotonic()

    def step(self, cap: float = 30.0) -> float:
        """The timeout for the next remote step: at least 1 s, at most ``cap``, and short
        enough that the step ends inside the deadline even when it is killed at that
        timeout (:data:`KILL_GRACE_S`, :data:`STEP_MARGIN_S`); rounded down as
        :func:`seconds` prints it, so the messages that quote it read ``13 s``.

        Raises:
            DeadlineExceeded: what is left of the deadline cannot hold one more step.
        """
        usable = min(cap, self.left() - KILL_GRACE_S - STEP_MARGIN_S)
        if usable < 1.0:
            raise DeadlineExceeded(f"doctor's {seconds(self.total)} s deadline passed")
        return float(seconds(usable))


def seconds(value: float) -> str:
    """A duration as doctor prints it: whole seconds from 10 s up, else one decimal (never
    ``0.123457`` or ``44.9824``); rounded down, so a timeout sent on stays inside the deadline."""
    if value >= 10:
        return str(int(value))
    return f"{math.floor(value * 10) / 10:.1f}"


def doctor(tgt: Target, *, deadline_s: float = DEFAULT_DEADLINE_S, torch: bool = True,
           torch_timeout_s: float = 60.0) -> DoctorReport:
    """Every check, host side then container side, within ``deadline_s`` in all.

    Never raises for what it finds: a failure is a row. (Bugs still raise.)
    """
    start = time.monotonic()
    clock = _Clock(deadline_s)
    report = DoctorReport(tgt.label)
    rows = report.rows
    skip_rest: str | None = None
    try:
        skip_rest = _host_checks(tgt, clock, rows, torch=torch, torch_timeout_s=torch_timeout_s)
    except DeadlineExceeded as exc:
        skip_rest = f"no answer in time: {exc.message}"
        rows.append(doctor_row("deadline", "fail", skip_rest, "",
                               "check the host (load, a hung nvidia-smi: the driver may be wedged); "
                               "a longer --deadline"))
    except TransportError as exc:
        skip_rest = f"the connection failed: {exc.message}"
        rows.append(doctor_row("ssh", "fail", exc.message, "", exc.hint or ""))
    if skip_rest is not None:
        done = {r["name"] for r in rows}
        for name in ("ssh", "pct", "container-running", "host-driver", "host-device-nodes",
                     "ct-config-devices", *AGENT_ROWS, "xid-events"):
            if name not in done:
                rows.append(doctor_row(name, "skip", skip_rest))
    if not any(r["name"] == "deadline" for r in rows) and (unrun := unfinished(rows)):
        rows.append(doctor_row(
            "deadline", "fail", f"doctor's {seconds(deadline_s)} s {DEADLINE_SKIP} for "
            f"{len(unrun)} check(s): {', '.join(unrun)}", "",
            f"a longer --deadline (the container's checks need {seconds(CONTAINER_MIN_S)} s or "
            "more after the host's)"))
    report.elapsed_s = time.monotonic() - start
    return report


def unfinished(rows: list[Row]) -> list[str]:
    """The checks skipped for want of time (their reason says :data:`DEADLINE_SKIP`, on
    either side): a doctor that could not run them is incomplete, never a clean bill, so
    :func:`doctor` adds a failing ``deadline`` row that names them."""
    return [r["name"] for r in rows if r["status"] == "skip" and DEADLINE_SKIP in r["reason"]]


def _host_checks(tgt: Target, clock: _Clock, rows: list[Row], *, torch: bool,
                 torch_timeout_s: float) -> str | None:
    """Append the rows in order; returns why the rest is skipped (None: all ran)."""
    remote, ct = tgt.remote, tgt.ctid
    way = entry.of(tgt.host)
    if way.has_container:
        rc, text = hostfacts.command_text(remote, ["pct", "status", str(ct)], timeout=clock.step(),
                                          step="pct status")
    else:  # the connection is the one host-side fact a direct host has before the GPU's
        rc, text = hostfacts.command_text(remote, ["true"], timeout=clock.step(), step="connect")
    rows.append(doctor_row("ssh", "ok", f"connected to {tgt.host.ssh_label()} (host key "
                           "checked against known_hosts)", tgt.host.known_hosts_path().as_posix()))
    if way.has_container:
        running = rc == 0 and text.split() == ["status:", "running"]
        pct_row, ct_row = _pct_rows(tgt, rc, text, clock)
        rows += [pct_row, ct_row]
        if pct_row["status"] == "fail":
            return "pct is not usable on the host"
    else:
        running = True  # it answered over SSH: the host is the target
        rows += [doctor_row(n, "skip", way.why_not) for n in ("pct", "container-running")]
    host = hostfacts.gpus(remote, clock.step())
    if host.driver is None:
        # a host meant to have none (the inventory gives the target no GPUs) skips; one the
        # inventory gives GPUs fails: a driver that did not load is no clean bill
        spec = tgt.host.target_spec(ct)
        want = spec.gpus if spec is not None else 0
        rows.append(doctor_row("host-driver", "fail" if want else "skip",
                               f"{NO_DRIVER}, though the inventory gives this target {want} "
                               "GPU(s)" if want else NO_DRIVER, host.evidence or
                               "/proc/driver/nvidia/version: no such file",
                               "install the NVIDIA driver on the host (apt install nvidia-driver "
                               "or NVIDIA's .run), then modprobe nvidia"))
        rows.append(doctor_row("host-device-nodes", "skip", NO_DRIVER))
        rows.append(doctor_row("ct-config-devices", "skip",
                               NO_DRIVER if way.has_container else way.why_not))
    else:
        rows.append(doctor_row("host-driver", "ok" if host.smi_error is None else "fail",
                               f"driver {host.driver}" if host.smi_error is None else
                               f"driver {host.driver} loaded, but nvidia-smi on the host fails",
                               host.smi_error or host.evidence,
                               "" if host.smi_error is None else _smi_fix(host.smi_error)))
        nodes, _listing = hostfacts.device_nodes(remote, clock.step())
        rows.append(_host_nodes_row(nodes))
        if way.has_container:
            rc2, conf = hostfacts.command_text(remote, ["pct", "config", str(ct)],
                                               timeout=clock.step(), step="pct config")
            rows.append(_ct_config_row(tgt, nodes, conf if rc2 == 0 else None, conf))
        else:
            rows.append(doctor_row("ct-config-devices", "skip", way.why_not))
    if running:
        rows += _agent_rows(tgt, clock, torch=torch, torch_timeout_s=torch_timeout_s,
                            host_driver=host.driver)
    else:
        rows += [doctor_row(n, "skip", f"container {ct} is not running") for n in AGENT_ROWS]
    if host.driver is None:
        rows.append(doctor_row("xid-events", "skip", NO_DRIVER))
    else:
        now = time.time()
        log = hostfacts.kernel_events(remote, now - XID_LOOKBACK_S, now, timeout=clock.step())
        rows.append(xid_row(log, host.bus_to_index, tgt.host.user))
    return None


def _smi_fix(smi_error: str) -> str:
    """The fix of a host-driver row whose nvidia-smi failed (``smi_error``: how)."""
    if smi_error.startswith(hostfacts.SMI_HUNG):
        return ("see the xid-events row for the GPU (Xid 79: it fell off the bus); drain the "
                "host and reset that GPU (nvidia-smi -r -i N) or reboot")
    return ("reboot the host after a driver update (the loaded module and the host's libraries "
            "differ)")


def _pct_rows(tgt: Target, rc: int, text: str, clock: _Clock) -> tuple[Row, Row]:
    ct = tgt.ctid
    from opsctl.remote.command import CommandResult
    from opsctl.remote.transport import classify_pct_failure

    if rc != 0:
        fake = CommandResult(("pct", "status", str(ct)), "", rc, b"", text.encode(), 0.0)
        try:
            classify_pct_failure(tgt.host, ct, fake, "pct status")
        except HostSetupError as exc:
            return (doctor_row("pct", "fail", exc.message, hostfacts.first_line(text), exc.hint or ""),
                    doctor_row("container-running", "skip", "pct is not usable"))
        except (ContainerMissing, ContainerNotRunning) as exc:
            return (doctor_row("pct", "ok", "pct answers"),
                    doctor_row("container-running", "fail", exc.message,
                               hostfacts.first_line(text), exc.hint or ""))
        return (doctor_row("pct", "fail", f"pct status exited {rc}", hostfacts.first_line(text)),
                doctor_row("container-running", "skip", "pct is not usable"))
    vrc, version = hostfacts.command_text(tgt.remote, ["dpkg-query", "-W", "-f=${Version}",
                                                       "pve-container"], timeout=clock.step(),
                                          step="pve-container version")
    version = version.strip()
    if vrc == 0 and version:
        pct = doctor_row("pct", "ok", f"pve-container {version}", f"pve-container {version}")
        if _older(version, (5, 0, 9)):
            pct = doctor_row("pct", "fail", "pve-container older than 5.0.9 (no pct exec --keep-env)",
                             f"pve-container {version}", "apt update && apt install pve-container")
    else:
        pct = doctor_row("pct", "warn", "pct answers; the pve-container version is unknown",
                         hostfacts.first_line(version), "dpkg-query -W pve-container (on the host)")
    running = text.split() == ["status:", "running"]
    ct_row = doctor_row("container-running", "ok" if running else "fail",
                        "running" if running else f"container {ct} is not running",
                        hostfacts.first_line(text), "" if running else f"pct start {ct}")
    return pct, ct_row


def _older(version: str, than: tuple[int, ...]) -> bool:
    import re

    nums = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
    return bool(nums) and nums < than


def _host_nodes_row(nodes: dict[str, tuple[int, int]]) -> Row:
    gpus = sorted(p for p in nodes if p[len("/dev/nvidia"):].isdigit())
    need = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    missing = [p for p in need if p not in nodes] + ([] if gpus else ["/dev/nvidia0"])
    evidence = ", ".join(f"{p} {nodes[p][0]},{nodes[p][1]}" for p in sorted(nodes)) or "no /dev/nvidia*"
    if missing:
        uvm = any("uvm" in p for p in missing)
        fix = ("on the host: nvidia-modprobe -u -c=0 (creates /dev/nvidia-uvm and -tools), and at "
               "boot: echo nvidia-uvm > /etc/modules-load.d/nvidia-uvm.conf") if uvm else \
            "on the host: nvidia-modprobe -c=0 (or modprobe nvidia; check dmesg for NVRM errors)"
        return doctor_row("host-device-nodes", "fail", f"missing on the host: {', '.join(missing)}"
                          + (" (nothing has loaded nvidia-uvm yet: CUDA finds no device while "
                             "nvidia-smi works)" if uvm else ""), evidence, fix)
    caps = "" if any("nvidia-caps" in p for p in nodes) else " (no nvidia-caps: needed for MIG only)"
    return doctor_row("host-device-nodes", "ok", f"{len(gpus)} GPU node(s), nvidiactl, nvidia-uvm"
                      + caps, evidence)


def _ct_config_row(tgt: Target, nodes: dict[str, tuple[int, int]], conf: str | None,
                   raw: str) -> Row:
    ct = tgt.ctid
    if conf is None:
        return doctor_row("ct-config-devices", "fail", "pct config failed", hostfacts.first_line(raw))
    entries = pctconf.parse(conf)
    want = spec.gpus if (spec := tgt.host.target_spec(ct)) is not None else 0
    gpu_nodes = sorted((p for p in nodes if p[len("/dev/nvidia"):].isdigit()),
                       key=lambda p: int(p[len("/dev/nvidia"):]))
    passed = [p for p in gpu_nodes if not pctconf.missing_lines(entries, p, *nodes[p])]
    if want == 0 and not passed:
        return doctor_row("ct-config-devices", "skip", f"the inventory gives container {ct} no GPUs "
                          "(gpus: 0) and its config passes none", "",
                          f"set containers.{ct}.gpus in the inventory if it should have some")
    missing: list[str] = []
    for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        if p in nodes:
            missing += pctconf.missing_lines(entries, p, *nodes[p])
    if len(passed) < max(1, want):
        for p in [g for g in gpu_nodes if g not in passed][: max(1, want) - len(passed)]:
            missing += pctconf.missing_lines(entries, p, *nodes[p])
    evidence = "; ".join(ln.strip() for ln in conf.splitlines()
                         if ln.startswith(("lxc.cgroup", "lxc.mount.entry", "dev"))) or \
        "no device entries in pct config"
    if missing:
        uniq = list(dict.fromkeys(missing))
        return doctor_row("ct-config-devices", "fail",
                          f"/etc/pve/lxc/{ct}.conf misses {len(uniq)} device line(s)",
                          evidence[:400], " | ".join(uniq) + f" (then pct reboot {ct})")
    return doctor_row("ct-config-devices", "ok",
                      f"{len(passed)} GPU node(s) and the control nodes are passed through",
                      evidence[:400])


def _agent_rows(tgt: Target, clock: _Clock, *, torch: bool, torch_timeout_s: float,
                host_driver: str | None) -> list[Row]:
    want = spec.gpus if (spec := tgt.host.target_spec(tgt.ctid)) is not None else None
    try:
        if not _payload_current(tgt, clock):
            if clock.left() < PAYLOAD_SHIP_S + XID_RESERVE_S:
                return [doctor_row(n, "skip", "the container has no current opsctl payload, and "
                                   "shipping it (up to 2 min) does not fit: doctor's "
                                   f"{seconds(clock.total)} s {DEADLINE_SKIP} for it", "",
                                   "`opsctl deploy` ships it; or give doctor a longer --deadline")
                        for n in AGENT_ROWS]
            tgt.agent.ensure_payload(force=True)
        agent_s = clock.step(cap=clock.left()) - AGENT_MARGIN_S - XID_RESERVE_S
        if agent_s < 1.0:
            return [doctor_row(n, "skip", f"doctor's {seconds(clock.total)} s {DEADLINE_SKIP} "
                               "for the container's checks", "", "a longer --deadline")
                    for n in AGENT_ROWS]
        args = ["--torch-timeout", seconds(torch_timeout_s), "--deadline", seconds(agent_s)]
        args += ["--direct"] if tgt.host.direct else ["--ct", str(tgt.ctid)]
        if want:
            args += ["--expect-gpus", str(want)]
        if host_driver:
            args += ["--host-driver", host_driver]
        if not torch:
            args.append("--no-torch")
        doc = tgt.agent.call("doctor", *args, timeout=clock.step(cap=clock.left()))
    except (DeadlineExceeded, TransportError):
        raise
    except OpsctlError as exc:
        # none of the container's checks ran: an incomplete doctor, never a clean bill
        why = f"the agent could not run: {exc.message}"
        return [doctor_row("agent", "fail", why, getattr(exc, "evidence", "") or "",
                           exc.hint or f"opsctl exec {shlex.join(tgt.flags)} -- python3 --version "
                           "(the agent runs on the target's python3)"),
                *(doctor_row(n, "skip", why) for n in AGENT_ROWS)]
    return [doctor_row(r["name"], r["status"], r["reason"], r["evidence"], r["fix"])
            for r in doc["rows"]]


def _payload_current(tgt: Target, clock: _Clock) -> bool:
    """Whether the container runs this opsctl's payload, asked within the clock (the agent
    client's own check has a fixed timeout of its own); a manifest that does not parse is
    not current."""
    from opsctl.errors import ReplyShapeError
    from opsctl.remote import payload, shapes
    from remote_payload.wire_shapes import PayloadManifestDoc

    r = tgt.remote.pct_exec(tgt.ctid, ["cat", f"{tgt.agent.root}/payload/MANIFEST.json"],
                            timeout=clock.step(), step="read payload manifest",
                            keep_bytes=MANIFEST_BYTES)
    if r.rc != 0:
        return False
    try:
        doc = shapes.parse_doc(PayloadManifestDoc, r.stdout, where=f"{tgt.label}: payload manifest")
    except ReplyShapeError:
        return False
    return bool(doc["digest"] == payload.build_manifest().digest)


def xid_row(log: hostfacts.KernelLog, bus_to_index: dict[str, int], user: str) -> Row:
    """``xid-events``: the Xids of the lookback window, per GPU, with the latest line."""
    if log.error is not None:
        return doctor_row("xid-events", "skip", "the host's kernel log is not readable", log.error,
                          f"on the host: usermod -aG adm,systemd-journal {user} (journalctl -k), "
                          "or sysctl kernel.dmesg_restrict=0 (dmesg)")
    xids = [e for e in log.events if e.kind == "xid"]
    if not xids:
        return doctor_row("xid-events", "ok", f"no Xid in the last {XID_LOOKBACK_S / 3600:g} h "
                          f"({log.source})")
    per_gpu: dict[str, list[kernlog.KernelEvent]] = {}
    for e in xids:
        per_gpu.setdefault(_gpu_name(e.pci, bus_to_index), []).append(e)
    worst = xids[-1]
    meaning, action = kernlog.xid_meaning(worst.xid or 0)
    summary = ", ".join(f"{g}: Xid {'/'.join(sorted({str(e.xid) for e in es}))}"
                        for g, es in per_gpu.items())
    return doctor_row("xid-events", "warn", f"{len(xids)} Xid event(s) in the last "
                      f"{XID_LOOKBACK_S / 3600:g} h ({summary}); latest Xid {worst.xid}: {meaning}",
                      worst.line, action)


def _gpu_name(pci: str | None, bus_to_index: dict[str, int]) -> str:
    if pci in bus_to_index:
        return f"GPU {bus_to_index[pci]} ({pci})"
    return f"GPU at {pci}"


# --- host kernel events in a job's diagnosis ---------------------------------------------


def kernel_diagnosis(tgt: Target, st: StatusDoc, *, timeout: float = 20.0) -> list[DiagnosisDoc]:
    """Diagnosis entries for the host kernel's Xid lines and OOM kills of this container in
    the job's time window: ``host-xid`` (an error for a failed/lost job, a warning for a live
    one) and ``host-oom``. [] when there are none; one ``info`` entry when the host's log
    cannot be read (it says why). Transport errors are entries too: the diagnosis around it
    must still show."""
    from opsctl.ops.watch import is_terminal

    since = st["started_at"] or st["created_at"]
    until = st["ended_at"] or time.time()
    try:
        log = hostfacts.kernel_events(tgt.remote, since, until, timeout=timeout)
        host = hostfacts.gpus(tgt.remote, timeout) if any(e.kind == "xid" for e in log.events) \
            else hostfacts.HostGpus(None, "")
    except OpsctlError as exc:
        return [{"cause": "host-log", "severity": "info",
                 "summary": f"the host's kernel log could not be read: {exc.message}",
                 "evidence": [], "hint": ""}]
    if log.error is not None:
        return [{"cause": "host-log", "severity": "info",
                 "summary": "the host's kernel log is not readable: Xid and OOM lines of this "
                            "job are unknown", "evidence": [log.error],
                 "hint": f"on the host: usermod -aG adm,systemd-journal {tgt.host.user}"}]
    return diagnosis_items(log.events, host.bus_to_index, tgt.ctid, live=not is_terminal(st))


def diagnosis_items(events: list[kernlog.KernelEvent], bus_to_index: dict[str, int], ctid: int,
                    *, live: bool) -> list[DiagnosisDoc]:
    """The ``host-xid``/``host-oom`` entries of a window's kernel events (pure)."""
    items: list[DiagnosisDoc] = []
    by_code: dict[tuple[int, str], list[kernlog.KernelEvent]] = {}
    for e in events:
        if e.kind == "xid":
            by_code.setdefault((e.xid or 0, e.pci or "?"), []).append(e)
    for (code, pci), evs in by_code.items():
        meaning, action = kernlog.xid_meaning(code)
        gpu = _gpu_name(pci, bus_to_index)
        items.append({
            "cause": "host-xid", "severity": "warning" if live else "error",
            "summary": f"host kernel: Xid {code} on {gpu} during the job: {meaning}",
            "evidence": [e.line for e in evs[-3:]], "hint": action})
    for e in events:
        if e.kind == "oom" and kernlog.of_container(e, ctid):
            items.append({
                "cause": "host-oom", "severity": "error",
                "summary": f"host kernel: the OOM killer killed {e.process or 'a process'} (pid "
                           f"{e.pid}) of container {ctid} during the job",
                "evidence": [e.line], "hint": f"give container {ctid} more memory (pct set {ctid} "
                                              "--memory <MiB>) or make the job use less"})
    return items
