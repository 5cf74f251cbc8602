"""The torchrun command line of one node of a multi-node run (pure: no I/O).

Every node runs ``python -m torch.distributed.run`` (torchrun) with the same c10d rendezvous:
node 0's address and a port free there (both asked from node 0's container), the run's job id
as ``--rdzv-id``, ``--nnodes`` and ``--nproc-per-node``. torchrun then does what opsctl must
not do itself: it starts the local ranks, gives them RANK/WORLD_SIZE/LOCAL_RANK/GROUP_RANK/
MASTER_ADDR/MASTER_PORT, and when one node's agent or rank dies the others' rendezvous or
collectives fail, so every node's job ends (``--max-restarts 0``: a failure fails the run,
opsctl does not retry behind the user's back).

Choices made here, explicitly rather than by torchrun's heuristics:

- ``--rdzv-conf is_host=1`` on node 0 only. torchrun otherwise guesses whether it should host
  the rendezvous store by matching the endpoint against its own addresses; containers that
  share a network (the sandbox: 127.0.0.1 everywhere) would all guess "yes".
- ``--local-addr``: the address this node announces to the others (the worker process group's
  MASTER_ADDR comes from rank 0's). Without it torchrun uses the container's FQDN, which other
  containers often cannot resolve.
- Global ranks follow the rendezvous (c10d sorts the nodes by announced address, then agent
  pid), not the order of ``--nodes``: node 0 hosts the store, but rank 0 may live on any node.
  The trainer places its drafter/target roles by global rank, so that is all it needs.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from opsctl.errors import ConfigError

LAUNCHER_MODULE = "torch.distributed.run"
_PYTHONS = ("python", "python3")


@dataclass(frozen=True)
class Rendezvous:
    """What every node of one run shares."""

    host: str  # node 0's address, as the other nodes reach it
    port: int
    run_id: str
    nnodes: int

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def nproc_per_node(gpus: int, command: t.Sequence[str]) -> int:
    """Ranks per node: the container's GPUs (inventory ``gpus:``), else (a CPU container,
    ``gpus: 0``) the playbook command's own ``--nproc N``, else 1.

    Raises:
        ConfigError: ``--nproc`` without a positive integer after it.
    """
    if gpus > 0:
        return gpus
    for i, arg in enumerate(command):
        value = None
        if arg == "--nproc" and i + 1 < len(command):
            value = command[i + 1]
        elif arg.startswith("--nproc="):
            value = arg.partition("=")[2]
        if value is not None:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"playbook command: --nproc {value!r} is not a positive integer")
            return int(value)
    return 1


def launcher_command(command: t.Sequence[str], rdzv: Rendezvous, *, node_index: int,
                     nproc: int, local_addr: str) -> list[str]:
    """``command`` (``python3 -m MODULE ...`` or ``python3 SCRIPT ...``) run under torchrun.

    Raises:
        ConfigError: the command does not start with python (torchrun runs python programs).
    """
    argv = list(command)
    if not argv or argv[0].rsplit("/", 1)[-1] not in _PYTHONS or len(argv) < 2:
        raise ConfigError(f"--nodes runs the playbook command under torchrun, so it must be "
                          f"`python3 -m MODULE ...` or `python3 SCRIPT ...`; got {argv[:3]!r}")
    if argv[1] == "-m":
        if len(argv) < 3:
            raise ConfigError("playbook command: `-m` without a module name")
        program = ["-m", argv[2]]
        rest = argv[3:]
    elif argv[1].startswith("-"):
        raise ConfigError(f"playbook command: python option {argv[1]!r} before the program; "
                          "torchrun takes `-m MODULE` or a script path")
    else:
        program, rest = [argv[1]], argv[2:]
    return [argv[0], "-m", LAUNCHER_MODULE,
            f"--nnodes={rdzv.nnodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv.endpoint}", f"--rdzv-id={rdzv.run_id}",
            f"--rdzv-conf=is_host={1 if node_index == 0 else 0}",
            f"--local-addr={local_addr}", "--max-restarts=0",
            *program, *rest]


def socket_env(ifname: str | None) -> dict[str, str]:
    """``NCCL_SOCKET_IFNAME`` (and ``GLOO_SOCKET_IFNAME`` where gloo can take it: plain names,
    no ``^``/``=`` prefix) for an inventory ``socket_ifname``; nothing when unset."""
    if not ifname:
        return {}
    env = {"NCCL_SOCKET_IFNAME": ifname}
    if not ifname.startswith(("^", "=")):
        env["GLOO_SOCKET_IFNAME"] = ifname
    return env
