"""Torch build swaps in the container, run through the real agent verbs against a tmp root.

Fake ``torch`` wheels come from a PEP 503 index served on 127.0.0.1 by the test; every
install is a real venv + isolated pip + verification. One module-wide root is shared
(installs cost seconds), so the tests run in file order and each leaves cu128 current.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import typing as t
from pathlib import Path

import pytest

from remote_payload.agent.torchenv import caches, current_python, job_env
from remote_payload.agent.torchenv.layout import Layout
from tests.agent_helper import run_agent
from tests.waiting import wait_for
from tests.wheel_index import (
    build_fake_torches,
    build_wheel,
    closed_port_url,
    serve_index,
    write_simple_index,
)


def agent(root: Path, *args: str) -> tuple[dict[str, t.Any], float]:
    """Run one agent verb like the transport does; returns (reply, wall seconds)."""
    # generous: a real install or a cold+seeded compile shares 2 cores with the other xdist
    # workers (measured 100 s of a 300 s limit under load); a hang still fails, just later
    run = run_agent(root, *args, timeout=600)
    return run.reply, run.wall_s


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> t.Iterator[str]:
    base = tmp_path_factory.mktemp("index")
    wheels = build_fake_torches(str(base / "wheels"))
    wheels.append(build_wheel(str(base / "wheels"), "opsctl_fake_extra", "1.0",
                              {"opsctl_fake_extra.py": "OK = True\n"}, requires=["torch"]))
    write_simple_index(str(base / "index"), wheels)
    with serve_index(str(base / "index")) as url:
        yield url


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, index_url: str) -> Path:
    """A root with torch 2.11.0+cu128 installed and current."""
    r = tmp_path_factory.mktemp("opsctl-root")
    reply, _ = agent(r, "swap", "--variant", "cu128", "--version", "2.11.0",
                     "--index-url", index_url, "--pip-retries", "0")
    assert reply["ok"], reply
    return r


def swap(root: Path, variant: str, index_url: str, *extra: str) -> tuple[dict[str, t.Any], float]:
    return agent(root, "swap", "--variant", variant, "--version", "2.11.0", "--index-url",
                 index_url, "--pip-retries", "0", *extra)


def leftovers(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root / "envs") if n.startswith((".building", ".trash")))


def test_no_build_means_no_python_and_no_job_env(tmp_path: Path) -> None:
    assert current_python(str(tmp_path)) is None
    assert job_env(str(tmp_path)) == {}
    reply, _ = agent(tmp_path, "envs")
    assert reply["data"]["current"] is None and reply["data"]["builds"] == []


def test_install_verifies_the_new_build_before_making_it_current(root: Path) -> None:
    reply, _ = agent(root, "envs")
    data = reply["data"]
    assert data["current"] == "torch-2.11.0-cu128"
    assert [b["name"] for b in data["builds"]] == ["torch-2.11.0-cu128"]
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"
    assert current_python(str(root)) == str(root / "envs" / "torch-2.11.0-cu128" / "bin" / "python")
    first = data["history"][0]
    assert (first["to"], first["action"], first["result"]) == ("torch-2.11.0-cu128", "install", "ok")
    marker = json.loads((root / "envs" / "torch-2.11.0-cu128" / ".opsctl-build.json").read_text())
    checks = {c["name"]: c for c in marker["verification"]["checks"]}
    assert checks["version"]["ok"] and checks["cuda-version"]["ok"]
    # the compile check is skipped only because the wheel says it is a fake
    assert checks["compile"]["skipped"] and "fake test wheel" in checks["compile"]["detail"]
    assert leftovers(root) == []


def test_installed_venv_has_no_trace_of_its_temp_build_name(root: Path) -> None:
    pip_script = (root / "envs" / "torch-2.11.0-cu128" / "bin" / "pip").read_text()
    assert ".building-" not in pip_script
    proc = subprocess.run([str(root / "envs" / "torch-2.11.0-cu128" / "bin" / "pip"), "--version"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_dry_run_changes_nothing(root: Path, index_url: str) -> None:
    reply, _ = swap(root, "cu130", index_url, "--dry-run")
    assert reply["data"]["action"] == "install" and reply["data"]["dry_run"] is True
    assert not (root / "envs" / "torch-2.11.0-cu130").exists()
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"


def test_swap_to_new_build_then_back_is_only_a_symlink_switch(root: Path, index_url: str) -> None:
    reply, _ = swap(root, "cu130", index_url)
    assert reply["ok"], reply
    assert (reply["data"]["action"], reply["data"]["previous"]) == ("install", "torch-2.11.0-cu128")
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu130"

    back, wall = swap(root, "cu128", index_url)
    assert back["data"]["action"] == "switch" and back["data"]["log_path"] is None
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"
    print(f"\nswitch back: {wall:.3f}s wall (agent process), "
          f"{back['data']['switch_seconds'] * 1000:.2f} ms rename")
    assert wall < 2.0, f"switching to an installed build took {wall:.2f}s (target <= 2 s)"

    again, _ = swap(root, "cu128", index_url)
    assert again["data"]["action"] == "noop"
    history = agent(root, "envs")[0]["data"]["history"]
    assert [(h["from"], h["to"], h["action"]) for h in history[-2:]] == [
        ("torch-2.11.0-cu128", "torch-2.11.0-cu130", "install"),
        ("torch-2.11.0-cu130", "torch-2.11.0-cu128", "switch")]


def test_failed_verification_keeps_current_and_removes_half_made_venv(root: Path,
                                                                     index_url: str) -> None:
    reply, _ = swap(root, "cu126", index_url)  # the fake cu126 wheel says cuda 12.4
    assert not reply["ok"]
    err = reply["error"]
    assert err["type"] == "TorchInstallFailed"
    assert (err["fields"]["step"], err["fields"]["reason"]) == ("verify", "verify-failed")
    assert "torch.version.cuda = '12.4', expected '12.6'" in err["message"]
    assert err["fields"]["current"] == "torch-2.11.0-cu128"
    log = Path(err["fields"]["log_path"])
    assert log.is_file() and "OPSCTL_INSPECT" in log.read_text()
    assert str(log) in err["message"]
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"
    assert not (root / "envs" / "torch-2.11.0-cu126").exists()
    assert leftovers(root) == []
    last = agent(root, "envs")[0]["data"]["history"][-1]
    assert (last["to"], last["result"], last["step"]) == ("torch-2.11.0-cu126", "failed", "verify")


def test_unreachable_index_is_a_clear_error_and_keeps_current(root: Path) -> None:
    url = closed_port_url()
    reply, _ = swap(root, "cu126", url)
    err = reply["error"]
    assert (err["fields"]["step"], err["fields"]["reason"]) == ("index", "index-unreachable")
    assert "Connection refused" in err["message"] and url in err["message"]
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"
    assert leftovers(root) == []


def test_missing_version_says_what_the_index_has(root: Path, index_url: str) -> None:
    reply, _ = agent(root, "swap", "--variant", "cu128", "--version", "2.99.0", "--index-url",
                     index_url, "--pip-retries", "0")
    err = reply["error"]
    assert (err["fields"]["step"], err["fields"]["reason"]) == ("index", "no-such-version")
    assert "torch 2.99.0+cu128 is not on" in err["message"]
    assert "(it has: 2.11.0+cu128)" in err["message"]  # same variant's versions
    assert not (root / "envs" / "torch-2.99.0-cu128").exists()


def test_bad_pin_is_refused_before_anything_is_done(root: Path, index_url: str) -> None:
    reply, _ = agent(root, "swap", "--variant", "rocm6", "--version", "2.11.0",
                     "--index-url", index_url)
    assert (reply["error"]["type"], reply["error"]["fields"]["step"]) == ("TorchInstallFailed",
                                                                         "args")


def launch(root: Path, job_id: str, command: list[str]) -> None:
    """A real job through the agent's own launch verb (real tmux, real wrapper)."""
    spec = {"job_id": job_id, "name": "test-job", "command": command, "env": {},
            "workdir": str(root), "healthy_when": {"started": True}, "timeout_s": 60}
    reply, _ = agent(root, "launch", "--spec-json", json.dumps(spec), "--replace")
    assert reply["ok"], reply


@pytest.fixture
def tmux_socket(monkeypatch: pytest.MonkeyPatch) -> t.Iterator[str]:
    sock = f"opsctl-torchswap-{os.getpid()}"
    monkeypatch.setenv("OPSCTL_TMUX_SOCKET", sock)
    yield sock
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, check=False)


@pytest.fixture
def running_job(root: Path, tmux_socket: str) -> t.Iterator[str]:
    job_id = f"test-job-20261129-{time.time_ns() % 1_000_000:06d}-abcd"
    launch(root, job_id, ["sleep", "60"])
    yield job_id
    agent(root, "stop", "--job", job_id, "--grace", "1")


def test_swap_and_cache_clear_refuse_while_a_job_runs(root: Path, index_url: str,
                                                     running_job: str) -> None:
    reply, _ = swap(root, "cu130", index_url)
    assert reply["error"]["type"] == "JobRunning"
    assert reply["error"]["fields"]["job_id"] == running_job
    assert running_job in reply["error"]["message"]
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"
    reply, _ = agent(root, "cache-clear", "--all")
    assert reply["error"]["type"] == "JobRunning"


def test_install_only_is_allowed_while_a_job_runs_and_does_not_switch(root: Path, index_url: str,
                                                                      running_job: str) -> None:
    reply, _ = swap(root, "cu130", index_url, "--install-only")
    assert reply["ok"], reply
    assert reply["data"]["action"] in ("install-only", "present")
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"


def test_finished_job_does_not_block_a_swap(root: Path, index_url: str, tmux_socket: str) -> None:
    launch(root, "done-job-20261129-000000-abcd", ["true"])
    wait_for(lambda: agent(root, "status")[0]["data"]["state"] == "SUCCEEDED", 10)
    reply, _ = swap(root, "cu128", index_url)
    assert reply["data"]["action"] == "noop"


def test_every_build_gets_its_own_cache_dir_and_provenance(root: Path, index_url: str) -> None:
    env128 = job_env(str(root))
    assert env128["OPSCTL_TORCH_BUILD"] == "torch-2.11.0-cu128"
    fp128 = env128["OPSCTL_CACHE_FINGERPRINT"]
    assert fp128.startswith("torch2.11.0+cu128-cuda12.8-tritonnone-")
    assert env128["TORCHINDUCTOR_CACHE_DIR"] == str(root / "cache" / fp128 / "inductor")
    assert env128["TRITON_CACHE_DIR"] == str(root / "cache" / fp128 / "triton")
    assert env128["OPSCTL_CACHE_ARTIFACTS"] == str(root / "cache" / fp128 / "mega-cache.bin")
    assert os.path.isdir(env128["TORCHINDUCTOR_CACHE_DIR"])
    prov = json.loads((root / "cache" / fp128 / "provenance.json").read_text())
    assert prov["build"] == "torch-2.11.0-cu128" and prov["facts"]["torch"] == "2.11.0+cu128"

    assert swap(root, "cu130", index_url)[0]["data"]["action"] == "switch"
    try:
        env130 = job_env(str(root))
    finally:
        swap(root, "cu128", index_url)
    assert env130["OPSCTL_CACHE_FINGERPRINT"] != fp128
    assert env130["TORCHINDUCTOR_CACHE_DIR"] != env128["TORCHINDUCTOR_CACHE_DIR"]


def test_fingerprint_is_cached_next_to_the_venv(root: Path) -> None:
    job_env(str(root))
    t0 = time.monotonic()
    for _ in range(10):
        job_env(str(root))
    per_call = (time.monotonic() - t0) / 10
    assert per_call < 0.05, f"job_env took {per_call:.3f}s: the fingerprint was not cached"


def test_cache_info_reports_current_stale_and_outside_caches(root: Path, tmp_path: Path) -> None:
    fp = job_env(str(root))["OPSCTL_CACHE_FINGERPRINT"]
    (root / "cache" / fp / "inductor" / "x.bin").write_bytes(b"x" * 1000)
    outside = tmp_path / "torchinductor_someone"
    (outside / "fxgraph").mkdir(parents=True)
    (outside / "fxgraph" / "entry").write_bytes(b"y" * 10)
    info = caches.cache_info(Layout(str(root)), outside=[(str(outside), "inductor default")])
    by_fp = {c["fingerprint"]: c for c in info["caches"]}
    assert info["current_fingerprint"] == fp and by_fp[fp]["status"] == "current"
    assert by_fp[fp]["size_bytes"] >= 1000 and by_fp[fp]["last_used_at"] is not None
    assert by_fp[fp]["created_at"] is not None
    stale = [c for c in info["caches"] if c["fingerprint"] != fp]
    assert stale and all(c["status"] == "stale" for c in stale)  # cu130's, from the test above
    assert info["outside"][0]["path"] == str(outside) and info["outside"][0]["files"] == 1
    assert str(outside) in info["warnings"][0]
    reply, _ = agent(root, "cache-info")
    assert {c["fingerprint"] for c in reply["data"]["caches"]} == set(by_fp)


def test_cache_clear_removes_current_then_all(root: Path) -> None:
    fp = job_env(str(root))["OPSCTL_CACHE_FINGERPRINT"]
    before = {c["fingerprint"] for c in agent(root, "cache-info")[0]["data"]["caches"]}
    assert len(before) >= 2
    reply, _ = agent(root, "cache-clear")
    assert [r["fingerprint"] for r in reply["data"]["removed"]] == [fp]
    after = {c["fingerprint"] for c in agent(root, "cache-info")[0]["data"]["caches"]}
    assert after == before - {fp}
    reply, _ = agent(root, "cache-clear", "--all")
    assert {r["fingerprint"] for r in reply["data"]["removed"]} == after
    assert agent(root, "cache-info")[0]["data"]["caches"] == []
    assert not [n for n in os.listdir(root / "cache") if n.startswith(".trash")]


FAKE_WARMUP = '''
import argparse, json, os, sys, time
with open(sys.argv[0] + ".cache-dirs", "a") as f:  # where each run was told to keep its caches
    f.write(json.dumps([os.environ.get(k) for k in ("OPSCTL_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")]) + "\\n")
p = argparse.ArgumentParser()
p.add_argument("--warmup-only", action="store_true")
p.add_argument("--save-cache-artifacts")
p.add_argument("--load-cache-artifacts")
p.add_argument("--hits", type=int, default=1)
a = p.parse_args()
assert a.warmup_only
if a.save_cache_artifacts:
    open(a.save_cache_artifacts, "wb").write(b"fake artifact")
    print(json.dumps({"event": "compile", "name": "step", "seconds": 2.5,
                      "cache": {"inductor.fxgraph_cache_miss": 1}}))
else:
    assert open(a.load_cache_artifacts, "rb").read() == b"fake artifact"
    print(json.dumps({"event": "compile", "name": "step", "seconds": 0.5,
                      "cache": {"inductor.fxgraph_cache_hit": a.hits}}))
print(json.dumps({"event": "done", "step": 0}))
'''


def test_cache_seed_installs_the_artifact_only_when_hits_prove_reuse(root: Path,
                                                                     tmp_path: Path) -> None:
    script = tmp_path / "warm.py"
    script.write_text(FAKE_WARMUP)
    reply, _ = agent(root, "cache-seed", "--command-json",
                     json.dumps(["python3", str(script), "--hits", "0"]))
    err = reply["error"]
    assert (err["type"], err["fields"]["step"]) == ("CacheSeedFailed", "prove-reuse")
    fp = job_env(str(root))["OPSCTL_CACHE_FINGERPRINT"]
    assert not (root / "cache" / fp / "mega-cache.bin").exists()

    reply, _ = agent(root, "cache-seed", "--command-json", json.dumps(["python3", str(script)]))
    data = reply["data"]
    assert data["fingerprint"] == fp and data["reuse_proven"] is True
    assert (data["cold"]["compile_seconds"], data["seeded"]["compile_seconds"]) == (2.5, 0.5)
    assert data["seeded"]["counters"] == {"inductor.fxgraph_cache_hit": 1}
    assert data["speedup"] == 5.0
    assert (root / "cache" / fp / "mega-cache.bin").read_bytes() == b"fake artifact"
    prov = json.loads((root / "cache" / fp / "provenance.json").read_text())
    assert prov["seed"]["seeded"]["hits"] == 1
    assert not [n for n in os.listdir(root / "cache") if n.startswith(".seed")]
    # both runs keep bytecode where jobs do (the build's folder), compile caches of their own
    runs = [json.loads(ln) for ln in (tmp_path / "warm.py.cache-dirs").read_text().splitlines()]
    assert [d for d, _ in runs[-2:]] == [str(root / "cache" / fp)] * 2
    assert all(ind.startswith(str(root / "cache" / ".seed-")) for _, ind in runs[-2:])


def test_reinstalling_the_current_build_keeps_it_current(root: Path, index_url: str) -> None:
    reply, _ = swap(root, "cu128", index_url, "--reinstall")
    assert (reply["data"]["action"], reply["data"]["previous"]) == ("install", "torch-2.11.0-cu128")
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"
    assert current_python(str(root)) is not None and leftovers(root) == []


def test_a_reinstall_killed_between_its_two_renames_gets_the_old_build_back(
        root: Path, index_url: str) -> None:
    # without renameat2 a reinstall moves the old build aside, then renames the new one in;
    # a kill between the two leaves only the old build at .trash-: the next swap restores it
    build = root / "envs" / "torch-2.11.0-cu128"
    os.rename(root / "envs" / "current", root / "envs" / "current.saved")
    aside = root / "envs" / ".trash-torch-2.11.0-cu128-99999"
    os.rename(build, aside)
    os.rename(root / "envs" / "current.saved", root / "envs" / "current")
    swap(root, "cu128", index_url)
    assert not aside.exists() and (build / "bin" / "python").exists()
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128" and leftovers(root) == []


def test_wheelhouse_without_the_pinned_wheel_fails_before_making_a_venv(root: Path,
                                                                        tmp_path: Path) -> None:
    build_fake_torches(str(tmp_path))  # cu126/cu128/cu130 fakes, no +cpu
    reply, _ = agent(root, "swap", "--variant", "cpu", "--version", "2.11.0",
                     "--wheelhouse", str(tmp_path))
    err = reply["error"]
    assert (err["fields"]["step"], err["fields"]["reason"]) == ("wheelhouse", "no-such-version")
    assert "found: 2.11.0+cu126, 2.11.0+cu128, 2.11.0+cu130" in err["message"]
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128" and leftovers(root) == []


def test_wheelhouse_install_of_a_fake_build(root: Path, tmp_path: Path, index_url: str) -> None:
    build_fake_torches(str(tmp_path))
    reply, _ = agent(root, "swap", "--variant", "cu130", "--version", "2.11.0", "--reinstall",
                     "--wheelhouse", str(tmp_path))
    assert reply["ok"], reply
    marker = json.loads((root / "envs" / "torch-2.11.0-cu130" / ".opsctl-build.json").read_text())
    assert (marker["pin"], marker["wheelhouse"], marker["index_url"]) == (
        "2.11.0+cu130", str(tmp_path), None)
    swap(root, "cu128", index_url)


def test_a_killed_install_leaves_nothing_behind_after_the_next_swap(root: Path,
                                                                    index_url: str) -> None:
    stale = root / "envs" / ".building-torch-2.11.0-cu130-99999"
    (stale / "bin").mkdir(parents=True)
    assert agent(root, "envs")[0]["data"]["in_progress_or_leftover"] == [stale.name]
    swap(root, "cu128", index_url)
    assert not stale.exists()


def test_extra_requirements_install_without_replacing_the_pinned_torch(root: Path,
                                                                      index_url: str) -> None:
    reply, _ = swap(root, "cu130", index_url, "--reinstall", "--requirement", "opsctl-fake-extra",
                    "--requirements-index-url", index_url)
    assert reply["ok"], reply
    python = root / "envs" / "torch-2.11.0-cu130" / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import opsctl_fake_extra, torch; "
                          "print(opsctl_fake_extra.OK, torch.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "2.11.0+cu130"]
    swap(root, "cu128", index_url)


def test_a_current_build_lacking_a_playbooks_requirement_is_built_again_with_it(
        root: Path, index_url: str) -> None:
    """A playbook's new requirements are never skipped because its torch build is current."""
    extra = ("--requirement", "opsctl-fake-extra", "--requirements-index-url", index_url)
    reply, _ = swap(root, "cu128", index_url, *extra)
    assert reply["ok"], reply
    assert reply["data"]["action"] == "install"
    assert reply["data"]["requirements_added"] == ["opsctl-fake-extra"]
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"
    python = root / "envs" / "torch-2.11.0-cu128" / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import opsctl_fake_extra, torch; "
                          "print(opsctl_fake_extra.OK, torch.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "2.11.0+cu128"]
    again, _ = swap(root, "cu128", index_url, *extra)  # it has them now: nothing to do
    assert again["data"]["action"] == "noop" and again["data"]["requirements_added"] == []


def test_install_only_never_rebuilds_the_current_build_under_a_live_job(
        root: Path, index_url: str, running_job: str) -> None:
    reply, _ = swap(root, "cu128", index_url, "--install-only", "--requirement",
                    "opsctl-fake-extra==1.0", "--requirements-index-url", index_url)
    assert reply["error"]["type"] == "JobRunning", reply
    assert "opsctl-fake-extra==1.0" in reply["error"]["message"]
    assert running_job in reply["error"]["message"]
    assert os.readlink(root / "envs" / "current") == "torch-2.11.0-cu128"
    assert leftovers(root) == []
