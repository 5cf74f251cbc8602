"""What reaches the user's terminal, as pure logic: remote text never as control sequences, how
lines wrap, what a deploy's and a swap's last line claims.

The remote halves of these rules run against the real sandbox in
``tests/sandbox/test_deploy_and_job_wrapper_sandbox.py``; the local files and the playbook regexes are in
``tests/unit/test_local_state_files.py`` and ``tests/unit/test_playbook.py``.
"""

from __future__ import annotations

import io
import re
import typing as t

from rich.console import Console

from opsctl import errors
from opsctl.cli import render
from remote_payload.wire_shapes import StatusDoc
from tests.replies import status_doc

# OSC title, clear-scrollback, OSC 52 clipboard write, a CSI clear screen, an 8-bit CSI, a
# BEL, a carriage return that would overwrite the line, a bidi override and rich markup
EVIL = ("\x1b]0;pwned\x07\x1b[3J\x1b]52;c;ZXZpbA==\x1b\\\x1b[2J\x9b31m\x07\rspoof\u202e"
        "[bold red]markup[/]")
CONTROL = re.compile(r"\x1b\]|\x1b\[[0-9;]*[JHK]|\x1b\\|[\x07\x9b\r\u202e]")


def evil_status(**extra: object) -> StatusDoc:
    return status_doc(**{
        "job_id": "job-1", "state": "RUNNING", "phase": EVIL, "pane_tail": [EVIL, "ok"],
        "output_tail": [EVIL], "evidence": [EVIL],
        "diagnosis": [{"cause": "x", "severity": "error", "summary": EVIL, "evidence": [EVIL],
                       "hint": EVIL}],
        "last_step": {"step": EVIL, "tok_s": 1000.0, "loss": EVIL}, "gpu_error": EVIL,
        "output_log": EVIL, **extra})


def rendered(draw: t.Callable[[Console], None], width: int = 100) -> str:
    buf = io.StringIO()
    # a real terminal: rich adds its own colour codes, so only remote sequences are looked for
    draw(Console(file=buf, force_terminal=True, width=width, color_system="standard"))
    return buf.getvalue()


def test_remote_text_never_reaches_the_terminal_as_control_sequences():
    st = evil_status()
    out = rendered(lambda c: render.status(c, "host ct 200", st))
    out += rendered(lambda c: c.print(render.progress_line(st, 3.0, None)))
    out += rendered(lambda c: c.print(render.progress_line(st, 3.0, EVIL)))
    out += rendered(lambda c: render.error(c, errors.RemoteCommandFailed(EVIL, hint=EVIL,
                                                                           log_path=EVIL)))
    out += rendered(lambda c: c.print(render.deploy_verdict(EVIL, "healthy", st, 1.0)))
    assert CONTROL.search(out) is None, repr(CONTROL.search(out))
    assert "\\x1b]52;c;ZXZpbA==" in out  # shown, inert, so the user sees what the job tried
    assert "[bold red]markup[/]" in out  # markup in remote text is text, never style


def test_the_sanitiser_keeps_ordinary_text_and_optionally_newlines():
    assert render.safe("loss 0.25\tstep 3 · ok ✓") == "loss 0.25\tstep 3 · ok ✓"
    assert render.safe("a\nb") == "a\\x0ab"
    assert render.safe("a\nb", newlines=True) == "a\nb"
    assert render.safe("\x1b[31m") == "\\x1b[31m"


def test_the_metrics_line_wraps_between_values_never_inside_one():
    step = {"step": 123456, "loss": 1.23456789, "acc": 0.5, "tok_s": 123456.0, "eta_s": 98765.0,
            "lr": 0.000123}
    bits = render.metrics_line(step)
    assert isinstance(bits, render.Bits)
    out = rendered(lambda c: c.print(bits), width=40)
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in out.splitlines()]
    assert len(lines) > 1  # it did wrap at 40 columns
    for value in bits.bits:
        assert any(value in ln for ln in lines), (value, lines)
    wide = rendered(lambda c: c.print(bits), width=200)
    assert len(wide.strip().splitlines()) == 1


def test_a_deploy_whose_job_already_finished_says_so_with_its_exit_code():
    done = status_doc(job_id="j", state="SUCCEEDED", exit_code=0, healthy=True)
    for outcome in ("terminal", "healthy"):
        line = render.deploy_verdict("j", outcome, done, 2.0).plain
        assert "finished SUCCEEDED (exit code 0)" in line and "running" not in line
    live = status_doc(job_id="j", state="RUNNING", healthy=True)
    assert "healthy" in render.deploy_verdict("j", "healthy", live, 2.0).plain


def test_a_swap_torch_dry_run_says_what_would_happen_and_that_nothing_changed():
    rep = {"action": "install", "build": "cu130", "previous": "cu128", "elapsed_s": 1.0,
           "dry_run": True}
    out = rendered(lambda c: c.print(render.swap_headline(rep)))
    assert "would install and switch to cu130" in out
    assert "[dry run: nothing was changed]" in out
    assert "installed and switched" not in out
    real = render.swap_headline({**rep, "dry_run": False}).plain
    assert real.startswith("installed and switched to cu130")
