"""Nothing lost through ``push``/``pull``: a delete never reaches a root, a home or the cwd, a
pull never writes into the cwd unasked, ``../`` never leaves the data dir, deletions are
confirmed, a torn file is never a success and Ctrl-C keeps the previous copy; through the
real sandbox (sshd -> pct exec -> LXC).

The pure rules behind these (and their property tests) are in ``tests/unit/test_files_rules.py``.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl.cli import cli
from tests.paths import REPO
from tests.sandbox.test_files_sandbox import run, unique
from tests.sandbox_plugin import sandbox_home
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox
ROOT = REPO
CT = ("--host", "sandbox", "--ct", "200")
METHODS = pytest.mark.parametrize("method", ["rsync", "tar"])


def sh(script: str) -> str:
    """Run ``script`` in the container; its stdout."""
    res = run("exec", *CT, "--", "sh", "-c", script)
    assert res.exit_code == 0, res.output
    return res.stdout


def mode(path: str) -> str:
    return sh(f"stat -c %a {path}").strip()


def rootfs(path: str) -> Path:
    """The container's ``path`` seen from this machine (the sandbox's LXC rootfs)."""
    return sandbox_home() / "sandbox" / "lxc" / "200" / "rootfs" / path.lstrip("/")


def error_of(res) -> dict:
    return json.loads(res.stdout)["error"]


class TestDeleteNeverAppliesToRootHomeOrCwd:
    @pytest.mark.parametrize("dest", ["/", "/root", "/etc", "/tmp", "/opt/opsctl/data",
                                      "/opt/opsctl", "/root/.."])
    def test_a_push_with_delete_to_a_protected_container_path_is_refused(self, target, tmp_path,
                                                                       dest):
        sh("touch /root/keep-me && chmod 700 /root")
        (tmp_path / "empty").mkdir()
        res = run("push", *CT, str(tmp_path / "empty"), dest, "--delete", "-y", "--json")
        assert res.exit_code == 2, res.output
        err = error_of(res)
        assert err["type"] == "DeleteRefused" and "nothing was sent or deleted" in err["message"]
        assert "keep-me" in sh("ls -A /root") and mode("/root") == "700"

    def test_a_symlink_to_the_home_is_judged_by_where_it_points(self, target, tmp_path):
        link = unique("to-root")
        sh(f"mkdir -p /opt/opsctl/data && ln -s /root /opt/opsctl/data/{link} && touch /root/keep-me")
        (tmp_path / "empty").mkdir()
        res = run("push", *CT, str(tmp_path / "empty"), link, "--delete", "-y", "--json")
        assert res.exit_code == 2 and "/root" in error_of(res)["message"], res.output
        assert "keep-me" in sh("ls -A /root")

    @METHODS
    def test_a_pull_with_delete_into_the_cwd_or_the_home_is_refused(self, target, tmp_path,
                                                                   monkeypatch, method):
        src = unique("srcdir")
        sh(f"mkdir -p /opt/opsctl/data/{src} && echo x > /opt/opsctl/data/{src}/f")
        home, cwd = tmp_path / "home", tmp_path / "home" / "work"
        cwd.mkdir(parents=True)
        (cwd / "mine.txt").write_text("mine")
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.chdir(cwd)
        for dest in (".", str(home), "~", str(tmp_path), "sub/.."):
            res = run("pull", *CT, src, dest, "--delete", "-y", "--method", method, "--json")
            assert res.exit_code == 2 and error_of(res)["type"] == "DeleteRefused", (dest, res.output)
        assert sorted(os.listdir(cwd)) == ["mine.txt"] and not (home / "f").exists()

    def test_pull_of_the_root_with_delete_and_no_dest_is_refused(self, target, tmp_path,
                                                                monkeypatch):
        monkeypatch.chdir(tmp_path)
        (tmp_path / "mine.txt").write_text("mine")
        res = run("pull", *CT, "/", "--delete", "-y", "--json")
        assert res.exit_code == 2, res.output
        assert os.listdir(tmp_path) == ["mine.txt"]


class TestPullWithoutDestNeverWritesIntoCwd:
    def test_pull_of_the_root_without_dest_is_refused_and_writes_nothing(self, target, tmp_path,
                                                                         monkeypatch):
        monkeypatch.chdir(tmp_path)
        res = run("pull", *CT, "/", "--json")
        assert res.exit_code == 2 and "DEST" in error_of(res)["message"], res.output
        assert os.listdir(tmp_path) == []

    def test_pull_without_dest_lands_in_a_directory_named_after_src(self, target, tmp_path,
                                                                     monkeypatch):
        src = unique("named")
        sh(f"mkdir -p /opt/opsctl/data/{src} && echo x > /opt/opsctl/data/{src}/f")
        monkeypatch.chdir(tmp_path)
        res = run("pull", *CT, src, "--json")
        assert res.exit_code == 0, res.output
        assert os.listdir(tmp_path) == [src] and (tmp_path / src / "f").read_text() == "x\n"


class TestRelativeDestWithDotDot:
    def test_a_relative_container_path_leaving_the_data_dir_is_refused(self, target, tmp_path):
        (tmp_path / "f").write_text("x")
        name = unique("escape")
        res = run("push", *CT, str(tmp_path / "f"), f"../{name}", "--json")
        assert res.exit_code == 2 and "leaves /opt/opsctl/data" in error_of(res)["message"]
        assert name not in sh("ls -A /opt/opsctl")
        res = run("pull", *CT, "../jobs", str(tmp_path / "jobs"), "--json")
        assert res.exit_code == 2 and not (tmp_path / "jobs").exists()

    def test_the_absolute_path_of_the_same_place_is_taken_as_is(self, target, tmp_path):
        (tmp_path / "f").write_text("x")
        name = unique("abs")
        res = run("push", *CT, str(tmp_path / "f"), f"/opt/opsctl/{name}", "--json")
        assert res.exit_code == 0, res.output
        sh(f"rm /opt/opsctl/{name}")


def _extras(dest: str, n: int) -> None:
    sh(f"mkdir -p {dest} && cd {dest} && for i in $(seq {n}); do touch extra$i; done")


class TestDeleteCountIsConfirmed:
    @METHODS
    def test_more_than_ten_deletions_without_a_terminal_need_yes(self, target, tmp_path, method):
        src = tmp_path / "src"
        src.mkdir()
        (src / "new.txt").write_text("new")
        dest = f"/opt/opsctl/data/{unique('many')}"
        _extras(dest, 12)
        res = run("push", *CT, str(src), dest, "--delete", "--method", method, "--json")
        assert res.exit_code == 2, res.output
        err = error_of(res)
        assert "12 entries" in err["message"] and "-y" in err["hint"]
        assert sorted(sh(f"ls -A {dest}").split()) == sorted(f"extra{i}" for i in range(1, 13))

        res = run("push", *CT, str(src), dest, "--delete", "-y", "--method", method, "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["deleted"] == 12 and sh(f"ls -A {dest}").split() == ["new.txt"]

    def test_answering_no_deletes_nothing_and_exits_130(self, target, tmp_path, monkeypatch):
        monkeypatch.setattr("opsctl.cli.app.interactive", lambda: True)
        src = tmp_path / "src"
        src.mkdir()
        dest = f"/opt/opsctl/data/{unique('ask')}"
        _extras(dest, 11)
        res = CliRunner().invoke(cli, ["push", *CT, str(src), dest, "--delete"], input="n\n")
        assert res.exit_code == 130, res.output
        assert "--delete will remove 11 entries" in res.output and "remove these 11" in res.output
        assert len(sh(f"ls -A {dest}").split()) == 11

    def test_ten_deletions_go_through_and_are_counted(self, target, tmp_path):
        src = tmp_path / "src"
        src.mkdir()
        dest = f"/opt/opsctl/data/{unique('few')}"
        _extras(dest, 10)
        res = run("push", *CT, str(src), dest, "--delete")
        assert res.exit_code == 0, res.output
        assert "--delete will remove 10 entries" in res.output and sh(f"ls -A {dest}") == ""


class TestDryRun:
    def test_a_dry_run_push_prints_the_plan_and_changes_nothing(self, target, tmp_path):
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "new.txt").write_text("new")
        dest = f"/opt/opsctl/data/{unique('plan')}"
        _extras(dest, 2)
        res = run("push", *CT, str(src), dest, "--delete", "--dry-run", "--json")
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert (doc["ok"], doc["dry_run"], doc["dest"]) == (True, True, dest)
        assert set(doc["send"]) >= {"sub", "sub/new.txt"}
        assert sorted(doc["delete"]) == ["extra1", "extra2"]
        assert sorted(sh(f"ls -A {dest}").split()) == ["extra1", "extra2"]
        res = run("push", *CT, str(src), f"{dest}-none/deeper", "--dry-run")
        assert res.exit_code == 0 and "would send 3, delete 0" in " ".join(res.output.split())
        assert sh(f"ls -d {dest}-none 2>/dev/null || true") == ""

    def test_a_dry_run_pull_prints_the_plan_and_changes_nothing(self, target, tmp_path):
        src = unique("pplan")
        sh(f"mkdir -p /opt/opsctl/data/{src} && echo x > /opt/opsctl/data/{src}/f")
        dest = tmp_path / "here"
        dest.mkdir()
        (dest / "stale").write_text("s")
        res = run("pull", *CT, src, str(dest), "--delete", "--dry-run", "--json")
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert (doc["send"], doc["delete"]) == (["f"], ["stale"])
        assert os.listdir(dest) == ["stale"]


@METHODS
class TestPushKeepsExistingDirMode:
    def test_existing_directories_keep_their_mode_on_both_sides(self, target, tmp_path, method):
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "f").write_text("x")
        src.chmod(0o755)
        base = f"/opt/opsctl/data/{unique('modes')}"
        sh(f"mkdir -p {base}/sticky {base}/private/sub && chmod 1777 {base}/sticky && "
           f"chmod 700 {base}/private && chmod 750 {base}/private/sub")
        for dest in (f"{base}/sticky", f"{base}/private"):
            res = run("push", *CT, str(src), dest, "--method", method)
            assert res.exit_code == 0, res.output
        assert (mode(f"{base}/sticky"), mode(f"{base}/private"), mode(f"{base}/private/sub")) \
            == ("1777", "700", "750")
        assert mode(f"{base}/sticky/sub") == "755"  # a new directory gets the source's mode

        back = tmp_path / "back"
        back.mkdir()
        back.chmod(0o700)
        res = run("pull", *CT, f"{base}/private", str(back), "--method", method)
        assert res.exit_code == 0, res.output
        assert stat.S_IMODE(back.stat().st_mode) == 0o700 and (back / "sub" / "f").exists()

    def test_a_push_into_tmp_leaves_tmp_1777(self, target, tmp_path, method):
        src = tmp_path / "src"
        src.mkdir()
        src.chmod(0o755)
        name = unique("in-tmp")
        (src / name).write_text("x")
        sh("chmod 1777 /tmp")  # as the container has it (a broken opsctl may have changed it)
        res = run("push", *CT, str(src), "/tmp", "--method", method)
        assert res.exit_code == 0, res.output
        assert mode("/tmp") == "1777"
        sh(f"rm /tmp/{name}")


class _Writer:
    """Appends to ``path`` until stopped: a file that changes for the whole transfer."""

    def __init__(self, path: Path):
        self.path, self.stop, self.thread = path, threading.Event(), None

    def __enter__(self) -> _Writer:
        def write() -> None:
            with self.path.open("ab") as f:
                while not self.stop.wait(0.01):
                    f.write(b"x" * 4096)
                    f.flush()
        self.thread = threading.Thread(target=write, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=10)


@METHODS
class TestTornFileIsNeverReportedAsSuccess:
    def test_a_push_of_a_file_written_meanwhile_fails_naming_it(self, target, tmp_path, method):
        src = tmp_path / "src"
        src.mkdir()
        (src / "grows.bin").write_bytes(os.urandom(16 << 20))
        (src / "still.txt").write_text("still")
        dest = f"/opt/opsctl/data/{unique('torn')}"
        sh(f"mkdir -p {dest} && echo previous > {dest}/grows.bin")
        with _Writer(src / "grows.bin"):
            res = run("push", *CT, str(src), dest, "--method", method, "--bwlimit", "8192",
                      "--json")
        assert res.exit_code == 25, res.output
        err = error_of(res)
        assert err["type"] == "SourceChanged" and err["files"] == ["grows.bin"], err
        assert "grows.bin" in err["message"] and err["hint"]
        if method == "tar":  # the tar receiver drops what changed: the previous copy stays
            assert sh(f"cat {dest}/grows.bin") == "previous\n"

    def test_a_push_of_one_file_written_meanwhile_names_it(self, target, tmp_path, method):
        one = tmp_path / "grows.bin"
        one.write_bytes(os.urandom(16 << 20))
        with _Writer(one):
            res = run("push", *CT, str(one), f"/opt/opsctl/data/{unique('torn1')}/grows.bin",
                      "--method", method, "--bwlimit", "8192", "--json")
        assert res.exit_code == 25, res.output
        assert error_of(res)["files"] == ["grows.bin"]

    def test_a_pull_of_a_file_written_meanwhile_fails_naming_it(self, target, tmp_path, method):
        src = f"/opt/opsctl/data/{unique('torn-pull')}"
        sh(f"mkdir -p {src} && head -c {16 << 20} /dev/urandom > {src}/grows.bin")
        with _Writer(rootfs(f"{src}/grows.bin")):
            res = run("pull", *CT, src, str(tmp_path / "back"), "--method", method,
                      "--bwlimit", "8192", "--json")
        assert res.exit_code == 25, res.output
        assert error_of(res)["files"] == ["grows.bin"]


def _interrupt_when(proc: subprocess.Popen, grown: t.Callable[[], bool]) -> None:
    """Ctrl-C (SIGINT to opsctl's process group) once ``grown()``; a dead opsctl fails."""
    wait_for(lambda: grown() or proc.poll() is not None, 60, interval=0.05)
    assert grown() and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) != 0


def _opsctl(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "opsctl", *args],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _half_files(where: Path) -> list[str]:
    """Temporary files of rsync (.NAME.XXXXXX) or tarsync (.NAME.opsctl-part) left behind."""
    return sorted(p.name for p in where.iterdir() if p.name.startswith(".big.bin"))


@METHODS
class TestCtrlCKeepsThePreviousCopy:
    def test_an_interrupted_pull_keeps_the_previous_local_copy_and_no_half_file(
            self, target, tmp_path, method):
        src = f"/opt/opsctl/data/{unique('ctrlc-pull')}"
        sh(f"mkdir -p {src} && head -c {48 << 20} /dev/urandom > {src}/big.bin")
        back = tmp_path / "back"
        back.mkdir()
        (back / "big.bin").write_text("previous\n")  # no pull wrote it: --force
        proc = _opsctl("pull", *CT, src, str(back), "--method", method, "--bwlimit", "8192",
                       "--force")

        def grown() -> bool:
            return any(p.stat().st_size > 4 << 20 for p in back.glob(".big.bin*"))
        _interrupt_when(proc, grown)
        time.sleep(0.5)  # scenario: a window for a late rename of a half file into place
        assert (back / "big.bin").read_text() == "previous\n"
        assert _half_files(back) == []

    def test_an_interrupted_push_keeps_the_previous_container_copy_and_no_half_file(
            self, target, tmp_path, method):
        src = tmp_path / "src"
        src.mkdir()
        (src / "big.bin").write_bytes(os.urandom(48 << 20))
        dest = f"/opt/opsctl/data/{unique('ctrlc-push')}"
        sh(f"mkdir -p {dest} && echo previous > {dest}/big.bin")
        seen = rootfs(dest)
        proc = _opsctl("push", *CT, str(src), dest, "--method", method, "--bwlimit", "8192")

        def grown() -> bool:
            return any(p.stat().st_size > 4 << 20 for p in seen.glob(".big.bin*"))
        _interrupt_when(proc, grown)
        wait_for(lambda: not _half_files(seen), 10)  # the container side notices its peer is gone
        assert sh(f"cat {dest}/big.bin") == "previous\n"
        assert _half_files(seen) == []
