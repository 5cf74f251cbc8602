"""The queue's boot hook (``remote_payload/agent/boothook.py``): installed once,
never over a file opsctl did not write, its command an argv quoted by systemd's or cron's
rules for any root, however hostile. Unit dirs are tmp dirs; cron is a stand-in script that
keeps the crontab in a file (the real ``crontab`` would edit this machine's)."""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remote_payload.agent import boothook

HOSTILE_ROOTS = ["/opt/opsctl", "/opt/my root", '/opt/"quoted"', "/opt/it's", "/opt/100%",
                 "/opt/%n%%", "/opt/$HOME", "/opt/${PATH}", "/opt/$$", "/opt/back\\slash",
                 "/opt/semi;colon", "/opt/ünïcode", "/opt/`id`", "/opt/-dash", "/opt/a b/ c"]


def systemd_words(exec_start: str) -> list[str]:
    """ExecStart's argv as systemd reads it (systemd.unit(5) specifiers, then words with
    quotes and C escapes, then ``$$``), for the quoting this module writes."""
    line = ""
    i = 0
    while i < len(exec_start):  # specifiers: %% is %, any other % is a specifier (never ours)
        if exec_start[i] == "%":
            assert exec_start[i + 1] == "%", f"an unescaped specifier in {exec_start!r}"
            i += 1
        line += exec_start[i]
        i += 1
    words: list[str] = []
    i = 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        assert line[i] == '"', f"an unquoted word in {line!r}"
        i += 1
        word = ""
        while line[i] != '"':
            if line[i] == "\\":
                i += 1
                assert line[i] in '\\"', f"an escape systemd reads differently: {line!r}"
            word += line[i]
            i += 1
        i += 1
        assert "$" not in word.replace("$$", ""), f"a lone $ would be a variable: {word!r}"
        words.append(word.replace("$$", "$"))
    return words


def cron_words(line: str) -> list[str]:
    """The argv of a crontab command: cron turns ``\\%`` into ``%`` (and an unescaped ``%``
    would end the command), then ``/bin/sh`` splits it."""
    out, i = "", 0
    while i < len(line):
        if line[i] == "\\" and line[i + 1:i + 2] == "%":
            out += "%"
            i += 2
            continue
        assert line[i] != "%", f"an unescaped % in {line!r}"
        out += line[i]
        i += 1
    return shlex.split(out)


printable = st.text(st.characters(min_codepoint=0x20, exclude_characters="\x7f",
                                  exclude_categories=("Cs",)), max_size=40)


@given(printable)
def test_any_printable_word_survives_systemd_quoting(word: str) -> None:
    assert systemd_words(boothook.systemd_quote(word)) == [word]


@given(printable)
def test_any_printable_root_survives_the_crontab_line(tail: str) -> None:
    argv = boothook.advance_argv("/" + tail, python="/usr/bin/python3", env="/usr/bin/env")
    assert cron_words(boothook.cron_command(argv)) == argv


@pytest.mark.parametrize("root", HOSTILE_ROOTS)
def test_a_hostile_root_is_one_argument_of_the_unit(root: str) -> None:
    argv = boothook.advance_argv(root, python="/usr/bin/python3", env="/usr/bin/env")
    text = boothook.unit_text(root, argv)
    [exec_start] = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert systemd_words(exec_start.removeprefix("ExecStart=")) == argv
    assert argv[argv.index("--root") + 1] == root and argv[1] == f"PYTHONPATH={root}/payload"


@pytest.mark.parametrize("root", ["relative/root", "/opt/new\nline", "/opt/tab\t",
                                  "/opt/nul\x00", "/opt/" + "x" * 2000, "/opt/\udcff"])
def test_a_root_no_hook_can_name_is_refused(root: str) -> None:
    with pytest.raises(ValueError):
        boothook.check_root(root)
    doc = boothook.ensure(root, systemd_flag="/", unit_dir="/nonexistent-never-written")
    assert doc["kind"] == "none" and "after a restart the queue waits" in str(doc["warning"])


def test_two_roots_get_two_hooks_and_one_root_always_the_same() -> None:
    assert boothook.hook_name("/opt/a") == boothook.hook_name("/opt/a")
    assert boothook.hook_name("/opt/a") != boothook.hook_name("/opt/b")
    assert boothook.hook_name("/opt/a").startswith("opsctl-queue-")


def _systemd(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    flag = tmp_path / "run-systemd"
    flag.mkdir()
    unit_dir = tmp_path / "units"
    return unit_dir, {"systemd_flag": str(flag), "unit_dir": str(unit_dir)}


def test_systemd_gets_an_enabled_unit_once(tmp_path: Path) -> None:
    unit_dir, where = _systemd(tmp_path)
    doc = boothook.ensure("/opt/my root", **where)
    name = boothook.hook_name("/opt/my root") + ".service"
    unit = unit_dir / name
    assert doc == {"kind": "systemd", "path": str(unit), "warning": None}
    text = unit.read_text()
    assert text.startswith(boothook.MARK) and "Type=oneshot" in text and "KillMode=process" in text
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    link = unit_dir / "multi-user.target.wants" / name
    assert os.readlink(link) == str(unit)
    before = unit.stat().st_mtime_ns
    assert boothook.ensure("/opt/my root", **where) == doc  # idempotent: nothing rewritten
    assert unit.stat().st_mtime_ns == before
    assert sorted(p.name for p in unit_dir.iterdir()) == sorted([name, "multi-user.target.wants"])


def test_its_own_outdated_unit_is_rewritten(tmp_path: Path) -> None:
    unit_dir, where = _systemd(tmp_path)
    boothook.ensure("/opt/r", **where, argv=["/old/env", "x"])
    boothook.ensure("/opt/r", **where)
    assert "/old/env" not in (unit_dir / (boothook.hook_name("/opt/r") + ".service")).read_text()


def test_a_unit_file_opsctl_did_not_write_is_left_alone(tmp_path: Path) -> None:
    unit_dir, where = _systemd(tmp_path)
    unit_dir.mkdir()
    theirs = unit_dir / (boothook.hook_name("/opt/r") + ".service")
    theirs.write_text("[Service]\nExecStart=/bin/true\n")
    doc = boothook.ensure("/opt/r", **where)
    assert doc["kind"] == "none" and "opsctl did not write it" in str(doc["warning"])
    assert theirs.read_text() == "[Service]\nExecStart=/bin/true\n"
    assert not (unit_dir / "multi-user.target.wants").exists()


def test_an_enable_link_opsctl_did_not_make_is_left_alone(tmp_path: Path) -> None:
    unit_dir, where = _systemd(tmp_path)
    wants = unit_dir / "multi-user.target.wants"
    wants.mkdir(parents=True)
    link = wants / (boothook.hook_name("/opt/r") + ".service")
    link.symlink_to("/dev/null")  # masked by hand
    doc = boothook.ensure("/opt/r", **where)
    assert doc["kind"] == "none" and "not enabled" in str(doc["warning"])
    assert os.readlink(link) == "/dev/null"


def test_an_unwritable_unit_dir_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    unit_dir, where = _systemd(tmp_path)
    unit_dir.write_text("a file where the unit dir should be (root can write any dir)")
    doc = boothook.ensure("/opt/r", **where)
    assert doc["kind"] == "none" and "after a restart the queue waits" in str(doc["warning"])


def test_no_systemd_and_no_cron_says_so(tmp_path: Path) -> None:
    doc = boothook.ensure("/opt/r", systemd_flag=str(tmp_path / "absent"),
                          crontab="no-such-crontab-here")
    assert doc == {"kind": "none", "path": None, "warning": boothook.NO_HOOK}


def test_the_switch_turns_the_hook_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unit_dir, where = _systemd(tmp_path)
    monkeypatch.setenv(boothook.ENV_SWITCH, "off")
    assert boothook.ensure("/opt/r", **where)["kind"] == "none"
    assert not unit_dir.exists()


@pytest.fixture
def fake_crontab(tmp_path: Path) -> tuple[str, Path]:
    """A ``crontab`` that keeps root's crontab in a file (``-l`` / ``-``), as cron's does."""
    table = tmp_path / "crontab.txt"
    script = tmp_path / "crontab"
    script.write_text(f"""#!/bin/sh
if [ "$1" = -l ]; then
  [ -f {shlex.quote(str(table))} ] || {{ echo "no crontab for root" >&2; exit 1; }}
  exec cat {shlex.quote(str(table))}
fi
[ "$1" = - ] && exec cat > {shlex.quote(str(table))}
exit 2
""")
    script.chmod(0o755)
    return str(script), table


def test_cron_gets_one_reboot_line_and_keeps_the_others(tmp_path: Path,
                                                         fake_crontab: tuple[str, Path]) -> None:
    cron, table = fake_crontab
    table.write_text("MAILTO=ops\n0 3 * * * /usr/local/bin/backup  # theirs")  # no final newline
    kw = {"systemd_flag": str(tmp_path / "absent"), "crontab": cron}
    doc = boothook.ensure("/opt/100% root", **kw)
    assert doc["kind"] == "cron" and doc["warning"] is None
    assert boothook.ensure("/opt/100% root", **kw) == doc  # idempotent
    lines = table.read_text().splitlines()
    assert lines[:2] == ["MAILTO=ops", "0 3 * * * /usr/local/bin/backup  # theirs"]
    assert len(lines) == 4 and lines[2].startswith(boothook.MARK)
    assert cron_words(lines[3].removeprefix("@reboot "))[-3:] == ["--root", "/opt/100% root",
                                                                  "queue-advance"]


def test_no_crontab_yet_is_a_new_one(tmp_path: Path, fake_crontab: tuple[str, Path]) -> None:
    cron, table = fake_crontab
    assert boothook.ensure("/opt/r", systemd_flag=str(tmp_path / "x"), crontab=cron)["kind"] == "cron"
    assert table.read_text().count("@reboot ") == 1
