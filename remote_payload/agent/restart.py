"""The restart policy: whether a job's attempt that just ended is run again.

A playbook's ``restart: {max_restarts: N, on: [...]}`` travels in the launch spec
(``spec["restart"]``). The wrapper (the long-lived process in the container) asks
:func:`should_restart` when an attempt ends or its hang watch fires, so the decision is
made with no opsctl client connected. This module is pure (no I/O): the rule is tested
on its own (``tests/unit/test_restart_policy.py``).

``on`` names what restarts, any of:

- ``failed``: any exit that is not 0, or death by a signal (the default when only
  ``max_restarts`` is given, like ``torchrun --max-restarts``);
- a diagnosis id (``remote_payload/agent/diagnosis.py``'s causes: ``nccl_timeout``,
  ``cuda_oom``, ``rank_failed``, ``python_exception``, ...), matched against the diagnosis
  of the attempt's output when it ended;
- ``hang``: the wrapper's hang watch found the job silent past its budget; the attempt is
  stopped (INT, TERM, KILL) and run again. Never implied by ``failed``: it kills a live job;
- an exit code (an int; a death by signal *n* also matches ``128 + n``).

Never restarted, whatever ``on`` says: a usage error (exit 2), a job that was cancelled
(``opsctl stop``, ``deploy --replace``, the playbook's ``max_duration_s``), and a job that
already had ``max_restarts`` restarts.
"""

from __future__ import annotations

import signal as _signal
import typing as t

from remote_payload import wire

ON_FAILED = wire.RESTART_ON_FAILED
ON_HANG = wire.RESTART_ON_HANG
DEFAULT_ON = wire.RESTART_DEFAULT_ON
USAGE_ERROR_EXIT = wire.USAGE_ERROR_EXIT
#: Pause before attempt n+1: ``min(BACKOFF_BASE_S * 2**(n-1), BACKOFF_MAX_S)`` (1, 2, 4 ... 30 s).
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 30.0
DECISION_RESTART = "restart"
DECISION_GIVE_UP = "give up"


class Decision(t.NamedTuple):
    """What to do after an attempt ended: ``restart`` or not, and why."""

    restart: bool
    reason: str  # what ended the attempt: the matched diagnosis id, ``exit 1``, ``SIGKILL``, ``hang``
    why: str  # one line for the evidence and the pane

    @property
    def decision(self) -> str:
        return DECISION_RESTART if self.restart else DECISION_GIVE_UP


def ended_by(exit_code: int | None, signal: str | None) -> str:
    """``exit 1`` or the signal's name: how the attempt ended, as restarts record it."""
    if signal:
        return signal
    return f"exit {exit_code}"


def _signum(name: str | None) -> int | None:
    try:
        return int(_signal.Signals[name]) if name else None
    except KeyError:
        return None


def should_restart(diagnosis: t.Sequence[str], exit_code: int | None, signal: str | None,
                   policy: t.Mapping[str, t.Any] | None, attempts: int,
                   cancelled: bool) -> Decision | None:
    """The decision after attempt number ``attempts`` (1-based) ended, or None (nothing to decide).

    ``diagnosis`` is the attempt's diagnosis ids (for a hang: ``["hang"]`` with no exit
    yet). None means no policy, or the attempt succeeded (exit 0, no signal, no hang).
    """
    if policy is None:
        return None
    hung = ON_HANG in diagnosis and exit_code is None and signal is None
    if not hung and exit_code == 0 and not signal:
        return None
    on = list(policy.get("on") or DEFAULT_ON)
    ids = [d for d in diagnosis if d]
    how = ON_HANG if hung else ended_by(exit_code, signal)
    first = next((d for d in ids if d in on), None)
    reason = first or how
    if cancelled:
        return Decision(False, reason, "cancelled (stop, replace or time limit): never restarted")
    if exit_code == USAGE_ERROR_EXIT and not signal:
        return Decision(False, reason, "exit 2 is a usage error: never restarted")
    codes = {exit_code} if exit_code is not None else set()
    num = _signum(signal)
    if num is not None:
        codes.add(128 + num)
    matched = (first is not None
               or any(isinstance(x, int) and not isinstance(x, bool) and x in codes for x in on)
               or (ON_FAILED in on and not hung))
    if not matched:
        named = f"{how} ({', '.join(ids)})" if ids and not hung else how
        return Decision(False, reason, f"{named} is not in restart.on {on}")
    limit = int(policy.get("max_restarts") or 0)
    if attempts > limit:
        return Decision(False, reason, f"restart limit reached: {limit} restart(s) already made")
    return Decision(True, reason, f"restart {attempts} of {limit} after {reason}")


def backoff_s(attempts: int) -> float:
    """Seconds to wait before running attempt ``attempts + 1``."""
    return float(min(BACKOFF_BASE_S * 2.0 ** max(attempts - 1, 0), BACKOFF_MAX_S))
