"""What the container's helper programs answer is untrusted: a hostile answer is one error.

The container's own ``python3`` answers opsctl's helper scripts (the pull/push probe,
tarsync's list/stat/send, the payload manifest) with hostile text, or sends a tree deeper than
``limits.TREE_DEPTH``: each is one error line with a documented exit code, never a traceback,
never a false "ok"; and ``--delete`` removes only what the user confirmed.

A wrapper at ``/usr/local/bin/python3`` in ct 200 (ahead of /usr/bin on PATH) prints
``/tmp/hostile/reply`` when its ``-c`` code contains ``/tmp/hostile/match`` (and, if
``/tmp/hostile/verb`` exists, its next word is that verb); anything else runs the real python.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from opsctl import errors
from tests.cli_runner import run_cli as run
from tests.sandbox.test_files_sandbox import unique

pytestmark = pytest.mark.sandbox
CT = ("--host", "sandbox", "--ct", "200")
DOCUMENTED = {0} | {getattr(errors, n) for n in dir(errors) if n.isupper()
                    and isinstance(getattr(errors, n), int)}

WRAPPER = r"""#!/bin/sh
if [ -f /tmp/hostile/match ] && [ "$1" = "-c" ]; then
  m=$(cat /tmp/hostile/match)
  case "$2" in
    *"$m"*)
      if [ ! -f /tmp/hostile/verb ] || [ "$(cat /tmp/hostile/verb)" = "$3" ]; then
        cat /tmp/hostile/reply; exit 0
      fi;;
  esac
fi
exec /usr/bin/python3 "$@"
"""


def sh(script: str, *args: str) -> None:
    res = run("exec", *CT, "--", "sh", "-c", script, "sh", *args)
    assert res.exit_code == 0, res.output


@pytest.fixture
def hostile_python(target):
    sh('mkdir -p /tmp/hostile && rm -f /tmp/hostile/* && printf "%s" "$1" > /usr/local/bin/python3 '
       '&& chmod 755 /usr/local/bin/python3', WRAPPER)

    def arm(match: str, reply: str, verb: str | None = None) -> None:
        """``reply`` DEEP: 100,000 ``[`` (a RecursionError for json.loads)."""
        sh('rm -f /tmp/hostile/verb; printf "%s" "$1" > /tmp/hostile/reply; '
           'if [ "$1" = DEEP ]; then /usr/bin/python3 -c "print(chr(91) * 100000)" > /tmp/hostile/reply; fi; '
           'printf "%s" "$2" > /tmp/hostile/match; [ -z "$3" ] || printf "%s" "$3" > /tmp/hostile/verb',
           reply, match, verb or "")

    yield arm
    sh("rm -rf /tmp/hostile /usr/local/bin/python3")


def _one_line_error(res) -> None:
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in DOCUMENTED and res.exit_code != 0, res.output
    assert "error" in res.output.lower() or res.output.strip(), res.output


PROBE_MARK = '"homes": sorted(h for h'


@pytest.mark.parametrize("reply", ["not json at all\n", "[1, 2]\n", "{}\n", "DEEP"])
def test_pull_probe_answered_with_hostile_text_is_one_error(hostile_python, tmp_path, reply):
    sh("mkdir -p /opt/opsctl/data/atk && echo x > /opt/opsctl/data/atk/f")
    hostile_python(PROBE_MARK, reply)
    res = run("pull", *CT, "atk", str(tmp_path / "copy"))
    _one_line_error(res)
    assert res.exit_code == errors.REMOTE_FAILED, res.output


@pytest.mark.parametrize("reply", ["not json at all\n", "{}\n"])
def test_push_probe_answered_with_hostile_text_is_one_error(hostile_python, tmp_path, reply):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    hostile_python(PROBE_MARK, reply)
    res = run("push", *CT, str(src), unique("atk"), "--delete", "--dry-run")
    _one_line_error(res)
    assert res.exit_code == errors.REMOTE_FAILED, res.output


TARSYNC_MARK = "def _delete_extra"


@pytest.mark.parametrize(("method", "verb", "reply"), [
    ("tar", "list", "garbage\n"), ("tar", "list", "DEEP"), ("tar", "list", "[1]"),
    ("rsync", "stat", "garbage\n"), ("rsync", "stat", "[1]"), ("rsync", "stat", "DEEP")])
def test_a_hostile_tarsync_answer_to_a_pull_is_one_error(hostile_python, tmp_path, method,
                                                        verb, reply):
    """``list`` plans a tar pull; ``stat`` is the before/after look of an rsync pull."""
    sh("mkdir -p /opt/opsctl/data/atk && echo x > /opt/opsctl/data/atk/f")
    hostile_python(TARSYNC_MARK, reply, verb)
    start = time.monotonic()
    res = run("pull", *CT, "atk", str(tmp_path / "copy"), "--method", method)
    assert time.monotonic() - start < 120
    _one_line_error(res)
    assert res.exit_code == errors.REMOTE_FAILED, res.output


def test_a_deeply_nested_payload_manifest_is_no_digest_and_no_traceback(target, tmp_path):
    """100k ``[`` in the container's ``payload/MANIFEST.json``: no digest (deploy ships the
    payload again), and doctor's payload row is no traceback."""
    sh('mkdir -p /opt/opsctl/payload && cp /opt/opsctl/payload/MANIFEST.json /tmp/manifest.bak '
       '2>/dev/null; python3 -c "print(\'[\' * 100000)" > /opt/opsctl/payload/MANIFEST.json')
    try:
        res = run("exec", *CT, "--", "head", "-c", "20", "/opt/opsctl/payload/MANIFEST.json")
        assert res.stdout.startswith("[[[["), res.output
        from opsctl.config import inventory
        from opsctl.remote.agent_client import Agent
        from opsctl.remote.transport import Remote
        with Remote(inventory.load().resolve("sandbox"), use_mux=False) as r:
            assert Agent(r, 200).remote_digest() is None
        res = run("doctor", *CT, "--json")
        assert "Traceback" not in res.output and not isinstance(res.exception, RecursionError), \
            repr(res.exception)
    finally:
        sh("if [ -f /tmp/manifest.bak ]; then mv /tmp/manifest.bak /opt/opsctl/payload/MANIFEST.json; "
           "else rm -f /opt/opsctl/payload/MANIFEST.json; fi")



# --- a hostile tarsync `send` stream ---------------------------------------------------

import base64  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import tarfile  # noqa: E402
from pathlib import Path  # noqa: E402


def _stream(listing: dict, members: list[tuple[str, str, bytes | str]]) -> bytes:
    """A tarsync stream: the listing, then (name, kind, data-or-linkname) members, each file
    followed by its correct sha256 member."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        add(".opsctl/list.json", json.dumps(listing).encode())
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.mode = 0o6777
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, str(data)
                tar.addfile(info)
            else:
                assert isinstance(data, bytes)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                add(".opsctl/sum", hashlib.sha256(data).hexdigest().encode())
    return buf.getvalue()


def _walk(root: Path) -> list[Path]:
    """Every entry under ``root``, iteratively (a 2000-deep tree breaks rglob and os.walk)."""
    out, todo = [], [root]
    while todo:
        d = todo.pop()
        for e in os.scandir(d):
            out.append(Path(e.path))
            if e.is_dir(follow_symlinks=False):
                todo.append(Path(e.path))
    return out


def _arm_bytes(verb: str, data: bytes) -> None:
    sh('rm -f /tmp/hostile/verb; printf "%s" "$1" | base64 -d > /tmp/hostile/reply; '
       'printf "%s" "$2" > /tmp/hostile/match; printf "%s" "$3" > /tmp/hostile/verb',
       base64.b64encode(data).decode(), TARSYNC_MARK, verb)


DEEP_NAME = "data/" + "d/" * 2000 + "f"
STREAMS = {
    "dotdot": [("data/../../escape", "file", b"x")],
    "link-then-through": [("data/sub", "sym", "/"), ("data/sub/etc-x", "file", b"x")],
    "inner-link-then-through": [("data/in", "dir", b""), ("data/in/up", "sym", ".."),
                                ("data/in/up/up2", "sym", ".."), ("data/in/up/up2/x", "file", b"x")],
    "hardlink": [("data/h", "hard", "/etc/passwd")],
    "deep": [(DEEP_NAME, "file", b"x")],
    "file-over-dir": [("data/a", "dir", b""), ("data/a", "file", b"x")],
}


@pytest.mark.parametrize("name", list(STREAMS))
def test_a_hostile_send_stream_writes_nothing_outside_dest(hostile_python, tmp_path, name):
    sh("mkdir -p /opt/opsctl/data/atk && echo x > /opt/opsctl/data/atk/f")
    _arm_bytes("send", _stream({"root": "dir", "entries": ["f"]}, STREAMS[name]))
    work = tmp_path / "work"
    work.mkdir()
    dest = work / "copy"
    before = set(os.listdir("/etc"))
    start = time.monotonic()
    res = run("pull", *CT, "atk", str(dest), "--method", "tar", "--json")
    assert time.monotonic() - start < 120
    assert os.listdir(work) == ["copy"] or os.listdir(work) == [], os.listdir(work)
    assert set(os.listdir("/etc")) == before
    assert not (tmp_path / "escape").exists() and not Path("/etc-x").exists()
    for p in _walk(dest) if dest.exists() else []:
        assert not (p.is_file() and os.stat(p).st_mode & 0o7000), p
        if p.is_symlink():
            assert os.path.realpath(p).startswith(str(dest)), (p, os.readlink(p))
    subprocess.run(["rm", "-rf", str(work)], check=False)  # a 2000-deep tree breaks pytest's rmtree
    _one_line_error(res) if res.exit_code else None


def test_delete_removes_only_what_was_confirmed_whatever_the_stream_lists(hostile_python,
                                                                           tmp_path):
    """--dry-run says ``extra`` goes; the run's stream lists ``extra`` and omits ``keep``
    (which the source has): nothing is removed, and the refusal names ``keep``."""
    sh("mkdir -p /opt/opsctl/data/atkdel && echo k > /opt/opsctl/data/atkdel/keep")
    dest = tmp_path / "copy"
    dest.mkdir()
    (dest / "keep").write_text("k\n")
    (dest / "extra").write_text("e")
    plan = run("pull", *CT, "atkdel", str(dest), "--method", "tar", "--delete", "--dry-run",
               "--json", "--force")
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["delete"] == ["extra"], plan.output
    _arm_bytes("send", _stream({"root": "dir", "entries": ["extra"]}, []))
    res = run("pull", *CT, "atkdel", str(dest), "--method", "tar", "--delete", "-y", "--force")
    _one_line_error(res)
    assert "'keep'" in res.output and "not confirmed" in res.output, res.output
    assert sorted(os.listdir(dest)) == ["extra", "keep"]


@pytest.mark.parametrize("method", ["rsync", "tar"])
def test_a_source_deeper_than_the_cap_is_one_line_naming_it(target, tmp_path, method):
    """A legitimate 2000-level tree in the container: the pull and the next pull with
    --delete over what arrived are one line each naming the cap (never the container's
    traceback, never a RecursionError here)."""
    sh("mkdir -p /opt/opsctl/data/atkdeep && cd /opt/opsctl/data/atkdeep && "
       "python3 -c \"import os\nfor i in range(2000):\n    os.mkdir('d'); os.chdir('d')\n"
       "open('f','w').write('x')\"")
    dest = tmp_path / "copy"
    try:
        for extra in ([], ["--delete", "-y"]):
            res = run("pull", *CT, "atkdeep", str(dest), "--method", method, "--force", *extra)
            _one_line_error(res)
            assert "256" in res.output, res.output
    finally:
        sh("rm -rf /opt/opsctl/data/atkdeep")
        subprocess.run(["rm", "-rf", str(dest)], check=False)


def test_a_hostile_stream_cannot_leave_a_tree_deeper_than_the_cap(hostile_python, tmp_path):
    """The stream sends a file 2000 levels down: refused before it is written; the user's next
    ``pull --delete`` of the same source is a plain pull again."""
    sh("mkdir -p /opt/opsctl/data/atk && echo x > /opt/opsctl/data/atk/f")
    _arm_bytes("send", _stream({"root": "dir", "entries": ["f"]}, STREAMS["deep"]))
    dest = tmp_path / "copy"
    try:
        first = run("pull", *CT, "atk", str(dest), "--method", "tar")
        _one_line_error(first)
        assert "levels deep" in first.output, first.output
        assert not (dest / "d" / "d" / "d").exists()
        sh("rm -f /tmp/hostile/match")  # the container behaves again
        res = run("pull", *CT, "atk", str(dest), "--method", "tar", "--delete", "-y", "--force")
        assert res.exit_code == 0, res.output
        assert (dest / "f").read_text() == "x\n"
    finally:
        subprocess.run(["rm", "-rf", str(dest)], check=False)


@pytest.mark.parametrize("method", ["rsync", "tar"])
def test_pushing_a_source_deeper_than_the_cap_is_one_line_and_sends_nothing(target, tmp_path,
                                                                            method):
    src = tmp_path / "src"
    here = src
    for _ in range(300):
        here = here / "d"
    here.mkdir(parents=True)
    (here / "f").write_text("x")
    dest = unique("atkdeep-push")
    res = run("push", *CT, str(src), dest, "--method", method)
    _one_line_error(res)
    assert "256" in res.output and res.exit_code == errors.USAGE, res.output
    gone = run("exec", *CT, "--", "test", "-e", f"/opt/opsctl/data/{dest}/d/d/d")
    assert gone.exit_code != 0, "nothing of the deep tree was sent"
