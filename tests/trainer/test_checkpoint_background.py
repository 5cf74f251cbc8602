"""Periodic checkpoints never stop training: staged in host memory, written by one background
writer, at most one in flight, the final one durable before ``done``, never torn by a kill;
``--keep-last``/``--keep-every`` remove only this run's old checkpoints, never the one
``latest`` names, one being read, another run's or one a user changed."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import typing as t

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.paths import REPO
from tests.waiting import wait_for

torch = pytest.importorskip("torch")

from remote_payload import safe_write, wire  # noqa: E402
from remote_payload.trainer import checkpoint, saver  # noqa: E402
from remote_payload.trainer.config import TrainerConfigError, parse_args  # noqa: E402
from remote_payload.trainer.train import _StopFlag, main  # noqa: E402
from remote_payload.wire_shapes import event_problem  # noqa: E402

FAST = ["--preset", "tiny", "--device", "cpu", "--attn", "sdpa", "--compile", "off",
        "--seq-buckets", "48,96", "--token-budget", "384", "--log-every", "1"]


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


def _complete(ckpt: pathlib.Path) -> bool:
    names = {p.name for p in ckpt.iterdir()}
    return {"model.safetensors", "optim.pt", "meta.json", safe_write.MARKER} <= names


# --- the trainer -------------------------------------------------------------------------


def _writer_done_before_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step boundary first waits for the write in flight: the checkpoints land at the
    steps they are due on a loaded machine too (deferral has its own test below)."""
    real = saver.Checkpointer.step_end

    def step_end(self: t.Any, *args: t.Any, **kwargs: t.Any) -> t.Any:
        if self._busy is not None:
            concurrent.futures.wait([self._busy])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(saver.Checkpointer, "step_end", step_end)


def test_periodic_checkpoints_are_written_in_the_background_and_say_what_training_waited(
        capsys, tmp_path, monkeypatch):
    _writer_done_before_each_step(monkeypatch)
    rc, ev = _run(capsys, "--steps", "6", "--ckpt-every", "2", "--out-dir", str(tmp_path))
    assert rc == 0, ev[-3:]
    ck = [e for e in ev if e["event"] == "checkpoint"]
    assert [(e["step"], e["mode"]) for e in ck] == [(2, "background"), (4, "background"),
                                                    (6, "final")], ck
    assert all(e["blocked_s"] < 1.0 and e["write_s"] >= 0 for e in ck), ck
    assert [(e, event_problem(e)) for e in ev if event_problem(e)] == []
    assert ev[-1]["event"] == "done" and (tmp_path / "latest").read_text() == "ckpt-0000006\n"
    for step in (2, 4, 6):
        assert _complete(tmp_path / f"ckpt-{step:07d}")


def test_a_background_checkpoint_holds_the_same_state_as_a_synchronous_one(capsys, tmp_path):
    common = ["--steps", "4", "--ckpt-every", "2", "--warmup-steps", "1", "--lr", "2e-3"]
    assert _run(capsys, *common, "--out-dir", str(tmp_path / "bg"))[0] == 0
    assert _run(capsys, *common, "--ckpt-write", "sync", "--out-dir", str(tmp_path / "sync"))[0] == 0
    from safetensors.torch import load_file

    for step in (2, 4):
        a = load_file(str(tmp_path / "bg" / f"ckpt-{step:07d}" / "model.safetensors"))
        b = load_file(str(tmp_path / "sync" / f"ckpt-{step:07d}" / "model.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), step
        oa = torch.load(tmp_path / "bg" / f"ckpt-{step:07d}" / "optim.pt", weights_only=True)
        ob = torch.load(tmp_path / "sync" / f"ckpt-{step:07d}" / "optim.pt", weights_only=True)
        sa, sb = oa["optim"]["state"], ob["optim"]["state"]
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i]), step
        assert oa["optim"]["param_groups"] == ob["optim"]["param_groups"]


def test_a_checkpoint_due_while_one_is_written_is_deferred_with_a_warning_and_training_goes_on(
        capsys, tmp_path, monkeypatch):
    # the write of ckpt-3 is held until training has finished step 8: the checkpoint due at 6
    # meets a busy writer whatever the machine's speed, and the writer is free well before 40
    reached = threading.Event()
    real_step_end, real_commit = saver.Checkpointer.step_end, saver.checkpoint.commit

    def step_end(self: t.Any, step: int, *args: t.Any, **kwargs: t.Any) -> t.Any:
        if step >= 8:
            reached.set()
        return real_step_end(self, step, *args, **kwargs)

    def commit(out_dir: t.Any, step: int, *args: t.Any, **kwargs: t.Any) -> t.Any:
        if step == 3:
            assert reached.wait(120), "training never reached step 8"
        return real_commit(out_dir, step, *args, **kwargs)

    monkeypatch.setattr(saver.Checkpointer, "step_end", step_end)
    monkeypatch.setattr(saver.checkpoint, "commit", commit)
    rc, ev = _run(capsys, "--steps", "40", "--ckpt-every", "3", "--out-dir", str(tmp_path))
    assert rc == 0, ev[-3:]
    warn = [e for e in ev if e["event"] == "warning" and e.get("source") == "checkpoint"]
    assert warn and warn[0]["step"] == 6 and warn[0]["writing"] == 3, warn
    assert len([w for w in warn if w["writing"] == 3]) == 1, "one warning per deferral"
    kinds = [(e["event"], e.get("step")) for e in ev]
    staged, committed = kinds.index(("step", 3)), kinds.index(("checkpoint", 3))
    assert len([k for k, _ in kinds[staged + 1:committed] if k == "step"]) >= 3, \
        "training waited for the disk"
    nxt = [e for e in ev if e["event"] == "checkpoint"][1]
    assert nxt.get("deferred_from") == 6 and 6 < nxt["step"] < 40, nxt
    final = [e for e in ev if e["event"] == "checkpoint"][-1]
    assert final["mode"] == "final" and [e["step"] for e in ev if e["event"] == "checkpoint"
                                         ].count(40) == 1, "the last step is written once"
    assert [(e, event_problem(e)) for e in ev if event_problem(e)] == []


def test_the_final_checkpoint_waits_for_the_one_in_flight_and_is_durable_before_done(
        capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(saver.ENV_WRITE_PAUSE, "4:2")
    rc, ev = _run(capsys, "--steps", "5", "--ckpt-every", "4", "--out-dir", str(tmp_path))
    assert rc == 0, ev[-3:]
    tail = [(e["event"], e.get("step"), e.get("mode")) for e in ev
            if e["event"] in ("checkpoint", "done")]
    assert tail == [("checkpoint", 4, "background"), ("checkpoint", 5, "final"),
                    ("done", 5, None)], tail
    assert _complete(tmp_path / "ckpt-0000004") and _complete(tmp_path / "ckpt-0000005")
    assert (tmp_path / "latest").read_text() == "ckpt-0000005\n"


def _spawn(*argv: str, env: dict[str, str]) -> subprocess.Popen:
    full = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen([sys.executable, "-m", "remote_payload.trainer", *FAST, *argv],
                            cwd=REPO, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def test_a_sigkill_mid_write_leaves_latest_on_the_last_complete_checkpoint_and_resume_works(
        capsys, tmp_path):
    out = tmp_path / "run"
    p = _spawn("--steps", "100000", "--ckpt-every", "2", "--keep-last", "1",
               "--out-dir", str(out), env={saver.ENV_WRITE_PAUSE: "4:120"})
    try:
        def half_written() -> list[pathlib.Path]:
            # the checkpoint due at 4, or the step a busy writer deferred it to (a loaded
            # machine writes ckpt-2 for longer than two steps)
            if not out.is_dir():
                return []
            return [d for d in out.iterdir() if d.name.startswith(".ckpt-")
                    and d.name[1:13] >= "ckpt-0000004" and (d / "model.safetensors").is_file()]

        held = wait_for(half_written, 120)
        assert held, "the writer never reached the pause"
        assert (out / "latest").read_text() == "ckpt-0000002\n"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=60)
    assert not (out / held[0].name[1:13]).exists()
    assert _complete(out / "ckpt-0000002")
    assert checkpoint.resolve("auto", str(out)) == out / "ckpt-0000002"
    checkpoint.release(out / "ckpt-0000002")
    rc, ev = _run(capsys, "--steps", "5", "--ckpt-every", "2", "--keep-last", "1",
                  "--resume", "auto", "--out-dir", str(out))
    assert rc == 0, ev[-3:]
    assert next(e for e in ev if e["event"] == "resume")["step"] == 2
    assert (out / "latest").read_text() == "ckpt-0000005\n" and _complete(out / "ckpt-0000005")
    # the resumed attempt's --keep-last removes the killed attempt's checkpoint too: one run
    assert sorted(d.name for d in out.iterdir() if d.name.startswith("ckpt-")) == ["ckpt-0000005"]


# --- flags -------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--keep-last", "-1"], ["--keep-every", "-3", "--keep-last", "2"],
                                  ["--keep-every", "100"], ["--ckpt-write", "later"]])
def test_keep_and_write_flags_are_checked(argv):
    with pytest.raises(TrainerConfigError):
        parse_args(argv)


def test_every_bundled_trainer_playbook_parses_with_the_trainers_own_flags():
    import yaml

    found = 0
    for path in sorted((REPO / "opsctl" / "bundled" / "playbooks").glob("*.yaml")):
        cmd = yaml.safe_load(path.read_text()).get("command") or []
        if cmd[:3] == ["python3", "-m", "remote_payload.trainer"] and not (
                len(cmd) > 3 and not cmd[3].startswith("-")):
            parse_args(cmd[3:])
            found += 1
    assert found >= 2


def test_the_gpu_playbook_bounds_the_progress_a_crash_loses_and_the_disk():
    import yaml

    cmd = yaml.safe_load((REPO / "opsctl/bundled/playbooks/dflash-8gpu.yaml").read_text())["command"]
    args = parse_args(cmd[3:])
    measured_step_s = 1.66  # 8 H200s, this playbook's shape (docs/trainer-performance.md)
    assert 0 < args.ckpt_every * measured_step_s <= 300
    assert 1 <= args.keep_last <= 5 and args.ckpt_write == "background"


# --- pruning -----------------------------------------------------------------------------


def _model():
    from remote_payload.trainer.config import preset
    from remote_payload.trainer.model import Drafter

    model = Drafter(preset("tiny"), "sdpa")
    return model, torch.optim.AdamW(model.parameters())


def _write(out: pathlib.Path, steps, run_id="me") -> None:
    model, opt = _model()
    for s in steps:
        checkpoint.save(str(out), s, model, opt, {"run_id": run_id})


def _names(out: pathlib.Path) -> list[str]:
    return sorted(d.name for d in out.iterdir() if d.name.startswith("ckpt-"))


def test_keep_last_removes_only_this_runs_older_checkpoints(tmp_path):
    _write(tmp_path, [1], run_id="someone-else")
    _write(tmp_path, [2, 3, 4, 5])
    removed, kept = checkpoint.prune(str(tmp_path), keep_last=2, owners={"me"})
    assert removed == ["ckpt-0000002", "ckpt-0000003"] and kept == []
    assert _names(tmp_path) == ["ckpt-0000001", "ckpt-0000004", "ckpt-0000005"]


def test_keep_every_keeps_the_first_checkpoint_at_or_after_each_milestone(tmp_path):
    _write(tmp_path, [3, 5, 6, 7, 11, 12])
    removed, _ = checkpoint.prune(str(tmp_path), keep_last=1, keep_every=5, owners={"me"})
    assert _names(tmp_path) == ["ckpt-0000005", "ckpt-0000011", "ckpt-0000012"], removed


def test_the_checkpoint_latest_names_is_never_removed(tmp_path):
    _write(tmp_path, [1, 2, 3])
    (tmp_path / "latest").write_text("ckpt-0000001\n")  # a user pointed it back
    removed, kept = checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})
    assert removed == ["ckpt-0000002"] and kept == ["ckpt-0000001: named by latest"]


def test_a_checkpoint_being_read_is_never_removed(tmp_path):
    _write(tmp_path, [1, 2])
    checkpoint.hold(tmp_path / "ckpt-0000001")  # what an export or a resume holds
    try:
        removed, kept = checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})
    finally:
        checkpoint.release(tmp_path / "ckpt-0000001")
    assert removed == [] and kept == ["ckpt-0000001: being read (a resume, export or eval holds it)"]
    assert checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})[0] == ["ckpt-0000001"]


def test_an_export_process_holds_its_checkpoint_against_removal(tmp_path):
    _write(tmp_path, [1, 2])
    code = ("import sys; from remote_payload.trainer import checkpoint; "
            f"checkpoint.resolve({str(tmp_path / 'ckpt-0000001')!r}, 'x'); "
            "print('held', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        assert checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})[0] == []
    finally:
        p.communicate("", timeout=60)
    assert checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})[0] == ["ckpt-0000001"]


def test_a_checkpoint_a_user_changed_is_never_removed(tmp_path):
    _write(tmp_path, [1, 2])
    (tmp_path / "ckpt-0000001" / "notes.txt").write_text("my notes")
    removed, kept = checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})
    assert removed == [] and "changed or added" in kept[0]
    assert (tmp_path / "ckpt-0000001" / "notes.txt").read_text() == "my notes"


def test_directories_and_links_opsctl_did_not_write_are_never_counted_or_removed(tmp_path):
    _write(tmp_path, [5, 6])
    (tmp_path / "ckpt-0000001").mkdir()
    (tmp_path / "ckpt-0000001" / "meta.json").write_text(json.dumps({"run_id": "me", "step": 1}))
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    _write(elsewhere, [2])
    (tmp_path / "ckpt-0000002").symlink_to(elsewhere / "ckpt-0000002")
    removed, kept = checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})
    assert removed == ["ckpt-0000005"] and kept == []
    assert _names(tmp_path) == ["ckpt-0000001", "ckpt-0000002", "ckpt-0000006"]
    assert _complete(elsewhere / "ckpt-0000002")


@pytest.mark.parametrize("swap", ["a link", "a directory", "a file added"])
def test_a_checkpoint_swapped_or_changed_during_its_removal_is_put_back_untouched(
        tmp_path, monkeypatch, swap):
    """The removal's checks pass, then (in the instant before its rename) the checkpoint is
    replaced by a user's link or directory, or gains a file: what was swapped in stays, at its
    name, whole."""
    import shutil

    out = tmp_path / "out"
    out.mkdir()
    _write(out, [1, 2])
    users = tmp_path / "users-dir"
    users.mkdir()
    (users / "data.txt").write_text("mine")
    victim = str(out / "ckpt-0000001")
    real = safe_write.mount_inside

    def racing(dest: str) -> t.Any:  # the last check before the rename
        if dest == victim and not os.path.lexists(users / "swapped"):
            (users / "swapped").touch()
            if swap == "a file added":
                (out / "ckpt-0000001" / "notes.txt").write_text("my notes")
            else:
                shutil.rmtree(dest)
                if swap == "a link":
                    os.symlink(users, dest)
                else:
                    os.mkdir(dest)
                    (out / "ckpt-0000001" / "data.txt").write_text("mine too")
        return real(dest)

    monkeypatch.setattr(safe_write, "mount_inside", racing)
    removed, kept = checkpoint.prune(str(out), keep_last=1, owners={"me"})
    assert removed == [] and "while it was being removed" in kept[0], kept
    assert sorted(p.name for p in out.iterdir()) == ["ckpt-0000001", "ckpt-0000002", "latest"]
    assert (users / "data.txt").read_text() == "mine"
    if swap == "a link":
        assert os.readlink(victim) == str(users)
    elif swap == "a directory":
        assert (out / "ckpt-0000001" / "data.txt").read_text() == "mine too"
    else:
        assert (out / "ckpt-0000001" / "notes.txt").read_text() == "my notes"
        assert _complete(out / "ckpt-0000001")


def test_a_damaged_latest_removes_nothing(tmp_path):
    _write(tmp_path, [1, 2, 3])
    (tmp_path / "latest").write_text("../elsewhere")
    removed, kept = checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})
    assert removed == [] and kept[0].startswith("latest:")
    assert _names(tmp_path) == ["ckpt-0000001", "ckpt-0000002", "ckpt-0000003"]


def test_a_reader_of_a_checkpoint_removed_meanwhile_gets_an_error_naming_it(tmp_path):
    _write(tmp_path, [1, 2])
    checkpoint.prune(str(tmp_path), keep_last=1, owners={"me"})
    with pytest.raises(checkpoint.CheckpointError, match="cannot be opened"):
        checkpoint.hold(tmp_path / "ckpt-0000001")


@settings(max_examples=200, deadline=None)
@given(steps=st.sets(st.integers(1, 400), max_size=30), keep_last=st.integers(0, 6),
       keep_every=st.integers(0, 120))
def test_the_policy_keeps_the_newest_and_one_per_milestone_and_nothing_else(steps, keep_last,
                                                                            keep_every):
    kept = checkpoint.kept_steps(steps, keep_last, keep_every)
    assert kept <= steps
    ordered = sorted(steps)
    newest = set(ordered[-keep_last:]) if keep_last else set(ordered)
    assert newest <= kept
    if keep_every:
        for m in {s // keep_every for s in steps if s >= keep_every}:
            assert min(s for s in steps if s // keep_every == m) in kept
    extra = kept - newest
    assert all(keep_every and s >= keep_every and s == min(x for x in steps if x // keep_every
                                                          == s // keep_every) for s in extra)


# --- staging -----------------------------------------------------------------------------


def test_the_host_buffers_are_allocated_once_and_reused(tmp_path):
    model, opt = _model()
    ck = saver.Checkpointer(str(tmp_path), model, opt, torch.device("cpu"), keep_last=1,
                            owners={"me"})
    loss = sum(p.sum() for p in model.parameters())
    loss.backward()
    opt.step()
    assert ck.step_end(1, True, lambda: {"run_id": "me"}) == []
    first = {k: v.data_ptr() for k, v in ck.staging.buffers.items()}
    assert first and ck.staging.bytes > 0
    ck.drain()
    opt.step()
    ck.step_end(2, True, lambda: {"run_id": "me"})
    events = ck.drain()
    assert [e[1]["step"] for e in events] == [2] and events[0][1]["removed"] == ["ckpt-0000001"]
    assert {k: v.data_ptr() for k, v in ck.staging.buffers.items()} == first
    ck.close()


# --- the benchmark -----------------------------------------------------------------------


def test_the_stall_benchmark_runs_every_mode_and_reports_blocked_time_tok_s_and_staging(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("checkpoint_stall",
                                                  REPO / "benchmarks" / "checkpoint_stall.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "stall.json"
    assert bench.main(["--preset", "tiny", "--device", "cpu", "--steps", "4", "--ckpt-every", "2",
                       "--warmup", "1", "--seq", "96", "--token-budget", "384",
                       "--ckpt-dir", str(tmp_path / "ck"), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "checkpoint_stall"
    res = doc["result"]
    for mode in ("none", "background", "sync"):
        assert res[mode]["tok_s"] > 0 and res[mode]["steps"] == 4, res[mode]
    for mode in ("background", "sync"):
        assert res[mode]["due"] == 2 and len(res[mode]["blocked_s"]) == 2, res[mode]
        assert res[mode]["blocked_max_s"] >= res[mode]["blocked_mean_s"] >= 0
    assert res["sync"]["checkpoints"] == 2, res["sync"]
    # a slow disk defers step 4's behind step 2's write, and the loop ends before it is taken
    assert 1 <= res["background"]["checkpoints"] <= 2, res["background"]
    assert res["background"]["staging_bytes"] > 0
    assert set(res["targets"]) == {"blocked_at_most_1s", "tok_s_within_2pct"}
    assert not any((tmp_path / "ck").glob("*/ckpt-*")), "the benchmark leaves no checkpoint"


def test_a_background_write_the_disk_refuses_ends_the_run_with_one_line_and_keeps_latest(
        capsys, tmp_path):
    # the first attempt leaves ckpt-0000002 and latest; the resumed one's first periodic
    # checkpoint (step 4) finds the writer free whatever the machine's load, so it is taken at
    # step 4 itself, never deferred past the file in its way
    assert _run(capsys, "--steps", "2", "--out-dir", str(tmp_path))[0] == 0
    (tmp_path / "ckpt-0000004").write_text("a file in the way")
    rc, ev = _run(capsys, "--steps", "8", "--ckpt-every", "2", "--resume", "auto",
                  "--out-dir", str(tmp_path))
    assert rc == 2, ev[-3:]
    err = ev[-1]
    assert err["event"] == "error" and "ckpt-0000004" in err["message"], err
    assert "\n" not in err["message"]
    assert (tmp_path / "latest").read_text() == "ckpt-0000002\n" and _complete(tmp_path / "ckpt-0000002")
    assert (tmp_path / "ckpt-0000004").read_text() == "a file in the way"


def test_a_run_that_resumes_nothing_stops_at_once_over_another_runs_checkpoints(capsys, tmp_path):
    """A fresh run into an --out-dir that holds another run's checkpoints would meet them step
    for step: it stops before its first step, in one line (exit 2) that says the three ways on,
    and touches nothing."""
    assert _run(capsys, "--steps", "4", "--ckpt-every", "2", "--run-id", "run-a",
                "--out-dir", str(tmp_path))[0] == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, ev = _run(capsys, "--steps", "4", "--ckpt-every", "2", "--run-id", "run-b",
                  "--out-dir", str(tmp_path))
    assert rc == 2, ev[-3:]
    err = ev[-1]
    assert err["event"] == "error" and "holds checkpoints of run 'run-a'" in err["message"], err
    for way in ("--resume auto", "another --out-dir", "--replace-checkpoints"):
        assert way in err["message"]
    assert "\n" not in err["message"] and not [e for e in ev if e["event"] == "step"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_replace_checkpoints_removes_only_other_runs_checkpoints_then_trains(capsys, tmp_path):
    assert _run(capsys, "--steps", "4", "--ckpt-every", "2", "--run-id", "run-a",
                "--out-dir", str(tmp_path))[0] == 0
    (tmp_path / "ckpt-0000009").mkdir()  # a user's directory named like one
    (tmp_path / "ckpt-0000009" / "notes.txt").write_text("mine\n")
    rc, ev = _run(capsys, "--steps", "4", "--ckpt-every", "2", "--run-id", "run-b",
                  "--replace-checkpoints", "--out-dir", str(tmp_path))
    assert rc == 0, ev[-3:]
    (warn,) = [e for e in ev if e["event"] == "warning" and e.get("source") == "checkpoint"]
    assert warn["removed"] == ["ckpt-0000002", "ckpt-0000004"], warn
    assert [(e, event_problem(e)) for e in ev if event_problem(e)] == []
    assert (tmp_path / "ckpt-0000009" / "notes.txt").read_text() == "mine\n"
    for step in (2, 4):
        meta = json.loads((tmp_path / f"ckpt-{step:07d}" / "meta.json").read_text())
        assert meta["run_id"] == "run-b"
    assert (tmp_path / "latest").read_text() == "ckpt-0000004\n"


def test_replace_checkpoints_leaves_one_being_read_and_does_not_start(capsys, tmp_path):
    assert _run(capsys, "--steps", "2", "--run-id", "run-a", "--out-dir", str(tmp_path))[0] == 0
    checkpoint.hold(tmp_path / "ckpt-0000002")  # what an export or a resume holds
    try:
        rc, ev = _run(capsys, "--steps", "2", "--run-id", "run-b", "--replace-checkpoints",
                      "--out-dir", str(tmp_path))
    finally:
        checkpoint.release(tmp_path / "ckpt-0000002")
    assert rc == 2 and "being read" in ev[-1]["message"], ev[-3:]
    assert _complete(tmp_path / "ckpt-0000002")


def test_two_trainers_committing_one_step_at_once_never_take_the_others_checkpoint(tmp_path):
    """Both started fresh before either wrote (the start check saw nothing): the second
    commit of a step refuses the first's directory rather than keep it as its own."""
    state = {"w": torch.zeros(2)}
    first = checkpoint.commit(str(tmp_path), 2, state, {}, {"run_id": "run-a", "lineage": ["run-a"]})
    with pytest.raises(safe_write.DestinationRefused) as exc:
        checkpoint.commit(str(tmp_path), 2, state, {}, {"run_id": "run-b", "lineage": ["run-b"]})
    assert "not this run's" in str(exc.value) and "run-a" in str(exc.value)
    assert json.loads((first / "meta.json").read_text())["run_id"] == "run-a"
    assert (tmp_path / "latest").read_text() == "ckpt-0000002\n"


def test_a_resumed_attempt_keeps_the_checkpoint_its_earlier_attempt_committed(capsys, tmp_path):
    assert _run(capsys, "--steps", "4", "--ckpt-every", "2", "--run-id", "run-a",
                "--out-dir", str(tmp_path))[0] == 0
    (tmp_path / "latest").write_text("ckpt-0000002\n")  # as a crash before latest moved leaves it
    rc, ev = _run(capsys, "--steps", "4", "--ckpt-every", "2", "--resume", "auto",
                  "--run-id", "run-b", "--out-dir", str(tmp_path))
    assert rc == 0, ev[-3:]
    assert (tmp_path / "latest").read_text() == "ckpt-0000004\n"


def test_the_optimizer_state_the_disk_refuses_is_the_oserror_it_is():
    """torch's zip writer says "unexpected pos ..." for a full disk, naming neither the disk
    nor the file; written through a Python file, it is the ENOSPC it met."""
    import errno

    with pytest.raises(OSError) as got:
        checkpoint.save_torch({"x": torch.zeros(1 << 16)}, pathlib.Path("/dev/full"))
    assert got.value.errno == errno.ENOSPC


def test_a_full_disk_during_a_background_write_is_one_line_and_leaves_latest_and_no_torn_dir(
        capsys, tmp_path, monkeypatch):
    """The first checkpoint fits on a small tmpfs; the second's weights fit and its optimizer
    state does not (written one after the other by the write pause): exit 2 in one line, the
    previous checkpoint and ``latest`` kept, no temporary directory left, and a resume loads
    the previous one."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", str(small)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        out = small / "run"
        monkeypatch.setenv(saver.ENV_WRITE_PAUSE, "4:0.01")
        _writer_done_before_each_step(monkeypatch)
        rc, ev = _run(capsys, "--steps", "8", "--ckpt-every", "2", "--out-dir", str(out))
        assert rc == 2, ev[-3:]
        err = ev[-1]
        assert err["event"] == "error" and err["type"] == "WriteFailed", err
        assert err["message"] == f"{out}/ckpt-0000004: cannot write: No space left on device"
        assert sorted(p.name for p in out.iterdir()) == ["ckpt-0000002", "latest"]
        assert (out / "latest").read_text() == "ckpt-0000002\n" and _complete(out / "ckpt-0000002")
        assert checkpoint.resolve("auto", str(out)) == out / "ckpt-0000002"
        checkpoint.release(out / "ckpt-0000002")
    finally:  # lazily: a failed writer's file may still be open until it is collected
        subprocess.run(["umount", "-l", str(small)], check=True)


def test_a_crash_while_a_checkpoint_is_written_still_commits_it_and_says_so(capsys, tmp_path,
                                                                          monkeypatch):
    """The run fails with a background write in flight: the write is committed and its
    ``checkpoint`` event comes before the error, so the record names what a restart resumes
    from (the ledger counts the steps after it as lost, not the ones before)."""
    monkeypatch.setenv(saver.ENV_WRITE_PAUSE, "2:1")
    with pytest.raises(RuntimeError):
        main([*FAST, "--steps", "10", "--ckpt-every", "2", "--debug-fault", "raise",
              "--debug-fault-step", "3", "--out-dir", str(tmp_path)])
    ev = _events(capsys.readouterr().out)
    kinds = [(e["event"], e.get("step")) for e in ev]
    assert ("checkpoint", 2) in kinds, kinds
    assert kinds.index(("checkpoint", 2)) < [k for k, _ in kinds].index("error"), kinds
    assert (tmp_path / "latest").read_text() == "ckpt-0000002\n" and _complete(tmp_path / "ckpt-0000002")


def test_replace_checkpoints_in_the_current_directory_removes_only_the_trainers_own(
        capsys, tmp_path, monkeypatch):
    """--out-dir . (the cwd, say a home): the user's files, folders and a folder named like a
    checkpoint stay, and so does the directory itself; only checkpoints a trainer wrote go."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(b"x")
    (tmp_path / "ckpt-0000006").mkdir()
    assert _run(capsys, "--steps", "2", "--run-id", "run-a", "--out-dir", ".")[0] == 0
    rc, ev = _run(capsys, "--steps", "1", "--run-id", "run-b", "--replace-checkpoints",
                  "--out-dir", ".")
    assert rc == 0, ev[-3:]
    (warn,) = [e for e in ev if e["event"] == "warning" and e.get("source") == "checkpoint"]
    assert warn["removed"] == ["ckpt-0000002"], warn
    assert (tmp_path / "notes.txt").read_text() == "mine\n" and (tmp_path / "data" / "x.bin").exists()
    assert (tmp_path / "ckpt-0000006").is_dir() and tmp_path.is_dir()
    assert (tmp_path / "latest").read_text() == "ckpt-0000001\n"
