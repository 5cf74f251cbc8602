"""Process layout: one process per device, torchrun-compatible, or self-spawned.

Ranks 0..D-1 train drafters (DDP among themselves); in the ``split`` topology ranks
D..W-1 run the target and send hidden states. Rank 0 is always a drafter, so rank 0
logs and writes checkpoints in both topologies.

Split protocol, per global batch j (drafter j % D consumes it at step j // D, target
D + j % K produces it): the target computes features for j ahead of time, waits for a
one-element request from the drafter (1 = send, 0 = stop), then sends. On a stop at
step s, exactly one drafter tells each target to stop: the one its next batch is for.
"""

from __future__ import annotations

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
    if device.type == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                            device_id=torch.device("cuda", local) if device.type == "cuda" else None)
    d = world - k
    drafters = list(range(d))
    group = dist.new_group(drafters) if k else dist.group.WORLD
    ctrl = dist.new_group(drafters, backend="gloo") if (k or device.type == "cuda") else group
    return Topo(rank, world, local, d, k, group if d > 1 else None, ctrl if d > 1 else None)


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

    Returns the first non-zero child exit code, else 0."""
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
