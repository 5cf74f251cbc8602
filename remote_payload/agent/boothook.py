"""The queue's boot hook: after a container restart the queue moves on by itself.

No wrapper survives a restart, so nothing would call ``advance`` until the next opsctl call.
The first ``queue-add`` in a root installs a hook that runs the agent's ``queue-advance``
verb when the container boots: the jobs that were running become LOST, their dependants are
cancelled, and what can start starts, with no client connected.

- systemd running (``/run/systemd/system``): a unit of opsctl's own,
  ``/etc/systemd/system/opsctl-queue-<hash of the root>.service`` (``Type=oneshot``,
  ``KillMode=process`` so the jobs it starts outlive it), enabled by the symlink
  ``systemctl enable`` would make in ``multi-user.target.wants/``;
- otherwise ``crontab`` present: one ``@reboot`` line in root's crontab, after a comment
  naming opsctl, added once (the other lines are kept as they are);
- otherwise no hook, and the reply says so (the CLI prints it).

A file opsctl did not write (no :data:`MARK` on its first line) is never overwritten. The
hook's command is an argv: quoted word by word by systemd's rules (:func:`systemd_quote`) or,
for cron, joined once with :func:`shlex.join` (``%`` escaped, cron's one special character).
It runs the root's ``payload`` symlink, which the payload store never removes (it is the
current payload). The verb takes the queue lock, as every ``advance`` does: running it twice,
or beside a wrapper, never starts a job twice.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import sys
import typing as t

from remote_payload import boundedread, procgroup, safe_write

if t.TYPE_CHECKING:
    from remote_payload.wire_shapes import BootHookDoc

SYSTEMD_RUNNING = "/run/systemd/system"
UNIT_DIR = "/etc/systemd/system"
WANTED_BY = "multi-user.target"
#: the first line of every file opsctl writes here: what has it is opsctl's to rewrite
MARK = "# opsctl queue boot hook"
ADVANCE_VERB = "queue-advance"
NO_HOOK = ("no boot hook in this container (no systemd, no cron): after a restart the queue "
           "waits for the next opsctl call")
MAX_ROOT = 1024
#: ``OPSCTL_BOOT_HOOK=off`` in the agent's environment: install nothing (the tests that run the
#: agent on a workstation set it; a container that wants no hook may too)
ENV_SWITCH = "OPSCTL_BOOT_HOOK"


def check_root(root: str) -> None:
    """A root a hook can name: absolute, UTF-8, printable (no newline can end a unit line or
    a crontab entry early).

    Raises:
        ValueError: naming what is wrong.
    """
    if not root.startswith("/"):
        raise ValueError(f"the root {root!r} is not an absolute path")
    if len(root) > MAX_ROOT:
        raise ValueError(f"the root is {len(root)} characters long; at most {MAX_ROOT}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in root):
        raise ValueError(f"the root {root!r} holds a control character (a newline, a tab)")
    try:
        root.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the root {root!r} is not valid UTF-8") from None


def hook_name(root: str) -> str:
    """``opsctl-queue-<16 hex>``: opsctl's, and one per root (two roots, two hooks)."""
    return "opsctl-queue-" + hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def advance_argv(root: str, python: str | None = None, env: str | None = None) -> list[str]:
    """The hook's command: this root's current payload runs ``queue-advance``."""
    return [env or shutil.which("env") or "/usr/bin/env", f"PYTHONPATH={root}/payload",
            python or sys.executable or "/usr/bin/python3", "-m", "remote_payload.agent",
            "--root", root, ADVANCE_VERB]


def systemd_quote(word: str) -> str:
    """One argv word for ``ExecStart=``, by systemd's rules (systemd.service(5), "Command
    lines"; systemd.unit(5), "Specifiers"): double quotes, C escapes for ``\\`` and ``"``,
    ``%%`` for a literal ``%`` (specifiers are expanded even inside quotes) and ``$$`` for a
    literal ``$`` (environment variables too).

    Raises:
        ValueError: a control character (systemd would end or fold the line there).
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in word):
        raise ValueError(f"{word!r} holds a control character; it cannot be a unit's argument")
    body = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{body}"'


def unit_text(root: str, argv: t.Sequence[str]) -> str:
    name = hook_name(root)
    return "\n".join([
        f"{MARK} for the opsctl root in ExecStart (written by opsctl; remove: "
        f"systemctl disable {name}.service && rm {UNIT_DIR}/{name}.service)",
        "[Unit]",
        "Description=opsctl: move the job queue on after a container restart",
        "After=network-online.target local-fs.target",
        "",
        "[Service]",
        "Type=oneshot",
        # the jobs it starts (tmux, wrappers) stay when this process ends
        "KillMode=process",
        "TimeoutStartSec=600",
        "ExecStart=" + " ".join(systemd_quote(w) for w in argv),
        "",
        "[Install]",
        f"WantedBy={WANTED_BY}",
        "",
    ])


def cron_command(argv: t.Sequence[str]) -> str:
    """The argv as the one shell line cron runs (``shlex.join``); ``%`` becomes ``\\%``
    (crontab(5): an unescaped ``%`` ends the command, even inside quotes).

    Raises:
        ValueError: a control character.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for w in argv for c in w):
        raise ValueError("a control character cannot be in a crontab line")
    return shlex.join(argv).replace("%", "\\%")


def ensure(root: str, *, systemd_flag: str = SYSTEMD_RUNNING, unit_dir: str = UNIT_DIR,
           crontab: str | None = "crontab", argv: t.Sequence[str] | None = None) -> BootHookDoc:
    """Install the boot hook for ``root`` if it is not there (idempotent); never raises: a
    hook that cannot be installed is a warning (the jobs are queued and run all the same)."""
    if os.environ.get(ENV_SWITCH) == "off":
        return {"kind": "none", "path": None, "warning": f"no boot hook ({ENV_SWITCH}=off): "
                "after a restart the queue waits for the next opsctl call"}
    try:
        check_root(root)
        command = list(argv) if argv is not None else advance_argv(root)
        if os.path.isdir(systemd_flag):
            return _ensure_unit(root, command, unit_dir)
        cron = shutil.which(crontab) if crontab else None
        if cron:
            return _ensure_cron(root, command, cron)
    except (OSError, ValueError) as exc:  # TimeoutError included: a hung crontab was ended
        return {"kind": "none", "path": None,
                "warning": f"no boot hook ({exc}): after a restart the queue waits for the "
                           "next opsctl call"}
    return {"kind": "none", "path": None, "warning": NO_HOOK}


def _ensure_unit(root: str, argv: list[str], unit_dir: str) -> BootHookDoc:
    name = hook_name(root) + ".service"
    path = os.path.join(unit_dir, name)
    text = unit_text(root, argv)
    existing: str | None
    try:
        existing = boundedread.read_regular(path, 1 << 16, cut=True).decode("utf-8", "replace")
    except FileNotFoundError:
        existing = None
    except boundedread.Refused:  # a link, FIFO or directory there: not opsctl's unit
        existing = ""
    if existing is not None and not existing.startswith(MARK):
        return {"kind": "none", "path": path, "warning": f"{path} exists and opsctl did not "
                "write it: left alone, no boot hook (after a restart the queue waits for the "
                "next opsctl call)"}
    if existing != text:
        os.makedirs(unit_dir, exist_ok=True)
        safe_write.write_text(path, text, mode=0o644)
    wants = os.path.join(unit_dir, f"{WANTED_BY}.wants")
    link = os.path.join(wants, name)
    if os.path.islink(link) and os.readlink(link) == path:
        return {"kind": "systemd", "path": path, "warning": None}
    if os.path.lexists(link):
        return {"kind": "none", "path": path, "warning": f"{link} exists and opsctl did not make "
                "it: left alone, the unit is not enabled (after a restart the queue waits for "
                "the next opsctl call)"}
    os.makedirs(wants, exist_ok=True)
    safe_write.write_link(link, path)
    return {"kind": "systemd", "path": path, "warning": None}


def _ensure_cron(root: str, argv: list[str], cron: str) -> BootHookDoc:
    line = "@reboot " + cron_command(argv)
    listed = procgroup.run([cron, "-l"], 30)
    if listed.rc != 0 and b"no crontab" not in listed.err.lower():
        raise OSError(f"crontab -l failed: {listed.err.decode(errors='replace').strip()[:200]}")
    text = listed.out.decode("utf-8", "surrogateescape") if listed.rc == 0 else ""
    where = f"root's crontab ({hook_name(root)})"
    if line in text.splitlines():
        return {"kind": "cron", "path": where, "warning": None}
    if text and not text.endswith("\n"):
        text += "\n"
    text += f"{MARK} ({hook_name(root)}), written by opsctl: the next line moves its queue on\n"
    text += line + "\n"
    wrote = procgroup.run([cron, "-"], 30, input=text.encode("utf-8", "surrogateescape"))
    if wrote.rc != 0:
        raise OSError(f"crontab - failed: {wrote.err.decode(errors='replace').strip()[:200]}")
    return {"kind": "cron", "path": where, "warning": None}
