"""``doctor``: the container-side checks of ``opsctl doctor`` (:mod:`remote_payload.agent.doctor`).

Answers ``{"rows": [doctor rows], "facts": {...}}``; a check never raises, a machine
without GPUs answers ``skip`` rows.
"""

from __future__ import annotations

import argparse
import math
import typing as t


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--expect-gpus", type=int, default=None,
                   help="the GPU count the inventory gives the container")
    p.add_argument("--torch-timeout", type=float, default=60.0,
                   help="seconds for torch's CUDA init and a matmul on every GPU")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds for every check together: the reply is written within them, "
                        "a check with no time left a skip row")
    p.add_argument("--no-torch", action="store_true", help="skip the torch check")
    p.add_argument("--ct", default="<ct>", help="the container's id, for the fix lines")
    p.add_argument("--direct", action="store_true",
                   help="the agent runs on the SSH host itself (no container): fix lines for it")
    p.add_argument("--host-driver", default=None,
                   help="the driver version the host reports (its nvidia-smi or /proc): the "
                        "container's libraries are compared with it")


def run(verb: str, args: argparse.Namespace) -> dict[str, t.Any]:
    from remote_payload.agent import doctor

    timeout = min(max(args.torch_timeout, 1.0), 600.0)
    deadline = (min(max(args.deadline, 1.0), 3600.0)
                if args.deadline is not None and math.isfinite(args.deadline) else None)
    return doctor.run_all(args.root, expect_gpus=args.expect_gpus, torch_timeout_s=timeout,
                          torch=not args.no_torch, ctid=str(args.ct), host_driver=args.host_driver,
                          deadline_s=deadline, direct=args.direct)
