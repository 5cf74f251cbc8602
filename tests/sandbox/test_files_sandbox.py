"""`opsctl push` / `pull` through the real sandbox: sshd -> pct exec -> LXC container.

Every result is checked byte for byte on both sides (a sha256 per file, computed in the
container by the container's python), both for rsync and for the tar fallback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.cli_runner import run_cli as run
from tests.paths import REPO
from tests.sandbox_plugin import sandbox_home
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox

ROOT = REPO
# sha256 (or "dir", or "->target") of every entry under argv[1], as one JSON object
TREE_HASH = r"""
import hashlib, json, os, sys
top = sys.argv[1]
out = {}
for d, dirs, files in os.walk(top):
    for n in dirs + files:
        p = os.path.join(d, n)
        rel = os.path.relpath(p, top)
        if os.path.islink(p):
            out[rel] = "->" + os.readlink(p)
        elif os.path.isdir(p):
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(open(p, "rb").read()).hexdigest()
print(json.dumps(out, sort_keys=True))
"""
ODD_NAMES = ["plain.txt", "with space", "q'uote\"d", "new\nline", "-leading-dash", "ünïcødé ✓",
             "$(touch PWNED)", "`id`", "sub dir/inner;rm -rf x", "sub dir/deeper/é"]


def container_tree(path: str) -> dict[str, str]:
    res = run("exec", "--host", "sandbox", "--ct", "200", "--", "python3", "-c", TREE_HASH, path)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def local_tree(path: Path) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", TREE_HASH, str(path)], capture_output=True,
                         check=True, text=True).stdout
    return json.loads(out)


def odd_tree(where: Path) -> Path:
    for name in ODD_NAMES:
        p = where / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(3000) + name.encode())
    (where / "link to plain").symlink_to("plain.txt")
    (where / "empty dir").mkdir()
    return where


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("method", ["rsync", "tar"])
class TestRoundTrip:
    def test_push_then_pull_of_odd_names_is_byte_exact_and_a_repush_sends_nothing(self, target,
                                                                                 tmp_path, method):
        src = odd_tree(tmp_path / "src")
        dest = unique("odd")  # relative: under <root>/data
        res = run("push", "--host", target, "--ct", "200", str(src), dest, "--method", method, "--json")
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert (doc["ok"], doc["method"], doc["dest"]) == (True, method, f"/opt/opsctl/data/{dest}")
        assert doc["files"] == len(ODD_NAMES) and doc["bytes"] > 0
        assert container_tree(doc["dest"]) == local_tree(src)
        res = run("push", "--host", target, "--ct", "200", str(src), dest, "--method", method, "--json")
        doc = json.loads(res.stdout)
        assert (res.exit_code, doc["files"], doc["bytes"]) == (0, 0, 0)

        back = tmp_path / "back"
        res = run("pull", "--host", target, "--ct", "200", dest, str(back), "--method", method, "--json")
        assert res.exit_code == 0, res.output
        assert local_tree(back) == local_tree(src)
        assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()

    def test_delete_removes_extra_files_only_when_asked(self, target, tmp_path, method):
        src = odd_tree(tmp_path / "src")
        dest = f"/root/{unique('del')}"  # an absolute path is taken as is
        assert run("push", "--host", target, "--ct", "200", str(src), dest, "--method", method).exit_code == 0
        assert run("exec", "--host", target, "--ct", "200", "--", "touch", f"{dest}/extra").exit_code == 0
        res = run("push", "--host", target, "--ct", "200", str(src), dest, "--method", method, "--json")
        assert json.loads(res.stdout)["deleted"] == 0 and "extra" in container_tree(dest)
        res = run("push", "--host", target, "--ct", "200", str(src), dest, "--method", method,
                  "--delete", "--json")
        assert json.loads(res.stdout)["deleted"] == 1
        assert container_tree(dest) == local_tree(src)


def test_a_push_of_one_file_without_dest_lands_in_the_data_dir(target, tmp_path):
    name = unique("single") + ".bin"
    (tmp_path / name).write_bytes(b"\0\1\2" * 1000)
    res = run("push", "--host", target, "--ct", "200", str(tmp_path / name), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["dest"] == f"/opt/opsctl/data/{name}"
    res = run("exec", "--host", target, "--ct", "200", "--", "sha256sum", f"/opt/opsctl/data/{name}")
    assert res.stdout.split()[0] == local_tree(tmp_path)[name]


def test_pulling_a_missing_path_is_a_remote_error_naming_it(target, tmp_path):
    res = run("pull", "--host", target, "--ct", "200", "no/such/thing", str(tmp_path / "x"), "--json")
    assert res.exit_code == 25
    assert "/opt/opsctl/data/no/such/thing' does not exist" in json.loads(res.stdout)["error"]["message"]


def _partial_size(dest_dir: Path, name: str) -> int:
    """Bytes rsync has written so far for ``name`` (its temporary file, then the partial)."""
    sizes = [p.stat().st_size for p in dest_dir.glob(f".{name}.*")] if dest_dir.is_dir() else []
    return max(sizes, default=0)


def test_an_interrupted_push_resumes_without_starting_from_zero(target, tmp_path, isolated_env):
    """Ctrl-C keeps the destination's previous copy; what arrived waits in .opsctl-partial/."""
    size = 64 << 20
    src = tmp_path / "big.bin"
    with src.open("wb") as f:
        f.write(os.urandom(size))
    dest = f"/root/{unique('resume')}"
    assert run("exec", "--host", target, "--ct", "200", "--", "sh", "-c",
               f"mkdir -p {dest} && echo previous > {dest}/big.bin").exit_code == 0
    # the container's file system seen from this machine, only to know when to interrupt
    seen = sandbox_home() / "sandbox" / "lxc" / "200" / "rootfs" / dest.lstrip("/")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "opsctl", "push", "--host", target, "--ct", "200",
                             str(src), f"{dest}/big.bin", "--bwlimit", "8192"], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: _partial_size(seen, "big.bin") >= 8 << 20 or proc.poll() is not None, 60,
             interval=0.05)
    assert _partial_size(seen, "big.bin") >= 8 << 20 and proc.poll() is None, \
        proc.stderr.read() if proc.stderr else ""
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: opsctl and its rsync
    proc.wait(timeout=30)
    # the container's rsync keeps the partial file when its peer is gone
    wait_for((seen / ".opsctl-partial" / "big.bin").exists, 10)
    assert (seen / ".opsctl-partial" / "big.bin").exists(), sorted(os.listdir(seen))
    time.sleep(0.5)  # scenario: the container's rsync finishes writing what it kept
    kept = (seen / ".opsctl-partial" / "big.bin").stat().st_size
    assert 0 < kept < size
    assert (seen / "big.bin").read_bytes() == b"previous\n"  # the previous copy is untouched
    assert not list(seen.glob(".big.bin.*"))  # no temporary file left under the user's name

    res = run("push", "--host", target, "--ct", "200", str(src), f"{dest}/big.bin", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["matched_bytes"] > 0 and doc["bytes"] < size  # it did not start from zero
    res = run("exec", "--host", target, "--ct", "200", "--", "sha256sum", f"{dest}/big.bin")
    assert res.stdout.split()[0] == local_tree(tmp_path)["big.bin"]
    assert sorted(os.listdir(seen)) == ["big.bin"]  # the partial directory is gone


def test_deploy_pushes_playbook_files_and_pull_fetches_its_outputs(target, tmp_path, monkeypatch):
    data = tmp_path / "inputs"
    data.mkdir()
    (data / "prompt.txt").write_text("hello from this machine\n")
    out_name = unique("out")
    script = ("import pathlib, shutil; d = pathlib.Path('/opt/opsctl/data'); "
              f"(d / '{out_name}').mkdir(exist_ok=True); "
              f"shutil.copy(d / 'inputs/prompt.txt', d / '{out_name}' / 'echo.txt')")
    book = tmp_path / "files.yaml"
    book.write_text(json.dumps({"name": "files", "command": ["python3", "-c", script],
                                "files": [{"src": str(data)}], "outputs": [out_name]}))
    res = run("deploy", "--host", target, "--ct", "200", "--playbook", str(book), "--replace", "--json")
    assert res.exit_code == 0, res.output
    steps = [s["step"] for s in json.loads(res.stdout)["steps"]]
    assert steps.index("files-done") < steps.index("launch")
    assert run("status", "--follow", "--json", "--poll", "0.3").exit_code == 0

    monkeypatch.chdir(tmp_path)
    res = run("pull", "--host", target, "--ct", "200", "--playbook", str(book), "--json")
    assert res.exit_code == 0, res.output
    assert (tmp_path / out_name / "echo.txt").read_text() == "hello from this machine\n"


def test_a_push_to_a_missing_container_is_the_container_error(target, tmp_path, missing_ct):
    (tmp_path / "f").write_text("x")
    res = run("push", "--host", target, "--ct", str(missing_ct), str(tmp_path / "f"), "--json")
    assert res.exit_code == 20, res.output
    assert json.loads(res.stdout)["error"]["type"] == "ContainerMissing"


def _same_size_and_mtime(path: Path, content: bytes) -> None:
    """Rewrite ``path`` with other bytes of the same length, keeping its mtime."""
    st = path.stat()
    assert len(content) == st.st_size
    path.write_bytes(content)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("method", ["rsync", "tar"])
class TestContentIsComparedNotAssumed:
    def test_a_pulled_file_that_differs_with_the_same_size_and_mtime_is_fetched_again(
            self, target, tmp_path, method):
        dest = unique("same")
        assert run("exec", "--host", target, "--ct", "200", "--", "sh", "-c",
                   f"mkdir -p /opt/opsctl/data/{dest} && printf remote! > "
                   f"/opt/opsctl/data/{dest}/f").exit_code == 0
        back = tmp_path / "back"
        res = run("pull", "--host", target, "--ct", "200", dest, str(back), "--method", method)
        assert res.exit_code == 0, res.output
        _same_size_and_mtime(back / "f", b"local!!")
        res = run("pull", "--host", target, "--ct", "200", dest, str(back), "--method", method,
                  "--json")
        assert res.exit_code == 0, res.output
        assert (back / "f").read_bytes() == b"remote!"
        assert json.loads(res.stdout)["files"] == 1

    def test_a_pushed_file_that_differs_with_the_same_size_and_mtime_is_sent_again(
            self, target, tmp_path, method):
        src = tmp_path / "src"
        src.mkdir()
        (src / "f").write_bytes(b"first!!")
        dest = f"/opt/opsctl/data/{unique('same')}"
        assert run("push", "--host", target, "--ct", "200", str(src), dest, "--method",
                   method).exit_code == 0
        _same_size_and_mtime(src / "f", b"second!")
        res = run("push", "--host", target, "--ct", "200", str(src), dest, "--method", method)
        assert res.exit_code == 0, res.output
        assert container_tree(dest) == local_tree(src)


class TestPullNeverReplacesWhatItDidNotWrite:
    def test_an_existing_dest_no_pull_wrote_needs_force(self, target, tmp_path):
        dest = unique("model")
        assert run("exec", "--host", target, "--ct", "200", "--", "sh", "-c",
                   f"mkdir -p /opt/opsctl/data/{dest} && echo new > "
                   f"/opt/opsctl/data/{dest}/config.json").exit_code == 0
        mine = tmp_path / "Qwen3-8B"
        mine.mkdir()
        (mine / "config.json").write_text("mine\n")
        res = run("pull", "--host", target, "--ct", "200", dest, str(mine), "--json")
        assert res.exit_code == 2, res.output
        err = json.loads(res.stdout)["error"]
        assert err["type"] == "LocalWriteError" and "no pull wrote it" in err["message"]
        assert "--force" in err["hint"] and (mine / "config.json").read_text() == "mine\n"
        res = run("pull", "--host", target, "--ct", "200", dest, str(mine), "--force")
        assert res.exit_code == 0, res.output
        assert (mine / "config.json").read_text() == "new\n"
        res = run("pull", "--host", target, "--ct", "200", dest, str(mine))  # it pulled there
        assert res.exit_code == 0, res.output

    def test_a_link_as_dest_is_refused_and_its_target_untouched(self, target, tmp_path):
        dest = unique("linked")
        assert run("exec", "--host", target, "--ct", "200", "--", "sh", "-c",
                   f"echo new > /opt/opsctl/data/{dest}").exit_code == 0
        victim = tmp_path / "victim"
        victim.write_text("keep\n")
        (tmp_path / "link").symlink_to(victim)
        res = run("pull", "--host", target, "--ct", "200", dest, str(tmp_path / "link"),
                  "--force", "--json")
        assert res.exit_code == 2 and "symbolic link" in json.loads(res.stdout)["error"]["message"]
        assert victim.read_text() == "keep\n"

    @pytest.mark.parametrize("dest", [".", "", "~"])
    def test_the_current_directory_and_the_home_are_refused_even_with_force(
            self, target, tmp_path, monkeypatch, dest):
        src = unique("cwd")
        assert run("exec", "--host", target, "--ct", "200", "--", "sh", "-c",
                   f"mkdir -p /opt/opsctl/data/{src} && echo x > /opt/opsctl/data/{src}/f"
                   ).exit_code == 0
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("HOME", str(tmp_path))
        res = run("pull", "--host", target, "--ct", "200", src, dest, "--force", "--json")
        assert res.exit_code == 2, res.output
        assert os.listdir(tmp_path) == []

    def test_a_dest_on_a_full_disk_is_one_line_and_exit_2(self, target, tmp_path):
        src = unique("full")
        assert run("exec", "--host", target, "--ct", "200", "--", "sh", "-c",
                   f"echo x > /opt/opsctl/data/{src}").exit_code == 0
        res = run("pull", "--host", target, "--ct", "200", src, "/dev/full/x", "--json")
        assert res.exit_code == 2, res.output
        assert "not a directory" in json.loads(res.stdout)["error"]["message"]


def test_playbook_outputs_sharing_a_name_are_refused_naming_both(target, tmp_path, monkeypatch):
    name = unique("data")
    book = tmp_path / "outs.yaml"
    book.write_text(json.dumps({"name": "outs", "command": ["true"],
                                "outputs": [f"a/{name}", f"/root/{name}"]}))
    monkeypatch.chdir(tmp_path)
    res = run("pull", "--host", target, "--ct", "200", "--playbook", str(book), "--json")
    assert res.exit_code == 2, res.output
    message = json.loads(res.stdout)["error"]["message"]
    assert f"/opt/opsctl/data/a/{name}" in message and f"/root/{name}" in message
    assert sorted(os.listdir(tmp_path)) == ["outs.yaml"]


def _descendants(pid: int) -> dict[int, str]:
    """The live processes below ``pid`` (by their parent links), with their command names."""
    kids: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        comm, rest = stat.rsplit(b")", 1)
        fields = rest.split()
        if fields[0] in (b"Z", b"X"):
            continue
        kids.setdefault(int(fields[1]), []).append(int(entry))
        names[int(entry)] = comm.split(b"(", 1)[1].decode("utf-8", "replace")
    found: dict[int, str] = {}
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        found[p] = names[p]
        todo += kids.get(p, [])
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (
            b"Z", b"X")
    except OSError:
        return False


def test_a_sigkill_of_opsctl_mid_pull_ends_its_rsync_and_ssh_too(target, tmp_path):
    """The attack: opsctl SIGKILLed during a pull (no handler runs); its rsync and the ssh
    under it ran on to the end of the transfer. They end with it."""
    src = f"/root/{unique('killed')}"
    assert run("exec", "--host", target, "--ct", "200", "--", "sh", "-c",
               f"mkdir -p {src} && head -c 67108864 /dev/urandom > {src}/big.bin").exit_code == 0
    dest = tmp_path / "back"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "opsctl", "pull", "--host", target, "--ct",
                             "200", src, str(dest), "--method", "rsync", "--bwlimit", "2048"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: _partial_size(dest, "big.bin") >= 1 << 20 or proc.poll() is not None, 60,
             interval=0.05)
    below = _descendants(proc.pid)
    assert proc.poll() is None and "rsync" in below.values() and "ssh" in below.values(), \
        (below, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    proc.kill()  # SIGKILL: no handler of opsctl runs
    proc.wait(timeout=10)
    wait_for(lambda: not any(_alive(p) for p in below), 15, interval=0.1,
             what=f"the pull's children {below} to end with opsctl")
    assert _partial_size(dest, "big.bin") < 64 << 20  # they did not run on to the end
