"""``--report-to`` in real CPU runs: what each tracker recorded, read back with its own
reader, and the runs a broken tracker must not cost.

Loopback only: W&B runs offline (``WANDB_MODE=offline``), MLflow writes a SQLite store in
the run directory or is pointed at a dead port on 127.0.0.1.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import struct
import time

import pytest

from tests.trainer.test_trainer_run import FAST, _events, _fresh_stop_flag  # noqa: F401

torch = pytest.importorskip("torch")
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from remote_payload.agent.verbs import goodput as goodput_verb  # noqa: E402
from remote_payload.trainer import trackers  # noqa: E402
from remote_payload.trainer.train import main  # noqa: E402

KEY = "wandb-test-key-" + "0123456789abcdef" * 2  # a well-formed, never valid key
STEPS = ["--steps", "6", "--warmup-steps", "1", "--token-budget", "384", "--log-every", "2"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """No tracker may reach the network: W&B offline, no telemetry, MLflow not configured."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("MLFLOW_ENABLE_TELEMETRY", "false")  # never phone home
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    for name in ("WANDB_DIR", "WANDB_API_KEY", "MLFLOW_TRACKING_URI", "WANDB_PROJECT",
                 "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)


def _run(capsys, out: pathlib.Path, *argv: str) -> tuple[int, list[dict]]:
    rc = main([*FAST, *STEPS, "--out-dir", str(out), *argv])
    return rc, _events(capsys.readouterr().out)


def _wandb_records(run_dir: pathlib.Path) -> list:
    """The records of an offline run's ``.wandb`` file (LevelDB's log format: 32 KiB blocks of
    ``crc32 u32, length u16, type u8`` chunks after a 7-byte ``:W&B`` header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, buf, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += left - 7
            continue
        chunk, pos = data[pos:pos + length], pos + length
        if kind in (1, 2):
            buf = chunk
        else:
            buf += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def test_every_tracker_records_the_step_metrics_goodput_config_and_tags_of_the_run(
        capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", KEY)  # offline all the same: WANDB_MODE says so
    goodput = _goodput_file(tmp_path / goodput_verb.SUMMARY_CACHE)
    monkeypatch.setenv("OPSCTL_GOODPUT_FILE", str(tmp_path / goodput_verb.SUMMARY_CACHE))
    out = tmp_path / "run"
    rc, ev = _run(capsys, out, "--report-to", "tensorboard,wandb,mlflow", "--run-id", "trk1")
    assert rc == 0, ev[-3:]
    assert [e for e in ev if e["event"] == "warning"] == []
    steps = {e["step"]: e for e in ev if e["event"] == "step"}
    assert sorted(steps) == [2, 4, 6], steps
    (said,) = [e for e in ev if e["event"] == "trackers"]
    assert said["report_to"] == ["tensorboard", "wandb", "mlflow"] and said["run"] == "trk1"
    assert said["tensorboard"] == str(out / "tensorboard")
    assert said["mlflow"] == f"sqlite:///{out}/mlflow.db"

    # TensorBoard, read with its own EventAccumulator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard" / "trk1"))
    acc.Reload()
    for name in ("loss", "acc", "tok_s", "lr"):
        got = {s.step: s.value for s in acc.Scalars(f"train/{name}")}
        assert got == pytest.approx({k: e[name] for k, e in steps.items()}, rel=1e-6), name
    assert {"config/text_summary", "tags/text_summary"} <= set(acc.Tags()["tensors"])
    tags_text = acc.Tensors("tags/text_summary")[0].tensor_proto.string_val[0].decode()
    assert f"torch: {torch.__version__}" in tags_text and "payload: local" in tags_text

    # W&B's offline run: history, config, tags
    (wb_dir,) = (out / "wandb").glob("offline-run-*")
    records = _wandb_records(wb_dir)
    history = [{i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [int(h["_step"]) for h in history] == [2, 4, 6], history
    assert [float(h["train/loss"]) for h in history] == pytest.approx(
        [steps[s]["loss"] for s in (2, 4, 6)])
    # the run's goodput, once, at the first step after the summary was read
    assert [(int(h["_step"]), float(h["goodput/ratio"])) for h in history
            if "goodput/ratio" in h] == [(2, pytest.approx(goodput["goodput"]))]
    assert float(history[0]["goodput/badput_s/stall"]) == pytest.approx(goodput["causes"]["stall"])
    (run_rec,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert f"torch:{torch.__version__}" in run_rec.tags and run_rec.display_name == "trk1"
    assert "args.lr" in {c.key for c in run_rec.config.update}

    # MLflow's store: metrics per step, params, tags, a finished run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=said["mlflow"])
    (run,) = client.search_runs([client.get_experiment_by_name("dflash").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "trk1"
    hist = client.get_metric_history(run.info.run_id, "train/loss")
    assert {m.step: m.value for m in hist} == pytest.approx({k: e["loss"] for k, e in steps.items()})
    hist = client.get_metric_history(run.info.run_id, "goodput/effective_tok_s")
    assert [(m.step, m.value) for m in hist] == [(2, pytest.approx(goodput["effective_tok_s"]))]
    assert run.data.params["args.steps"] == "6" and run.data.params["model.block_size"] == "4"
    assert run.data.tags["torch"] == torch.__version__ and run.data.tags["payload"] == "local"

    # the key is in the environment only: no file the run wrote holds it
    holders = [p for p in out.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert holders == [], holders


def test_broken_trackers_each_cost_one_warning_and_the_run_finishes(capsys, tmp_path, monkeypatch):
    """TensorBoard's directory taken by a file (a read-only or full disk fails the same way),
    MLflow pointed at a dead port, and a W&B stand-in that raises on every call."""

    class Raises:
        name = "wandb"

        def where(self, info):
            return "/nowhere"

        def start(self, info):
            raise ConnectionError("wandb: network is down")

        log = finish = start

    monkeypatch.setitem(trackers.BACKENDS, "wandb", Raises)
    # the dead server's refusal must arrive before the close: MLflow's first import and its
    # retry take longer than the close timeout on a loaded 2-core machine
    monkeypatch.setattr(trackers, "CLOSE_TIMEOUT_S", 110.0)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    for k in trackers.MLFLOW_HTTP_DEFAULTS:
        monkeypatch.delenv(k, raising=False)  # the trainer's own bounds apply
    out = tmp_path / "run"
    out.mkdir()
    (out / "tensorboard").write_text("a file where the logdir goes\n")
    t0 = time.monotonic()
    rc, ev = _run(capsys, out, "--report-to", "tensorboard,wandb,mlflow")
    took = time.monotonic() - t0
    assert rc == 0, ev[-3:]
    assert ev[-1]["event"] == "done" and ev[-1]["reason"] == "finished", ev[-1]
    warns = {e["tracker"]: e for e in ev if e["event"] == "warning"}
    assert set(warns) == {"tensorboard", "wandb", "mlflow"}, warns
    assert all(e["source"] == "tracker" and "switched off" in e["message"] for e in warns.values())
    assert "network is down" in warns["wandb"]["message"]
    assert took < 120, f"the run took {took:.0f} s with a dead MLflow server"
    assert len([e for e in ev if e["event"] == "step"]) == 3


def test_a_tracker_that_fails_while_the_run_ends_is_named_before_the_done_event(
        capsys, tmp_path, monkeypatch):
    """A dead server whose refusal arrives after the last step: the warning still comes before
    ``done``, which status and every log reader take as the run's last word."""

    class SlowRefusal:
        name = "wandb"

        def where(self, info):
            return "/nowhere"

        def start(self, info):
            time.sleep(2)  # scenario: the refusal arrives after the three quick steps
            raise ConnectionError("refused")

        log = finish = start

    monkeypatch.setitem(trackers.BACKENDS, "wandb", SlowRefusal)
    rc, ev = _run(capsys, tmp_path / "run", "--report-to", "wandb")
    assert rc == 0
    kinds = [e["event"] for e in ev]
    assert kinds[-1] == "done", kinds
    assert kinds.index("warning") < kinds.index("done"), kinds


def test_report_to_names_outside_the_choices_are_exit_2_before_the_run(capsys, tmp_path):
    rc = main([*FAST, "--report-to", "tensorboard,tensorboard", "--out-dir", str(tmp_path)])
    ev = _events(capsys.readouterr().out)
    assert rc == 2 and ev[-1]["event"] == "error", ev
    assert "named twice" in ev[-1]["message"]
    assert not any(tmp_path.iterdir())


def test_report_to_none_starts_no_tracker_and_writes_nothing_for_one(capsys, tmp_path):
    out = tmp_path / "run"
    rc, ev = _run(capsys, out, "--report-to", "none", "--steps", "2")
    assert rc == 0
    assert not any(e["event"] in ("trackers", "warning") for e in ev)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in out.iterdir() if p.name.startswith(("ckpt-", "latest")))


def test_a_sigterm_ends_the_run_with_the_last_step_in_tensorboard(tmp_path):
    """SIGTERM stops at a step boundary; the trackers are closed (flushed) before exit."""
    import json
    import signal
    import subprocess
    import sys

    from tests.paths import REPO

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "remote_payload.trainer", *FAST, "--steps", "100000",
                          "--token-budget", "384", "--out-dir", str(out), "--run-id", "sig",
                          "--report-to", "tensorboard"], env=env, cwd=REPO,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    seen = 0
    for line in p.stdout:
        if line.startswith('{"event":"step"'):
            seen += 1
            if seen == 3:
                p.send_signal(signal.SIGTERM)
        if line.startswith('{"event":"done"'):
            done = json.loads(line)
    assert p.wait(120) == 0
    assert done["reason"] == "SIGTERM", done
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard" / "sig"))
    acc.Reload()
    assert max(s.step for s in acc.Scalars("train/loss")) >= 3
    assert glob.glob(str(out / "tensorboard" / "sig" / "events.out.tfevents.*"))


def _goodput_file(path: pathlib.Path) -> dict:
    """The run's summary as the job's wrapper writes it: the agent's own ledger of a run with
    a crash (its stall, lost progress and restart gap), summed up as ``status`` shows it."""
    from remote_payload.agent import goodput

    t0 = 1_790_000_000.0
    events = [{"event": "startup", "first_step_at": 5.0, "_at": t0 + 5},
              *({"event": "step", "step": s, "tok_s": 900.0, "_at": t0 + 5 + s}
                for s in range(1, 31)),
              {"event": "restart", "attempt": 2, "reason": "python_exception", "_at": t0 + 40},
              {"event": "resume", "step": 20, "_at": t0 + 44},
              {"event": "startup", "first_step_at": 4.0, "_at": t0 + 45},
              *({"event": "step", "step": s, "tok_s": 900.0, "_at": t0 + 25 + s}
                for s in range(21, 41))]
    facts = goodput.JobFacts("train-20261203-100000-aaaa", t0 - 1, t0, None, "RUNNING", events)
    doc = goodput.ledger([facts], t0 + 66.0)
    summary = {"run_id": "train-20261203-100000-aaaa", **goodput.summary(doc)}
    cache = {"key": [], "at": t0 + 66.0, "moment": ["RUNNING", 2], "run_id": summary["run_id"],
             "summary": summary}
    path.write_text(json.dumps(cache))
    return summary


def test_tensorboard_gets_the_runs_goodput_from_the_wrappers_summary(capsys, tmp_path, monkeypatch):
    """The trainer cannot see its run's earlier attempts: the wrapper's summary (named by
    OPSCTL_GOODPUT_FILE) becomes goodput scalars at the trainer's step."""
    summary = _goodput_file(tmp_path / goodput_verb.SUMMARY_CACHE)
    assert summary["causes"]["stall"] > 0 and summary["causes"]["lost"] > 0
    monkeypatch.setenv("OPSCTL_GOODPUT_FILE", str(tmp_path / goodput_verb.SUMMARY_CACHE))
    out = tmp_path / "run"
    rc, ev = _run(capsys, out, "--report-to", "tensorboard", "--run-id", "gp1")
    assert rc == 0, ev[-3:]
    assert [e for e in ev if e["event"] == "warning"] == []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard" / "gp1"))
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    # read once per refresh of the file (at most every 10 s): at the first logged step
    ratio = [(s.step, s.value) for s in acc.Scalars("goodput/ratio")]
    assert ratio == [(2, pytest.approx(summary["goodput"], rel=1e-6))]
    (tok,) = acc.Scalars("goodput/effective_tok_s")
    assert (tok.step, tok.value) == (2, pytest.approx(summary["effective_tok_s"], rel=1e-6))
    for cause, seconds in summary["causes"].items():
        name = f"goodput/badput_s/{cause}"
        if cause == "productive":
            assert name not in scalars
            continue
        (got,) = acc.Scalars(name)
        assert (got.step, got.value) == (2, pytest.approx(seconds, rel=1e-6, abs=1e-6)), cause
    assert {f"train/{n}" for n in ("loss", "acc", "tok_s")} <= scalars


@pytest.mark.parametrize("plant", ["missing", "fifo", "link", "garbage", "huge"])
def test_a_goodput_file_that_is_damaged_or_planted_costs_the_scalars_never_the_run(
        capsys, tmp_path, monkeypatch, plant):
    path = tmp_path / "goodput-summary.json"
    if plant == "fifo":
        os.mkfifo(path)  # a reader that opened it blocking would wait forever
    elif plant == "link":
        real = tmp_path / "real.json"
        _goodput_file(real)
        os.symlink(real, path)
    elif plant == "garbage":
        path.write_bytes(b'{"at": 1e400, "summary": {"goodput": "\xff"')
    elif plant == "huge":
        path.write_bytes(b"[" * (trackers.GOODPUT_MAX_BYTES + 10))
    monkeypatch.setenv("OPSCTL_GOODPUT_FILE", str(path))
    out = tmp_path / "run"
    started = time.monotonic()
    rc, ev = _run(capsys, out, "--report-to", "tensorboard", "--run-id", "gp2")
    assert rc == 0, ev[-3:]
    assert time.monotonic() - started < 120
    assert [e for e in ev if e["event"] == "warning"] == []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard" / "gp2"))
    acc.Reload()
    assert [s for s in acc.Tags()["scalars"] if s.startswith("goodput/")] == []
    assert "train/loss" in acc.Tags()["scalars"]
