"""The container-side checks of ``opsctl doctor``, one function per check, each answering
one doctor row (:func:`remote_payload.wire.doctor_row`).

The same functions guard a launch (:func:`launch_rows`): the device nodes, ``/dev/shm``
and the free disk; the leftover-processes row is built from the launch's own
:func:`remote_payload.agent.gpus.preflight`. One definition each, so ``deploy`` refuses with
exactly the row ``doctor`` shows.

Nothing here raises on a machine without GPUs: every GPU check is then ``skip`` with the
reason (no NVIDIA driver).
"""

from __future__ import annotations

import json
import math
import os
import time
import typing as t

from remote_payload import boundedread, limits, procgroup, wire
from remote_payload.gpufacts import nvidia, shm
from remote_payload.wire import doctor_row

Row = dict[str, str]

PROC_VERSION = "/proc/driver/nvidia/version"
PROC_GPUS = "/proc/driver/nvidia/gpus"
NO_DRIVER = "no NVIDIA driver on the host"
#: Where the driver's user-space libraries are found (the CUDA forward-compatibility
#: directory, /usr/local/cuda/compat, is left out: its libcuda differs from the driver on
#: purpose).
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu",
            "/lib64", "/usr/local/nvidia/lib64", "/usr/lib/aarch64-linux-gnu")
DISK_FAIL_BYTES = 2 * shm.GIB  # a checkpoint, a torch build or a compile cache needs more
DISK_WARN_BYTES = 20 * shm.GIB
SMI_TIMEOUT_S = 10.0


def _read(path: str) -> str | None:
    """A driver file of ``/proc/driver/nvidia`` (a few lines; 1 MiB at most is read)."""
    try:
        return boundedread.read_regular(path, 1 << 20, follow_links=True,
                                        cut=True).decode("utf-8", "replace")
    except OSError:
        return None


def driver_version() -> str | None:
    """The loaded kernel module's version (a container sees the host's /proc/driver);
    None without a driver."""
    text = _read(PROC_VERSION)
    return None if text is None else nvidia.driver_from_proc(text)


def _first_line(text: str, needle: str = "") -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    hit = [ln for ln in lines if needle in ln] if needle else lines
    return limits.cut_line((hit or lines or [""])[0])


# --- libraries --------------------------------------------------------------------------


def library_listing() -> str:
    """File names of the NVIDIA libraries in :data:`LIB_DIRS`, one a line."""
    names = []
    for d in LIB_DIRS:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        names += [f"{d}/{e}" for e in entries if e.startswith(("libnvidia-ml.so.", "libcuda.so."))]
    return "\n".join(sorted(names))


def check_libraries(driver: str | None, listing: str | None = None) -> Row:
    name = "container-libraries"
    listing = library_listing() if listing is None else listing
    seen = nvidia.library_version_sets(listing)
    if driver is None:
        return doctor_row(name, "skip", NO_DRIVER, _first_line(listing))
    fix = (f"in the container: sh NVIDIA-Linux-x86_64-{driver}.run --no-kernel-module --silent "
           f"(the host's driver, user space only), or apt install "
           f"libnvidia-compute-{driver.split('.')[0]}={driver}*")
    missing = [lib for lib in ("libnvidia-ml", "libcuda") if lib not in seen]
    if missing:
        return doctor_row(name, "fail", f"no {' and no '.join(missing)} in the container",
                          f"searched {', '.join(LIB_DIRS)}", fix)
    wrong = {lib: [v for v in vs if v != driver] for lib, vs in seen.items()}
    wrong = {lib: vs for lib, vs in wrong.items() if vs}
    evidence = "; ".join(f"{lib}.so.{v}" for lib, vs in sorted(seen.items()) for v in vs) \
        + f"; driver {driver}"
    if wrong:
        only_wrong = [lib for lib, vs in wrong.items() if driver not in seen[lib]]
        status = "fail" if only_wrong else "warn"
        why = ("Failed to initialize NVML: Driver/library version mismatch" if only_wrong
               else "an older copy sits beside the matching one")
        return doctor_row(name, status, f"library version differs from the driver ({why})",
                          evidence, fix)
    return doctor_row(name, "ok", f"libnvidia-ml and libcuda are {driver}", evidence)


# --- device nodes -----------------------------------------------------------------------


def container_nodes() -> dict[str, tuple[int, int]]:
    """The NVIDIA character devices under /dev: path -> (major, minor)."""
    import stat

    out: dict[str, tuple[int, int]] = {}
    for d in ("/dev", "/dev/nvidia-caps"):
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for e in entries:
            if not e.startswith("nvidia"):
                continue
            path = f"{d}/{e}"
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                out[path] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return out


def check_device_nodes(driver: str | None, nodes: dict[str, tuple[int, int]] | None = None,
                       ctid: str = "<ct>", direct: bool = False) -> Row:
    """The GPU device nodes the job opens; ``direct``: the host is the target (no LXC
    config to pass them through, so the fix makes them on the host)."""
    name = "container-device-nodes"
    if driver is None:
        return doctor_row(name, "skip", NO_DRIVER)
    nodes = container_nodes() if nodes is None else nodes
    gpus = sorted(p for p in nodes if p[len("/dev/nvidia"):].isdigit())
    need = [*(gpus or ["/dev/nvidia0"]), "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    missing = [p for p in need if p not in nodes]
    evidence = ", ".join(f"{p} {nodes[p][0]},{nodes[p][1]}" for p in sorted(nodes)) or "no /dev/nvidia*"
    if missing:
        uvm = "/dev/nvidia-uvm" in missing
        first = missing[0]
        if direct:
            fix = ("on this host: nvidia-modprobe -u -c=0 (creates /dev/nvidia-uvm and -tools)"
                   if uvm else "on this host: nvidia-modprobe -c=0 (or modprobe nvidia; check "
                               "dmesg for NVRM errors)")
        else:
            fix = (f"on the host: nvidia-modprobe -u -c=0 (creates /dev/nvidia-uvm), then in "
                   f"/etc/pve/lxc/{ctid}.conf: lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm "
                   f"none bind,optional,create=file; pct reboot {ctid}") if uvm else (
                f"in /etc/pve/lxc/{ctid}.conf: lxc.mount.entry: {first} {first.lstrip('/')} none "
                f"bind,optional,create=file (or on PVE 8: dev0: {first}); pct reboot {ctid}")
        why = "CUDA finds no device although nvidia-smi works" if uvm and len(missing) <= 2 \
            else "the container cannot open the GPU"
        return doctor_row(name, "fail", f"missing in the container: {', '.join(missing)} ({why})",
                          evidence, fix)
    return doctor_row(name, "ok", f"{len(gpus)} GPU node(s), nvidiactl and nvidia-uvm present",
                      evidence)


# --- nvidia-smi ---------------------------------------------------------------------------


def smi_gpus(timeout_s: float = SMI_TIMEOUT_S) -> tuple[list[dict[str, str]], str | None]:
    """``[{index, bus_id, persistence, name}]`` from nvidia-smi, and its error line (None: ok)."""
    from remote_payload.agent.common import which

    smi = which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found in the container"
    from remote_payload import procgroup

    try:
        proc = procgroup.run([smi, "--query-gpu=index,pci.bus_id,persistence_mode,name",
                              "--format=csv,noheader"], timeout_s)
    except TimeoutError:
        return [], f"nvidia-smi did not answer within {_seconds(timeout_s)} s"
    except OSError as exc:
        return [], f"nvidia-smi: {exc}"
    out = proc.out.decode("utf-8", "replace")
    if proc.rc != 0:
        return [], _first_line(out + "\n" + proc.err.decode("utf-8", "replace")) \
            or f"nvidia-smi exited {proc.rc}"
    return parse_smi_rows(out)


def parse_smi_rows(out: str) -> tuple[list[dict[str, str]], str | None]:
    rows: list[dict[str, str]] = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) != 4 or not parts[0].isdigit():
            if line.strip():
                return rows, f"unexpected nvidia-smi line: {line.strip()[:200]!r}"
            continue
        rows.append({"index": parts[0], "bus_id": parts[1], "persistence": parts[2],
                     "name": parts[3]})
    return rows, None


def check_gpu_count(driver: str | None, rows: list[dict[str, str]], error: str | None,
                    expect: int | None) -> Row:
    name = "gpu-count"
    if driver is None:
        return doctor_row(name, "skip", NO_DRIVER)
    if error is not None:
        return doctor_row(name, "fail", "nvidia-smi in the container failed", error,
                          "see container-libraries and container-device-nodes")
    seen = f"{len(rows)} GPU(s): " + ", ".join(f"{r['index']} {r['name']} {r['bus_id']}" for r in rows)
    if expect is not None and len(rows) != expect:
        return doctor_row(name, "fail", f"the container sees {len(rows)} GPU(s), the "
                          f"inventory says {expect}", seen,
                          "pass the missing /dev/nvidiaN nodes to the container (see "
                          "ct-config-devices), or fix gpus: in the inventory")
    return doctor_row(name, "ok", f"{len(rows)} GPU(s)" + ("" if expect is None else
                                                          " as the inventory says"), seen)


def check_persistence(driver: str | None, rows: list[dict[str, str]]) -> Row:
    name = "persistence-mode"
    if driver is None:
        return doctor_row(name, "skip", NO_DRIVER)
    if not rows:
        return doctor_row(name, "skip", "no GPU answered nvidia-smi")
    off = [r for r in rows if r["persistence"].lower() != "enabled"]
    evidence = ", ".join(f"GPU {r['index']}: {r['persistence']}" for r in rows)
    if off:
        return doctor_row(name, "warn", "persistence mode is off: slow first CUDA init, "
                          "spurious timeouts", evidence,
                          "on the host: systemctl enable --now nvidia-persistenced (or nvidia-smi -pm 1)")
    return doctor_row(name, "ok", "persistence mode on", evidence)


# --- /dev/shm and disk ---------------------------------------------------------------------


def statvfs_bytes(path: str) -> tuple[int, int] | None:
    """(size, free for an unprivileged writer) of the filesystem at ``path``, else None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def check_shm(gpus: int, size: int | None = None) -> Row:
    name = "dev-shm"
    need = shm.needed_bytes(gpus)
    if size is None:
        got = statvfs_bytes("/dev/shm")
        size = got[0] if got else None
    if need == 0:
        return doctor_row(name, "skip", "no GPUs: NCCL does not run here",
                          f"/dev/shm {shm.human(size)}" if size is not None else "")
    fix = (f"in the container: mount -o remount,size={max(1, need // shm.GIB)}G /dev/shm (and "
           f"for every boot an /etc/fstab line: tmpfs /dev/shm tmpfs defaults,size="
           f"{max(1, need // shm.GIB)}G 0 0)")
    if size is None:
        return doctor_row(name, "fail", "no /dev/shm in the container (NCCL needs it)", "", fix)
    evidence = f"/dev/shm {shm.human(size)}; {gpus} GPU(s) want {shm.human(need)}"
    if size < need // 4:
        return doctor_row(name, "fail", f"/dev/shm is too small for NCCL at {gpus} ranks",
                          evidence, fix)
    if size < need:
        return doctor_row(name, "warn", f"/dev/shm is small for NCCL at {gpus} ranks", evidence, fix)
    return doctor_row(name, "ok", "large enough for NCCL", evidence)


def check_disk(root: str, got: tuple[int, int] | None = None) -> Row:
    name = "disk-free"
    path = root
    while got is None and path not in ("", "/") and not os.path.exists(path):
        path = os.path.dirname(path)
    if got is None:
        got = statvfs_bytes(path or "/")
    if got is None:
        return doctor_row(name, "warn", f"cannot read the free space of {path}")
    size, free = got
    evidence = f"{path}: {shm.human(free)} free of {shm.human(size)}"
    fix = (f"free space in the container: opsctl cache prune, old {root}/jobs/<id> dirs, "
           "unused envs; or grow the CT disk: pct resize <ct> rootfs +50G")
    if free < DISK_FAIL_BYTES:
        return doctor_row(name, "fail", f"less than {shm.human(DISK_FAIL_BYTES)} free for jobs, "
                          "envs and caches", evidence, fix)
    if free < DISK_WARN_BYTES:
        return doctor_row(name, "warn", f"less than {shm.human(DISK_WARN_BYTES)} free", evidence, fix)
    return doctor_row(name, "ok", "enough free space", evidence)


# --- leftovers (the launch preflight's own check) ------------------------------------------


def leftovers_row(check: dict[str, t.Any]) -> Row:
    """The row of a :func:`remote_payload.agent.gpus.preflight` result (one definition:
    ``doctor`` shows it, a launch refuses with it)."""
    name = "leftover-gpu-processes"
    if check.get("error"):
        return doctor_row(name, "warn", "nvidia-smi could not list the GPU processes",
                          str(check["error"]))
    busy = check.get("busy") or []
    if busy:
        evidence = "; ".join(f"GPU {b['index']}: {b['why']}" for b in busy)
        pids = [str(p["pid"]) for b in busy for p in b.get("processes") or [] if p.get("pid")]
        fix = (f"kill {' '.join(pids)} (in the container), or `opsctl stop` the job that holds "
               "them; deploy --force launches anyway") if pids else (
            "find the holder on the host (nvidia-smi there lists every process) and stop it; "
            "deploy --force launches anyway")
        return doctor_row(name, "fail", "GPUs hold memory of processes from outside the job",
                          evidence, fix)
    return doctor_row(name, "ok", "no process holds GPU memory")


def check_leftovers(driver: str | None) -> Row:
    if driver is None:
        return doctor_row("leftover-gpu-processes", "skip", NO_DRIVER)
    from remote_payload.agent import gpus

    return leftovers_row(gpus.preflight(None, settle_s=0.0))


# --- torch --------------------------------------------------------------------------------

TORCH_SCRIPT = r"""
import json, time, sys
t0 = time.time()
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available(),
       "count": torch.cuda.device_count(), "devices": []}
for i in range(out["count"]):
    d = {"index": i}
    try:
        d["name"] = torch.cuda.get_device_name(i)
        s = time.time()
        x = torch.randn(1024, 1024, device=f"cuda:{i}")
        y = float((x @ x).sum())
        torch.cuda.synchronize(i)
        d["ok"] = y == y
        d["ms"] = round((time.time() - s) * 1000, 1)
    except Exception as exc:
        d["ok"] = False
        d["error"] = f"{type(exc).__name__}: {exc}"[:300]
    out["devices"].append(d)
out["seconds"] = round(time.time() - t0, 2)
print(json.dumps(out))
"""


def torch_python(root: str) -> str | None:
    """The python a job runs: the current torch build's (``envs/current``), else the
    container's ``python3`` on PATH, which is what a launch without an opsctl build runs (the
    playbook's ``python3`` command, unchanged); None when neither exists."""
    path = os.path.join(root, "envs", "current", "bin", "python")
    if os.path.exists(path):
        return path
    import shutil

    return shutil.which("python3")


def check_torch(driver: str | None, root: str, timeout_s: float,
                python: str | None = None) -> Row:
    name = "torch-matmul"
    if driver is None:
        return doctor_row(name, "skip", NO_DRIVER)
    python = python or torch_python(root)
    if python is None:
        return doctor_row(name, "skip", "no python a job could run",
                          f"{root}/envs/current missing and no python3 on PATH",
                          "opsctl swap-torch VARIANT --host H --ct N (e.g. cu130)")
    from remote_payload import procgroup

    try:
        proc = procgroup.run([python, "-c", TORCH_SCRIPT], timeout_s)
    except TimeoutError:
        return doctor_row(name, "fail", f"torch did not finish a matmul on every GPU within "
                          f"{_seconds(timeout_s)} s (a hung CUDA init or a wedged GPU)", python,
                          "see persistence-mode and the host's Xid events; reset the GPU")
    except OSError as exc:
        return doctor_row(name, "fail", f"cannot run {python}", str(exc))
    lines = proc.out.decode("utf-8", "replace").strip().splitlines()
    try:
        doc = json.loads(lines[-1])
    except (ValueError, IndexError):
        err = proc.err.decode("utf-8", "replace")
        if "No module named 'torch'" in err:
            return doctor_row(name, "skip", f"no torch in {python}, the python a job would run",
                              python, "opsctl swap-torch VARIANT --host H --ct N (e.g. cu130)")
        return doctor_row(name, "fail", f"torch failed (exit {proc.rc})",
                          _first_line("\n".join(reversed(err.splitlines())), "Error"))
    bad = [d for d in doc.get("devices", []) if not d.get("ok")]
    evidence = (f"{python}: torch {doc.get('torch')} (CUDA {doc.get('cuda')}): {doc.get('count')} "
                "device(s); " + ", ".join(f"{d['index']}: {d.get('name', '?')} "
                                          f"{d.get('ms', '-')} ms" for d in doc.get("devices", []))
                + f"; {doc.get('seconds')} s in all")
    if not doc.get("count"):
        return doctor_row(name, "fail", "torch sees no GPU", evidence,
                          "see container-device-nodes (nvidia-uvm) and container-libraries")
    if bad:
        return doctor_row(name, "fail", "a matmul failed on GPU(s) "
                          + ", ".join(str(d["index"]) for d in bad),
                          "; ".join(str(d.get("error")) for d in bad))
    return doctor_row(name, "ok", f"a matmul ran on each of {doc['count']} GPU(s)", evidence)


# --- all of them ---------------------------------------------------------------------------


def _seconds(value: float) -> str:
    """A duration as doctor prints it: whole seconds from 10 s up, else one decimal, rounded
    down (``opsctl.ops.doctor.seconds`` on the CLI side)."""
    if value >= 10:
        return str(int(value))
    return f"{math.floor(value * 10) / 10:.1f}"


#: What the leftovers check may take: two nvidia-smi queries, each ended with procgroup's
#: grace if it hangs.
LEFTOVERS_BUDGET_S = 2 * (3.0 + procgroup.GRACE_S)
#: a step given less than this is skipped rather than started
MIN_STEP_S = 1.0


class _Budget:
    """The verb's own deadline (``--deadline``): each child step gets what is left, less the
    grace procgroup takes to end a child that ignores SIGTERM, so the reply is written before
    the caller's deadline, with a row for every check."""

    def __init__(self, deadline_s: float | None):
        self.deadline_s = deadline_s
        self.end = None if deadline_s is None else time.monotonic() + deadline_s

    def step(self, cap: float, reserve: float = 0.0) -> float | None:
        """Seconds for the next child (at most ``cap``), or None when none is left."""
        if self.end is None:
            return cap
        left = self.end - time.monotonic() - procgroup.GRACE_S - reserve
        return min(cap, left) if left >= MIN_STEP_S else None

    def has(self, seconds: float) -> bool:
        """Whether ``seconds`` of work still fit before the deadline."""
        return self.end is None or self.end - time.monotonic() >= seconds

    def out_of_time(self, name: str) -> Row:
        return doctor_row(name, "skip", f"doctor's {_seconds(self.deadline_s or 0)} s "
                          f"{wire.DEADLINE_SKIP} for this check", "", "a longer --deadline")


def run_all(root: str, *, expect_gpus: int | None, torch_timeout_s: float,
            torch: bool = True, ctid: str = "<ct>", host_driver: str | None = None,
            deadline_s: float | None = None, direct: bool = False) -> dict[str, t.Any]:
    """Every container-side row; ``host_driver`` (what the host itself reports) is what the
    libraries must match, else the version the container reads in /proc/driver/nvidia (the
    host's loaded module either way; they differ only while a host update is half done).

    ``deadline_s`` bounds the whole run: nvidia-smi, torch and the leftovers check get what
    is left of it (torch keeps the leftovers' share back for them), and a check with no time
    left is a ``skip`` row that says so."""
    budget = _Budget(deadline_s)
    driver = driver_version()
    smi_s = budget.step(SMI_TIMEOUT_S)
    rows_smi: list[dict[str, str]]
    err: str | None
    if driver is None:
        rows_smi, err = [], None
    elif smi_s is None:
        rows_smi, err = [], f"not run: doctor's {_seconds(deadline_s or 0)} s deadline left no time"
    else:
        rows_smi, err = smi_gpus(smi_s)
    gpu_n = len(rows_smi) or len([p for p in container_nodes() if p[11:].isdigit()])
    rows = [
        check_libraries((host_driver or driver) if driver is not None else None),
        check_device_nodes(driver, ctid=ctid, direct=direct),
        check_gpu_count(driver, rows_smi, err, expect_gpus),
        check_persistence(driver, rows_smi),
        check_shm(gpu_n if driver is not None else 0),
        check_disk(root),
        _torch_row(driver, root, torch, budget.step(torch_timeout_s, reserve=LEFTOVERS_BUDGET_S),
                   budget),
        check_leftovers(driver) if driver is None or budget.has(LEFTOVERS_BUDGET_S)
        else budget.out_of_time("leftover-gpu-processes"),
    ]
    return {"rows": rows, "facts": {
        "driver": driver, "libraries": nvidia.library_version_sets(library_listing()),
        "nodes": {p: list(v) for p, v in container_nodes().items()}, "gpus": rows_smi,
        "smi_error": err}}


def _torch_row(driver: str | None, root: str, torch: bool, timeout_s: float | None,
               budget: _Budget) -> Row:
    if not torch:
        return doctor_row("torch-matmul", "skip", "--no-torch")
    if timeout_s is None and driver is not None:
        return budget.out_of_time("torch-matmul")
    return check_torch(driver, root, timeout_s or MIN_STEP_S)


def launch_rows(root: str, needed: list[int] | None) -> list[Row]:
    """The doctor rows a launch checks before it starts anything (the container-side ones
    that apply to every job; the leftovers row comes from the launch's own preflight)."""
    driver = driver_version()
    gpu_n = (len(needed) if needed is not None
             else len([p for p in container_nodes() if p[11:].isdigit()])) if driver else 0
    return [check_device_nodes(driver), check_shm(gpu_n), check_disk(root)]
