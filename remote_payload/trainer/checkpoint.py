"""Self-describing checkpoints, written atomically.

Layout of ``<out_dir>/ckpt-<step>/``: ``model.safetensors`` (drafter weights of the
*uncompiled* module; metadata holds cfg, step, torch version, run id), ``optim.pt``
(AdamW state), ``meta.json`` and opsctl's marker (kind ``checkpoint``, so an export never
lands on one). The directory is written under a temporary name and renamed into place, then
``<out_dir>/latest`` is replaced the same way, so a reader never sees half a checkpoint
(both through :mod:`remote_payload.safe_write`, the one writer of kept files). Files and
directories are fsynced before each rename: once :func:`save` returns, the checkpoint is on
the disk (the trainer says ``done`` only then).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import pathlib
import re
import sys
import typing as t

import torch
from torch import nn

from .. import safe_write

FORMAT = 1
_BAD_PREFIXES = ("_orig_mod.", "module.")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, malformed or does not match the model."""


def _check_keys(keys: t.Iterable[str], where: str) -> None:
    bad = sorted(k for k in keys if k.startswith(_BAD_PREFIXES) or "._orig_mod." in k)
    if bad:
        raise CheckpointError(
            f"{where}: unexpected wrapper prefixes in keys {bad[:3]} (a compiled or DDP module's "
            "state_dict was used; save and load the raw module)")


@functools.cache
def _warn_unreadable(mask: int, mode: int) -> None:
    print(f"warning: umask {mask:03o} makes checkpoints and exports mode {mode:04o}, unreadable to "
          "other users (a serving container running as another user cannot load them); "
          "umask 022 gives 0644", file=sys.stderr, flush=True)


def make_readable(paths: t.Iterable[pathlib.Path]) -> int:
    """Give weight files 0644, as far as the umask allows; returns the mode given.

    Why: safetensors' ``save_file`` creates its file 0600 while ``json``/``torch.save`` files
    get 0644, so a server running as another user could read a checkpoint's config and not
    its weights. A umask that takes read from group/others wins (the user chose it), with a
    one-line warning on stderr, once per process."""
    mask = safe_write.umask()
    mode = 0o644 & ~mask
    for p in paths:  # files of a fresh temporary directory of ours: never a link
        os.chmod(p, mode)
    if not mode & 0o004:
        _warn_unreadable(mask, mode)
    return mode


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def save_safetensors(state: dict[str, torch.Tensor], path: str,
                     metadata: dict[str, str] | None = None) -> None:
    """safetensors' ``save_file``, its I/O failures as the ``OSError`` they are.

    Why: safetensors raises ``SafetensorError("... No space left on device (os error 28)")``,
    which no ``except OSError`` sees; as an ``OSError`` a full disk becomes
    :mod:`~remote_payload.safe_write`'s one-line ``WriteFailed``.

    Raises:
        OSError: the disk said no (errno from the message).
    """
    from safetensors.torch import save_file

    try:
        save_file(state, path, metadata=metadata)
    except Exception as exc:
        m = _OS_ERROR.search(str(exc))
        if m is None or isinstance(exc, OSError):
            raise
        code = int(m.group(1))
        raise OSError(code, os.strerror(code), path) from None


def save(out_dir: str, step: int, raw_model: nn.Module, optim: torch.optim.Optimizer,
         meta: dict[str, t.Any]) -> pathlib.Path:
    """Write ``ckpt-<step>`` and point ``latest`` at it; returns the checkpoint path.

    Raises:
        DestinationRefused: ``out_dir`` or ``latest`` is a link, a protected place.
        WriteFailed: the disk said no (the previous checkpoints and ``latest`` are kept).
    """
    out = pathlib.Path(out_dir)
    final = out / f"ckpt-{step:07d}"
    state = {k: v.detach().contiguous().cpu() for k, v in raw_model.state_dict().items()}
    _check_keys(state, "save")
    full_meta = {"format": FORMAT, "step": step, "torch": torch.__version__, **meta}
    if not final.exists():
        with safe_write.new_directory(final, kind="checkpoint") as tmp:
            # the weights and the optimizer state (2x their size) are written at the same
            # time: both mostly wait on the disk (the final checkpoint of an 8B run)
            with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="ckpt") as pool:
                jobs = [pool.submit(save_safetensors, state, str(tmp / "model.safetensors"),
                                    metadata={"meta": json.dumps(full_meta, sort_keys=True)}),
                        pool.submit(torch.save, {"optim": optim.state_dict(), "step": step},
                                    tmp / "optim.pt")]
                for job in jobs:
                    job.result()
            (tmp / "meta.json").write_text(json.dumps(full_meta, indent=1, sort_keys=True))
            make_readable(p for p in tmp.iterdir() if p.is_file())
    safe_write.write_text(out / "latest", final.name + "\n")
    return final


#: what ``latest`` holds: the name of a checkpoint beside it (:func:`save` writes it)
_CKPT_NAME = re.compile(r"ckpt-[0-9]{7,}")


def _latest(out: pathlib.Path) -> pathlib.Path | None:
    """The checkpoint ``out/latest`` names, or None when there is no ``latest`` (a fresh run).

    A ``latest`` that is a FIFO, a link, a directory, oversized, or names anything but a
    checkpoint beside it (``../other-run``, ``/``, an empty line) is an error naming it:
    taking it for "no checkpoint" would train again from step 0 over a run's progress.

    Raises:
        CheckpointError: ``latest`` is there and names no checkpoint of this run.
    """
    latest = out / "latest"
    if not os.path.lexists(latest):
        return None
    fix = "remove it to start fresh, or name a checkpoint directory (--resume DIR, export DIR)"
    try:
        name = safe_write.read_regular(latest, 4096).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CheckpointError(f"{latest}: unreadable ({why}); {fix}") from None
    if not _CKPT_NAME.fullmatch(name) or not (out / name / "meta.json").is_file():
        raise CheckpointError(f"{latest}: names {name[:80]!r}, not a checkpoint in {out}; {fix}")
    return out / name


def resolve(resume: str | None, out_dir: str) -> pathlib.Path | None:
    """``None`` -> fresh start; ``auto`` -> ``out_dir/latest`` if any; else that directory.

    Raises:
        CheckpointError: an explicit path does not exist.
    """
    if resume is None:
        return None
    if resume == "auto":
        return _latest(pathlib.Path(out_dir))
    p = pathlib.Path(resume)
    if not (p / "meta.json").is_file():
        raise CheckpointError(f"--resume {resume}: no meta.json there")
    return p


def read_meta(path: pathlib.Path) -> dict[str, t.Any]:
    try:
        meta: dict[str, t.Any] = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable meta.json ({e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {meta.get('format')!r}, expected {FORMAT}")
    return meta


def load(path: pathlib.Path, raw_model: nn.Module, optim: torch.optim.Optimizer | None,
         device: torch.device) -> dict[str, t.Any]:
    """Load weights (and optimizer state) into the raw module; returns meta.

    Raises:
        CheckpointError: wrong format, wrapper prefixes, or key/shape mismatch.
    """
    from safetensors.torch import load_file

    meta = read_meta(path)
    state = load_file(str(path / "model.safetensors"), device=str(device))
    _check_keys(state, str(path))
    own = raw_model.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or extra:
        raise CheckpointError(f"{path}: keys differ (missing {missing[:3]}, unexpected {extra[:3]})")
    shapes = [k for k in own if own[k].shape != state[k].shape]
    if shapes:
        raise CheckpointError(f"{path}: shape mismatch for {shapes[:3]}")
    raw_model.load_state_dict(state)
    if optim is not None:
        opt_state = torch.load(path / "optim.pt", map_location=device, weights_only=True)
        optim.load_state_dict(opt_state["optim"])
    return meta
