"""Complete agent replies for tests of the code that reads them: the wire shapes
(``remote_payload/wire_shapes.py``) require every key the agent always sends, so a test
gives only the keys it is about and gets the rest here, checked against the shape."""

from __future__ import annotations

import typing as t

from opsctl.remote import shapes
from remote_payload.wire_shapes import DiagnosisDoc, StatusDoc

_STATUS: dict[str, t.Any] = {
    "job_id": "j", "name": "job", "state": "RUNNING", "healthy": False, "phase": None,
    "created_at": 1000.0, "started_at": None, "ended_at": None, "elapsed_s": 0.0, "pid": None,
    "pgid": None, "alive": False, "exit_code": None, "signal": None, "pane_tail": [],
    "output_tail": [], "output_log": "/opt/opsctl/jobs/j/output.log", "output_size": 0,
    "last_output_at": None, "last_step": None, "events_tail": [], "gpus": [], "gpu_error": None,
    "gpus_at": 1000.0, "diagnosis": [], "evidence": [],
    "tmux": {"socket": None, "session": None, "error": None}, "healthy_when": None,
    "timeout_s": None, "expect_tok_s": None, "hang_after_s": None, "phase_budgets_s": {},
    "budget_s": None, "hang_threshold_s": None, "hang": None, "errors": [], "preflight": None,
    "transitions": [], "now": 1000.0, "attempt": 1, "max_restarts": None, "restarts": [],
    "end_reason": None, "max_duration_s": None, "run": None,
}


def status_doc(**fields: t.Any) -> StatusDoc:
    """A ``status`` reply with ``fields`` over the defaults, as the CLI validates it."""
    return shapes.validate(StatusDoc, {**_STATUS, **fields}, where="test")


def diagnosis(cause: str, summary: str, severity: str = "error") -> DiagnosisDoc:
    return {"cause": cause, "severity": t.cast(t.Any, severity), "summary": summary,
            "evidence": [], "hint": ""}
