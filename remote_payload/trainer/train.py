"""The training loop: setup, compile discipline, steps, events, checkpoints, signals.

Launch (see the package docstring for more)::

    python -m remote_payload.trainer --preset tiny --device cpu --attn sdpa --steps 40
    python -m remote_payload.trainer --preset qwen3-8b --nproc 8 --topology split --target-ranks 5
    torchrun --nproc-per-node 8 -m remote_payload.trainer --preset qwen3-8b --topology split \\
        --target-ranks 5
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import signal
import socket
import sys
import time
import typing as t
import uuid

import torch

from .. import safe_write, wire
from ..compile_guard import serialized_compile
from . import checkpoint, dist, fp8, saver, schedule, trackers
from .checkpoint import CheckpointError
from .config import DrafterConfig, TrainArgs, TrainerConfigError, parse_args
from .data import Batch, Source, SyntheticSource, make_source
from .engine import Engine, lr_at
from .events import Log, Marks
from .flops import mfu_fields, step_flops
from .target import Target, build_target, config_from_dir

# How long each phase may stay silent (``budget_s`` on its events; the agent calls a silence
# longer than that a hang, 90 s when nothing was announced). Measured on an H200: a bucket's
# cold compile 74-96 s, the Qwen3-8B random target built in seconds; the budgets leave ~3x.
LOAD_BUDGET_S = 90.0  # each loading step: dist rendezvous, building the target, the drafter
LOAD_FROM_DISK_BUDGET_S = 300.0  # --target-path: reading 16 GB of safetensors
COMPILE_BUDGET_S = 300.0  # one shape's first step (compile + run), per bucket
FIRST_STEPS_BUDGET_S = 120.0  # from the end of a compile to the next step event
STEP_BUDGET_FACTOR = 4.0  # a step event is late after 4x the measured time between two
STEP_BUDGET_MIN_S = 30.0
#: most run ids a checkpoint's ``lineage`` carries (a run resumed more often than this forgets
#: its oldest attempts: their checkpoints are then left by --keep-last, never wrongly removed)
LINEAGE_MAX = 64


class _StopFlag:
    """Set by SIGINT/SIGTERM; the loop checks it at step boundaries."""

    requested = False
    signame = ""

    @classmethod
    def handler(cls, signum: int, _frame: t.Any) -> None:
        cls.requested = True
        cls.signame = signal.Signals(signum).name


def _resolve_runtime(args: TrainArgs) -> tuple[torch.device, str, bool, torch.dtype | None]:
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        raise TrainerConfigError("--device cuda but torch.cuda.is_available() is False")
    dev_type = args.device if args.device != "auto" else ("cuda" if cuda else "cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if dev_type == "cuda" else torch.device("cpu")
    attn = args.attn if args.attn != "auto" else ("flex" if dev_type == "cuda" else "sdpa")
    compile_on = args.compile == "on" or (args.compile == "auto" and dev_type == "cuda")
    if attn == "flex" and dev_type == "cpu":
        raise TrainerConfigError(
            "--attn flex on CPU: compiled flex_attention has no CPU backward; use --attn sdpa")
    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and dev_type == "cuda")
    return device, attn, compile_on, torch.bfloat16 if bf16 else None


def _apply_compile_settings(args: TrainArgs, log: Log) -> None:
    """Compile knobs, set here (not at import) so importing the package has no effects."""
    import torch._dynamo.config as dcfg

    limit = max(8, 4 * len(args.buckets()))
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, limit)
    # The agent exports OPSCTL_CACHE_ARTIFACTS (the build's seeded mega-cache) to launched jobs;
    # a seeding run itself (--save-cache-artifacts) must start cold, so it ignores the env.
    path = args.load_cache_artifacts or (
        None if args.save_cache_artifacts else os.environ.get(wire.ENV_ARTIFACTS))
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            data = f.read()
        torch.compiler.load_cache_artifacts(data)
        log.event(wire.EVENT_CACHE_ARTIFACTS_LOADED, path=path, bytes=len(data))


def cache_counters() -> dict[str, int]:
    """Inductor / AOTAutograd cache hit-miss counters (a loaded cache proves nothing
    until these show hits)."""
    from torch._dynamo.utils import counters

    out: dict[str, int] = {}
    for group in ("inductor", "aot_autograd"):
        for k, v in counters[group].items():
            if "cache" in k:
                out[f"{group}.{k}"] = int(v)
    out["graphs"] = int(counters["stats"].get("unique_graphs", 0))
    return out


def _model_config(args: TrainArgs) -> DrafterConfig:
    cfg = args.model_config()
    from .config import preset

    if args.target_path:
        over = config_from_dir(args.target_path, cfg)
        cfg = preset(args.preset, draft_layers=cfg.draft_layers, feature_layers=cfg.feature_layers,
                     block_size=cfg.block_size, max_anchors=cfg.max_anchors, gamma=cfg.gamma,
                     **over)
    if args.tokenizer:  # MASK is the id the target's tokenizer defines (chat_data.mask_token_id)
        from .chat_data import load_tokenizer, mask_token_id

        mask = mask_token_id(load_tokenizer(args.tokenizer), cfg.vocab_size)
        cfg = dataclasses.replace(cfg, mask_token_id=mask)
    return cfg


class Trainer:
    def __init__(self, args: TrainArgs, topo: dist.Topo, log: Log, marks: Marks | None = None):
        self.args, self.topo, self.log = args, topo, log
        self.marks = marks or Marks()
        #: ``--report-to``'s trackers (rank 0): closed before the ``done`` event, so a
        #: tracker's last warning is never printed after the run's last word
        self.reporting: trackers.Trackers | None = None
        #: ``--debug-fault`` / ``--debug-fault-plan``: this attempt's ``(fault, step)``, if any
        self.fault = args.fault_for(_attempt())
        self.device, self.attn, self.compile_on, self.amp = _resolve_runtime(args)
        self.cfg = _model_config(args)
        self.run_id = args.run_id or uuid.uuid4().hex[:12]
        self.tdtype = torch.bfloat16 if self.amp is torch.bfloat16 else torch.float32
        buckets = args.buckets()
        self.source: Source = make_source(
            args.data, self.cfg.vocab_size, args.tokenizer, buckets=buckets, token_budget=args.token_budget,
            max_batch=args.max_batch, n_anchors=self.cfg.max_anchors,
            block_size=self.cfg.block_size, seed=args.seed)
        self.args = args = schedule.apply(args, self.source, topo.n_drafters)
        # Split drafter ranks only need the target's embedding and LM head.
        body = not (topo.split and topo.is_drafter)
        if args.target_precision == "fp8" and not fp8.supported(self.device):
            raise TrainerConfigError(
                f"--target-precision fp8 needs compute capability 8.9+; {self.device} has "
                f"{'.'.join(map(str, torch.cuda.get_device_capability(self.device)))}")
        t0 = time.perf_counter()
        self.target: Target = build_target(self.cfg, self.device, self.tdtype, args.target_path,
                                           args.seed, body=body, precision=args.target_precision)
        self._sync()
        self.marks.mark("target_built_at")
        if args.target_path:  # the read rate: bytes read (deeper layers than the features need
            load_s = time.perf_counter() - t0  # are skipped, so not the files' size)
            gb = self.target.read_bytes / 1e9
            self.marks.at.update(load_s=round(load_s, 3), load_gb=round(gb, 3),
                                 load_gb_per_s=round(gb / max(load_s, 1e-9), 2))
        if self.compile_on:
            self.target.compile()  # per bucket shape; first call of each under the compile lock
        self.target_shapes: set[tuple[int, ...]] = set()
        self.engine: Engine | None = None
        if topo.is_drafter:
            self.engine = Engine(
                self.cfg, attn=self.attn, device=self.device, autocast_dtype=self.amp,
                compile_model=self.compile_on, embed=self.target.embed,
                head_weight=self.target.head_weight, lr=args.lr, weight_decay=args.weight_decay,
                grad_clip=args.grad_clip, ce_chunk=args.ce_chunk, ddp_group=topo.drafter_group,
                ddp_bucket_mb=args.ddp_bucket_mb, seed=args.seed)
        self._sync()
        self.marks.mark("drafter_built_at")
        self.seen_shapes: set[tuple[int, int]] = set()
        #: the run ids whose checkpoints are this run's (this attempt's, and those of the
        #: attempts it resumed from): what --keep-last may remove
        self.lineage: list[str] = [self.run_id]
        self.ckpt: saver.Checkpointer | None = None  # rank 0's checkpoints (see _drafter_loop)

    # --- helpers ---------------------------------------------------------------

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The target's features; the first call of each shape compiles (timed, reported,
        under the same process-wide lock as the drafter's first step).

        The time is the call's own: compiling (or loading) the graph and queueing the
        forward. It does not wait for the GPU to run that forward (~1.1 s of the 8B preset on
        an H200), so the drafter's first step traces its graph while the GPU runs it."""
        shape = tuple(input_ids.shape)
        if not self.compile_on or shape in self.target_shapes:
            return self.target.features(input_ids)
        self._sync()
        t0 = time.perf_counter()
        with serialized_compile():
            _start_compile_workers()  # the target builds its kernels in-process: see there
            feats = self.target.features(input_ids)
        secs = time.perf_counter() - t0
        self.target_shapes.add(shape)
        self.marks.at.setdefault("target_compile_s", round(secs, 3))
        self.log.event(wire.EVENT_COMPILE, name="target_features", shape=list(shape),
                       seconds=round(secs, 3), recompiles=max(0, len(self.target_shapes) - 1),
                       cache=cache_counters())
        self.log.say(f"compiled target features for shape {shape} in {secs:.1f}s")
        return feats

    def _feats_for(self, j: int, batch: Batch, window: _Window) -> torch.Tensor:
        if not self.topo.split:
            return self._features(batch.input_ids)
        rows, seq_len = batch.input_ids.shape
        width = self.cfg.feature_width
        with window.waiting():
            return dist.request_features(self.topo, j, (rows, seq_len, width), self.tdtype,
                                         self.device)

    def _step(self, feats: torch.Tensor, batch: Batch, step: int) -> t.Any:
        """One optimizer step; the first step of each shape compiles under the process-wide
        lock and is timed and reported."""
        if self.engine is None:
            raise RuntimeError("_step called on a target rank")
        shape = (batch.input_ids.shape[0], batch.input_ids.shape[1])
        lr = lr_at(step, self.args.lr, self.args.warmup_steps, self.args.steps,
                   self.args.min_lr_ratio)
        if shape in self.seen_shapes:
            return self.engine.train_step(feats, batch, lr), lr, None
        if self.compile_on:
            self.log.event(wire.EVENT_PHASE, phase="compiling", shape=list(shape),
                           budget_s=COMPILE_BUDGET_S)
        # no sync before: the target's first forward may still run on the GPU while this
        # step traces (see _features); the time then holds what is left of that forward
        t0 = time.perf_counter()
        with serialized_compile():
            out = self.engine.train_step(feats, batch, lr)
            self._sync()
        secs = time.perf_counter() - t0
        self.seen_shapes.add(shape)
        if self.compile_on:
            self.marks.at.setdefault("drafter_compile_s", round(secs, 3))
        if self.compile_on:
            cc = cache_counters()
            self.log.event(wire.EVENT_COMPILE, name="drafter_step", shape=list(shape), seconds=round(secs, 3),
                           recompiles=max(0, len(self.seen_shapes) - 1), cache=cc)
            self.log.say(f"compiled drafter step for shape {shape} in {secs:.1f}s")
        return out, lr, secs

    def _meta(self) -> dict[str, t.Any]:
        return {"run_id": self.run_id, "lineage": self.lineage[-LINEAGE_MAX:],
                "cfg": _asdict(self.cfg), "args": _asdict(self.args)}

    def _checkpointer(self) -> saver.Checkpointer | None:
        """Rank 0's checkpoints (periodic, final, pruning); None on every other rank."""
        if self.engine is None or self.topo.rank != 0:
            return None
        engine = self.engine
        ck = saver.Checkpointer(self.args.out_dir, engine.raw, engine.opt, self.device,
                                mode=self.args.ckpt_write, keep_last=self.args.keep_last,
                                keep_every=self.args.keep_every, owners=self.lineage)
        ck.engine_hook = lambda done: setattr(engine, "pending_copy", done)
        return ck

    def _send(self, events: list[tuple[str, dict[str, t.Any]]]) -> None:
        for name, fields in events:
            self.log.event(name, **fields)
            if name == wire.EVENT_CHECKPOINT:
                self.log.say(f"checkpoint saved: {fields['path']} ({fields['mode']}, training "
                             f"blocked {fields['blocked_s']:.2f}s, written in "
                             f"{fields['write_s']:.1f}s)")
            else:
                self.log.say(f"warning: {fields['message']}")

    def _fresh_out_dir(self) -> str | None:
        """Rank 0, on a run that resumes nothing: the other runs' checkpoints in --out-dir
        removed (``--replace-checkpoints``), or why the run must not start over them (its
        checkpoints would meet theirs step for step, and ``latest`` is theirs)."""
        theirs = checkpoint.others(self.args.out_dir, self.lineage)
        if not theirs:
            return None
        if self.args.replace_checkpoints:
            try:
                removed = checkpoint.replace_others(self.args.out_dir, self.lineage)
            except CheckpointError as e:
                return str(e)
            self.log.event(wire.EVENT_WARNING, source="checkpoint", removed=removed,
                           message=f"--replace-checkpoints removed {len(removed)} checkpoint(s) "
                                   f"of other runs from {self.args.out_dir}")
            self.log.say(f"removed other runs' checkpoints: {', '.join(removed)}")
            return None
        names = ", ".join(n for n, _ in theirs[:3]) + (f" and {len(theirs) - 3} more"
                                                       if len(theirs) > 3 else "")
        return (f"--out-dir {self.args.out_dir} holds checkpoints of run {theirs[-1][1]!r} "
                f"({names}) and this run resumes none: --resume auto continues that run, "
                "another --out-dir starts a new one beside it, --replace-checkpoints removes "
                "them first")

    def _resume(self) -> int:
        path = None
        problem = None
        if self.topo.rank == 0:
            p = checkpoint.resolve(self.args.resume, self.args.out_dir)
            path = str(p) if p is not None else None
            if path is None:
                problem = self._fresh_out_dir()
        path, problem = dist.broadcast_object(self.topo, (path, problem))
        if problem is not None:
            raise TrainerConfigError(problem)
        if path is None:
            return 0
        import pathlib

        if self.engine is not None:
            meta = checkpoint.load(pathlib.Path(path), self.engine.raw, self.engine.opt, self.device)
        else:
            meta = checkpoint.read_meta(pathlib.Path(path))
        checkpoint.release(pathlib.Path(path))  # read: --keep-last may remove it in time
        earlier = meta.get("lineage") or [meta.get("run_id")]
        if isinstance(earlier, list):
            ids = [x for x in earlier if isinstance(x, str) and x and x != self.run_id]
            self.lineage[:0] = ids[-LINEAGE_MAX:]
        self.marks.mark("resumed_at")
        self.log.event(wire.EVENT_RESUME, step=meta["step"], path=path, from_run=meta.get("run_id"))
        self.log.say(f"resumed from {path} at step {meta['step']}")
        return int(meta["step"])

    # --- modes -----------------------------------------------------------------

    def warmup(self) -> int:
        """Compile every shape bucket once (random features) and exit."""
        self.log.event(wire.EVENT_PHASE, phase="compiling", buckets=[list(s) for s in self.source.shapes()])
        if self.target.fused is not None:  # ranks that run the target's body
            for rows, seq_len in self.source.shapes():
                ids = torch.randint(0, self.cfg.vocab_size, (rows, seq_len), device=self.device)
                self._features(ids)
        if self.engine is not None:
            width = self.cfg.feature_width
            for rows, seq_len in self.source.shapes():
                src = SyntheticSource(self.cfg.vocab_size, buckets=[seq_len],
                                      token_budget=self.args.token_budget,
                                      max_batch=self.args.max_batch, n_anchors=self.cfg.max_anchors,
                                      block_size=self.cfg.block_size, seed=self.args.seed)
                batch = src.batch(0).to(self.device)
                feats = torch.randn(rows, seq_len, width, device=self.device, dtype=self.tdtype)
                self._step(feats, batch, 0)
        if self.topo.rank == 0 and self.args.save_cache_artifacts:
            art = torch.compiler.save_cache_artifacts()
            if art is not None:
                safe_write.write_bytes(self.args.save_cache_artifacts, art[0])  # whole, no link
                self.log.event(wire.EVENT_CACHE_ARTIFACTS, path=self.args.save_cache_artifacts,
                               bytes=len(art[0]))
        self.log.event(wire.EVENT_CACHE, **cache_counters())
        self.log.event(wire.EVENT_PHASE, phase="done")
        self.log.event(wire.EVENT_DONE, step=0, warmup_only=True)
        return 0

    def run(self) -> int:
        start = self._resume()
        if self.topo.is_drafter:
            return self._drafter_loop(start)
        return self._target_loop(start)

    def _maybe_fault(self, step: int) -> None:
        """``--debug-fault``: the failures opsctl must name, on demand (tests, device checks)."""
        args = self.args
        if self.fault is None or self.topo.rank != args.debug_fault_rank or step != self.fault[1]:
            return
        kind = self.fault[0]
        self.log.say(f"rank {self.topo.rank}: --debug-fault {kind} at step {step}")
        if kind == "raise":
            raise RuntimeError(f"--debug-fault raise on rank {self.topo.rank} at step {step}")
        if self.topo.distributed:
            dist.hang_forever(self.topo)
        import threading

        threading.Event().wait()

    def _target_loop(self, start: int) -> int:
        logged = start // self.args.log_every
        for j in self.topo.target_items(start, self.args.steps):
            self._maybe_fault(j // self.topo.n_drafters)
            batch = self.source.batch(j).to(self.device)
            feats = self._features(batch.input_ids)
            if not dist.serve_features(j % self.topo.n_drafters, feats):
                break
            step = j // self.topo.n_drafters + 1
            if step // self.args.log_every > logged:
                # a node whose ranks all run the target (split across nodes) still tells its
                # agent it makes progress; the numbers are rank 0's (a drafter's) to give
                logged = step // self.args.log_every
                self.log.event(wire.EVENT_STEP, step=step, role="target",
                               **{wire.FIELD_BUDGET: COMPILE_BUDGET_S})
        return 0

    def _drafter_loop(self, start: int) -> int:
        args, topo, log = self.args, self.topo, self.log
        log.event(wire.EVENT_PHASE, phase="compiling" if self.compile_on else "training",
                  start_step=start, steps=args.steps,
                  budget_s=COMPILE_BUDGET_S if self.compile_on else FIRST_STEPS_BUDGET_S)
        step, announced = start, not self.compile_on
        window = _Window(self.device)
        self.ckpt = self._checkpointer()
        while step < args.steps:
            self._maybe_fault(step)
            stop = _StopFlag.requested or (0 < args.stop_at_step <= step)
            if dist.all_drafters_max(topo, float(stop)) > 0:
                dist.tell_targets_stop(topo, step, args.steps, self.device)
                break
            j = topo.batch_index(step)
            cpu_batch = self.source.batch(j)
            batch = cpu_batch.to(self.device)
            feats = self._feats_for(j, batch, window)
            out, lr, compile_s = self._step(feats, batch, step)
            step += 1
            if not announced or (compile_s is not None and self.compile_on):
                # back from a compile: the next event is a step event, after log_every steps
                log.event(wire.EVENT_PHASE, phase="training", step=step, budget_s=FIRST_STEPS_BUDGET_S)
                announced = True
            window.add(out)
            if compile_s is not None and self.compile_on:
                window.restart_clock()  # tok_s measures steady state, not compilation
            else:
                window.tokens += cpu_batch.n_tokens
                window.timed_steps += 1
                if self.device.type == "cuda":
                    rows, seq_len = cpu_batch.input_ids.shape
                    window.flops += step_flops(self.cfg, rows, seq_len, cpu_batch.anchors,
                                               cpu_batch.valid)["total"]
            if step % args.log_every == 0 or step == args.steps:
                self._log_step(step, lr, window)
                window = _Window(self.device, window.step_time)
            if not self.marks.sent:
                self._startup_event()
            if self.ckpt is not None:
                due = bool(args.ckpt_every) and step % args.ckpt_every == 0 and step < args.steps
                self._send(self.ckpt.step_end(step, due, self._meta, last=step >= args.steps))
        last_step = time.perf_counter()
        final_save = self._start_final_save(step)
        if args.check_replicas:
            self._check_replicas()
        dist.finish(topo)  # the other ranks leave while rank 0 writes (barrier, destroy)
        ckpt_s = self._join_final_save(final_save, step)
        why = _StopFlag.signame or ("stop-at-step" if step < args.steps else "finished")
        if self.reporting is not None:
            self.reporting.close(ok=True)
        log.event(wire.EVENT_PHASE, phase="done")
        done: dict[str, t.Any] = {"step": step, "reason": why}
        if ckpt_s is not None:
            done["ckpt_s"] = ckpt_s
        done["shutdown_s"] = round(time.perf_counter() - last_step, 3)
        log.event(wire.EVENT_DONE, **done)
        log.say(f"done at step {step} ({why})")
        return 0

    def settle_checkpoint(self) -> None:
        """After a failure: wait for the periodic checkpoint in flight and say it, so the
        record shows what the next attempt resumes from (the interpreter's exit waits for the
        writer thread anyway; its event would be lost). A failed write is not reported over
        the failure that ended the run."""
        if self.ckpt is None:
            return
        with contextlib.suppress(Exception):
            self._send(self.ckpt.drain())

    def _startup_event(self) -> None:
        """Once, after the first optimizer step: when each start-up phase ended (seconds
        since the process started) and how long the first compiles took."""
        self._sync()
        self.marks.mark("first_step_at")
        self.marks.sent = True
        self.log.event(wire.EVENT_STARTUP, **self.marks.at)

    def _start_final_save(self, step: int) -> t.Any:
        """Rank 0 writes the final checkpoint on a thread while the run winds down (the
        replica check, the process group's barrier and destroy); :meth:`_join_final_save`
        waits for it to be durable before ``done`` is said."""
        if self.ckpt is None:
            return None
        import concurrent.futures

        ck, meta = self.ckpt, self._meta()

        def write() -> tuple[list[tuple[str, dict[str, t.Any]]], saver.Job]:
            before = ck.drain()  # the write in flight first: the final one comes after it
            return before, ck.final(step, meta)

        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="final-ckpt")
        fut = pool.submit(write)
        pool.shutdown(wait=False)
        return fut

    def _join_final_save(self, saver_: t.Any, step: int) -> float | None:
        """Wait for the final checkpoint; returns its write time (None: not this rank's)."""
        if saver_ is None:
            return None
        # result() re-raises an error of either write here, before any `done`
        got: tuple[list[tuple[str, dict[str, t.Any]]], saver.Job] = saver_.result()
        before, job = got
        self._send(before)
        secs = round(job.write_s, 3)
        if self.ckpt is not None:
            self.ckpt.close()
        self.log.event(wire.EVENT_CHECKPOINT, **job.event(), seconds=secs)
        self.log.say(f"checkpoint saved: {job.path} ({secs:.1f}s)")
        return secs

    def _log_step(self, step: int, lr: float, w: _Window) -> None:
        self._sync()
        elapsed = time.perf_counter() - w.t0
        loss_s, correct, counted, n, tok_all, flops_all, wait_all = dist.all_drafters_sum(
            self.topo, [float(w.loss), float(w.correct), float(w.counted), float(w.steps),
                        float(w.tokens), w.flops, w.wait_seconds()])
        tok_s = tok_all / elapsed if w.timed_steps and elapsed > 0 else 0.0
        if w.timed_steps:
            w.step_time = elapsed / w.timed_steps
        eta = (w.step_time or 0.0) * (self.args.steps - step)
        budget = (max(STEP_BUDGET_MIN_S, STEP_BUDGET_FACTOR * w.step_time * self.args.log_every)
                  if w.step_time else COMPILE_BUDGET_S)
        fields: dict[str, t.Any] = {"step": step, "loss": round(loss_s / max(n, 1.0), 5),
                                    "acc": round(correct / max(counted, 1.0), 5),
                                    "tok_s": round(tok_s, 1), "eta_s": round(eta, 1),
                                    "lr": float(f"{lr:.4g}")}
        if flops_all and elapsed > 0:
            fields.update(mfu_fields(flops_all / elapsed / self.topo.world, self.args.peak_tflops,
                                     self.args.matmul_tflops))
        if self.topo.split and elapsed > 0:
            # share of the drafters' time spent waiting for the targets' features: above half,
            # the targets are the bottleneck (more target ranks, or colocated, would be faster)
            fields["feature_wait_pct"] = round(
                100.0 * wait_all / (elapsed * self.topo.n_drafters), 1)
        if self.device.type == "cuda":  # this rank's peak (rank 0: a drafter)
            fields["mem_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 2)
        fields[wire.FIELD_BUDGET] = round(budget, 1)
        self.log.event(wire.EVENT_STEP, **fields)
        self.log.say(f"step {step}/{self.args.steps} loss {fields['loss']:.4f} acc "
                     f"{fields['acc']:.3f} tok/s {tok_s:,.0f} eta {eta:,.0f}s lr {lr:.2e}")

    def _check_replicas(self) -> None:
        if self.engine is None:
            return
        h = hashlib.sha256()
        for k, v in sorted(self.engine.raw.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().float().cpu().numpy().tobytes())
        digest = int.from_bytes(h.digest()[:7], "big")
        sums = dist.gather_drafters(self.topo, digest)
        self.log.event(wire.EVENT_REPLICAS, identical=len(set(sums)) == 1,
                       checksums=[f"{x:014x}" for x in sums])


class _Window:
    """Metrics accumulated on the device between two step events (no per-step sync)."""

    def __init__(self, device: torch.device, step_time: float | None = None):
        self.loss = torch.zeros((), device=device)
        self.correct = torch.zeros((), device=device)
        self.counted = torch.zeros((), device=device)
        self.steps = 0
        self.tokens = 0
        self.timed_steps = 0
        self.flops = 0.0
        self.step_time = step_time
        self.t0 = time.perf_counter()
        self.device = device
        self.waits: list[tuple[t.Any, t.Any]] = []  # CUDA event pairs around feature receives
        self.wait_s = 0.0  # the same on CPU, where a receive blocks

    @contextlib.contextmanager
    def waiting(self) -> t.Iterator[None]:
        """Time a feature receive: on CUDA as stream time (the receive is asynchronous; the
        events measure how long the compute stream waited for it), on CPU as wall time."""
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            yield
            self.wait_s += time.perf_counter() - t0
            return
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        yield
        end.record()
        self.waits.append((start, end))

    def wait_seconds(self) -> float:
        """After a device sync: the time spent waiting for features in this window."""
        return self.wait_s + float(sum(s.elapsed_time(e) for s, e in self.waits)) / 1000.0

    def add(self, out: t.Any) -> None:
        self.loss += out.loss
        self.correct += out.correct
        self.counted += out.counted
        self.steps += 1

    def restart_clock(self) -> None:
        self.t0 = time.perf_counter()
        self.tokens, self.timed_steps, self.flops = 0, 0, 0.0
        self.waits, self.wait_s = [], 0.0


def _attempt() -> int:
    """Which attempt of its job this process is (the wrapper's ``OPSCTL_ATTEMPT``; 1 outside
    a job or when the value is not a number)."""
    text = os.environ.get(wire.ENV_ATTEMPT, "1")
    return int(text) if text.isdigit() and len(text) <= 6 else 1


def _asdict(obj: t.Any) -> dict[str, t.Any]:
    import dataclasses

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(obj).items()}


def run(args: TrainArgs) -> int:
    """Run one rank (already inside torchrun / a spawned child, or single-process)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _StopFlag.handler)
    rank = int(os.environ.get("RANK", "0"))
    log = Log(rank, local_rank=int(os.environ.get("LOCAL_RANK", str(rank))))
    topo: dist.Topo | None = None
    marks = Marks()
    try:
        log.event(wire.EVENT_PHASE, phase="loading", preset=args.preset, topology=args.topology,
                  torch=torch.__version__, pid=os.getpid(),
                  budget_s=LOAD_FROM_DISK_BUDGET_S if args.target_path else LOAD_BUDGET_S)
        device, _attn, compile_on, _amp = _resolve_runtime(args)
        if device.type == "cuda":
            _start_cuda(device)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if compile_on:  # else nothing compiles: no knobs to set, no mega-cache to load (and
            _apply_compile_settings(args, log)  # no torch._dynamo import here: ~0.5 s a CPU rank)
            _warm_compile_pool()
        log.gpu = dist.gpu_label(device)
        wire.announce_process(rank=rank, role="starting", gpu=log.gpu)
        topo = dist.init(args, device)
        marks.mark("pg_ready_at")
        log.rank, log.local_rank = topo.rank, topo.local_rank
        log.event(wire.EVENT_PHASE, phase="loading", detail="process groups ready", world=topo.world,
                  budget_s=LOAD_FROM_DISK_BUDGET_S if args.target_path else LOAD_BUDGET_S)
        wire.announce_process(rank=topo.rank, local_rank=topo.local_rank, world=topo.world,
                              role="drafter" if topo.is_drafter else "target", gpu=log.gpu)
        trainer = Trainer(args, topo, log, marks)
        log.say(f"dflash trainer: preset {args.preset}, {trainer.cfg.draft_layers} draft layers, "
                f"block {trainer.cfg.block_size}, {trainer.cfg.max_anchors} anchors, device "
                f"{trainer.device}, attn {trainer.attn}, compile {trainer.compile_on}, world "
                f"{topo.world} ({topo.n_drafters} drafter, {topo.n_targets} target ranks)")
        reporting = trainer.reporting = _open_trackers(trainer, log)
        ok = False
        try:
            rc = trainer.warmup() if args.warmup_only else trainer.run()
            ok = rc == 0
        except BaseException:
            trainer.settle_checkpoint()
            raise
        finally:
            if reporting is not None:
                reporting.close(ok)  # a failed run's; a finished one closed before `done`
        dist.finish(topo)
        if topo.distributed:
            _leave(rc)
        return rc
    except (TrainerConfigError, CheckpointError, safe_write.DestinationError) as e:
        # a checkpoint the disk refused (full, read-only) or a link at `latest`: one line
        log.error(type(e).__name__, str(e))
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:
        log.error(type(e).__name__, str(e))
        raise


def _open_trackers(trainer: Trainer, log: Log) -> trackers.Trackers | None:
    """``--report-to``'s backends, on rank 0 alone, listening to this rank's events (none for
    ``--warmup-only``: seeding a compile cache is no run to track)."""
    names = trackers.parse_report_to(trainer.args.report_to)
    if trainer.topo.rank != 0 or not names or trainer.args.warmup_only:
        return None

    def warn(tracker: str, message: str, **extra: t.Any) -> None:
        log.event(wire.EVENT_WARNING, source="tracker", tracker=tracker, message=message, **extra)

    info = trackers.RunInfo(
        run_id=trainer.run_id, out_dir=trainer.args.out_dir,
        config={**trackers.flatten("args", _asdict(trainer.args)),
                **trackers.flatten("model", _asdict(trainer.cfg))},
        tags={"torch": torch.__version__, "payload": _payload_digest(), "run": trainer.run_id})
    opened = trackers.open_trackers(names, info, warn,
                                    lambda **where: log.event(wire.EVENT_TRACKERS, **where),
                                    goodput_file=os.environ.get(wire.ENV_GOODPUT_FILE) or None)
    if opened is not None:
        log.listeners.append(opened.on_event)
    return opened


def _payload_digest() -> str:
    """The deployed payload's digest (its ``MANIFEST.json``); ``local`` outside a payload."""
    import json

    import remote_payload

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(remote_payload.__file__))),
                        "MANIFEST.json")
    try:
        with open(path, encoding="utf-8") as f:
            digest = json.load(f).get("digest")
    except (OSError, ValueError, AttributeError):
        return "local"
    return str(digest) if digest else "local"


def _start_cuda(device: torch.device) -> None:
    """Create the CUDA context of ``device`` on a thread, while the main thread sets up
    compiles and the process group and imports transformers (a second or two).
    torch's lazy initialisation holds a lock, so the main thread's first CUDA call waits for
    this one instead of racing it; a failure here is left to that call to raise."""
    import threading

    def init() -> None:
        with contextlib.suppress(Exception):
            torch.empty(0, device=device)

    threading.Thread(target=init, name="cuda-init", daemon=True).start()


def _warm_compile_pool() -> None:
    """Start inductor's compile workers now, while the target is built, not at the first
    compile (they take seconds to start). Only a head start: failures are left to
    the first compile, which starts the pool itself and reports them.

    Only the pool's sidecar starts here; its workers start at the first compile job. Starting
    them too (``AsyncCompile.wakeup``) made an H200's warm start 1.1 s slower (16 workers
    importing torch beside this process's own start) and the cold start no faster
    (2026-12-02, docs/benchmarks.md)."""
    with contextlib.suppress(Exception):
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.warm_pool()


def _start_compile_workers() -> None:
    """Start the compile pool's workers as the target's graph starts to compile.

    Inductor starts them at its first compile job, but the target's graph submits none (its
    kernels are built in this process: ``target.TARGET_COMPILE_OPTIONS``), so without this the
    drafter's step, the big compile, would be the one to start them, and would build its
    kernels here, one after another, until they answer: its cold first call took 77.2 s on an
    H200, and 68.6 s with the workers started here (2026-12-02). Here they start while the
    target compiles, as they did when the target's kernels went through the pool. Only a head
    start, like :func:`_warm_compile_pool`."""
    with contextlib.suppress(Exception):
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.wakeup()


def _leave(rc: int) -> t.NoReturn:
    """End a finished rank of a distributed run now, without the interpreter's teardown.

    Why: in two of ~15 suite runs a CPU (gloo) rank that had finished (checkpoint, ``done``
    event, process group destroyed) never exited; its stacks showed it inside no Python code,
    in the native destructors run as :func:`run`'s locals went (DDP's reducer still holds the
    destroyed group). A finished rank has nothing left to do: its output is flushed here, its
    checkpoint was written and renamed, and inductor's compile workers watch their parent.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def main(argv: t.Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except TrainerConfigError as e:
        Log().error("TrainerConfigError", str(e))
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    if args.nproc > 1 and "RANK" not in os.environ:
        return spawn(argv, args.nproc)
    with contextlib.suppress(Exception):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return run(args)


# --- self-spawned ranks ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(local_rank: int, argv: list[str], world: int, port: int) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rc = main(argv)
    if rc:
        raise SystemExit(rc)


def spawn(argv: list[str], nproc: int) -> int:
    """Run ``nproc`` local ranks of this trainer; forward SIGINT/SIGTERM to them.

    Returns the first non-zero child exit code, else 0. When one rank fails, torch's
    ``ProcessContext.join`` SIGTERMs the others and SIGKILLs what is left after 30 s, so no
    rank keeps holding a GPU (a rank blocked inside a collective ignores SIGTERM)."""
    from torch.multiprocessing.spawn import (
        ProcessExitedException,
        ProcessRaisedException,
        start_processes,
    )

    ctx = start_processes(_child, args=(argv, nproc, _free_port()),  # type: ignore[no-untyped-call]
                          nprocs=nproc, join=False, start_method="spawn")

    def forward(signum: int, _frame: t.Any) -> None:
        for pid in ctx.pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not ctx.join(timeout=1.0):
            pass
    except ProcessExitedException as e:
        return e.exit_code if e.exit_code and e.exit_code > 0 else 1
    except ProcessRaisedException as e:
        print(str(e), flush=True)
        return 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 0
