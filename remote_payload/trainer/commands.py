"""``python -m remote_payload.trainer [COMMAND] ...``: training (no command) or one of the
recipe's other steps. Each command lives in its own module; this table is the one place
they are listed.

    python -m remote_payload.trainer --preset tiny ...          # train (see train.py)
    python -m remote_payload.trainer regenerate ...             # the target writes the data
    python -m remote_payload.trainer pack DATA OUT [--tokenizer DIR]  # JSONL -> token store
    python -m remote_payload.trainer eval ...                   # acceptance length tau
    python -m remote_payload.trainer export CKPT OUT            # z-lab/dflash format
    python -m remote_payload.trainer e2e --out-dir DIR          # the whole recipe, tiny, CPU
"""

from __future__ import annotations

import argparse
import sys
import typing as t

from .. import safe_write, wire
from .checkpoint import CheckpointError
from .config import TrainerConfigError
from .events import Log


def _pack(argv: t.Sequence[str]) -> dict[str, t.Any]:
    from .chat_data import iter_records
    from .token_store import write_store

    p = argparse.ArgumentParser(prog="python -m remote_payload.trainer pack",
                                description="Write JSONL records as a memory-mapped token store.")
    p.add_argument("data", help="JSONL file or directory of *.jsonl shards")
    p.add_argument("out", help="store directory to write, whole or not at all; never a file, a "
                               "link, the current directory, a home or /")
    p.add_argument("--tokenizer", default=None, help="needed for messages/text records")
    p.add_argument("--force", action="store_true",
                   help="replace OUT although opsctl did not write it (its files are lost)")
    a = p.parse_args(argv)
    return {"out": a.out, **write_store(a.out, iter_records(a.data, a.tokenizer), force=a.force)}


def _export(argv: t.Sequence[str]) -> dict[str, t.Any]:
    import pathlib

    from .export import run
    from .serving import export_lines

    summary = run(argv)
    return {**summary, SAY_AFTER: export_lines(pathlib.Path(summary["out"]),
                                               pathlib.Path(summary["ckpt"]))}


def _regenerate(argv: t.Sequence[str]) -> dict[str, t.Any]:
    from .regenerate import run

    return run(argv)


def _eval(argv: t.Sequence[str]) -> dict[str, t.Any]:
    from .evaluate import run

    return run(argv)


def _e2e(argv: t.Sequence[str]) -> dict[str, t.Any]:
    from .e2e import run

    return run(argv)


#: a summary's human lines, said after the summary line and kept out of the event
SAY_AFTER = "say_after"

#: command -> (function, event its summary is sent as; None when the command sends its own)
COMMANDS: dict[str, tuple[t.Callable[[t.Sequence[str]], dict[str, t.Any]], str | None]] = {
    "regenerate": (_regenerate, None),
    "pack": (_pack, "pack"),
    "eval": (_eval, None),
    "export": (_export, "export"),
    "e2e": (_e2e, None),
}


def main(argv: t.Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        from .train import main as train_main

        return train_main(argv)
    fn, event = COMMANDS[argv[0]]
    log = Log()
    try:
        summary = fn(argv[1:])
    except (TrainerConfigError, CheckpointError, safe_write.DestinationError) as e:
        log.error(type(e).__name__, str(e))
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    after = summary.pop(SAY_AFTER, [])
    if event is not None:
        log.event(event, **summary)
        log.say(f"{argv[0]}: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    for line in after:
        log.say(line)
    log.event(wire.EVENT_PHASE, phase="done")
    return 0
