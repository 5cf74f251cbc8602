"""Trainer runs end to end on CPU: learning, events, checkpoints, resume, signals, ranks."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests.paths import REPO

torch = pytest.importorskip("torch")

from remote_payload import wire  # noqa: E402
from remote_payload.trainer import checkpoint  # noqa: E402
from remote_payload.trainer.checkpoint import CheckpointError  # noqa: E402
from remote_payload.trainer.train import _StopFlag, main  # noqa: E402

ROOT = REPO
FAST = ["--preset", "tiny", "--device", "cpu", "--attn", "sdpa", "--compile", "off",
        "--seq-buckets", "48,96", "--log-every", "1"]


@pytest.fixture(autouse=True)
def _fresh_stop_flag():
    _StopFlag.requested, _StopFlag.signame = False, ""
    yield
    _StopFlag.requested, _StopFlag.signame = False, ""


def _events(text: str) -> list[dict]:
    return [e for e in map(wire.parse_event, text.splitlines()) if e is not None]


def _run(capsys, *argv: str) -> tuple[int, list[dict]]:
    rc = main([*FAST, *argv])
    return rc, _events(capsys.readouterr().out)


def _load(path: pathlib.Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_loss_decreases_on_the_learnable_synthetic_task(capsys, tmp_path):
    rc, ev = _run(capsys, "--steps", "40", "--lr", "3e-3", "--warmup-steps", "5",
                  "--token-budget", "768", "--out-dir", str(tmp_path))
    assert rc == 0, ev[-3:]
    losses = [e["loss"] for e in ev if e["event"] == "step"]
    assert len(losses) == 40, losses
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.8, (first, last)


def test_every_event_line_parses_and_steps_carry_the_contract_fields(capsys, tmp_path):
    rc, ev = _run(capsys, "--steps", "3", "--token-budget", "384", "--out-dir", str(tmp_path))
    assert rc == 0, ev
    kinds = [e["event"] for e in ev]
    assert kinds[0] == "phase" and ev[0]["phase"] == "loading", ev[0]
    phases = [e["phase"] for e in ev if e["event"] == "phase"]
    assert phases == ["loading", "loading", "training", "done"], phases
    for e in (e for e in ev if e["event"] == "step"):
        for key, typ in (("step", int), ("loss", float), ("acc", float), ("tok_s", float),
                         ("eta_s", float), ("lr", float)):
            assert isinstance(e[key], typ), (key, e)
    assert "checkpoint" in kinds and kinds[-1] == "done", kinds
    assert all(wire.PHASE_TO_STATE.get(p) or p == "done" for p in phases), phases


def test_a_bad_flag_is_reported_as_an_error_event_with_exit_code_2(capsys):
    rc = main(["--preset", "qwen3"])
    ev = _events(capsys.readouterr().out)
    assert rc == 2, rc
    assert ev[-1]["event"] == "error" and "qwen3-8b" in ev[-1]["message"], ev


def test_checkpoint_then_resume_reproduces_an_uninterrupted_run(capsys, tmp_path):
    common = ["--steps", "6", "--token-budget", "384", "--warmup-steps", "2", "--lr", "2e-3"]
    rc, _ = _run(capsys, *common, "--out-dir", str(tmp_path / "a"))
    assert rc == 0
    rc, ev = _run(capsys, *common, "--out-dir", str(tmp_path / "b"), "--stop-at-step", "3")
    assert rc == 0 and ev[-1]["step"] == 3, ev[-1]
    rc, ev = _run(capsys, *common, "--out-dir", str(tmp_path / "b"), "--resume", "auto")
    assert rc == 0
    assert next(e for e in ev if e["event"] == "resume")["step"] == 3, ev
    assert [e["step"] for e in ev if e["event"] == "step"] == [4, 5, 6], ev
    a, b = _load(tmp_path / "a" / "ckpt-0000006"), _load(tmp_path / "b" / "ckpt-0000006")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    meta = json.loads((tmp_path / "b" / "ckpt-0000006" / "meta.json").read_text())
    assert meta["step"] == 6 and meta["torch"] == torch.__version__ and meta["run_id"], meta
    assert meta["cfg"]["preset"] == "tiny", meta["cfg"]
    oa = torch.load(tmp_path / "a" / "ckpt-0000006" / "optim.pt", weights_only=True)
    ob = torch.load(tmp_path / "b" / "ckpt-0000006" / "optim.pt", weights_only=True)
    sa, sb = oa["optim"]["state"], ob["optim"]["state"]
    assert all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa), "optimizer differs"


def test_loading_a_compiled_modules_state_dict_fails_loudly(tmp_path):
    from safetensors.torch import save_file

    from remote_payload.trainer.config import preset
    from remote_payload.trainer.model import Drafter

    model = Drafter(preset("tiny"), "sdpa")
    opt = torch.optim.AdamW(model.parameters())
    path = checkpoint.save(str(tmp_path), 1, model, opt, {"run_id": "x"})
    save_file({f"_orig_mod.{k}": v.contiguous() for k, v in model.state_dict().items()},
              str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="_orig_mod"):
        checkpoint.load(path, model, opt, torch.device("cpu"))


def test_warmup_only_reports_every_bucket_and_exits(capsys, tmp_path):
    rc, ev = _run(capsys, "--warmup-only", "--token-budget", "384")
    assert rc == 0
    compiling = next(e for e in ev if e.get("phase") == "compiling")
    assert compiling["buckets"] == [[8, 48], [4, 96]], compiling
    assert ev[-1] == {"event": "done", "step": 0, "warmup_only": True}, ev[-1]


def _spawn(*argv: str, **kw) -> subprocess.Popen:
    # the job site hook arms faulthandler on SIGUSR1 in every rank, as for an opsctl job
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "remote_payload" / "sitehook"),
                                                        str(ROOT)]),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "remote_payload.trainer", *FAST, *argv],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **kw)


def _finish(p: subprocess.Popen, timeout_s: float) -> str:
    """The output of ``p`` once it exits; past ``timeout_s`` a hang fails the test with every
    rank's stacks (SIGUSR1 to the process group, then SIGKILL)."""
    try:
        return p.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGUSR1)
        time.sleep(2)  # scenario: the ranks get time to write their stacks before SIGKILL
        os.killpg(p.pid, signal.SIGKILL)
        out = p.communicate()[0]
        pytest.fail(f"no exit within {timeout_s:g} s; output and stacks:\n{out[-12000:]}")


def test_sigint_saves_a_checkpoint_and_exits_0(tmp_path):
    p = _spawn("--steps", "100000", "--token-budget", "384", "--out-dir", str(tmp_path))
    lines: list[str] = []
    deadline = time.monotonic() + 60
    assert p.stdout is not None
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        lines.append(line)
        if (wire.parse_event(line) or {}).get("event") == "step":
            break
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    ev = _events("".join(lines) + out)
    assert p.returncode == 0, out[-2000:]
    ck = [e for e in ev if e["event"] == "checkpoint"]
    assert ck and pathlib.Path(ck[-1]["path"], "model.safetensors").is_file(), ev[-4:]
    assert ev[-1]["event"] == "done" and ev[-1]["reason"] == "SIGINT", ev[-1]


@pytest.mark.parametrize("topology", [["--topology", "split", "--target-ranks", "1", "--nproc", "3"],
                                      ["--nproc", "2"]], ids=["split-1t-2d", "colocated-2"])
def test_gloo_ranks_train_and_keep_drafter_replicas_identical(tmp_path, topology):
    p = _spawn(*topology, "--steps", "4", "--token-budget", "384", "--check-replicas",
               "--out-dir", str(tmp_path))
    out = _finish(p, 120)
    ev = _events(out)
    assert p.returncode == 0, out[-3000:]
    steps = [e for e in ev if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4], ev
    if "split" in topology:  # split steps say how much the drafters wait for the target's features
        assert all(0.0 <= e["feature_wait_pct"] <= 100.0 for e in steps), steps
    rep = [e for e in ev if e["event"] == "replicas"]
    n_drafters = 2
    assert rep and rep[0]["identical"] and len(rep[0]["checksums"]) == n_drafters, rep
    assert (tmp_path / "ckpt-0000004" / "model.safetensors").is_file()


def test_every_phase_and_step_says_how_long_the_job_may_stay_silent_after_it(capsys, tmp_path):
    rc, ev = _run(capsys, "--steps", "3", "--token-budget", "384", "--out-dir", str(tmp_path))
    assert rc == 0
    announced = [e for e in ev if e["event"] in ("phase", "step") and e.get("phase") != "done"]
    assert announced and all(e[wire.FIELD_BUDGET] > 0 for e in announced), announced


# A rank that raises takes the other down, and its error event names it: the same two-rank run
# under deploy, with the job's diagnosis built from that event, is tests/sandbox/
# test_distributed_sandbox.py::test_a_rank_that_raises_fails_the_job_with_its_error_and_leaves_no_rank


# A collective that never completes ends the job after --pg-timeout, each rank's error event
# saying it timed out: the same deadlocked two-rank run under deploy, after its hang was named,
# is tests/sandbox/test_distributed_sandbox.py::
# test_a_deadlock_is_named_with_every_ranks_stacks_then_the_pg_timeout_ends_the_job


def test_the_pg_timeout_must_be_a_positive_number(capsys):
    assert main([*FAST, "--pg-timeout", "nan"]) == 2
    assert "--pg-timeout must be > 0" in capsys.readouterr().err

