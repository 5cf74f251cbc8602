"""The deadlines of pip and of the torch compile check hold whatever the child does: a pip
that prints nothing, and a child whose grandchild keeps the output pipe open (alone, or after
leaving the session). Each call returns within its deadline plus the group's grace, and no
process of the child's tree survives it.

Both sides are covered: the agent's ``run_logged`` (``pip install``, ``venv``, the compile
check ``inspect_torch.py --verify``, the cache seeds) and the operator's ``pip download`` for a
wheelhouse. The fake pips are real processes, marked by ``PGTEST=<token>`` (which every
descendant inherits), so a survivor is found by a /proc scan."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from opsctl.config.torch_builds import TorchBuild
from opsctl.errors import TorchEnvError
from opsctl.ops.wheelhouse import prepare_wheelhouse
from remote_payload import procgroup
from remote_payload.agent.torchenv.procs import clean_env, run_logged
from tests import live_processes
from tests.waiting import wait_for

DEADLINE_S = 2.0
#: SIGTERM, the group's grace for a tree that ignores it, and this slow machine's scheduling
SLACK_S = procgroup.GRACE_S + 2.0
#: The child that exits at once is given a long deadline: the call ends with it, the
#: grandchild's pipe notwithstanding, long before the deadline comes.
AFTER_EXIT = "grandchild-holds-stdout-after-exit"
LONG_DEADLINE_S = 30.0

#: What each fake pip does. Each one prints its pid file's line first, so the test knows the
#: tree started.
CHILDREN = {
    "silent": """\
        echo started
        exec sleep 300
        """,
    "stubborn-silent": """\
        trap '' TERM
        echo started
        sleep 300
        """,
    "grandchild-holds-stdout-after-exit": """\
        sleep 301 &
        echo started
        exit 0
        """,
    "grandchild-holds-stdout-while-hung": """\
        sh -c "trap '' TERM; sleep 302" &
        echo started
        sleep 303
        """,
    "setsid-grandchild-holds-stdout": """\
        setsid sleep 304 &
        echo started
        sleep 305
        """,
    "python-grandchild-holds-stdout": f"""\
        {sys.executable} -c 'import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(306)
        print("started", flush=True)
        time.sleep(307)'
        """,
}


@pytest.fixture
def token(monkeypatch) -> str:
    """A unique marker in this test's environment, so in every process it starts."""
    tok = uuid.uuid4().hex
    monkeypatch.setenv("PGTEST", tok)
    yield tok
    for pid in live_processes.with_env(f"PGTEST={tok}"):  # a failed test leaves nothing
        os.kill(pid, signal.SIGKILL)


def _fake_pip(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "pip"
    script.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return script


def _no_survivor(tok: str) -> bool:
    return not live_processes.with_env(f"PGTEST={tok}")


@pytest.mark.parametrize("kind", sorted(CHILDREN))
def test_pip_and_the_compile_check_return_by_their_deadline_and_leave_nothing(kind, token,
                                                                             tmp_path):
    pip = _fake_pip(tmp_path, CHILDREN[kind])
    started = time.monotonic()
    rc, out = run_logged([str(pip), "install", "torch"], log_path=str(tmp_path / "log"),
                         env=clean_env(PGTEST=token), label="pip",
                         timeout_s=LONG_DEADLINE_S if kind == AFTER_EXIT else DEADLINE_S,
                         heartbeat_s=0.5)
    took = time.monotonic() - started
    assert took < DEADLINE_S + SLACK_S, f"{kind}: returned after {took:.1f} s"
    assert "started" in out
    if kind == AFTER_EXIT:
        assert rc == 0  # the child's own exit stands; its leftover was ended
    else:
        assert rc == -signal.SIGKILL
        assert "timed out after 2s" in (tmp_path / "log").read_text()
    assert _no_survivor(token), f"{kind}: processes of the tree survived the call"


def test_a_child_that_keeps_printing_is_still_ended_at_its_deadline(token, tmp_path):
    pip = _fake_pip(tmp_path, """\
        echo started
        while :; do echo progress; sleep 0.05; done
        """)
    started = time.monotonic()
    rc, _ = run_logged([str(pip)], log_path=str(tmp_path / "log"), env=clean_env(PGTEST=token),
                       label="verify", timeout_s=DEADLINE_S)
    assert time.monotonic() - started < DEADLINE_S + SLACK_S
    assert rc == -signal.SIGKILL
    assert _no_survivor(token)


def test_a_child_that_finishes_keeps_its_output_and_exit_code(token, tmp_path):
    pip = _fake_pip(tmp_path, """\
        echo one
        printf 'no newline at the end'
        exit 3
        """)
    rc, out = run_logged([str(pip)], log_path=str(tmp_path / "log"), env=clean_env(PGTEST=token),
                         label="pip", timeout_s=30)
    assert (rc, out) == (3, "one\nno newline at the end\n")
    assert "[exit 3 " in (tmp_path / "log").read_text()


@pytest.mark.parametrize("kind", sorted(CHILDREN))
def test_pip_download_returns_by_its_deadline_and_leaves_nothing(kind, token, tmp_path):
    pip = _fake_pip(tmp_path, CHILDREN[kind])
    build = TorchBuild("cpu", "2.13.0", "http://127.0.0.1:9/simple", wheelhouse=True)
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(TorchEnvError) as caught:
        prepare_wheelhouse(build, tmp_path / "wheels", pip=[str(pip)], on_line=lines.append,
                           timeout_s=LONG_DEADLINE_S if kind == AFTER_EXIT else DEADLINE_S)
    took = time.monotonic() - started
    assert took < DEADLINE_S + SLACK_S, f"{kind}: returned after {took:.1f} s"
    assert lines[:1] == ["started"]
    if kind == AFTER_EXIT:
        assert "no torch wheel" in str(caught.value)  # pip "succeeded" with nothing saved
    else:
        assert "did not finish within 2 s" in str(caught.value)
    assert _no_survivor(token), f"{kind}: processes of the tree survived the call"


def test_a_grandchild_printing_after_the_child_exited_is_read_before_it_is_ended(token,
                                                                                 tmp_path):
    pip = _fake_pip(tmp_path, """\
        (sleep 0.3; echo Saved ./late.whl; sleep 300) &
        echo started
        """)
    lines: list[str] = []
    group = procgroup.Group([str(pip)], stderr=procgroup.STDOUT)
    assert group.stream(30, lines.append, linger=2.0) == 0
    assert lines == ["started", "Saved ./late.whl"]
    assert wait_for(lambda: _no_survivor(token), 2.0)


def test_a_line_without_end_is_handed_over_in_bounded_pieces(token):
    lines: list[str] = []
    group = procgroup.Group([sys.executable, "-c", "import sys; sys.stdout.write('x' * 200000)"],
                            stderr=procgroup.STDOUT)
    assert group.stream(30, lines.append) == 0
    assert "".join(lines) == "x" * 200000
    assert max(map(len, lines)) <= 65536


def test_the_tail_run_logged_returns_is_bounded_and_ends_with_the_last_line(token, tmp_path):
    pip = _fake_pip(tmp_path, """\
        i=0
        while [ $i -lt 3000 ]; do echo "line $i ................................"; i=$((i+1)); done
        """)
    rc, out = run_logged([str(pip)], log_path=str(tmp_path / "log"), env=clean_env(PGTEST=token),
                         label="pip", timeout_s=60)
    assert rc == 0 and len(out) <= 65536
    assert out.endswith("line 2999 ................................\n")
