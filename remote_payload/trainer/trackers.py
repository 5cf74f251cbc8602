"""Experiment trackers (``--report-to``): TensorBoard, Weights & Biases, MLflow.

The names and their meaning follow Hugging Face's ``TrainingArguments.report_to``: a comma
list of ``tensorboard``, ``wandb``, ``mlflow``; ``none`` (the default) reports nowhere, ``all``
to every one whose package is installed. Rank 0 alone reports.

One source of truth: a tracker sees exactly the events the trainer prints (it listens on
:class:`.events.Log`), so the curves in TensorBoard are the numbers ``status`` and ``plot``
show: every numeric field of a ``step`` event as ``train/<field>``, of an ``eval`` or
``acceptance`` event as ``eval/<field>``. The run's configuration goes in as hyper-parameters,
the torch build and the payload digest as tags.

The run's goodput goes beside a ``step`` event's metrics: ``goodput/ratio``,
``goodput/effective_tok_s``, ``goodput/wall_s`` and ``goodput/badput_s/<cause>``. The trainer
cannot see its run's earlier attempts and re-deploys, so it computes none of it: the job's
wrapper keeps the run's ledger in brief in the job dir (the summary ``status`` shows; its path
in ``OPSCTL_GOODPUT_FILE``), and :class:`GoodputFile` reads it, bounded and untrusted.

Why a thread: a backend's calls can be slow (W&B's start ~10 s, MLflow's first SQLite
write ~15 s on 2 loaded cores, a dead MLflow server its HTTP timeout), and the training step
must never wait for them. The trainer only puts an event's metrics on each backend's bounded
queue (:data:`QUEUE_SIZE`), which a thread of that backend's own drains (a mute server slows
only its own backend); a full queue drops and counts, and the count is reported. A backend
that raises (its package missing, a network down, a bad key, a full disk) costs one
``warning`` event and is switched off; the run goes on.

Why our own fan-out instead of each library's trainer callbacks: those belong to
``transformers.Trainer`` and ``accelerate``; this trainer has neither loop. The backends'
own writers are used as they are (``torch.utils.tensorboard.SummaryWriter``, ``wandb.init``,
``mlflow.MlflowClient``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import sys
import threading
import time
import typing as t
import urllib.parse
from dataclasses import dataclass, field

from remote_payload import boundedread, wire

#: Every backend ``--report-to`` knows, by Hugging Face's names.
CHOICES = ("tensorboard", "wandb", "mlflow")
#: The import each backend needs (``all`` picks those that are installed).
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
#: Metric events waiting for the backends; above this many, new ones are dropped and counted.
QUEUE_SIZE = 1024
#: How long :meth:`Trackers.close` waits for the backends to write and finish: within the
#: 30 s ``opsctl stop`` grants after SIGTERM (the final checkpoint is already written by then).
CLOSE_TIMEOUT_S = 20.0
#: Event kind -> metric prefix. The metrics of an event are its numeric fields.
PREFIXES = {"step": "train", "eval": "eval", "acceptance": "eval"}
#: Fields of those events that are bookkeeping, not metrics.
NOT_METRICS = frozenset({"step", "budget_s", "_at", "role", "blocks", "prompts", "new_tokens",
                         "block_size", "seconds"})
#: W&B's and MLflow's own defaults when the environment names no project / experiment.
DEFAULT_PROJECT = "dflash"
#: MLflow's HTTP retries and timeout unless the environment sets them (its defaults, 7 retries
#: with back-off and 120 s, would keep a dead server's first call busy for minutes).
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
                        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


class ReportToError(ValueError):
    """A bad ``--report-to`` value: nothing was started."""


def parse_report_to(text: str) -> tuple[str, ...]:
    """``--report-to`` as backend names, in order; ``all`` stays ``("all",)`` (see :func:`resolve`).

    Raises:
        ReportToError: an unknown name (the message lists the choices), a name given twice,
            ``none`` or ``all`` beside other names, or an empty entry.
    """
    names = [n.strip().lower() for n in text.split(",")]
    shown = text if len(text) <= 80 else text[:80] + f"... ({len(text)} characters)"
    if any(not n for n in names):
        raise ReportToError(f"--report-to {shown!r}: an empty name; choices: "
                            f"{', '.join((*CHOICES, 'all', 'none'))}")
    unknown = [n for n in names if n not in (*CHOICES, "all", "none")]
    if unknown:
        raise ReportToError(f"--report-to: unknown tracker {unknown[0][:80]!r}; choices: "
                            f"{', '.join((*CHOICES, 'all', 'none'))}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ReportToError(f"--report-to {shown!r}: {twice[0]!r} is named twice")
    for word in ("none", "all"):
        if word in names and len(names) > 1:
            raise ReportToError(f"--report-to {shown!r}: {word!r} stands alone (it means "
                                f"{'no tracker' if word == 'none' else 'every installed one'})")
    return () if names == ["none"] else tuple(names)


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(PACKAGES[name]) is not None
    except (ImportError, ValueError):
        return False


def resolve(names: t.Sequence[str]) -> tuple[str, ...]:
    """``("all",)`` -> the installed backends; anything else as it is."""
    if tuple(names) == ("all",):
        return tuple(n for n in CHOICES if installed(n))
    return tuple(names)


def metrics_of(event: str, fields: t.Mapping[str, t.Any]) -> tuple[dict[str, float], int] | None:
    """The metrics an event carries, and the step they belong to (None: not a metric event)."""
    prefix = PREFIXES.get(event)
    if prefix is None:
        return None
    out: dict[str, float] = {}
    for k, v in fields.items():
        if k in NOT_METRICS or isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            out[f"{prefix}/{k}"] = float(v)
        elif isinstance(v, list) and v and all(isinstance(x, int | float) and not isinstance(x, bool)
                                                for x in v):
            out.update({f"{prefix}/{k}_{i + 1}": float(x) for i, x in enumerate(v)})
    step = fields.get("step")
    if not out:
        return None
    return out, step if isinstance(step, int) and not isinstance(step, bool) else 0


# --- the run's goodput, as the job's wrapper keeps it ------------------------------------

#: The causes of the run's ledger (``remote_payload.agent.goodput.CAUSES``; a test holds
#: them equal): each but ``productive`` is logged as ``goodput/badput_s/<cause>``.
GOODPUT_CAUSES = ("productive", "startup", "compile", "checkpoint", "stall", "lost",
                  "shutdown", "restart_gap", "queue_wait", "unknown")
#: The summary file is read at most this often (a step event between reads logs nothing new).
GOODPUT_READ_EVERY_S = 10.0
#: A summary file larger than this is damaged, never read whole.
GOODPUT_MAX_BYTES = 1 << 20
_GOODPUT_RANGE = {"goodput": (0.0, 1.0), "effective_tok_s": (0.0, 1e15), "wall_s": (0.0, 1e11)}




def goodput_metrics(data: bytes) -> tuple[float, dict[str, float]] | None:
    """``(computed at, scalars)`` of the summary file's bytes: ``goodput/ratio``,
    ``goodput/effective_tok_s``, ``goodput/wall_s`` and ``goodput/badput_s/<cause>``.

    The file sits in the job dir, where anything in the container may write, so it is
    untrusted: anything damaged (not UTF-8 JSON, not the summary's shape, a number out of its
    range or not finite, an unknown cause) is None, "no scalar this time". A figure the
    ledger has not got yet (``null``: no wall time) is left out. Never raises."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(doc, dict):
        return None
    at, summary = wire.number_in(doc.get("at"), 0.0, 1e11), doc.get("summary")
    if at is None or not isinstance(summary, dict):
        return None
    out: dict[str, float] = {}
    for key, (low, high) in _GOODPUT_RANGE.items():
        v = summary.get(key)
        if v is None:
            continue
        f = wire.number_in(v, low, high)
        if f is None:
            return None
        out["goodput/ratio" if key == "goodput" else f"goodput/{key}"] = f
    causes = summary.get("causes")
    if causes is not None:
        if not isinstance(causes, dict) or not set(causes) <= set(GOODPUT_CAUSES):
            return None
        for cause, v in causes.items():
            f = wire.number_in(v, 0.0, 1e11)
            if f is None:
                return None
            if cause != "productive":
                out[f"goodput/badput_s/{cause}"] = f
    return (at, out) if out else None


class GoodputFile:
    """The run's goodput summary that the job's wrapper refreshes (``OPSCTL_GOODPUT_FILE``):
    read at most every :data:`GOODPUT_READ_EVERY_S`, through the bounded reader (a regular
    file of at most :data:`GOODPUT_MAX_BYTES`; a link or a FIFO there is refused, never
    followed or waited on), and its scalars given once per refresh of the file."""

    def __init__(self, path: str, every_s: float = GOODPUT_READ_EVERY_S,
                 clock: t.Callable[[], float] = time.monotonic):
        self.path = path
        self.every_s = every_s
        self.clock = clock
        self.read_at: float | None = None
        self.logged_at: float | None = None  # the file's own "at" last given

    def poll(self) -> dict[str, float] | None:
        """The file's scalars when it was refreshed since the last ones given, else None."""
        now = self.clock()
        if self.read_at is not None and now - self.read_at < self.every_s:
            return None
        self.read_at = now
        try:
            data = boundedread.read_regular(self.path, GOODPUT_MAX_BYTES)
        except OSError:  # not there yet, a link, a FIFO, too large: no scalar this time
            return None
        got = goodput_metrics(data)
        if got is None or got[0] == self.logged_at:
            return None
        self.logged_at = got[0]
        return got[1]


@dataclass
class RunInfo:
    """What every backend is started with."""

    run_id: str
    out_dir: str  # the run directory (checkpoints); trackers write beside them
    config: dict[str, t.Any] = field(default_factory=dict)  # flat: "args.lr", "model.block_size"
    tags: dict[str, str] = field(default_factory=dict)  # torch build, payload digest


def flatten(prefix: str, doc: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """``{"a": {"b": 1}}`` -> ``{"prefix.a.b": 1}``; lists and tuples as JSON text."""
    out: dict[str, t.Any] = {}
    for k, v in doc.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(key, v))
        elif isinstance(v, list | tuple):
            out[key] = json.dumps(list(v))
        else:
            out[key] = v
    return out


#: Environment variables whose values are credentials (W&B's key, MLflow's basic auth and
#: token); :func:`secret_texts` adds the password of ``MLFLOW_TRACKING_URI``.
SECRET_ENV = ("WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


def secret_texts(environ: t.Mapping[str, str]) -> list[str]:
    """Every text a warning must not carry: each credential of ``environ`` as it is, stripped,
    and escaped the way ``repr`` and JSON write it (a library's error often quotes a header
    value with ``repr``), and the ``user:password`` of the tracking URI. Longest first, so a
    shorter form never leaves part of a longer one."""
    values = [environ.get(k, "") for k in SECRET_ENV]
    with contextlib.suppress(ValueError):
        netloc = urllib.parse.urlsplit(environ.get("MLFLOW_TRACKING_URI", "")).netloc
        if "@" in netloc:
            userinfo = netloc.rsplit("@", 1)[0]
            password = userinfo.partition(":")[2]
            values += [userinfo, password, urllib.parse.unquote(password)]
    forms: set[str] = set()
    for v in values:
        for form in (v, v.strip(), repr(v)[1:-1], json.dumps(v)[1:-1],
                     urllib.parse.quote(v, safe="")):
            if len(form.strip()) >= 4:  # a one-letter "password" would blank every warning
                forms.add(form)
    return sorted(forms, key=len, reverse=True)


def redact(text: str, secrets: t.Sequence[str]) -> str:
    """``text`` with every secret replaced by ``***``; withheld whole when a replacement
    itself leaves one (a key made of ``*`` beside more of them)."""
    for s in secrets:
        text = text.replace(s, "***")
    if any(s in text for s in secrets):
        return "(the message is withheld: it quotes a credential)"
    return text


def redact_uri(uri: str) -> str:
    """A tracking URI without its user:password (it goes in an event)."""
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return "<unparsable uri>"
    if "@" not in parts.netloc:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


# --- backends ------------------------------------------------------------------------


class Tracker(t.Protocol):
    """One backend. Every method may raise: the fan-out turns that into a warning."""

    name: str

    def where(self, info: RunInfo) -> str:
        """Where it writes (a directory or a URI, without credentials), said before it starts."""

    def start(self, info: RunInfo) -> None: ...

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self, ok: bool) -> None: ...


class TensorBoard:
    """Event files under ``<out_dir>/tensorboard/<run_id>`` (one TensorBoard run per trainer
    run; point TensorBoard at ``<out_dir>/tensorboard`` to compare them)."""

    name = "tensorboard"

    def __init__(self) -> None:
        self.writer: t.Any = None

    @staticmethod
    def logdir(out_dir: str) -> str:
        return os.path.join(os.path.abspath(out_dir), "tensorboard")

    def where(self, info: RunInfo) -> str:
        return self.logdir(info.out_dir)

    def start(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=os.path.join(self.logdir(info.out_dir), info.run_id),
                                    flush_secs=10)
        scalars = {k: v for k, v in info.config.items()
                   if isinstance(v, int | float | str | bool) and v is not None}
        # the hparams plugin's summaries in this run's own file (add_hparams would make a
        # sub-run per call); the metrics it pairs them with are the ones logged later
        for summary in hparams(scalars, {"train/loss": float("nan")}):  # type: ignore[no-untyped-call]
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("config", "```\n" + json.dumps(info.config, indent=1, default=str)
                             + "\n```")
        self.writer.add_text("tags", "  \n".join(f"{k}: {v}" for k, v in info.tags.items()))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def finish(self, ok: bool) -> None:
        if self.writer is not None:
            self.writer.close()


class WandB:
    """A W&B run: offline (files under ``$WANDB_DIR`` or ``<out_dir>/wandb``) unless a
    ``WANDB_API_KEY`` reaches the job (``secrets:`` in the playbook) or ``WANDB_MODE`` says
    otherwise. The key stays in the environment: it is never passed, written or logged here."""

    name = "wandb"

    def __init__(self) -> None:
        self.run: t.Any = None

    @staticmethod
    def mode() -> str:
        return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")

    def where(self, info: RunInfo) -> str:
        return os.path.join(os.path.abspath(os.environ.get("WANDB_DIR") or info.out_dir), "wandb")

    def start(self, info: RunInfo) -> None:
        import wandb as wandb_module

        wandb: t.Any = wandb_module  # its signatures change between releases; checked here by tests
        base = os.path.abspath(os.environ.get("WANDB_DIR") or info.out_dir)
        os.makedirs(base, exist_ok=True)
        wanted = {"console": "off", "silent": True, "disable_code": True, "disable_git": True,
                  "x_disable_stats": True, "init_timeout": 60.0}
        known = getattr(wandb.Settings, "model_fields", wanted)  # older wandb: take them all
        settings = wandb.Settings(**{k: v for k, v in wanted.items() if k in known})
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, name=info.run_id,
            dir=base, config=info.config, mode=self.mode(), settings=settings,
            tags=[f"{k}:{v}"[:64] for k, v in info.tags.items()])

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, ok: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if ok else 1)


class MLflow:
    """An MLflow run in ``$MLFLOW_TRACKING_URI`` (the playbook's ``env``), else in a SQLite
    store in the run directory (``<out_dir>/mlflow.db``: MLflow 3 refuses its old file
    store). Experiment: ``$MLFLOW_EXPERIMENT_NAME`` or ``dflash``."""

    name = "mlflow"
    #: parameter values MLflow accepts (6000 characters); longer ones are cut
    MAX_PARAM = 6000

    def __init__(self) -> None:
        self.client: t.Any = None
        self.run_id = ""

    @staticmethod
    def uri(out_dir: str) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or \
            "sqlite:///" + os.path.join(os.path.abspath(out_dir), "mlflow.db")

    def where(self, info: RunInfo) -> str:
        return redact_uri(self.uri(info.out_dir))

    def start(self, info: RunInfo) -> None:
        for k, v in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(k, v)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = self.uri(info.out_dir)
        if uri.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(uri[len("sqlite:///"):]) or ".", exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        run = self.client.create_run(exp_id, run_name=info.run_id, tags=dict(info.tags))
        self.run_id = run.info.run_id
        params = [Param(k, str(v)[:self.MAX_PARAM]) for k, v in info.config.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def finish(self, ok: bool) -> None:
        if self.client is not None and self.run_id:
            self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


BACKENDS: dict[str, t.Callable[[], Tracker]] = {
    "tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


# --- the fan-out -----------------------------------------------------------------------

#: ``warn(tracker, message, **extra)``: one ``warning`` event.
Warn = t.Callable[..., None]
_END = object()
#: Set when :meth:`Trackers.close` left a backend unfinished (see :func:`leave_if_abandoned`).
_ABANDONED = threading.Event()
#: The packages whose own threads' failures are a tracker's (a warning), not the run's traceback.
BACKEND_MODULES = ("tensorboard", "torch.utils.tensorboard", "wandb", "mlflow")


def leave_if_abandoned(rc: int) -> None:
    """End the process now, without the interpreter's exit hooks, when a backend was left
    unfinished at :meth:`Trackers.close`.

    Why: a backend's own exit hook waits for the work it never finished (W&B's waits for its
    service, which keeps calling a mute server for a minute and more), so a run that already
    said everything would outlive ``opsctl stop``'s grace and be killed. Its output is flushed
    first; the backend's files are as the close left them (said in the warning)."""
    if _ABANDONED.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def _backend_thread(thread: threading.Thread | None, tb: t.Any) -> str | None:
    """The backend package whose code a failed thread ran (its class, or a frame of its
    traceback), if any."""
    modules = [type(thread).__module__] if thread is not None else []
    while tb is not None:
        modules.append(str(tb.tb_frame.f_globals.get("__name__", "")))
        tb = tb.tb_next
    for module in modules:
        for name in BACKEND_MODULES:
            if module == name or module.startswith(name + "."):
                return name.rsplit(".", 1)[-1]
    return None


class _Lane:
    """One backend's queue and thread: a slow or mute backend holds up only itself."""

    def __init__(self, backend: Tracker, queue_size: int):
        self.backend = backend
        self.queue: queue.Queue[t.Any] = queue.Queue(queue_size)
        self.dropped = 0
        self.thread: threading.Thread | None = None


class Trackers:
    """Every backend of one run, each behind its own bounded queue and thread.

    The trainer calls :meth:`on_event` for each event it prints (never blocks) and
    :meth:`close` once at the end. Each backend's failure is reported once and switches that
    backend off; the others go on, and a slow one (a mute MLflow server: each call its HTTP
    timeout) delays and drops only its own metrics.
    """

    def __init__(self, backends: t.Sequence[Tracker], info: RunInfo, warn: Warn, *,
                 queue_size: int = QUEUE_SIZE, goodput: GoodputFile | None = None):
        self.backends = list(backends)  # the ones still on (a failure takes one out)
        self.goodput = goodput  # the run's ledger, logged beside a step event's metrics
        self.info = info
        self.warn = warn
        self.failed: dict[str, str] = {}
        self.secrets = secret_texts(os.environ)
        self._closed = threading.Event()  # set once close() has said its last word
        self._excepthook = threading.excepthook
        threading.excepthook = self._thread_failed
        self.lanes = [_Lane(b, queue_size) for b in self.backends]
        for lane in self.lanes:
            lane.thread = threading.Thread(target=self._work, args=(lane,), daemon=True,
                                           name=f"trackers-{lane.backend.name}")
            lane.thread.start()

    @property
    def dropped(self) -> int:
        """Metric events dropped, summed over the backends."""
        return sum(lane.dropped for lane in self.lanes)

    def on_event(self, event: str, fields: t.Mapping[str, t.Any]) -> None:
        try:
            got = metrics_of(event, fields)
        except (ValueError, TypeError, OverflowError) as exc:  # an int past float: never the run's
            self._warn("all", f"a {event} event's metrics could not be read: {type(exc).__name__}: {exc}")
            return
        if got is None:
            return
        if event == "step" and self.goodput is not None:
            try:
                extra = self.goodput.poll()
            except Exception as exc:  # a reader bug costs the goodput scalars, never the run
                self.goodput = None
                self._warn("all", f"the goodput summary could not be read: {type(exc).__name__}: "
                                  f"{exc}; no goodput scalars for this run")
                extra = None
            if extra:
                got = ({**got[0], **extra}, got[1])
        for lane in self.lanes:
            if lane.backend not in self.backends:
                continue
            try:
                lane.queue.put_nowait(got)
            except queue.Full:
                lane.dropped += 1
                if lane.dropped == 1:
                    name = lane.backend.name
                    self._warn(name, f"{name} falls behind: more than {lane.queue.maxsize} metric "
                                     "events wait; new ones are dropped (counted at the end)")

    def close(self, ok: bool, timeout: float | None = None) -> None:
        """Hand the backends the end of the run and wait (at most ``timeout`` s, all together;
        default :data:`CLOSE_TIMEOUT_S`) for them.

        A backend still busy then is named in one warning and says nothing more: its later
        failure would be an event after the run's ``done``, which every reader takes as the
        run's last word. A second call does nothing."""
        if self._closed.is_set():  # closed already: the run's end closes it once more
            return
        timeout = CLOSE_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        unmarked = list(self.lanes)  # a full queue takes its end mark once there is room
        while True:
            for lane in list(unmarked):
                with contextlib.suppress(queue.Full):
                    lane.queue.put_nowait((_END, ok))
                    unmarked.remove(lane)
            alive = [lane.thread for lane in self.lanes if lane.thread and lane.thread.is_alive()]
            left = deadline - time.monotonic()
            if not alive or left <= 0:
                break
            alive[0].join(min(0.05, left))
        for lane in self.lanes:
            if lane.dropped:
                name = lane.backend.name
                self._warn(name, f"{lane.dropped} metric event(s) were dropped: {name} fell behind",
                           dropped=lane.dropped)
        busy = [lane.backend.name for lane in self.lanes if lane.thread and lane.thread.is_alive()]
        if not busy and threading.excepthook == self._thread_failed:
            threading.excepthook = self._excepthook
        if busy:
            _ABANDONED.set()
            self._warn("all", f"{', '.join(busy)} did not finish within {timeout:g} s; left "
                              "unfinished (their last metrics may be missing)")
        self._closed.set()

    # --- the threads ---

    def _thread_failed(self, args: t.Any) -> None:
        """A backend library's own thread died (TensorBoard's writer on a full disk): one
        warning instead of a traceback in the job's output (the backend's next call fails
        too and switches it off). Any other thread's failure goes to the previous hook."""
        name = _backend_thread(args.thread, args.exc_traceback)
        if name is None or args.exc_type is SystemExit:
            self._excepthook(args)
            return
        self._warn(name, f"a {name} thread ({args.thread.name}) failed: "
                         f"{args.exc_type.__name__}: {args.exc_value}")

    def _work(self, lane: _Lane) -> None:
        b = lane.backend
        self._call(b, "start", self.info)
        while True:
            item = lane.queue.get()
            if isinstance(item, tuple) and item and item[0] is _END:
                if b in self.backends:
                    self._call(b, "finish", bool(item[1]))
                return
            if b in self.backends:
                metrics, step = item
                self._call(b, "log", metrics, step)

    def _call(self, backend: Tracker, what: str, *args: t.Any) -> None:
        try:
            getattr(backend, what)(*args)
        except BaseException as exc:  # a tracker's failure (even its sys.exit) is never the run's
            with contextlib.suppress(ValueError):
                self.backends.remove(backend)
            self.failed[backend.name] = f"{type(exc).__name__}: {exc}"
            self._warn(backend.name, f"{backend.name} failed at {what} and is switched off for "
                                     f"this run: {type(exc).__name__}: {exc}")
            if what == "log":
                with contextlib.suppress(BaseException):
                    backend.finish(False)

    def _warn(self, tracker: str, message: str, **extra: t.Any) -> None:
        if self._closed.is_set():  # a backend close() left behind: already named there
            return
        with contextlib.suppress(Exception):
            self.warn(tracker, redact(message, self.secrets)[:2000], **extra)


def open_trackers(names: t.Sequence[str], info: RunInfo, warn: Warn,
                  say: t.Callable[..., None], goodput_file: str | None = None) -> Trackers | None:
    """Start the named backends (``all`` resolved); ``say(**fields)`` gets where each
    writes (the ``trackers`` event). None when there are none. ``goodput_file``: the run's
    goodput summary (the job's ``OPSCTL_GOODPUT_FILE``), whose scalars go with the step
    metrics (:class:`GoodputFile`).

    A backend whose package is missing costs a warning, not the run."""
    names = resolve(names)
    if not names:
        return None
    backends: list[Tracker] = []
    for n in names:
        if not installed(n):
            warn(n, f"{n} is not installed in this environment; not reporting to it (add "
                    f"{PACKAGES[n]!r} to the playbook's requirements)")
            continue
        backends.append(BACKENDS[n]())
    if not backends:
        return None
    say(report_to=[b.name for b in backends], run=info.run_id,
        **{b.name: b.where(info) for b in backends})
    return Trackers(backends, info, warn,
                    goodput=GoodputFile(goodput_file) if goodput_file else None)
