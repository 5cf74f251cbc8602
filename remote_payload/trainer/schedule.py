"""How long a run is and how its learning rate moves: epochs -> steps, warm-up as a ratio.

The paper's recipe (arXiv 2602.06036) is a number of epochs over the regenerated set, a
warm-up of a fixed fraction of all steps, then cosine decay to 0. Steps stay the unit of
checkpoints and resume, so epochs are turned into steps once, here, from the data source's
batches per epoch and the number of drafter ranks (each consumes its own batches).
"""

from __future__ import annotations

import math
import typing as t
from dataclasses import dataclass, replace

from .config import TrainArgs, TrainerConfigError


@dataclass(frozen=True)
class Schedule:
    steps: int  # optimizer steps of the whole run
    warmup_steps: int  # linear warm-up steps (then cosine to lr * min_lr_ratio)


def resolve(args: TrainArgs, batches_per_epoch: int | None, n_drafters: int) -> Schedule:
    """Steps and warm-up of a run.

    Raises:
        TrainerConfigError: ``--epochs`` with a source that has no epochs.
    """
    steps = args.steps
    if args.epochs:
        if not batches_per_epoch:
            raise TrainerConfigError("--epochs needs a data source with epochs (--data)")
        steps = max(1, math.ceil(args.epochs * batches_per_epoch / max(1, n_drafters)))
    warmup = round(args.warmup_ratio * steps) if args.warmup_ratio > 0 else args.warmup_steps
    return Schedule(steps=steps, warmup_steps=min(warmup, steps))


def apply(args: TrainArgs, source: t.Any, n_drafters: int) -> TrainArgs:
    """``args`` with ``steps``/``warmup_steps`` resolved (unchanged without epochs/ratio)."""
    per_epoch = getattr(source, "batches_per_epoch", lambda: None)()
    s = resolve(args, per_epoch, n_drafters)
    return replace(args, steps=s.steps, warmup_steps=s.warmup_steps)
