"""``opsctl pull`` against a hostile container and a clumsy DEST, through the real sandbox,
on both the rsync and the tar path (both go through :mod:`opsctl.remote.receiver`): a link
leaving the tree is not created and is named (never the secret's bytes, never a write outside
DEST), a link inside it is kept; a setuid-root file, a 0666 file and a 1777 directory arrive
with the user's modes (umask applied); a FIFO or a device node is named and not created; a
directory swapped for a link to ``/`` during the pull never makes the copy a link out; odd
names (a newline, unicode, a leading dash) arrive as themselves; opsctl's own home is never
pulled over without ``--force``; ``--delete`` never reaches opsctl's own state."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from tests.sandbox.test_files_sandbox import run, unique

pytestmark = pytest.mark.sandbox
CT = ("--host", "sandbox", "--ct", "200")
METHODS = pytest.mark.parametrize("method", ["rsync", "tar"])


def sh(script: str) -> None:
    res = run("exec", *CT, "--", "sh", "-c", script)
    assert res.exit_code == 0, res.output


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for here, dirs, files in os.walk(root):
        for name in files + dirs:
            p = Path(here) / name
            rel = str(p.relative_to(root))
            out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else \
                "dir" if p.is_dir() else p.read_bytes().decode(errors="replace")
    return out


@METHODS
def test_a_link_leaving_the_tree_is_named_and_not_created_and_one_inside_is_kept(
        target, tmp_path, method):
    src = unique("hostile")
    sh(f"mkdir -p /opt/opsctl/data/{src}/sub && echo ok > /opt/opsctl/data/{src}/plain && "
       f"ln -s /etc/shadow /opt/opsctl/data/{src}/shadow && "
       f"ln -s ../plain /opt/opsctl/data/{src}/sub/inside && "
       f"ln -s ../../../../../../tmp /opt/opsctl/data/{src}/sub/escape")
    dest = tmp_path / "work" / "copy"
    res = run("pull", *CT, src, str(dest), "--method", method, "--json")
    assert res.exit_code == 25, res.output
    err = json.loads(res.stdout)["error"]
    assert err["type"] == "EntriesRefused", err
    assert sorted(r[0] for r in err["refused"]) == ["shadow", "sub/escape"], err
    assert "'shadow'" in err["message"] and "\n" not in err["message"]
    assert _tree(dest) == {"plain": "ok\n", "sub": "dir", "sub/inside": "-> ../plain"}
    assert sorted(os.listdir(tmp_path)) == ["work"]
    assert sorted(os.listdir(tmp_path / "work")) == ["copy"]


@pytest.fixture
def umask027():
    old = os.umask(0o027)
    yield
    os.umask(old)


@METHODS
def test_setuid_world_writable_and_sticky_modes_arrive_as_the_users_with_the_umask(
        target, tmp_path, method, umask027):
    """A root-owned 4755 copy of /bin/sh, a 0666 file and a 1777 directory in the container;
    here (umask 027) 0750, 0640 and 0750: the container never sets local permissions."""
    src = unique("modes")
    base = f"/opt/opsctl/data/{src}"
    sh(f"mkdir -p {base}/sticky && cp /bin/sh {base}/suid-sh && chown 0:0 {base}/suid-sh && "
       f"chmod 4755 {base}/suid-sh && echo w > {base}/open && chmod 0666 {base}/open && "
       f"chmod 1777 {base}/sticky && echo x > {base}/sticky/f && chmod 2775 {base}")
    dest = tmp_path / "copy"
    res = run("pull", *CT, src, str(dest), "--method", method, "--json")
    assert res.exit_code == 0, res.output
    modes = {p.name: oct(stat.S_IMODE(os.lstat(p).st_mode)) for p in [dest, *dest.rglob("*")]}
    assert modes == {"copy": "0o750", "suid-sh": "0o750", "open": "0o640", "sticky": "0o750",
                     "f": "0o640"}, modes


@METHODS
def test_a_fifo_and_a_device_node_are_named_and_never_created(target, tmp_path, method):
    src = unique("special")
    base = f"/opt/opsctl/data/{src}"
    sh(f"mkdir -p {base} && echo ok > {base}/plain && mkfifo {base}/pipe && "
       f"(mknod {base}/null c 1 3 2>/dev/null || cp -a /dev/null {base}/null 2>/dev/null || "
       f"mount --bind /dev/null {base}/null 2>/dev/null || true)")
    dest = tmp_path / "copy"
    res = run("pull", *CT, src, str(dest), "--method", method, "--json")
    assert res.exit_code == 25, res.output
    err = json.loads(res.stdout)["error"]
    refused = sorted(r[0] for r in err["refused"])
    assert "pipe" in refused and "'pipe'" in err["message"], err
    assert sorted(os.listdir(dest)) == ["plain"] or sorted(os.listdir(dest)) == ["null", "plain"]
    if "null" in os.listdir(dest):  # the container could not make a device: a plain file then
        assert stat.S_ISREG(os.lstat(dest / "null").st_mode)
    else:
        assert "null" in refused, err
    assert all(stat.S_ISREG(os.lstat(p).st_mode) for p in dest.iterdir())


#: Runs in the container, detached (every descriptor closed, so ``exec`` returns at once):
#: for $2 seconds, directory $1/sub is a link to / most of the time (0.8 s of every 0.9 s).
SWAPPER = (r'end=$(( $(date +%s) + $2 )); cd "$1" || exit 1; '
           r'while [ "$(date +%s)" -lt "$end" ]; do mv sub sub.x && ln -s / sub; sleep 0.8; '
           r'rm -f sub; mv sub.x sub; sleep 0.1; done')


@METHODS
def test_a_directory_swapped_for_a_link_to_root_during_pulls_never_makes_the_copy_a_link_out(
        target, tmp_path, method):
    src = unique("race")
    base = f"/opt/opsctl/data/{src}"
    sh(f"mkdir -p {base}/sub && for i in 1 2 3 4 5 6 7 8; do echo $i > {base}/sub/f$i; done")
    seconds = 12
    sh(f"nohup sh -c '{SWAPPER}' sh {base} {seconds} </dev/null >/dev/null 2>&1 &")
    dest = tmp_path / "copy"
    codes = []
    deadline = time.monotonic() + seconds - 1
    while time.monotonic() < deadline:
        res = run("pull", *CT, src, str(dest), "--method", method, "--json")
        codes.append(res.exit_code)
        assert res.exit_code in (0, 25), res.output  # a one-line error at worst
        assert "Traceback" not in res.output
        for p in [dest, *dest.rglob("*")]:
            if p.is_symlink():
                real = os.path.realpath(p)
                assert real == str(dest) or real.startswith(str(dest) + "/"), (p, os.readlink(p))
        assert sorted(os.listdir(tmp_path)) == ["copy"]
    assert 25 in codes, codes  # the link was seen (and refused) at least once


#: opsctl's own state in the container, as names (its data directory, the user's files, apart)
STATE = "find /opt/opsctl -maxdepth 3 -not -path '/opt/opsctl/data*' | sort"


@pytest.mark.parametrize("where", ["/opt/opsctl/envs", "/opt/opsctl/jobs", "/opt/opsctl/payloads",
                                   "/opt/opsctl/envs/some-build", "/opt/opsctl/data/../jobs"])
def test_push_delete_never_reaches_opsctls_own_state_in_the_container(target, tmp_path, where):
    before = run("exec", *CT, "--", "sh", "-c", STATE).stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    for extra in (["--dry-run"], ["-y"]):
        res = run("push", *CT, str(empty), where, "--delete", *extra, "--json")
        assert res.exit_code == 2, res.output
        err = json.loads(res.stdout)["error"]
        assert err["type"] == "DeleteRefused" and "opsctl's own state" in err["message"], err
    after = run("exec", *CT, "--", "sh", "-c", STATE).stdout
    assert after == before


def test_push_delete_into_a_directory_of_its_own_under_data_is_still_allowed(target, tmp_path):
    src = unique("mine")
    sh(f"mkdir -p /opt/opsctl/data/{src} && echo old > /opt/opsctl/data/{src}/stale")
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run("push", *CT, str(empty), src, "--delete", "-y", "--json")
    assert res.exit_code == 0, res.output


def test_pull_delete_never_reaches_opsctls_own_home_here(target, tmp_path, isolated_env):
    src = unique("own")
    sh(f"mkdir -p /opt/opsctl/data/{src} && echo x > /opt/opsctl/data/{src}/f")
    home = Path(os.environ["OPSCTL_HOME"])
    (home / "tensorboard" / "x").mkdir(parents=True)
    for dest in (home / "tensorboard", home / "tensorboard" / "x"):
        res = run("pull", *CT, src, str(dest), "--delete", "-y", "--force", "--json")
        assert res.exit_code == 2, res.output
        assert json.loads(res.stdout)["error"]["type"] == "DeleteRefused", res.output
    assert sorted(os.listdir(home / "tensorboard")) == ["x"]


@METHODS
@pytest.mark.parametrize("name", ["-rf", "--rsh=sh", "new\nline", "Grüße ü", " lead"])
def test_odd_names_arrive_as_themselves(target, tmp_path, method, name):
    src = unique("odd")
    sh(f"mkdir -p /opt/opsctl/data/{src} && printf x > '/opt/opsctl/data/{src}/{name}'")
    monkey_cwd = tmp_path / "cwd"
    monkey_cwd.mkdir()
    dest = monkey_cwd / name
    res = run("pull", *CT, f"{src}/{name}", str(dest), "--method", method, "--json")
    assert res.exit_code == 0, res.output
    assert dest.read_text() == "x"
    assert os.listdir(monkey_cwd) == [name]


def test_opsctls_own_home_is_not_pulled_over_without_force(target, tmp_path, isolated_env):
    src = unique("home")
    sh(f"mkdir -p /opt/opsctl/data/{src} && echo x > /opt/opsctl/data/{src}/f")
    home = Path(os.environ["OPSCTL_HOME"])
    for dest in (home, home / "inventory"):
        before = sorted(os.listdir(dest))
        res = run("pull", *CT, src, str(dest), "--json")
        assert res.exit_code == 2, res.output
        assert "no pull wrote it" in json.loads(res.stdout)["error"]["message"]
        assert sorted(os.listdir(dest)) == before


@METHODS
def test_a_link_planted_inside_a_pulled_dest_is_never_written_through(target, tmp_path, method):
    src = unique("planted")
    sh(f"mkdir -p /opt/opsctl/data/{src}/sub && echo v1 > /opt/opsctl/data/{src}/sub/f")
    dest = tmp_path / "copy"
    assert run("pull", *CT, src, str(dest), "--method", method).exit_code == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("keep\n")
    for p in sorted((dest / "sub").iterdir()):
        p.unlink()
    (dest / "sub").rmdir()
    (dest / "sub").symlink_to(outside)  # between two pulls, a link where a directory was
    sh(f"echo v2 > /opt/opsctl/data/{src}/sub/f")
    res = run("pull", *CT, src, str(dest), "--method", method, "--json")
    assert (outside / "f").read_text() == "keep\n", res.output
    assert sorted(os.listdir(outside)) == ["f"]
