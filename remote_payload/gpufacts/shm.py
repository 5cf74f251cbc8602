"""``/dev/shm``: its size from ``/proc/mounts`` or ``df``, and what NCCL needs of it."""

from __future__ import annotations

import re

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


_SIZE = re.compile(r"(?:^|,)size=(\d+)([kmgKMG%]?)(?:,|$)")


def size_from_mounts(text: str) -> int | None:
    """The ``size=`` of the last ``/dev/shm`` tmpfs line in ``/proc/mounts`` (the one that
    counts when two are stacked, as on the recorded H200 machine), in bytes; None when
    there is none or it is given in per cent."""
    size = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "/dev/shm":
            m = _SIZE.search(parts[3])
            if m and m[2] != "%":
                mult = {"": 1, "k": 1024, "m": MIB, "g": GIB}[m[2].lower()]
                size = int(m[1]) * mult
    return size


_DF_UNITS = {"": 1, "K": 1024, "M": MIB, "G": GIB, "T": GIB * 1024, "P": GIB * 1024 ** 2}


def size_from_df(text: str) -> int | None:
    """The size column of ``df -h /dev/shm`` (``tmpfs 128G 0 128G 0% /dev/shm``), in bytes."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[-1] == "/dev/shm":
            m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTP]?)i?B?", parts[1])
            if m:
                return int(float(m[1]) * _DF_UNITS[m[2]])
    return None


def human(n: int | float) -> str:
    """``1.0 GiB``, ``64 MiB``."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.0f} MiB"
