"""``/dev/shm``: the size NCCL needs of it, and sizes in words."""

from __future__ import annotations

GIB = 1024 ** 3
MIB = 1024 ** 2

#: What NCCL needs in /dev/shm per GPU of the node: its SHM transport maps, per pair of
#: local ranks and channel, buffers of NCCL_BUFFSIZE (4 MiB) for each of the LL, LL128 and
#: Simple protocols; at 8 ranks that is hundreds of MiB, and Docker's default of 64 MiB is
#: the classic "NCCL WARN Error: failed to extend /dev/shm" failure. NVIDIA's containers
#: are started with --shm-size=1g and more per GPU for large jobs: 512 MiB per GPU, at
#: least 1 GiB, is the rule used here (a warning below it, a failure below a quarter of it).
SHM_PER_GPU = 512 * MIB
SHM_MIN = 1 * GIB


def needed_bytes(gpus: int) -> int:
    """The /dev/shm size a node with ``gpus`` GPUs should have (0: none needed)."""
    if gpus <= 0:
        return 0
    return max(SHM_MIN, gpus * SHM_PER_GPU)


def human(n: int | float) -> str:
    """``1.0 GiB``, ``64 MiB``."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.0f} MiB"
