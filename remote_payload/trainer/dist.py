"""Process layout: one process per device, torchrun-compatible, or self-spawned.

Ranks 0..D-1 train drafters (DDP among themselves); in the ``split`` topology ranks
D..W-1 run the target and send hidden states. Rank 0 is always a drafter, so rank 0
logs and writes checkpoints in both topologies.

Split protocol, per global batch j (drafter j % D consumes it at step j // D, target
D + j % K produces it): the target computes features for j ahead of time, waits for a
one-element request from the drafter (1 = send, 0 = stop), then sends. On a stop at
step s, exactly one drafter tells each target to stop: the one its next batch is for.

Process groups: ONE backend spec, ``cpu:gloo,cuda:nccl`` on GPUs, for the default group and
for every subgroup, created in the same order on every rank. CPU tensors (the control
all-reduces, ``broadcast_object_list``) then go over gloo and CUDA tensors (DDP, the feature
send/recv) over NCCL, through the same group objects. Why not an NCCL default group plus a
separate gloo subgroup for control: with ``device_id`` bound (eager NCCL init), ``new_group``
makes a *non-member* rank join an ``ncclCommSplit`` (``perform_nocolor_split``) whatever
backend the subgroup asks for, while the members of a gloo-only subgroup split nothing: the
non-member waits forever in ``new_group`` (seen on 2 H200s, torch 2.11.0+cu130: the target
rank hung there while the drafter went on into ``broadcast_object_list``). With the same
backend everywhere, members and non-members make the same split calls. 5 + 3 ranks on 8 GPUs
and 1 + 1 on 2 take exactly this path.

Failures are never silent: every group has a finite timeout (``--pg-timeout``), PyTorch's NCCL
watchdog tears a rank down when a collective outlives it (and its flight recorder dumps the
last collectives into the job dir), and a rank that dies takes the others down with it
(``spawn``; torchrun does the same).
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import typing as t
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import TrainArgs, TrainerConfigError


@dataclass
class Topo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    n_drafters: int = 1  # D
    n_targets: int = 0  # K in split; 0 in colocated (every drafter runs its own target)
    drafter_group: t.Any = None  # DDP group (None when D == 1)
    ctrl_group: t.Any = None  # gloo group over drafters for CPU-side control (None when D == 1)

    @property
    def is_drafter(self) -> bool:
        return self.rank < self.n_drafters

    @property
    def split(self) -> bool:
        return self.n_targets > 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def batch_index(self, step: int) -> int:
        return step * self.n_drafters + self.rank

    def producer(self, j: int) -> int:
        return self.n_drafters + j % self.n_targets

    def target_items(self, start: int, steps: int) -> t.Iterator[int]:
        ti = self.rank - self.n_drafters
        first = start * self.n_drafters
        j = first + (ti - first) % self.n_targets
        while j < steps * self.n_drafters:
            yield j
            j += self.n_targets


def init(args: TrainArgs, device: torch.device) -> Topo:
    """Join the process group described by torchrun-style env vars (if any).

    Raises:
        TrainerConfigError: the topology does not fit the world size.
    """
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        if args.topology == "split":
            raise TrainerConfigError("--topology split needs >= 2 ranks (--nproc or torchrun)")
        return Topo()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    k = args.target_ranks if args.topology == "split" else 0
    if k >= world:
        raise TrainerConfigError(f"--target-ranks {k} leaves no drafter rank in a world of {world}")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(local)
    nccl_watchdog_settings(rank)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(seconds=args.pg_timeout),
                            device_id=torch.device("cuda", local) if cuda else None)
    d = world - k
    # every rank makes the same new_group calls in the same order, with the default backend
    # (see the module docstring for why a gloo-only subgroup hangs the non-members)
    group = dist.new_group(list(range(d))) if k and d > 1 else dist.group.WORLD
    drafters = group if d > 1 else None
    return Topo(rank, world, local, d, k, drafters, drafters)


def nccl_watchdog_settings(rank: int) -> None:
    """PyTorch's own hang/failure machinery, on unless the job's env says otherwise.

    Must run before ``init_process_group``: the NCCL backend reads these when it starts.
    """
    env = os.environ
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a timed-out rank tears itself down
    env.setdefault("TORCH_NCCL_ENABLE_MONITORING", "1")  # ...even if its watchdog is stuck
    env.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")  # the flight recorder's ring
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    job_dir = env.get("OPSCTL_JOB_DIR")
    if job_dir and "TORCH_FR_DUMP_TEMP_FILE" not in env:
        out = os.path.join(job_dir, "flight-recorder")
        os.makedirs(out, exist_ok=True)
        # one file per rank: <prefix><rank>; `python -m torch.distributed.flight_recorder.fr_trace`
        # reads the folder
        env["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(out, "rank_")


def gpu_label(device: torch.device) -> str | None:
    """The physical GPU a rank drives (``CUDA_VISIBLE_DEVICES`` applied), as nvidia-smi counts."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def all_drafters_max(topo: Topo, value: float) -> float:
    if topo.ctrl_group is None:
        return value
    t_ = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t_, op=dist.ReduceOp.MAX, group=topo.ctrl_group)
    return float(t_.item())


def all_drafters_sum(topo: Topo, values: list[float]) -> list[float]:
    if topo.ctrl_group is None:
        return values
    t_ = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t_, group=topo.ctrl_group)
    return [float(x) for x in t_.tolist()]


def gather_drafters(topo: Topo, value: int) -> list[int]:
    if topo.ctrl_group is None:
        return [value]
    t_ = torch.tensor([value], dtype=torch.int64)
    out = [torch.zeros_like(t_) for _ in range(topo.n_drafters)]
    dist.all_gather(out, t_, group=topo.ctrl_group)
    return [int(x.item()) for x in out]


def broadcast_object(topo: Topo, obj: t.Any) -> t.Any:
    if not topo.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def request_features(topo: Topo, j: int, shape: tuple[int, ...], dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor:
    src = topo.producer(j)
    dist.send(torch.ones(1, device=device), dst=src)
    feats = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(feats, src=src)
    return feats


def serve_features(dst: int, feats: torch.Tensor) -> bool:
    """Wait for drafter ``dst``'s request; send ``feats`` unless it says stop."""
    req = torch.zeros(1, device=feats.device)
    dist.recv(req, src=dst)
    if req.item() == 0:
        return False
    dist.send(feats.contiguous(), dst=dst)
    return True


def tell_targets_stop(topo: Topo, step: int, steps: int, device: torch.device) -> None:
    """At a stop before ``step``, release every target whose next batch is ours."""
    if not topo.split:
        return
    for ti in range(topo.n_targets):
        first = step * topo.n_drafters
        j = first + (ti - first) % topo.n_targets
        if j < steps * topo.n_drafters and j % topo.n_drafters == topo.rank:
            dist.send(torch.zeros(1, device=device), dst=topo.n_drafters + ti)


def finish(topo: Topo) -> None:
    if topo.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def hang_forever(topo: Topo) -> None:
    """``--debug-fault hang``: wait for a message no rank ever sends.

    The other ranks then block in their next collective: the deadlock opsctl must name.
    """
    peer = (topo.rank + 1) % topo.world
    # a CPU tensor goes over gloo, which honours tags (NCCL ignores them and could match a real
    # message); nobody sends with this tag
    dist.recv(torch.zeros(1), src=peer, tag=7411)


# --- self-spawned ranks ----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(local_rank: int, argv: list[str], world: int, port: int) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from .train import main

    rc = main(argv)
    if rc:
        raise SystemExit(rc)


def spawn(argv: list[str], nproc: int) -> int:
    """Run ``nproc`` local ranks of this trainer; forward SIGINT/SIGTERM to them.

    Returns the first non-zero child exit code, else 0. When one rank fails, torch's
    ``ProcessContext.join`` SIGTERMs the others and SIGKILLs what is left after 30 s, so no
    rank keeps holding a GPU (a rank blocked inside a collective ignores SIGTERM)."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_child, args=(argv, nproc, _free_port()), nprocs=nproc, join=False,
                             start_method="spawn")

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
    except mp.ProcessExitedException as e:
        return e.exit_code if e.exit_code and e.exit_code > 0 else 1
    except mp.ProcessRaisedException as e:
        print(str(e), flush=True)
        return 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 0
