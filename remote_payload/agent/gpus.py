"""GPU table for ``status`` and ``env``: ``nvidia-smi`` when on PATH, else NVML (pynvml).

No GPU (no driver, no nvidia-smi) is an answer, ``[]``, not an error. A
failing nvidia-smi is ``[]`` plus ``gpu_error`` so status still renders.

Why nvidia-smi first although NVML is in-process: measured on an H200 host,
``import pynvml`` alone takes ~44 ms, ``nvmlInit`` ~8 ms and the readings ~10 ms,
all on the critical path of ``status``; the nvidia-smi query takes ~27 ms but
runs as a subprocess started first and collected last (:class:`GpuQuery`), so
it overlaps the rest of the verb. NVML is the fallback for containers that
have the driver library but no nvidia-smi binary.

While a job runs its wrapper samples the table every :data:`SAMPLE_INTERVAL_S`
into ``jobs/<id>/gpus.json`` (:func:`sample_forever`); ``status`` reads a fresh
sample instead of paying for a query (nvidia-smi takes 100s of ms on 8 GPUs
without persistence mode).
"""

from __future__ import annotations

import contextlib
import json
import time
import typing as t

from remote_payload import boundedread, safe_write
from remote_payload.agent.common import which
from remote_payload.procgroup import Group

if t.TYPE_CHECKING:
    import threading

QUERY_FIELDS = ("index,name,utilization.gpu,memory.used,memory.total,"
                "temperature.gpu,power.draw")
SMI_ARGS = (f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits")
SMI_TIMEOUT_S = 3.0
SAMPLE_FILE = "gpus.json"
SAMPLE_INTERVAL_S = 2.0
SAMPLE_MAX_AGE_S = 3 * SAMPLE_INTERVAL_S  # older than this: the sampler is gone, query live
#: the largest GPU sample read (a few KiB for eight GPUs): a file grown past it is no sample
SAMPLE_MAX_BYTES = 1 << 20

Gpu = dict[str, t.Any]


def _num(text: str) -> float | None:
    """``[N/A]``, ``[Not Supported]``, ``N/A`` and anything unparsable become None."""
    s = text.strip()
    if not s or s.startswith("[") or s.upper() in ("N/A", "NA"):
        return None
    try:
        return float(s)
    except ValueError:
        return None


def parse_smi_csv(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` output.

    Raises
    ------
    ValueError
        A line does not have the 7 expected fields.
    """
    gpus: list[Gpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 7:
            # a GPU name never contains a comma in practice; refuse rather than guess
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index = _num(parts[0])
        gpus.append({
            "index": int(index) if index is not None else len(gpus),
            "name": parts[1],
            "util_pct": _num(parts[2]),
            "mem_used_mib": _num(parts[3]),
            "mem_total_mib": _num(parts[4]),
            "temp_c": _num(parts[5]),
            "power_w": _num(parts[6]),
        })
    return gpus


def _nvml_get(fn: t.Callable[..., t.Any], *args: t.Any) -> t.Any:
    """One NVML reading; None when this GPU does not support it (NVMLError_NotSupported...)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _nvml_query() -> list[Gpu] | None:
    """Query NVML; None when pynvml is missing or the driver cannot be reached."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        gpus: list[Gpu] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _nvml_get(pynvml.nvmlDeviceGetName, h)
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            util = _nvml_get(pynvml.nvmlDeviceGetUtilizationRates, h)
            # v2 excludes driver-reserved memory, as nvidia-smi does (v1 shows ~615 MiB used idle)
            mem = (_nvml_get(pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
                   if hasattr(pynvml, "nvmlMemory_v2") else None)
            if mem is None:
                mem = _nvml_get(pynvml.nvmlDeviceGetMemoryInfo, h)
            temp = _nvml_get(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            power = _nvml_get(pynvml.nvmlDeviceGetPowerUsage, h)  # milliwatts
            gpus.append({
                "index": i,
                "name": name or "",
                "util_pct": float(util.gpu) if util is not None else None,
                "mem_used_mib": mem.used / 2**20 if mem is not None else None,
                "mem_total_mib": mem.total / 2**20 if mem is not None else None,
                "temp_c": float(temp) if temp is not None else None,
                "power_w": power / 1000.0 if power is not None else None,
            })
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


class GpuQuery:
    """Start the query now, collect with :meth:`result` (``(gpus, gpu_error)``)."""

    def __init__(self, smi: str | None = None):
        self._done: tuple[list[Gpu], str | None] | None = None
        self._proc: Group | None = None
        smi = smi or which("nvidia-smi")
        if smi is None:
            self._done = (_nvml_query() or [], None)
            return
        try:
            self._proc = Group([smi, *SMI_ARGS])
        except OSError as exc:
            self._done = ([], f"nvidia-smi: {exc}")

    def result(self) -> tuple[list[Gpu], str | None]:
        if self._done is not None:
            return self._done
        proc = self._proc
        if proc is None:  # unreachable: __init__ sets one of the two
            return [], "no GPU query started"
        try:
            rc, out, err, _, _ = proc.result(SMI_TIMEOUT_S)
        except TimeoutError:
            self._done = ([], f"nvidia-smi timed out after {SMI_TIMEOUT_S:g}s")
            return self._done
        if rc != 0:
            text = (err or out).decode("utf-8", "replace").strip()
            self._done = ([], f"nvidia-smi exited {rc}: {text[-500:]}")
            return self._done
        try:
            self._done = (parse_smi_csv(out.decode("utf-8", "replace")), None)
        except ValueError as exc:
            self._done = ([], str(exc))
        return self._done


def query() -> tuple[list[Gpu], str | None]:
    """One-shot GPU table: ``(gpus, gpu_error)``."""
    return GpuQuery().result()


def sample_forever(path: str, stop: threading.Event, interval_s: float = SAMPLE_INTERVAL_S,
                   on_sample: t.Callable[[list[Gpu], float], None] | None = None) -> None:
    """Write ``{"at", "gpus", "gpu_error", "static"}`` to ``path`` every ``interval_s`` until ``stop``.

    A machine without nvidia-smi and NVML is sampled once (``static``: nothing will change).
    ``on_sample(table, at)`` also gets each non-empty table (the job's history).
    """
    while not stop.is_set():
        table, err = query()
        static = not table and err is None
        if on_sample is not None and table:
            with contextlib.suppress(Exception):  # the history must never stop the sampling
                on_sample(table, time.time())
        try:  # rewritten every few seconds: not fsynced (a lost sample costs nothing)
            safe_write.write_text(path, json.dumps({"at": time.time(), "gpus": table,
                                                    "gpu_error": err, "static": static}),
                                  durable=False)
        except OSError:  # a full disk: status queries the GPUs itself meanwhile; retry later
            static = False
        if static:
            return
        stop.wait(interval_s)


def read_sample(path: str, now: float) -> tuple[list[Gpu], str | None, float] | None:
    """``(gpus, gpu_error, sampled_at)`` from a fresh sample file, else None."""
    try:
        sample = json.loads(boundedread.read_regular(path, SAMPLE_MAX_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(sample, dict):
        return None
    at = float(sample.get("at") or 0.0)
    if not sample.get("static") and not 0 <= now - at <= SAMPLE_MAX_AGE_S:
        return None
    return list(sample.get("gpus") or []), sample.get("gpu_error"), at


# --- launch preflight -----------------------------------------------------------------

PREFLIGHT_FILE = "preflight.json"
BUSY_MEM_MIB = 1024.0  # an idle H200 shows 0-5 MiB used; a leftover process holds GiBs
_APPS_ARGS = ("--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
              "--format=csv,noheader,nounits")
_IDS_ARGS = ("--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits")


def needed_gpus(spec: dict[str, t.Any]) -> list[int] | None:
    """The GPU indices a job uses: the slots it was given (``gpu_slots``), the spec's ``gpus``
    list, else its ``CUDA_VISIBLE_DEVICES``, else None (every GPU the container has)."""
    slots = spec.get("gpu_slots")
    if isinstance(slots, list):
        return [int(x) for x in slots]
    listed = spec.get("gpus")
    if isinstance(listed, list):
        return [int(x) for x in listed]
    visible = str((spec.get("env") or {}).get("CUDA_VISIBLE_DEVICES") or "")
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else None


PREFLIGHT_SETTLE_S = 5.0  # memory of a process killed a moment ago takes a while to be freed


def preflight(needed: list[int] | None, own_pids: t.Collection[int] = (), smi: str | None = None,
              *, memory: bool = True, settle_s: float = PREFLIGHT_SETTLE_S) -> dict[str, t.Any]:
    """GPUs (of ``needed``) in use by something other than ``own_pids``, before a launch.

    Memory counts too (unless ``memory`` is False): from inside an LXC container nvidia-smi
    cannot see the processes of the host or of other containers, only the memory they hold.
    Memory held with no process to show for it is re-read for up to ``settle_s``: a process
    that just died (a job stopped for --replace) frees it late. ``{"needed", "busy": [...],
    "error"}``; no nvidia-smi is no GPU, not an error.
    """
    smi = smi or which("nvidia-smi")
    deadline = time.monotonic() + settle_s
    while True:
        out = _preflight_once(needed, own_pids, smi, memory)
        if not out["busy"] or any(b["processes"] for b in out["busy"]) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _preflight_once(needed: list[int] | None, own_pids: t.Collection[int], smi: str | None,
                    memory: bool) -> dict[str, t.Any]:
    out: dict[str, t.Any] = {"needed": needed, "busy": [], "error": None}
    if smi is None:
        return out
    try:
        ids = _smi_rows(smi, _IDS_ARGS, 3)
        apps = _smi_rows(smi, _APPS_ARGS, 4)
    except (OSError, ValueError, TimeoutError) as exc:
        out["error"] = f"nvidia-smi: {exc}"
        return out
    by_uuid: dict[str, list[dict[str, t.Any]]] = {}
    for uuid, pid, mem, name in apps:
        by_uuid.setdefault(uuid, []).append({"pid": int(pid) if pid.isdigit() else None,
                                             "mem_mib": _num(mem), "name": name})
    for index_s, uuid, used_s in ids:
        index = int(index_s)
        if needed is not None and index not in needed:
            continue
        procs = by_uuid.get(uuid, [])
        mine = [p for p in procs if p["pid"] in own_pids]
        foreign = [p for p in procs if p not in mine]
        used = (_num(used_s) or 0.0) - sum(p["mem_mib"] or 0.0 for p in mine)
        if foreign or (memory and used > BUSY_MEM_MIB):
            why = (f"{len(foreign)} process(es) from outside this job: "
                   + ", ".join(f"pid {p['pid']} {p['name']}" for p in foreign)) if foreign else (
                f"{used / 1024:.1f} GiB used by processes this container cannot see "
                "(the host or another container)")
            out["busy"].append({"index": index, "mem_used_mib": used, "processes": foreign,
                                "why": why})
    return out


def _smi_rows(smi: str, args: t.Sequence[str], width: int) -> list[list[str]]:
    from remote_payload import procgroup

    proc = procgroup.run([smi, *args], SMI_TIMEOUT_S)
    if proc.rc != 0:
        raise ValueError(f"exited {proc.rc}: "
                         f"{proc.err.decode('utf-8', 'replace').strip()[-300:]}")
    rows = []
    for line in proc.out.decode("utf-8", "replace").splitlines():
        if not line.strip() or "No running" in line:
            continue
        parts = [p.strip() for p in line.split(",", width - 1)]
        if len(parts) != width:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        rows.append(parts)
    return rows
