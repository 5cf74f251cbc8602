"""``--report-to``: the names (Hugging Face's), the metrics an event carries, and the fan-out
that keeps a failing or slow tracker from costing the run anything."""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remote_payload.trainer import trackers
from remote_payload.trainer.config import TrainArgs, TrainerConfigError
from remote_payload.trainer.trackers import ReportToError, RunInfo, Trackers, parse_report_to

# --- the names ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "names"), [
    ("none", ()),
    ("tensorboard", ("tensorboard",)),
    ("tensorboard,wandb,mlflow", ("tensorboard", "wandb", "mlflow")),
    (" WandB , mlflow ", ("wandb", "mlflow")),
    ("all", ("all",)),
])
def test_report_to_takes_hugging_faces_names(text, names):
    assert parse_report_to(text) == names


@pytest.mark.parametrize(("text", "words"), [
    ("comet_ml", ["unknown tracker 'comet_ml'", "tensorboard, wandb, mlflow, all, none"]),
    ("tensorboard,tensorboard", ["'tensorboard' is named twice"]),
    ("none,wandb", ["'none' stands alone"]),
    ("all,wandb", ["'all' stands alone"]),
    ("wandb,", ["an empty name"]),
    ("", ["an empty name"]),
])
def test_a_bad_report_to_is_one_error_naming_the_problem_and_the_choices(text, words):
    with pytest.raises(ReportToError) as err:
        parse_report_to(text)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_the_trainer_refuses_a_bad_report_to_before_anything_starts():
    with pytest.raises(TrainerConfigError, match="unknown tracker 'tb'; choices"):
        TrainArgs(report_to="tb")
    assert TrainArgs().report_to == "none"


@given(st.text(max_size=60))
def test_any_report_to_text_is_a_list_of_known_distinct_names_or_a_report_to_error(text):
    try:
        names = parse_report_to(text)
    except ReportToError:
        return
    assert len(set(names)) == len(names), names
    assert set(names) <= {*trackers.CHOICES, "all"}, names
    assert "all" not in names or names == ("all",), names


def test_all_means_every_installed_tracker(monkeypatch):
    monkeypatch.setattr(trackers, "installed", lambda n: n != "wandb")
    assert trackers.resolve(("all",)) == ("tensorboard", "mlflow")
    assert trackers.resolve(("wandb",)) == ("wandb",)  # named: tried, then warned about


# --- metrics and URIs --------------------------------------------------------------------


def test_a_step_event_gives_every_numeric_field_as_a_train_metric_at_its_step():
    got = trackers.metrics_of("step", {"step": 7, "loss": 2.5, "acc": 0.25, "tok_s": 1200.0,
                                       "lr": 1e-4, "mfu": 0.4, "budget_s": 30.0, "eta_s": 9.0})
    assert got == ({"train/loss": 2.5, "train/acc": 0.25, "train/tok_s": 1200.0,
                    "train/lr": 1e-4, "train/mfu": 0.4, "train/eta_s": 9.0}, 7)


def test_an_eval_event_gives_tau_and_per_position_acceptance_as_eval_metrics():
    got = trackers.metrics_of("acceptance", {"tau": 3.1, "tau_untrained": None,
                                             "per_position": [0.9, 0.5], "prompts": 4})
    assert got == ({"eval/tau": 3.1, "eval/per_position_1": 0.9, "eval/per_position_2": 0.5}, 0)


@pytest.mark.parametrize("event", [("phase", {"phase": "training"}),
                                   ("step", {"step": 3, "role": "target", "budget_s": 300.0}),
                                   ("warning", {"message": "x", "dropped": 3})])
def test_events_without_metrics_reach_no_tracker(event):
    assert trackers.metrics_of(*event) is None


def test_a_tracking_uri_loses_its_password_before_it_is_said():
    assert trackers.redact_uri("https://bob:s3cret@mlflow.example:5000/x") == \
        "https://***@mlflow.example:5000/x"
    assert trackers.redact_uri("sqlite:////runs/mlflow.db") == "sqlite:////runs/mlflow.db"


@given(st.text(max_size=80))
def test_redacting_any_uri_never_raises_and_never_keeps_a_password(text):
    out = trackers.redact_uri("http://user:pw0rdpw0rd@" + text)
    assert "pw0rdpw0rd" not in out or out == "<unparsable uri>"


# --- the fan-out -------------------------------------------------------------------------


class Recorder:
    name = "recorder"

    def __init__(self, fail_at: str = "", delay: float = 0.0):
        self.fail_at, self.delay = fail_at, delay
        self.logged: list[tuple[dict[str, float], int]] = []
        self.started = self.finished = None

    def where(self, info: RunInfo) -> str:
        return "/nowhere"

    def start(self, info: RunInfo) -> None:
        if self.fail_at == "start":
            raise OSError(28, "No space left on device")
        self.started = info.run_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        time.sleep(self.delay)  # scenario: a slow tracker server
        if self.fail_at == "log":
            raise ConnectionError("network is down")
        self.logged.append((metrics, step))

    def finish(self, ok: bool) -> None:
        if self.fail_at == "finish":
            raise RuntimeError("cannot finish")
        self.finished = ok


class Warnings(list):
    def __call__(self, tracker: str, message: str, **extra: object) -> None:
        self.append((tracker, message, extra))


def _info() -> RunInfo:
    return RunInfo(run_id="r1", out_dir="/tmp/none")


@pytest.mark.parametrize("fail_at", ["start", "log", "finish"])
def test_a_tracker_that_raises_costs_one_warning_and_the_others_go_on(fail_at):
    bad, good = Recorder(fail_at), Recorder()
    bad.name = "bad"
    warns = Warnings()
    fan = Trackers([bad, good], _info(), warns)
    for step in (1, 2, 3):
        fan.on_event("step", {"step": step, "loss": 1.0 / step})
    fan.close(ok=True, timeout=10)
    assert [s for _, s in good.logged] == [1, 2, 3] and good.finished is True
    assert len(warns) == 1 and warns[0][0] == "bad" and f"failed at {fail_at}" in warns[0][1], warns


def test_a_slow_tracker_never_blocks_the_step_and_overflow_is_dropped_and_counted():
    slow = Recorder(delay=0.05)
    warns = Warnings()
    fan = Trackers([slow], _info(), warns, queue_size=4)
    t0 = time.perf_counter()
    for step in range(1, 101):
        fan.on_event("step", {"step": step, "loss": 1.0})
    spent = time.perf_counter() - t0
    fan.close(ok=True, timeout=10)
    assert spent < 0.5, f"100 events took {spent:.3f} s on the trainer's thread"
    assert 0 < fan.dropped < 100 and len(slow.logged) + fan.dropped == 100, (fan.dropped, len(slow.logged))
    assert any(e.get("dropped") == fan.dropped for _, _, e in warns), warns


def test_a_tracker_that_hangs_at_the_end_is_left_after_the_close_timeout_with_a_warning():
    release = threading.Event()

    class Stuck(Recorder):
        name = "stuck"

        def finish(self, ok: bool) -> None:
            release.wait(30)

    warns = Warnings()
    fan = Trackers([Stuck()], _info(), warns)
    t0 = time.monotonic()
    fan.close(ok=True, timeout=0.5)
    assert time.monotonic() - t0 < 3
    assert any("did not finish within 0.5 s" in m for _, m, _ in warns), warns
    release.set()


def test_a_tracker_left_behind_at_close_says_nothing_after_the_run_has_ended():
    """Its failure would land after the run's ``done`` event, which readers take as the end."""
    release, failed = threading.Event(), threading.Event()

    class LateFailure(Recorder):
        name = "late"

        def start(self, info: RunInfo) -> None:  # a dead server, slower than the close timeout
            release.wait(30)
            failed.set()
            raise ConnectionError("refused")

    warns = Warnings()
    fan = Trackers([LateFailure()], _info(), warns)
    fan.close(ok=True, timeout=0.2)
    said = [m for _, m, _ in warns]
    release.set()
    assert failed.wait(5)
    time.sleep(0.2)  # scenario: the abandoned thread's failure has had time to speak
    assert [m for _, m, _ in warns] == said and len(said) == 1 and "did not finish" in said[0]


def test_a_warning_never_carries_the_wandb_key(monkeypatch):
    key = "k3y-" + "x" * 36
    monkeypatch.setenv("WANDB_API_KEY", key)

    class Leaky(Recorder):
        name = "wandb"

        def start(self, info: RunInfo) -> None:
            raise PermissionError(f"bad key {key}")

    warns = Warnings()
    Trackers([Leaky()], _info(), warns).close(ok=True, timeout=10)
    assert warns and all(key not in m for _, m, _ in warns), warns


def test_a_named_tracker_that_is_not_installed_is_a_warning_and_no_backend(monkeypatch):
    monkeypatch.setattr(trackers, "installed", lambda n: False)
    warns, said = Warnings(), []
    got = trackers.open_trackers(("wandb",), _info(), warns, lambda **kw: said.append(kw))
    assert got is None and said == []
    assert warns[0][0] == "wandb" and "not installed" in warns[0][1] and "requirements" in warns[0][1]


@pytest.mark.parametrize(("env", "secret"), [
    ({"WANDB_API_KEY": "a.b*c+d?[x]$\\1(key)\nline2"}, "a.b*c+d?[x]$\\1(key)\nline2"),
    ({"WANDB_API_KEY": "  padded-key-0123  "}, "padded-key-0123"),
    ({"MLFLOW_TRACKING_URI": "http://bob:s3cr%40tPW@127.0.0.1:1/"}, "s3cr@tPW"),
    ({"MLFLOW_TRACKING_URI": "http://bob:s3cretPW@127.0.0.1:1/"}, "s3cretPW"),
    ({"MLFLOW_TRACKING_TOKEN": "tok\r\nen-1234"}, "tok\r\nen-1234"),
    ({"MLFLOW_TRACKING_PASSWORD": "pass'word\"1"}, "pass'word\"1"),
])
def test_a_warning_never_carries_a_credential_in_any_form_a_library_quotes_it(monkeypatch, env, secret):
    for k in (*trackers.SECRET_ENV, "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    uri = env.get("MLFLOW_TRACKING_URI", "")

    class Leaky(Recorder):
        name = "mlflow"

        def start(self, info: RunInfo) -> None:  # as requests and MLflow word their errors
            raise ValueError(f"API request to {uri}/api failed; header value {secret!r}; raw {secret}; "
                             f"json {json.dumps(secret)}; stripped {secret.strip()}")

    warns = Warnings()
    Trackers([Leaky()], _info(), warns).close(ok=True, timeout=10)
    assert len(warns) == 1, warns
    text = warns[0][1]
    for form in (secret, secret.strip(), repr(secret)[1:-1], json.dumps(secret)[1:-1]):
        assert form not in text, text
    assert "failed at start" in text


@given(st.text(min_size=4, max_size=40).filter(lambda k: len(k.strip()) >= 4), st.text(max_size=40))
def test_redacting_never_leaves_a_secret_in_any_message(key, around):
    secrets = trackers.secret_texts({"WANDB_API_KEY": key})
    text = trackers.redact(f"{around}{key}{around}{key!r}{json.dumps(key)}{around}", secrets)
    assert key not in text and key.strip() not in text


@pytest.mark.parametrize("text", ["," * 10_000, "x" * 10_000, "wandb," + "é" * 5000])
def test_an_absurdly_long_report_to_is_a_short_error(text):
    with pytest.raises(ReportToError) as got:
        parse_report_to(text)
    assert len(str(got.value)) < 400 and "\n" not in str(got.value)


def test_a_backend_librarys_own_thread_failing_is_one_warning_not_a_traceback(capsys):
    from tensorboard.summary.writer import event_file_writer

    namespace = {"__name__": event_file_writer.__name__}  # code of TensorBoard's writer module
    exec("def boom():\n    raise OSError(28, 'No space left on device')\n", namespace)
    boom = namespace["boom"]
    warns = Warnings()
    fan = Trackers([Recorder()], _info(), warns)
    th = threading.Thread(target=boom, name="writer")
    th.start()
    th.join()
    fan.close(ok=True, timeout=10)
    assert [(n, "No space left on device" in m) for n, m, _ in warns] == [("tensorboard", True)], warns
    assert "Traceback" not in capsys.readouterr().err
    assert threading.excepthook is not fan._thread_failed


def test_a_tracker_left_unfinished_does_not_hold_the_process_exit(tmp_path):
    """Its library's exit hook (W&B's waits for its service) would outlive stop's grace."""
    import subprocess
    import sys

    from tests.paths import REPO

    script = textwrap.dedent("""
        import atexit, threading, time
        from remote_payload.trainer import trackers

        class Stuck:
            name = "stuck"
            def where(self, info): return "/nowhere"
            def start(self, info): pass
            def log(self, metrics, step): pass
            def finish(self, ok): threading.Event().wait(120)

        atexit.register(time.sleep, 120)  # what the stuck library's exit hook does
        fan = trackers.Trackers([Stuck()], trackers.RunInfo("r", "/tmp/none"), lambda *a, **k: None)
        fan.close(ok=True, timeout=0.5)
        print("closed", flush=True)
        trackers.leave_if_abandoned(0)
    """)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0 and res.stdout == "closed\n", res
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("value", [10**400, float("nan"), float("inf"), -float("inf"), [10**400, 1]])
def test_any_number_in_an_event_never_raises_on_the_trainers_thread(value):
    rec, warns = Recorder(), Warnings()
    fan = Trackers([rec], _info(), warns)
    fan.on_event("step", {"step": 1, "loss": value})
    fan.close(ok=True, timeout=10)
    assert rec.finished is True


def test_a_mute_tracker_holds_up_only_itself():
    release = threading.Event()

    class Mute(Recorder):
        name = "mute"

        def start(self, info: RunInfo) -> None:  # a server that accepts and never answers
            release.wait(30)

    good, warns = Recorder(), Warnings()
    fan = Trackers([Mute(), good], _info(), warns)
    for step in (1, 2, 3):
        fan.on_event("step", {"step": step, "loss": 1.0})
    t0 = time.monotonic()
    fan.close(ok=True, timeout=1)
    assert time.monotonic() - t0 < 3
    assert [s for _, s in good.logged] == [1, 2, 3] and good.finished is True
    assert [m for _, m, _ in warns] == ["mute did not finish within 1 s; left unfinished (their "
                                        "last metrics may be missing)"], warns
    release.set()
