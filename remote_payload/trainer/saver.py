"""Periodic checkpoints that training does not wait for: host staging and one background writer.

A periodic checkpoint (``--ckpt-every K``, ``--ckpt-write background``, the default) is
taken in two halves:

1. **Staging**, on the training thread at a step boundary. The drafter's fp32 weights and
   AdamW's state (both moments and the step counters; the rest of ``optim.state_dict()``, its
   param groups, is small Python data, copied as it is) are copied into host buffers that
   were allocated once and are reused for every checkpoint. On CUDA the buffers are pinned
   (page-locked) and the copies are queued, ``non_blocking``, on a side stream ordered after
   the step that produced the state; an event recorded after them is what the next optimizer
   step waits on (on the GPU: :attr:`.engine.Engine.pending_copy`) and what the writer waits
   on (on the CPU). The training thread does not wait at all: the next step's forward and
   backward run while the copy is in flight, and only its optimizer step, which overwrites
   the weights and moments, is ordered after the copy. Measured on an H200: 12.6 GB (the 8B
   drafter's state) copy in 0.23 s pinned and 10.8 s pageable (which is what ``.cpu()``
   makes); pinning them takes ~11 s, so they are pinned once, on the writer thread, after
   the first step (when AdamW's state exists), while training goes on. On CPU the buffers
   are plain memory and the copy is synchronous (it is a ``memcpy``).
2. **Committing**, on the writer thread: it waits for the copy's event, then writes the
   checkpoint through :func:`.checkpoint.commit` (the layout of :func:`.checkpoint.save`,
   through :mod:`remote_payload.safe_write`: a temporary sibling directory, fsync, rename),
   then replaces ``latest``, then applies ``--keep-last``/``--keep-every``
   (:func:`.checkpoint.prune`). ``latest`` moves only once the directory is durable, so a
   SIGKILL or a crash mid-write leaves the previous checkpoint and a ``latest`` naming it.

**At most one checkpoint is in flight**: the host buffers hold one copy, and they are
overwritten only once the writer is done with them. A checkpoint due while the writer is still
busy (the disk slower than ``--ckpt-every`` steps, or the buffers still being pinned) is
*deferred*: one ``warning`` event (``source: checkpoint``) says so, and the checkpoint is taken
at the first step boundary where the writer is free (its ``checkpoint`` event carries
``deferred_from``). Deferring, not waiting: waiting would stop training for the disk, the very
stall this module removes. Deferring, not skipping: a skipped checkpoint would leave up to
twice ``--ckpt-every`` steps of progress unsaved; a deferred one is taken as soon as it can be,
and no second copy is ever queued in memory.

The final checkpoint (the last step, a stop, SIGINT/SIGTERM) is synchronous, as it always
was: :meth:`Checkpointer.final` waits for the write in flight, then stages and commits the
last state before the trainer says ``done``.

``--ckpt-write sync`` is the previous behaviour (:func:`.checkpoint.save` on the training
thread at each periodic checkpoint, pageable copies): kept for comparison
(``benchmarks/checkpoint_stall.py``) and as a fallback.

Why not ``torch.distributed.checkpoint``: ``async_save`` writes DCP's own layout (``.distcp``
shards and a ``.metadata`` file), which neither the export (z-lab's safetensors) nor a resume
reads; its ``HuggingFaceStorageWriter`` writes the weights as safetensors but not AdamW's state
as ``optim.pt``, and neither writer goes through :mod:`~remote_payload.safe_write` (the marker,
the fsyncs, the refusals). Its staging (``torch.distributed.checkpoint.staging.DefaultStager``)
does what step 1 does, with two differences that matter here: synchronous, it synchronizes the
whole device after the copy (the training thread waits for the GPU); asynchronous, it copies on
a stream that is not ordered after the step that produced the state, so the caller must wait
for the staging before the next optimizer step. The staging here is therefore plain torch, in
DCP's manner: one host buffer per tensor (safetensors refuses tensors that share a storage),
pinned with ``cudaHostRegister`` (as DCP's ``StateDictStager`` does, so the sizes are not
rounded up to powers of two by the caching host allocator), reused, a side stream and events.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import time
import typing as t
from dataclasses import dataclass, field

import torch
from torch import nn

from . import checkpoint

#: test switch: ``STEP:SECONDS`` makes the first background write at or after ``STEP`` (a
#: checkpoint due at STEP that a busy writer deferred is the next one) sleep that long between
#: its weights and its optimizer state (a child killed mid-write, a deferred checkpoint)
ENV_WRITE_PAUSE = "OPSCTL_TRAINER_TEST_WRITE_PAUSE"

#: ``--ckpt-write``'s choices
MODES = ("background", "sync")

#: where a tensor sits in a state: its keys and indices, outermost first
Key = tuple[str | int, ...]


def _leaves(obj: t.Any, path: Key = ()) -> t.Iterator[tuple[Key, torch.Tensor]]:
    """Every tensor in a nest of dicts, lists and tuples, with its path."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))


def _rebuild(obj: t.Any, swap: t.Callable[[Key, torch.Tensor], torch.Tensor],
             path: Key = ()) -> t.Any:
    """The same nest with each tensor replaced by ``swap(path, tensor)`` (the rest copied)."""
    if isinstance(obj, torch.Tensor):
        return swap(path, obj)
    if isinstance(obj, dict):
        return {k: _rebuild(v, swap, (*path, k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebuild(v, swap, (*path, i)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(_rebuild(v, swap, (*path, i)) for i, v in enumerate(obj))
    return obj


def _layout(state: t.Any) -> tuple[tuple[Key, tuple[int, ...], torch.dtype], ...]:
    return tuple((p, tuple(x.shape), x.dtype) for p, x in _leaves(state))


class HostStaging:
    """Host buffers for one copy of a training state, allocated once and reused.

    On CUDA each buffer is pinned with ``cudaHostRegister`` (a pageable tensor that is then
    page-locked: no power-of-two rounding, unlike ``pin_memory()``); where pinning fails the
    buffer stays pageable (slower copies, never wrong ones)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.layout: tuple[tuple[Key, tuple[int, ...], torch.dtype], ...] = ()
        self.buffers: dict[Key, torch.Tensor] = {}
        self.pinned: list[int] = []  # data pointers registered with CUDA
        self.bytes = 0
        self.allocate_s = 0.0
        self.stream: t.Any = None
        #: how the buffers are pinned: registered (cudaHostRegister), pin_memory, or pageable
        self.how = "pageable"

    def ready_for(self, state: t.Any) -> bool:
        return bool(self.buffers) and _layout(state) == self.layout

    def allocate(self, layout: tuple[tuple[Key, tuple[int, ...], torch.dtype], ...]) -> None:
        """Make the buffers for ``layout`` (any thread; ~11 s for 12.6 GB pinned on an H200)."""
        self.release()
        t0 = time.perf_counter()
        cuda = self.device.type == "cuda"
        buffers: dict[Key, torch.Tensor] = {}
        for path, shape, dtype in layout:
            buf = torch.empty(shape, dtype=dtype, device="cpu")
            nbytes = buf.numel() * buf.element_size()
            if cuda and nbytes and self.how != "pin_memory":
                cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
                rc = int(cudart.cudaHostRegister(buf.data_ptr(), nbytes, 0))
                if rc == 0:
                    self.pinned.append(buf.data_ptr())
                    self.how = "registered"
                else:  # a runtime without host registration: the caching host allocator's
                    self.how = "pin_memory"  # pinned blocks (sizes rounded up to powers of two)
            if cuda and nbytes and self.how == "pin_memory":
                buf = buf.pin_memory()
            buffers[path] = buf
            self.bytes += nbytes
        self.buffers, self.layout = buffers, layout
        self.allocate_s = round(time.perf_counter() - t0, 3)

    def release(self) -> None:
        if self.pinned and torch.cuda.is_available():
            cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            for ptr in self.pinned:
                cudart.cudaHostUnregister(ptr)
        self.pinned, self.buffers, self.layout, self.bytes = [], {}, (), 0

    def copy(self, state: t.Any) -> tuple[t.Any, t.Any]:
        """Queue the copy of ``state`` into the buffers; returns (the host copy, an event to
        wait on before reading it or changing ``state``: None when the copy is done).

        On CUDA the copies run on a side stream after everything queued so far on the current
        stream (the step that produced ``state``). The buffers must fit (:meth:`ready_for`)."""
        if self.device.type != "cuda":
            return _rebuild(state, lambda p, x: self.buffers[p].copy_(x.detach())), None
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            host = _rebuild(state, lambda p, x: self.buffers[p].copy_(x.detach(), non_blocking=True))
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        return host, done


@dataclass
class Job:
    """One checkpoint taken: what it holds and how long training waited for it."""

    step: int
    mode: str  # background | sync | final
    blocked_s: float = 0.0  # the training thread's time in the checkpoint call
    deferred_from: int | None = None
    path: pathlib.Path | None = None
    write_s: float = 0.0
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # "<name>: <why it was not removed>"

    def event(self) -> dict[str, t.Any]:
        """The ``checkpoint`` event's fields."""
        out: dict[str, t.Any] = {"step": self.step, "path": str(self.path), "mode": self.mode,
                                 "blocked_s": round(self.blocked_s, 4),
                                 "write_s": round(self.write_s, 3)}
        if self.deferred_from is not None:
            out["deferred_from"] = self.deferred_from
        if self.removed:
            out["removed"] = self.removed
        if self.kept:
            out["kept"] = self.kept
        return out


def _write_pause(step: int, held: list[int]) -> float:
    """:data:`ENV_WRITE_PAUSE`'s seconds for the write of ``step`` (0 when unset, before its
    step, or once ``held``, the checkpointer's own record, has one write)."""
    raw = os.environ.get(ENV_WRITE_PAUSE, "")
    want, _, secs = raw.partition(":")
    try:
        if not raw or held or step < int(want):
            return 0.0
        held.append(step)
        return float(secs)
    except ValueError:
        return 0.0


class Checkpointer:
    """Rank 0's checkpoints: periodic ones (background or sync), the final one, pruning.

    Call :meth:`step_end` at every step boundary; it returns the events to send (the trainer
    prints them: only the training thread writes events). Not thread-safe: one caller."""

    def __init__(self, out_dir: str, raw: nn.Module, optim: torch.optim.Optimizer,
                 device: torch.device, *, mode: str = "background", keep_last: int = 0,
                 keep_every: int = 0, owners: t.Collection[str] = ()):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}; choices: {', '.join(MODES)}")
        self.out_dir, self.raw, self.optim, self.device = out_dir, raw, optim, device
        self.mode, self.keep_last, self.keep_every = mode, keep_last, keep_every
        self.owners = frozenset(owners)
        self.staging = HostStaging(device)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ckpt-writer")
        self._busy: concurrent.futures.Future[Job | None] | None = None
        self._pending: int | None = None  # a due step not taken yet (the writer was busy)
        self._warned = False
        self._in_flight: int | None = None  # the step the writer holds (None: pinning)
        self._paused: list[int] = []  # the write ENV_WRITE_PAUSE held (a test's, once)
        self.engine_hook: t.Callable[[t.Any], None] | None = None  # gets the copy's event

    # --- the state -------------------------------------------------------------------

    def _state(self) -> dict[str, t.Any]:
        return {"model": self.raw.state_dict(), "optim": self.optim.state_dict()}

    def busy(self) -> bool:
        return self._busy is not None and not self._busy.done()

    def _collect(self) -> list[tuple[str, dict[str, t.Any]]]:
        """The finished job's event (re-raising its error: a periodic write that failed ends
        the run as a synchronous one does)."""
        if self._busy is None or not self._busy.done():
            return []
        fut, self._busy = self._busy, None
        job = fut.result()
        return [] if job is None else [("checkpoint", job.event())]

    # --- the loop's calls ------------------------------------------------------------

    def step_end(self, step: int, due: bool, meta: t.Callable[[], dict[str, t.Any]], *,
                 last: bool = False) -> list[tuple[str, dict[str, t.Any]]]:
        """After optimizer step ``step``: report a finished write, take a checkpoint that is
        due (or was deferred), and after the first step pin the host buffers (background).
        ``last``: the final checkpoint comes next, so a deferred one is not taken."""
        events = self._collect()
        if last:
            self._pending = None
            return events
        if due and self._pending is None:
            self._pending = step
        if self.mode == "background" and not self.staging.buffers and not self.busy():
            layout = _layout(self._state())
            if self.device.type == "cuda":  # seconds of pinning: on the writer, as training goes on
                self._busy = self._pool.submit(self._allocate, layout)
                self._in_flight = None
            else:  # plain memory: as fast here as there
                self.staging.allocate(layout)
        if self._pending is None:
            return events
        if self.mode == "sync":
            events.append(("checkpoint", self._sync(step, meta()).event()))
            self._pending = None
            return events
        if self.busy():
            if not self._warned:
                self._warned = True
                events.append(("warning", self._deferred_warning(step)))
            return events
        due_at, self._pending, self._warned = self._pending, None, False
        t0 = time.perf_counter()
        state = self._state()
        if not self.staging.ready_for(state):  # the layout changed: re-made here, once
            self.staging.allocate(_layout(state))
        host, done = self.staging.copy(state)
        if done is not None and self.engine_hook is not None:
            self.engine_hook(done)
        job = Job(step, "background", deferred_from=due_at if due_at != step else None)
        job.blocked_s = time.perf_counter() - t0
        self._busy = self._pool.submit(self._write, job, host, done, meta())
        self._in_flight = step
        return events

    def _deferred_warning(self, step: int) -> dict[str, t.Any]:
        writing = self._in_flight
        what = (f"ckpt-{writing:07d} is still being written" if writing is not None
                else "the host buffers are still being pinned")
        return {"source": "checkpoint", "step": step, "writing": writing,
                "message": f"checkpoint due at step {self._pending} deferred: {what}; it is "
                           "taken at the first step the writer is free (a disk slower than "
                           "--ckpt-every steps: raise --ckpt-every)"}

    def drain(self) -> list[tuple[str, dict[str, t.Any]]]:
        """Wait for the write in flight; its event (its error re-raised)."""
        if self._busy is not None:
            concurrent.futures.wait([self._busy])
        return self._collect()

    def final(self, step: int, meta: dict[str, t.Any]) -> Job:
        """The last checkpoint, written synchronously (staged in the pinned buffers when they
        exist): durable when this returns. Call :meth:`drain` first."""
        t0 = time.perf_counter()
        state = self._state()
        if self.staging.ready_for(state):
            host, done = self.staging.copy(state)
            job = Job(step, "final")
            self._write(job, host, done, meta)
        else:
            job = self._sync(step, meta)
            job.mode = "final"
        job.write_s = job.blocked_s = time.perf_counter() - t0
        return job

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.staging.release()

    # --- the halves ------------------------------------------------------------------

    def _allocate(self, layout: tuple[tuple[Key, tuple[int, ...], torch.dtype], ...]) -> None:
        self.staging.allocate(layout)
        return None

    def _sync(self, step: int, meta: dict[str, t.Any]) -> Job:
        t0 = time.perf_counter()
        job = Job(step, "sync")
        job.path = checkpoint.save(self.out_dir, step, self.raw, self.optim, meta)
        job.removed, job.kept = self._prune()
        job.blocked_s = job.write_s = time.perf_counter() - t0
        return job

    def _write(self, job: Job, host: dict[str, t.Any], done: t.Any, meta: dict[str, t.Any]) -> Job:
        t0 = time.perf_counter()
        if done is not None:
            done.synchronize()
        pause = _write_pause(job.step, self._paused) if job.mode == "background" else 0.0
        job.path = checkpoint.commit(
            self.out_dir, job.step, host["model"], host["optim"], meta,
            after_weights=(lambda: time.sleep(pause)) if pause else None)
        job.removed, job.kept = self._prune()
        job.write_s = time.perf_counter() - t0
        return job

    def _prune(self) -> tuple[list[str], list[str]]:
        if not self.keep_last:
            return [], []
        return checkpoint.prune(self.out_dir, keep_last=self.keep_last,
                                keep_every=self.keep_every, owners=self.owners)
