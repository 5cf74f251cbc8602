"""A hostile container's agent reply through the real transport (sshd, the pct stand-in, a
container) and the real CLI: a reply without end is kept up to the cap and named, a reply with
NaN or a key carrying an escape sequence is one ``ReplyShapeError`` line, a traversal job id
never reaches a local path, a ``logs`` chunk that does not advance ends the command, a reply
that is not JSON says so. Each is one error line with exit 25, in bounded time, with nothing
written outside opsctl's logs.

Two fake agents: a shell script given as the container's python (:func:`_fake_agent`), and a
fake payload in an opsctl root of this module's own (``root:`` in its inventory), whose
``remote_payload.agent`` prints the reply a test put in ``<root>/replies/<verb>``: the CLI
runs its commands against it unchanged. ``tests/unit/test_hostile_agent.py`` covers every verb
at the CommandResult boundary.
"""

from __future__ import annotations

import json
import time
import typing as t
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl import errors
from opsctl.config import inventory as inventory_mod
from opsctl.remote.agent_client import Agent
from opsctl.remote.transport import Remote
from remote_payload import wire_shapes as ws
from tests.cli_runner import run_cli
from tests.fake_agent import plant_agent
from tests.replies import _STATUS, envelope, hostile
from tests.sandbox.test_pct_host_sandbox import spec

pytestmark = pytest.mark.sandbox

FAKE = "/tmp/opsctl-hostile-agent"
#: every exit code the OpsctlError tree documents (``opsctl help exit-codes``), and 0
DOCUMENTED = {0} | {getattr(errors, n) for n in dir(errors) if n.isupper()
                    and isinstance(getattr(errors, n), int)}
ROOT = "/opt/opsctl-hostile"

#: the fake payload's agent: prints ``<root>/replies/<verb>`` as it is (nothing if none)
FAKE_MAIN = """\
import os, sys
words = sys.argv[1:]
root = words[words.index("--root") + 1]
rest = [w for i, w in enumerate(words) if w != "--root" and (i == 0 or words[i - 1] != "--root")]
verb = next((w for w in rest if not w.startswith("-")), "")
try:
    with open(os.path.join(root, "replies", verb), "rb") as f:
        sys.stdout.buffer.write(f.read())
except OSError:
    pass
"""


def _fake_agent(r: Remote, script: str) -> Agent:
    res = r.pct_exec(200, ["sh", "-c", f'printf "%s" "$1" > {FAKE} && chmod +x {FAKE}',
                           "sh", f"#!/bin/sh\n{script}\n"], timeout=20)
    assert res.rc == 0, res.stderr
    return Agent(r, 200, python=FAKE)


def test_a_reply_without_end_is_kept_to_the_cap_and_named(sandbox, monkeypatch):
    monkeypatch.setenv("OPSCTL_REPLY_BYTES", "100000")
    with Remote(spec(sandbox), use_mux=False) as r:
        agent = _fake_agent(r, "head -c 20000000 /dev/zero | tr '\\0' a")
        start = time.monotonic()
        with pytest.raises(errors.RemoteCommandFailed,
                           match="over the 100000 bytes a reply may have") as exc:
            agent.call("status", timeout=60)
    assert exc.value.exit_code == 25 and time.monotonic() - start < 60


def test_a_reply_with_nan_or_an_escape_in_a_key_is_one_inert_reply_shape_error(sandbox):
    data = json.dumps({**_STATUS, "phase_budgets_s": {"\x1b]0;pwn\x07": 1}})
    nan = '{"ok": true, "verb": "status", "data": ' + data.replace('"elapsed_s": 0.0',
                                                                    '"elapsed_s": NaN') + "}"
    escape = envelope("status", {**_STATUS, "phase_budgets_s": {"\x1b]0;pwn\x07": "x"}}).decode()
    with Remote(spec(sandbox), use_mux=False) as r:
        agent = _fake_agent(r, "cat <<'EOF'\n" + nan + "\nEOF")
        with pytest.raises(errors.ReplyShapeError,
                           match="elapsed_s: Input should be a finite number") as exc:
            agent.call("status", timeout=30)
        assert exc.value.log_path and Path(exc.value.log_path).is_file()
        agent = _fake_agent(r, "cat <<'EOF'\n" + escape + "\nEOF")
        with pytest.raises(errors.ReplyShapeError) as exc:
            agent.call("status", timeout=30)
    assert "\x1b" not in exc.value.message and "\\x1b" in exc.value.message


# --- the real CLI against a fake payload --------------------------------------------------


@pytest.fixture(scope="module")
def home(sandbox, tmp_path_factory: pytest.TempPathFactory) -> t.Iterator[Path]:
    """This module's OPSCTL_HOME, its inventory's root ``ROOT``, and a fake payload there."""
    from tests.sandbox_plugin import private_home

    home = tmp_path_factory.mktemp("hostile-home")
    with private_home(sandbox, home, ROOT):
        plant_agent(ROOT, FAKE_MAIN)
        yield home




def _answer(verb: str, reply: bytes) -> None:
    """The fake agent's next answers to ``verb``: ``reply``, exactly."""
    with Remote(inventory_mod.load().resolve("sandbox"), use_mux=False) as r:
        res = r.pct_exec(200, ["python3", "-c", _WRITE_BYTES, f"{ROOT}/replies/{verb}"],
                         stdin=reply, timeout=30)
    assert res.rc == 0, res.stderr


_WRITE_BYTES = """\
import os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
with open(sys.argv[1], "wb") as f:
    f.write(sys.stdin.buffer.read())
"""


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def cli(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> t.Callable[..., t.Any]:
    """``opsctl ARGS --host sandbox --ct 200`` with a HOME of its own: the command must end
    within 60 s, with a documented exit code, and leave HOME and OPSCTL_HOME as they were but
    for the logs folder."""
    monkeypatch.setenv("OPSCTL_HOME", str(home))
    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(home / "inventory"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> t.Any:
        before_home, before_ours = _tree(tmp_path), _tree(home)
        start = time.monotonic()
        res = run_cli(*args, "--host", "sandbox", "--ct", "200")
        assert time.monotonic() - start < 60
        assert "Traceback" not in res.output
        assert _tree(tmp_path) == before_home, "written into HOME"
        new = _tree(home) - before_ours
        assert all(p.startswith("logs") or p.startswith("state") for p in new), sorted(new)
        return res

    return run


def _error_line(res: t.Any) -> str:
    lines = res.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), res.output
    assert all(ln.startswith(("  hint: ", "  full output: ")) for ln in lines[1:]), res.stderr
    return t.cast(str, lines[0])


def test_a_traversal_job_id_in_status_is_one_error_and_reaches_no_local_path(cli):
    _answer("status", envelope("status", {**_STATUS, "job_id": "../../../.ssh"}))
    for command in (["status"], ["tensorboard"]):
        res = cli(*command)
        assert res.exit_code == errors.REMOTE_FAILED, res.output
        assert "job_id: String should match pattern" in _error_line(res)


def test_a_logs_chunk_that_does_not_advance_ends_logs_with_one_error(cli):
    _answer("logs", envelope("logs", {"job_id": "j", "offset": 0, "next_offset": 0, "data_b64": "",
                                      "eof": False, "size": 10, "state": "RUNNING",
                                      "terminal": False, "exit_code": None, "signal": None,
                                      "since_indexed": True}))
    res = cli("logs")
    assert res.exit_code == errors.REMOTE_FAILED, res.output
    assert "does not advance" in _error_line(res)


def test_a_time_of_1e308_in_jobs_is_refused_never_printed(cli):
    row = {"job_id": "j", "name": "x", "state": "SUCCEEDED", "elapsed_s": 1e308}
    _answer("jobs", envelope("jobs", {"current": None, "jobs": [row], "total": 1, "limit": 20,
                                      "damaged": []}))
    res = cli("jobs")
    assert res.exit_code == errors.REMOTE_FAILED, res.output
    assert "elapsed_s: Input should be less than or equal to" in _error_line(res)
    assert "0" * 50 not in res.output


def test_a_reply_that_is_not_json_says_so_with_the_saved_output(cli):
    _answer("status", b"Traceback (most recent call last):\nMemoryError\n")
    res = cli("status")
    assert res.exit_code == errors.REMOTE_FAILED, res.output
    line = _error_line(res)
    assert "the reply is not JSON" in line and "no output" not in line
    (saved,) = [ln.split(": ", 1)[1] for ln in res.stderr.splitlines() if "full output" in ln]
    assert "MemoryError" in Path(saved).read_text()


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
@pytest.mark.parametrize(("command", "verb"), [(["status"], "status"), (["jobs"], "jobs")])
def test_whatever_the_agent_answers_through_the_real_transport_exits_documented(
        cli, command: list[str], verb: str, data: st.DataObject) -> None:
    doc = data.draw(hostile(ws.REPLY_SHAPES[verb]))
    _answer(verb, envelope(verb, doc))
    res = cli(*command)
    assert res.exit_code in DOCUMENTED, res.output
    if res.exit_code:
        _error_line(res)
