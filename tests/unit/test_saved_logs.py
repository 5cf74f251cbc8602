"""The saved output of failed steps (``~/.opsctl/logs``) stays bounded whatever the container
answers: each log is cut to its cap (head and tail, the cut named), a repeat of the same
output is not saved again, the folder keeps a total limit with the oldest of *its own* logs
removed first, and a link planted in the folder is never written through."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from opsctl.config import paths
from opsctl.errors import RemoteCommandFailed
from opsctl.remote import savedlogs, transport
from opsctl.remote.agent_client import parse_reply
from opsctl.remote.command import CommandResult
from remote_payload import limits

MiB = 1 << 20


def hostile(n: int, size: int = 3 * MiB) -> CommandResult:
    """A reply that is no agent reply: ``size`` bytes of output, different each time."""
    body = (f"junk {n} ".encode() * (size // 8 + 1))[:size]
    return CommandResult(("python3", "-m", "remote_payload.agent", "status"), "pct exec 200 --",
                         0, body, b"Traceback: " + body[: size // 4], 0.5)


def logs(home: Path) -> list[Path]:
    return sorted(p for p in (home / "logs").iterdir() if savedlogs.NAME_RE.fullmatch(p.name))


def folder_bytes(home: Path) -> int:
    return sum(p.lstat().st_size for p in (home / "logs").iterdir())


def test_a_loop_of_hostile_replies_keeps_the_logs_folder_under_its_limit(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPSCTL_LOGS_TOTAL_BYTES", str(5 * MiB))
    paths_seen = set()
    for n in range(40):  # a dashboard polling a hostile container
        with pytest.raises(RemoteCommandFailed) as info:
            parse_reply("sandbox", 200, "agent status", hostile(n))
        saved = Path(str(info.value.log_path))
        assert saved.is_file()  # the error points at a log that is there
        paths_seen.add(saved)
        assert folder_bytes(isolated_env) <= 5 * MiB
    assert len(paths_seen) == 40
    assert len(logs(isolated_env)) >= 2  # the newest are kept


def test_one_log_keeps_the_head_and_the_tail_and_names_the_cut(isolated_env: Path):
    out = b"HEAD-" + b"m" * (8 * MiB) + b"-TAIL"
    path = transport.save_log("agent status", CommandResult(("x",), "x", 1, out, b"err", 0.1))
    data = path.read_bytes()
    assert len(data) <= limits.cap("LOG_FILE_BYTES") + 4096
    assert b"HEAD-" in data and b"-TAIL" in data and b"err" in data
    cut = len(out) - 2 * (limits.cap("LOG_FILE_BYTES") // 2 // 2)
    assert limits.cut_marker(cut).encode() in data
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_same_output_again_points_at_the_log_already_saved(isolated_env: Path):
    result = hostile(1, size=1000)
    first = transport.save_log("agent status", result)
    again = [transport.save_log("agent status", result) for _ in range(20)]
    assert set(again) == {first}
    assert len(logs(isolated_env)) == 1
    other = transport.save_log("agent status", hostile(2, size=1000))
    assert other != first


def test_only_opsctls_own_logs_are_removed_and_oldest_first(isolated_env: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPSCTL_LOGS_TOTAL_BYTES", str(2 * MiB))
    folder = paths.logs_dir()
    notes = folder / "notes.txt"  # the user's: never opsctl's to remove
    notes.write_bytes(b"n" * (3 * MiB))
    victim = isolated_env / "victim"
    victim.write_bytes(b"keep me")
    planted = folder / "20000101-000000-x-1-0123456789abcdef.log"  # named like ours, a link
    planted.symlink_to(victim)
    old = transport.save_log("old", hostile(1, size=900_000))
    past = time.time() - 3600
    os.utime(old, (past, past))
    new = transport.save_log("new", hostile(2, size=900_000))
    newer = transport.save_log("newer", hostile(3, size=900_000))
    assert not old.exists() and new.exists() and newer.exists()
    assert notes.read_bytes() == b"n" * (3 * MiB)
    assert planted.is_symlink() and victim.read_bytes() == b"keep me"


def test_a_folder_grown_huge_before_is_brought_under_the_limit_by_the_next_save(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch):
    folder = paths.logs_dir()
    for n in range(30):
        (folder / f"20260101-0000{n:02d}-step-1-{n:016x}.log").write_bytes(b"o" * (256 << 10))
    monkeypatch.setenv("OPSCTL_LOGS_TOTAL_BYTES", str(2 * MiB))
    latest = transport.save_log("agent status", hostile(9, size=1000))
    assert latest.exists() and folder_bytes(isolated_env) <= 2 * MiB


def test_a_link_planted_at_the_logs_name_is_not_followed(isolated_env: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    """Whoever can write in the folder and guesses the next name (its time, step, pid and
    content digest) gets a log beside their link, never through it."""
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20261203-101010")
    result = hostile(5, size=1000)
    digest = savedlogs._digest("agent status", result.command, result.rc,
                               (result.stdout, result.stderr))
    target = isolated_env / "authorized_keys"
    target.write_text("ssh-ed25519 AAAA user\n")
    link = paths.logs_dir() / f"20261203-101010-agent-status-{os.getpid()}-{digest}.log"
    link.symlink_to(target)
    saved = transport.save_log("agent status", result)
    assert saved != link and saved.is_file() and not saved.is_symlink()
    assert target.read_text() == "ssh-ed25519 AAAA user\n"
    assert link.is_symlink()


def test_a_fresh_log_never_opens_a_planted_link(isolated_env: Path):
    target = isolated_env / "target"
    target.write_text("mine")
    (paths.logs_dir() / "wheelhouse-x.log").symlink_to(target)
    fresh = paths.new_log("wheelhouse-x.log")
    assert fresh.name == "wheelhouse-x-1.log" and not fresh.is_symlink()
    assert target.read_text() == "mine"
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_the_folder_keeps_a_bounded_number_of_logs_however_small(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(savedlogs, "MAX_FILES", 5)
    kept = [transport.save_log("agent status", hostile(n, size=100)) for n in range(12)]
    assert len(logs(isolated_env)) == 5
    assert kept[-1].exists()


def _plant_file(logs_path: Path) -> None:
    logs_path.write_text("a file where the logs folder goes")


def _plant_dangling_link(logs_path: Path) -> None:
    logs_path.symlink_to("/nonexistent/opsctl-logs")


@pytest.mark.parametrize("plant", [_plant_file, _plant_dangling_link], ids=["file", "dangling-link"])
def test_a_bad_reply_when_the_logs_folder_cannot_be_made_is_still_the_reply_error(
        isolated_env: Path, plant):
    """The log serves the error being built: when this machine cannot keep it, the error is
    still the reply's (one line, its exit code), and its log path is the note that says why."""
    isolated_env.mkdir(parents=True, exist_ok=True)
    plant(isolated_env / "logs")
    with pytest.raises(RemoteCommandFailed) as info:
        parse_reply("sandbox", 200, "agent status",
                    CommandResult(("x",), "x", 0, b"not json\n", b"", 0.1))
    assert "is not JSON" in info.value.message
    assert str(info.value.log_path).startswith("not saved: ")
    assert "logs" in str(info.value.log_path) and "\n" not in str(info.value.log_path)
    assert (isolated_env / "logs").is_symlink() or (isolated_env / "logs").read_text().startswith("a file")


def test_a_full_disk_under_the_logs_folder_is_a_note_never_an_exception(
        isolated_env: Path, monkeypatch: pytest.MonkeyPatch):
    from remote_payload import safe_write

    def full(path, data, **kw):
        raise safe_write.WriteFailed(path, "No space left on device", 28)

    monkeypatch.setattr(safe_write, "write_bytes", full)
    saved = transport.save_log("agent status", hostile(1, size=100))
    assert isinstance(saved, savedlogs.UnsavedLog)
    assert str(saved).startswith("not saved: ") and "No space left" in str(saved)


def test_an_unsaved_note_is_one_inert_line():
    note = str(savedlogs.unsaved("/h/.opsctl/logs\x1b]0;pwned\x07\nsecond line\u202e"))
    assert note.isprintable() and "\x1b" not in note and "\u202e" not in note
    assert note.startswith("not saved: /h/.opsctl/logs")


def test_opsctl_status_with_a_bad_reply_and_logs_a_file_shows_the_reply_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tests.cli_runner import run_cli
    from tests.replies import ScriptedContainer, write_inventory

    home = tmp_path / ".opsctl"
    monkeypatch.setenv("OPSCTL_HOME", str(home))
    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(home / "inventory"))
    write_inventory(home)
    (home / "logs").write_text("a file where the logs folder goes")
    ScriptedContainer(lambda verb, args: b"not json\n").install(monkeypatch)
    res = run_cli("status", "--host", "pve1", "--ct", "200")
    assert res.exit_code == 25, res.output
    assert "Traceback" not in res.output
    lines = res.stderr.splitlines()
    assert lines[0].startswith("error: ") and "is not JSON" in lines[0]
    assert any(line.strip().startswith("full output: not saved: ") for line in lines), res.stderr
