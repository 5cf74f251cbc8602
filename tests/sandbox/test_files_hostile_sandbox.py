"""``opsctl pull`` against a hostile container and a clumsy DEST, through the real sandbox:
a link in the source to the container's secrets arrives as a link (never the secret's bytes,
never a write outside DEST), odd names (a newline, unicode, a leading dash) arrive as
themselves, and opsctl's own home is never pulled over without ``--force``."""

from __future__ import annotations

import json
import os
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
def test_a_link_to_the_containers_secrets_arrives_as_a_link_and_nothing_lands_outside(
        target, tmp_path, method):
    src = unique("hostile")
    sh(f"mkdir -p /opt/opsctl/data/{src}/sub && echo ok > /opt/opsctl/data/{src}/plain && "
       f"ln -s /etc/shadow /opt/opsctl/data/{src}/shadow && "
       f"ln -s ../../../../../../tmp /opt/opsctl/data/{src}/sub/escape")
    dest = tmp_path / "work" / "copy"
    res = run("pull", *CT, src, str(dest), "--method", method, "--json")
    assert res.exit_code == 0, res.output
    assert _tree(dest) == {"plain": "ok\n", "shadow": "-> /etc/shadow", "sub": "dir",
                           "sub/escape": "-> ../../../../../../tmp"}
    assert sorted(os.listdir(tmp_path)) == ["work"]
    assert sorted(os.listdir(tmp_path / "work")) == ["copy"]


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
