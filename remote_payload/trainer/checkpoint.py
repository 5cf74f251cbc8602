"""Self-describing checkpoints, written atomically.

Layout of ``<out_dir>/ckpt-<step>/``: ``model.safetensors`` (drafter weights of the
*uncompiled* module; metadata holds cfg, step, torch version, run id), ``optim.pt``
(AdamW state), ``meta.json`` and opsctl's marker (kind ``checkpoint``, so an export never
lands on one). The directory is written under a temporary name and renamed into place, then
``<out_dir>/latest`` is replaced the same way, so a reader never sees half a checkpoint
(both through :mod:`remote_payload.safe_write`, the one writer of kept files). Files and
directories are fsynced before each rename: once :func:`save` (or :func:`commit`, the
background writer's, :mod:`.saver`) returns, the checkpoint is on the disk (the trainer says
``done`` only then).

Removing old checkpoints (``--keep-last N``, ``--keep-every K``: :func:`prune`) and reading one
(a resume, ``export``, ``eval``: :func:`resolve` and :func:`load`) meet on a ``flock`` of the
checkpoint directory: a reader holds it shared until it is done (the process's end, or
:func:`release`), the pruner takes it exclusive without waiting and leaves a directory it cannot
take. A reader that finds the directory gone once it holds the lock (removed while it was being
opened) gets a :class:`CheckpointError` saying so, never half a checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
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


def save_torch(obj: t.Any, path: pathlib.Path) -> None:
    """``torch.save`` of ``obj`` into a new file ``path``, its I/O failures as the ``OSError``
    they are.

    Why: given a path, torch's zip writer turns a full disk into ``RuntimeError("[enforce fail
    at inline_container.cc:672] . unexpected pos 171264 vs 171156")``, which names neither the
    disk nor the file, and no ``except OSError`` sees it (the run ended in a traceback).
    Given a Python file, the ``OSError`` its ``write`` raised is that error's context.

    Raises:
        OSError: the disk said no.
    """
    try:
        with open(path, "wb") as f:
            torch.save(obj, f)
    except OSError:
        raise
    except Exception as exc:
        seen: BaseException | None = exc.__context__
        while seen is not None and not isinstance(seen, OSError):
            seen = seen.__context__
        if seen is None:
            raise
        raise OSError(seen.errno, seen.strerror, str(path)) from None


def save(out_dir: str, step: int, raw_model: nn.Module, optim: torch.optim.Optimizer,
         meta: dict[str, t.Any]) -> pathlib.Path:
    """Write ``ckpt-<step>`` and point ``latest`` at it, on the calling thread (the weights
    copied with ``.cpu()``); returns the checkpoint path.

    Raises:
        DestinationRefused: ``out_dir`` or ``latest`` is a link, a protected place.
        WriteFailed: the disk said no (the previous checkpoints and ``latest`` are kept).
    """
    state = {k: v.detach().contiguous().cpu() for k, v in raw_model.state_dict().items()}
    return commit(out_dir, step, state, optim.state_dict(), meta)


def commit(out_dir: str, step: int, model_state: dict[str, torch.Tensor],
           optim_state: dict[str, t.Any], meta: dict[str, t.Any], *,
           after_weights: t.Callable[[], None] | None = None) -> pathlib.Path:
    """Write ``ckpt-<step>`` from a state already copied (host tensors: the background
    writer's, :mod:`.saver`) and then point ``latest`` at it; returns the checkpoint path.
    A ``ckpt-<step>`` already there that this run wrote (a resumed run that reaches a step an
    earlier attempt committed: its ``run_id`` is in ``meta["lineage"]``) is kept and named;
    one another run wrote (two trainers sharing an out-dir) is refused, so ``latest`` never
    names another run's weights as this one's. ``after_weights``: a test's pause between the
    two files (they are then written one after the other).

    Raises:
        DestinationRefused: ``out_dir`` or ``latest`` is a link, a protected place, or
            ``ckpt-<step>`` is another run's.
        WriteFailed: the disk said no (the previous checkpoints and ``latest`` are kept).
    """
    out = pathlib.Path(out_dir)
    final = out / f"ckpt-{step:07d}"
    _check_keys(model_state, "save")
    full_meta = {"format": FORMAT, "step": step, "torch": torch.__version__, **meta}
    kept = final.is_dir() and not final.is_symlink() and (final / "meta.json").is_file()
    if kept:
        _check_ours(final, step, [str(x) for x in meta.get("lineage") or [meta.get("run_id")]])
    else:
        # anything else there (a file, a link, a user's directory) is refused by new_directory
        with safe_write.new_directory(final, kind="checkpoint") as tmp:
            weights = functools.partial(
                save_safetensors, model_state, str(tmp / "model.safetensors"),
                metadata={"meta": json.dumps(full_meta, sort_keys=True)})
            moments = functools.partial(save_torch, {"optim": optim_state, "step": step},
                                        tmp / "optim.pt")
            if after_weights is not None:
                weights()
                after_weights()
                moments()
            else:
                # the weights and the optimizer state (2x their size) are written at the same
                # time: both mostly wait on the disk (the final checkpoint of an 8B run)
                with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="ckpt") as pool:
                    for job in [pool.submit(weights), pool.submit(moments)]:
                        job.result()
            (tmp / "meta.json").write_text(json.dumps(full_meta, indent=1, sort_keys=True))
            make_readable(p for p in tmp.iterdir() if p.is_file())
    safe_write.write_text(out / "latest", final.name + "\n")
    return final


#: bytes of a checkpoint's ``meta.json`` read to learn whose it is (it holds a few hundred)
META_BYTES = 1 << 20


def _check_ours(ckpt: pathlib.Path, step: int, lineage: list[str]) -> None:
    """Refuse ``ckpt`` unless one of ``lineage`` (this run's ids) wrote it at ``step``."""
    try:
        meta = json.loads(safe_write.read_regular(ckpt / "meta.json", META_BYTES))
    except (OSError, ValueError) as exc:
        meta, why = None, f"its meta.json cannot be read ({exc})"
    else:
        why = "" if isinstance(meta, dict) else "its meta.json is not an object"
    if isinstance(meta, dict):
        if meta.get("run_id") in lineage and meta.get("step") == step:
            return
        why = (f"it holds run {str(meta.get('run_id'))[:40]!r} at step {meta.get('step')!r}, "
               f"not this run's step {step}")
    raise safe_write.DestinationRefused(
        ckpt, f"already there and not this run's: {why}; two trainers share this --out-dir? "
        "(each run needs its own; nothing was written and latest was not moved)")


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
        found = _latest(pathlib.Path(out_dir))
        if found is not None:
            hold(found)
        return found
    p = pathlib.Path(resume)
    if not (p / "meta.json").is_file():
        raise CheckpointError(f"--resume {resume}: no meta.json there")
    hold(p)
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

    hold(path)
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


# --- readers and removal ------------------------------------------------------------------

#: how long a reader waits for a removal that holds the checkpoint's lock (a rename: instant)
READ_LOCK_WAIT_S = 30.0
_HELD: dict[str, int] = {}


def hold(path: pathlib.Path) -> None:
    """Hold a shared lock on checkpoint ``path`` until :func:`release` or the process ends,
    so :func:`prune` leaves it while it is read (idempotent).

    Raises:
        CheckpointError: ``path`` cannot be opened, or was removed while it was opened.
    """
    import fcntl
    import time

    key = os.path.abspath(path)
    if key in _HELD:
        try:
            if os.stat(key, follow_symlinks=False).st_ino == os.fstat(_HELD[key]).st_ino:
                return
        except OSError:
            pass
        release(path)  # a directory since replaced at the same path: hold the new one
    try:
        fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be opened ({e.strerror or e})") from None
    deadline = time.monotonic() + READ_LOCK_WAIT_S
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CheckpointError(f"{path}: locked by a removal for over "
                                          f"{READ_LOCK_WAIT_S:.0f} s; try again") from None
                time.sleep(0.05)
        try:
            same = os.stat(key, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if not same:
            raise CheckpointError(f"{path}: removed (--keep-last) while it was being opened; "
                                  "read the run's latest checkpoint")
    except BaseException:
        os.close(fd)
        raise
    _HELD[key] = fd


def release(path: pathlib.Path) -> None:
    """Let :func:`prune` remove ``path`` again (the end of a resume's read)."""
    fd = _HELD.pop(os.path.abspath(path), None)
    if fd is not None:
        os.close(fd)


def _step_of(name: str) -> int | None:
    return int(name[5:]) if _CKPT_NAME.fullmatch(name) else None


_STALE = re.compile(r"\.(ckpt-[0-9]{7,})\.[0-9a-f]{12}\.(?:tmp|old)")


def kept_steps(steps: t.Iterable[int], keep_last: int, keep_every: int = 0) -> set[int]:
    """The steps :func:`prune` keeps of ``steps``: the ``keep_last`` highest (all when 0)
    and, for ``keep_every`` K > 0, the lowest step at or after each multiple of K."""
    ordered = sorted(set(steps))
    keep = set(ordered[-keep_last:]) if keep_last > 0 else set(ordered)
    if keep_every > 0:
        firsts: dict[int, int] = {}
        for s in ordered:
            if s >= keep_every:
                firsts.setdefault(s // keep_every, s)
        keep.update(firsts.values())
    return keep


def _trainers(out: pathlib.Path) -> dict[int, tuple[pathlib.Path, str]]:
    """The checkpoints a trainer wrote in ``out``, by step: a real directory ``ckpt-<step>``
    with opsctl's marker of kind ``checkpoint`` and a ``meta.json`` of that step; with the
    ``run_id`` that wrote it. Anything else (a user's directory, a link) is not one.

    Raises:
        OSError: ``out`` cannot be listed (a missing ``out`` holds none).
    """
    found: dict[int, tuple[pathlib.Path, str]] = {}
    try:
        entries = list(os.scandir(out))
    except FileNotFoundError:
        return found
    for entry in entries:
        step = _step_of(entry.name)
        if step is None or not entry.is_dir(follow_symlinks=False):
            continue
        marker = safe_write.read_marker(entry.path)
        if marker is None or marker.get("kind") != "checkpoint":
            continue
        try:
            meta = json.loads(safe_write.read_regular(os.path.join(entry.path, "meta.json"),
                                                      META_BYTES))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("step") == step:
            found[step] = (pathlib.Path(entry.path), str(meta.get("run_id"))[:80])
    return found


def _remove_unread(path: pathlib.Path) -> str | None:
    """Remove the checkpoint ``path`` unless it is being read (its lock is held) or was
    changed since it was written; None when removed, else why it stays."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        return f"cannot be opened ({e.strerror or e})"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "being read (a resume, export or eval holds it)"
        try:
            safe_write.remove_directory(path, kind="checkpoint")
        except safe_write.DestinationError as e:
            return e.reason
        return None
    finally:
        os.close(fd)


def others(out_dir: str, owners: t.Collection[str]) -> list[tuple[str, str]]:
    """``(name, run_id)`` of the checkpoints in ``out_dir`` that a run not in ``owners``
    wrote, oldest first (none known when ``out_dir`` cannot be listed: its first checkpoint
    then fails in one line)."""
    try:
        found = _trainers(pathlib.Path(out_dir))
    except OSError:
        return []
    return [(path.name, run) for _, (path, run) in sorted(found.items()) if run not in owners]


def replace_others(out_dir: str, owners: t.Collection[str]) -> list[str]:
    """Remove the checkpoints of runs not in ``owners`` (``--replace-checkpoints``), then a
    ``latest`` that named one of them; returns the names removed.

    Raises:
        CheckpointError: one could not be removed (a reader holds it, a user changed it):
            nothing of it is lost, and the run does not start over it.
    """
    out = pathlib.Path(out_dir)
    named = None
    with contextlib.suppress(CheckpointError):
        named = _latest(out)
    removed: list[str] = []
    kept: list[str] = []
    try:
        found = _trainers(out)
    except OSError as e:
        raise CheckpointError(f"{out_dir}: unreadable ({e.strerror or e})") from None
    for _, (path, run) in sorted(found.items()):
        if run in owners:
            continue
        why = _remove_unread(path)
        if why is None:
            removed.append(path.name)
        else:
            kept.append(f"{path.name}: {why}")
    if kept:
        raise CheckpointError(f"{out_dir}: --replace-checkpoints could not remove "
                              f"{'; '.join(kept[:3])}; nothing else was started")
    if named is not None and named.name in removed:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out / "latest")
    return removed


def prune(out_dir: str, *, keep_last: int, keep_every: int = 0,
          owners: t.Collection[str]) -> tuple[list[str], list[str]]:
    """Remove this run's older checkpoints; returns (names removed, ``"name: why"`` of those
    the policy would remove but that stay).

    The policy sees only checkpoints of this run: a real directory ``ckpt-<step>`` beside
    ``latest`` with opsctl's marker of kind ``checkpoint`` and a ``meta.json`` whose
    ``run_id`` is one of ``owners`` (this process's run id and those of the attempts it
    resumed from). Anything else there (another run's checkpoints, a user's directory, a link)
    is never counted and never touched. Of this run's checkpoints it keeps the ``keep_last``
    newest by step, the milestones (``keep_every`` K > 0: the earliest checkpoint at or after
    each multiple of K) and the one ``latest`` names; it removes the rest, except one being
    read (its lock is held: :func:`hold`) or changed since it was written (the marker's
    manifest: :func:`remote_payload.safe_write.remove_directory`). ``latest`` unreadable:
    nothing is removed. Temporary siblings a killed writer or removal left are cleaned too.
    ``keep_last`` 0 removes nothing.
    """
    if keep_last < 1:
        return [], []
    out = pathlib.Path(out_dir)
    try:
        latest = _latest(out)
    except CheckpointError as e:
        return [], [f"latest: {e}"]
    try:
        stale = {m.group(1) for name in os.listdir(out) if (m := _STALE.fullmatch(name))}
        mine = {step: path for step, (path, run) in _trainers(out).items() if run in owners}
    except OSError as e:
        return [], [f"{out}: unreadable ({e.strerror or e})"]
    for name in sorted(stale):
        safe_write.clean_stale(out / name)
    steps = sorted(mine)
    keep = kept_steps(steps, keep_last, keep_every)
    removed: list[str] = []
    kept: list[str] = []
    for step in steps:
        path = mine[step]
        if step in keep:
            continue
        if latest is not None and path.name == latest.name:
            kept.append(f"{path.name}: named by latest")
            continue
        why = _remove_unread(path)
        if why is None:
            removed.append(path.name)
        else:
            kept.append(f"{path.name}: {why}")
    return removed, kept
