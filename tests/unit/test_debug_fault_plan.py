"""``--debug-fault-plan``: a fault per attempt of the job (the wrapper's ``OPSCTL_ATTEMPT``),
so one deploy with a restart policy can crash, crash again and hang (the goodput sandbox
scenario). A malformed plan is refused before anything starts."""

from __future__ import annotations

import pytest

from remote_payload.trainer.config import TrainArgs, TrainerConfigError


def test_each_attempt_gets_its_own_entry_and_none_past_the_list() -> None:
    args = TrainArgs(debug_fault_plan="raise@30,raise@28,hang@25,-")
    assert [args.fault_for(k) for k in range(1, 6)] == [
        ("raise", 30), ("raise", 28), ("hang", 25), None, None]


def test_without_a_plan_every_attempt_gets_the_single_fault() -> None:
    args = TrainArgs(debug_fault="hang", debug_fault_step=7)
    assert args.fault_for(1) == args.fault_for(3) == ("hang", 7)
    assert TrainArgs().fault_for(1) is None


@pytest.mark.parametrize("plan", ["boom@3", "raise", "raise@", "raise@-1", "hang@1e3",
                                  "raise@30,,-", "- @1", "raise@" + "9" * 12])
def test_a_malformed_plan_is_refused_naming_the_entry(plan: str) -> None:
    with pytest.raises(TrainerConfigError, match="--debug-fault-plan entry"):
        TrainArgs(debug_fault_plan=plan)


@pytest.mark.parametrize(("text", "attempt"), [("3", 3), ("", 1), ("x", 1), ("-2", 1),
                                               ("9" * 20, 1)])
def test_the_attempt_comes_from_the_wrappers_environment(monkeypatch, text, attempt) -> None:
    pytest.importorskip("torch")
    from remote_payload.trainer import train

    monkeypatch.setenv("OPSCTL_ATTEMPT", text)
    assert train._attempt() == attempt
