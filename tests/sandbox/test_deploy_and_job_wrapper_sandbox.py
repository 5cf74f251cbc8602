"""Deploys and the job wrapper against hostile cases, through the real sandbox: loopback sshd
-> pct -> LXC -> agent -> tmux.

Each test states one rule: a refused or concurrent deploy removing a
live job's code, followers switching jobs, a regex wedging the wrapper, detached children
surviving ``stop``, terminal control sequences, a full disk, and Ctrl-C during
``deploy --replace``. Every test has its own opsctl root in the container.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.config import paths
from opsctl.ops import jobs, watch
from opsctl.remote import payload
from tests import waiting
from tests.cli_runner import run_cli as run
from tests.paths import REPO
from tests.sandbox_plugin import use_private_root

pytestmark = pytest.mark.sandbox
CT = "200"

# these waits are for whole jobs on a loaded machine: 30 s, polled every 0.3 s
wait_for = functools.partial(waiting.wait_for, timeout=30.0, what="condition", interval=0.3)


@pytest.fixture
def root(sandbox, isolated_env: Path):
    """The sandbox host with an opsctl root of its own in the container."""
    root = f"/tmp/opsctl-wrapper-{uuid.uuid4().hex[:8]}"
    use_private_root(sandbox, isolated_env, root)
    yield root
    for jid in cexec("sh", "-c", f"ls {root}/jobs 2>/dev/null || true").split():
        if jid != "current":
            run("stop", "--host", "sandbox", "--ct", CT, "--job", jid, "--grace", "1")
    cexec("sh", "-c", f"umount -l {root}/jobs 2>/dev/null; rm -rf {root}")


def cexec(*argv: str) -> str:
    return run("exec", "--host", "sandbox", "--ct", CT, "--", *argv).stdout


def book(tmp_path: Path, name: str, script: str, **extra: object) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps({"name": name, "command": ["python3", "-c", script], **extra}))
    return p


def deploy(tmp_path: Path, name: str, script: str, *flags: str, **extra: object) -> dict:
    res = run("deploy", "--host", "sandbox", "--ct", CT, "--playbook",
              str(book(tmp_path, name, script, **extra)), "--no-wait", "--json", *flags)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def status(job: str | None = None) -> dict:
    res = run("status", "--host", "sandbox", "--ct", CT, "--json", *(["--job", job] if job else []))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def ticker(tag: str) -> str:
    return f"import time\nwhile True:\n    print('{tag}', flush=True)\n    time.sleep(0.2)\n"


# --- 1. payloads --------------------------------------------------------------------------


def payload_copy(tmp_path: Path, marker: str) -> Path:
    src = tmp_path / marker / "remote_payload"
    shutil.copytree(paths.payload_source(), src,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (src / "variant.txt").write_text(marker)
    return src


def test_a_live_jobs_payload_is_never_removed_and_a_refused_deploy_ships_nothing(
        root, tmp_path, monkeypatch):
    first = deploy(tmp_path, "a", "import time\nprint('up', flush=True)\ntime.sleep(300)")
    job_a, digest_a = first["job_id"], first["payload"]["digest"][:16]
    pid = first["status"]["pid"]
    assert cexec("readlink", f"/proc/{pid}/cwd").strip() == f"{root}/payloads/{digest_a}"

    src = payload_copy(tmp_path, "edited")
    monkeypatch.setattr(paths, "payload_source", lambda: src)
    for _ in range(2):  # refused twice with an edited payload: still nothing touched
        res = CliRunner().invoke(cli, ["deploy", "--host", "sandbox", "--ct", CT, "--playbook",
                                       str(book(tmp_path, "b", "pass")), "--force-payload",
                                       "--no-wait"])
        assert res.exit_code == errors.REMOTE_FAILED, res.output
        assert f"job {job_a} is RUNNING; stop it or launch with --replace" in res.output
        assert cexec("readlink", f"{root}/payload").strip() == f"payloads/{digest_a}"
        assert cexec("ls", f"{root}/payloads").split() == [digest_a]

    # other payloads shipped while A runs (deploys of other jobs): A's code stays
    with jobs.open_target("sandbox", int(CT)) as tgt:
        assert tgt.agent.ensure_payload(force=True).sent
        (src / "variant.txt").write_text("third")
        third = tgt.agent.ensure_payload(force=True)
    installed = cexec("ls", f"{root}/payloads").split()
    assert digest_a in installed and third.digest[:16] in installed
    assert cexec("readlink", f"/proc/{pid}/cwd").strip() == f"{root}/payloads/{digest_a}"
    assert status(job_a)["state"] == "RUNNING"


def test_concurrent_payload_transfers_never_break_each_other(root, tmp_path):
    manifests = [payload.build_manifest(payload_copy(tmp_path, m)) for m in ("one", "two")]

    def ship(m: payload.Manifest) -> dict:
        with jobs.open_target("sandbox", int(CT)) as tgt:
            r = tgt.remote.pct_exec(tgt.ctid, ["python3", "-c", payload.UNPACK_SCRIPT, root],
                                    timeout=120, stdin=payload.tar_bytes(m), step="payload")
            return {"rc": r.rc, "out": r.stdout.decode(), "err": r.stderr.decode()}

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(ship, manifests * 3))
    for r in results:
        assert r["rc"] == 0 and json.loads(r["out"].splitlines()[-1])["ok"], r
    with jobs.open_target("sandbox", int(CT)) as tgt:  # the installed agent works
        assert tgt.agent.call("jobs", timeout=30)["jobs"] == []
        digest = tgt.agent.remote_digest()
    assert digest in {m.digest for m in manifests}


# --- 5. followers -------------------------------------------------------------------------


def test_followers_stay_bound_to_their_job_when_a_deploy_replaces_it(root, tmp_path):
    job_a = deploy(tmp_path, "a", ticker("A-LINE"))["job_id"]
    got: dict[str, object] = {}

    def follow_status() -> None:
        with jobs.open_target("sandbox", int(CT)) as tgt:
            got["status"] = watch.wait(tgt.agent, None, until="terminal", timeout_s=120,
                                       poll_s=0.3).status

    def follow_logs() -> None:
        buf: list[bytes] = []
        with jobs.open_target("sandbox", int(CT)) as tgt:
            got["chunk"] = jobs.follow_logs(tgt, None, buf.append, follow=True, poll_s=0.3)
        got["logs"] = b"".join(buf)

    threads = [threading.Thread(target=f) for f in (follow_status, follow_logs)]
    for th in threads:
        th.start()
    time.sleep(2.0)  # scenario: both followers are following job a when b replaces it
    job_b = deploy(tmp_path, "b", ticker("B-LINE"), "--replace")["job_id"]
    for th in threads:
        th.join(timeout=90)
    st = got["status"]
    assert (st["job_id"], st["state"]) == (job_a, "CANCELLED")  # type: ignore[index]
    assert any(f"replaced by job {job_b}" in e for e in st["evidence"])  # type: ignore[index]
    assert got["chunk"]["job_id"] == job_a  # type: ignore[index]
    assert b"A-LINE" in got["logs"] and b"B-LINE" not in got["logs"]  # type: ignore[operator]


# --- 7. regex -----------------------------------------------------------------------------


def test_a_catastrophic_healthy_when_regex_cannot_wedge_the_wrapper(root, tmp_path):
    # the playbook loader refuses this regex; a spec sent straight to the agent still must
    # not wedge the wrapper (the matcher is bounded in time, not only checked at load)
    job_id = f"regex-{uuid.uuid4().hex[:6]}"
    script = ("import time\nfor i in range(20):\n    print('a' * 60 + 'b', flush=True)\n"
              "print('still pumping', flush=True)\ntime.sleep(300)\n")
    spec = {"job_id": job_id, "name": "regex", "command": ["python3", "-c", script],
            "healthy_when": {"regex": "(a+)+$"}}
    with jobs.open_target("sandbox", int(CT)) as tgt:
        tgt.agent.ensure_payload()
        tgt.agent.call("launch", "--spec-json", json.dumps(spec), timeout=60)
    st = wait_for(lambda: (s := status(job_id)) and "still pumping" in s["output_tail"] and s,
                  timeout=30, what="the wrapper to pump past the runaway regex")
    assert any("healthy_when regex switched off" in e for e in st["evidence"]), st["evidence"]
    start = time.monotonic()
    res = run("stop", "--host", "sandbox", "--ct", CT, "--job", job_id, "--grace", "5", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["state"] == "CANCELLED"
    assert time.monotonic() - start < 15
    final = status(job_id)
    assert final["exit_code"] is not None or final["signal"], final  # the wrapper recorded the exit


# --- 8. detached children -----------------------------------------------------------------

DETACHER = textwrap.dedent("""
    import os, subprocess, time
    subprocess.Popen(["setsid", "sleep", "1000"])
    # no marker in its environment either: only the job's cgroup still holds it
    subprocess.Popen(["env", "-i", "setsid", "sleep", "SCRUBBED"])
    if os.fork() == 0:  # double fork into a new session
        os.setsid()
        if os.fork() == 0:
            time.sleep(1000)
        os._exit(0)
    print("spawned", flush=True)
    time.sleep(EXIT_AFTER)
""")


def marked(job_id: str) -> list[str]:
    out = cexec("sh", "-c", f"grep -l 'OPSCTL_JOB_ID={job_id}' /proc/[0-9]*/environ "
                            "2>/dev/null || true")
    return [ln.split("/")[2] for ln in out.split()]


def scrubbed(seconds: str) -> str:
    return cexec("sh", "-c", f"pgrep -f '^sleep {seconds}$' || true").strip()


def detacher(exit_after: int) -> tuple[str, str]:
    seconds = f"1{uuid.uuid4().int % 10**6:06d}"
    return DETACHER.replace("EXIT_AFTER", str(exit_after)).replace("SCRUBBED", seconds), seconds


def test_stop_ends_detached_children_too(root, tmp_path):
    script, seconds = detacher(1000)
    job_id = deploy(tmp_path, "detach", script)["job_id"]
    wait_for(lambda: "spawned" in status(job_id)["output_tail"], what="the children")
    assert len(wait_for(lambda: len(marked(job_id)) >= 3 and marked(job_id))) >= 3
    assert wait_for(lambda: scrubbed(seconds), what="the scrubbed child")
    res = run("stop", "--host", "sandbox", "--ct", CT, "--job", job_id, "--grace", "2", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["state"], doc["remaining_pids"]) == ("CANCELLED", [])
    assert marked(job_id) == [] and scrubbed(seconds) == ""


LEAVER = textwrap.dedent("""
    import os, subprocess, time
    # a child that leaves the job's cgroup (for a cgroup of its own beside the job's) and its
    # session: its OPSCTL_JOB_ID marker still says whose it is
    mount = next(ln.split(" - ")[0].split()[4] for ln in open("/proc/self/mountinfo")
                 if ln.split(" - ")[1].split()[0] == "cgroup2")
    away = os.path.join(mount, "opsctl-jobs", "away-SECONDS")
    os.makedirs(away, exist_ok=True)
    child = subprocess.Popen(["setsid", "sleep", "SECONDS"])
    # and an orphan that also scrubbed its environment: no marker, no cgroup, no session
    orphan = int(subprocess.run(["sh", "-c", "env -i setsid sleep 2SECONDS >/dev/null 2>&1 & "
                                 "echo $!"], capture_output=True, text=True).stdout)
    for pid in (child.pid, orphan):
        with open(os.path.join(away, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    print("spawned", open(f"/proc/{orphan}/cgroup").read().split(), flush=True)
    time.sleep(1000)
""")


def test_stop_ends_children_that_left_the_jobs_cgroup_and_never_says_cancelled_while_one_lives(
        root, tmp_path):
    seconds = f"1{uuid.uuid4().int % 10**6:06d}"
    job_id = deploy(tmp_path, "leaver", LEAVER.replace("SECONDS", seconds))["job_id"]
    st = wait_for(lambda: (s := status(job_id)) and "spawned" in "".join(s["output_tail"]) and s,
                  what="the child")
    assert f"away-{seconds}" in "".join(st["output_tail"]), st["output_tail"]  # it left
    assert wait_for(lambda: scrubbed(seconds) and scrubbed("2" + seconds), what="the children")
    res = run("stop", "--host", "sandbox", "--ct", CT, "--job", job_id, "--grace", "2", "--json")
    doc = json.loads(res.stdout)
    left = scrubbed(seconds) + scrubbed("2" + seconds)
    assert not (doc["state"] == "CANCELLED" and left and not doc["remaining_pids"]), (doc, left)
    assert (res.exit_code, doc["state"], doc["remaining_pids"], left) == (0, "CANCELLED", [], "")
    cexec("sh", "-c", f"rmdir /sys/fs/cgroup/opsctl-jobs/away-{seconds} "
                      f"/sys/fs/cgroup/unified/opsctl-jobs/away-{seconds} 2>/dev/null; true")


def test_a_job_that_exits_leaves_no_detached_children_behind(root, tmp_path):
    script, seconds = detacher(1)
    job_id = deploy(tmp_path, "detach", script)["job_id"]
    st = wait_for(lambda: (s := status(job_id))["state"] == "SUCCEEDED" and s, what="the exit")
    assert any("leftover" in e for e in st["evidence"]), st["evidence"]
    assert marked(job_id) == [] and scrubbed(seconds) == ""


def test_a_job_whose_tmux_pane_goes_away_leaves_no_detached_children_behind(root, tmp_path):
    script, seconds = detacher(1000)
    job_id = deploy(tmp_path, "detach", script)["job_id"]
    wait_for(lambda: scrubbed(seconds) and len(marked(job_id)) >= 3, what="the children")
    with jobs.open_target("sandbox", int(CT)) as tgt:
        tmux = tgt.agent.call("status", "--job", job_id, timeout=30)["tmux"]
    cexec("tmux", "-L", tmux["socket"], "kill-session", "-t", tmux["session"])
    wait_for(lambda: status(job_id)["state"] == "LOST", what="LOST")
    assert wait_for(lambda: marked(job_id) == [] and scrubbed(seconds) == "", timeout=15,
                    what="the detached children to be ended")


# --- 9. terminal control sequences -------------------------------------------------------

EVIL = "\\x1b]0;pwned\\x07\\x1b[3J\\x1b]52;c;ZXZpbA==\\x07[bold red]markup[/]"


def test_a_jobs_control_sequences_never_reach_the_terminal_but_logs_stay_byte_exact(
        root, tmp_path):
    script = (f"import json, time\nprint('{EVIL}', flush=True)\n"
              f"print(json.dumps({{'event': 'phase', 'phase': '{EVIL}'}}), flush=True)\n"
              "time.sleep(300)\n")
    res = run("deploy", "--host", "sandbox", "--ct", CT, "--playbook",
              str(book(tmp_path, "evil", script)), "--replace")
    assert res.exit_code == 0, res.output
    st = wait_for(lambda: (s := run("status")) and "52;c;" in s.output and s, what="the output")
    for out in (res.output, st.output):
        assert "\x1b" not in out and "\x07" not in out, repr(out)
    assert "\\x1b]52;c;ZXZpbA==" in st.output and "[bold red]markup[/]" in st.output
    raw = CliRunner().invoke(cli, ["logs"], catch_exceptions=False).stdout_bytes
    assert b"\x1b]52;c;ZXZpbA==\x07" in raw  # logs is the raw output, on purpose


# --- 10. a full disk ----------------------------------------------------------------------

FILLER = textwrap.dedent("""
    import time
    i = 0
    while True:
        i += 1
        print(f"line {i} " + "x" * 4000, flush=True)
        open("/tmp/HEARTBEAT", "w").write(str(i))
        time.sleep(0.002 if i < 600 else 0.2)
""")


def test_a_full_disk_in_the_job_dir_kills_neither_the_job_nor_the_agent(root, tmp_path):
    heartbeat = f"/tmp/heartbeat-{uuid.uuid4().hex[:6]}"
    cexec("sh", "-c", f"mkdir -p {root}/jobs && mount -t tmpfs -o size=1m tmpfs {root}/jobs")
    job_id = deploy(tmp_path, "filler", FILLER.replace("/tmp/HEARTBEAT", heartbeat))["job_id"]
    st = wait_for(lambda: (s := status(job_id)) and any("disk full" in e for e in s["evidence"])
                  and s, timeout=60, what="the disk to fill")
    assert st["state"] == "RUNNING" and st["alive"], st
    def beat() -> int:  # the job rewrites the file: it may be caught empty
        text = cexec("cat", heartbeat).strip()
        return int(text) if text.isdigit() else 0

    first = wait_for(beat, what="a heartbeat")
    wait_for(lambda: beat() > first + 3, what="the job to keep running")
    logs = CliRunner().invoke(cli, ["logs", "--job", job_id], catch_exceptions=False)
    assert logs.exit_code == 0 and b"line 1 " in logs.stdout_bytes
    res = run("stop", "--host", "sandbox", "--ct", CT, "--job", job_id, "--grace", "2", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["state"] == "CANCELLED"  # the exit was recorded

    cexec("sh", "-c", f"cat /dev/zero > {root}/jobs/fill 2>/dev/null; true")
    res = CliRunner().invoke(cli, ["deploy", "--host", "sandbox", "--ct", CT, "--playbook",
                                   str(book(tmp_path, "next", "pass")), "--no-wait"])
    assert res.exit_code == errors.REMOTE_FAILED, res.output
    assert "disk full in the container" in res.output and "Traceback" not in res.output
    assert status(job_id)["state"] == "CANCELLED"
    cexec("rm", "-f", heartbeat)


# --- 11. Ctrl-C on deploy --replace -----------------------------------------------------------

STUBBORN = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(300)\n"


def test_ctrl_c_on_deploy_replace_never_launches_the_new_job_later(root, tmp_path, isolated_env):
    job_a = deploy(tmp_path, "a", STUBBORN)["job_id"]  # ignores SIGINT: the stop takes 30 s
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "opsctl", "deploy", "--host", "sandbox", "--ct", CT, "--playbook",
         str(book(tmp_path, "b", "import time\ntime.sleep(300)")), "--replace", "--no-wait"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: cexec("sh", "-c", f"test -e {root}/jobs/{job_a}/cancel_requested && echo y"),
             what="the replace to begin stopping the old job")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    text = err.decode()
    assert proc.returncode == errors.INTERRUPTED, text
    assert "was not launched and will not be" in text, text
    assert f"job {job_a} had already been sent the stop signal" in text, text
    # the launch in the container finishes its stop and then refuses. The stubborn job would
    # hold that stop for its 30 s grace: end it now, as the SIGTERM would ([.]: the pattern
    # never matches the exec guard's own command line). Then wait for that launch process to
    # end (not a fixed time), and nothing may have been made.
    cexec("pkill", "-KILL", "-f", "signal[.]SIG_IGN")
    launch = f"remote_payload[.]agent --root {root} launch"  # [.]: never matches this shell
    wait_for(lambda: cexec("sh", "-c", f"pgrep -f '{launch}' || echo gone").strip() == "gone",
             timeout=60, what="the interrupted launch to end in the container")
    # job dirs only: not the "current" link, nor the container's GPU count (gpu-slots.json)
    names = [n for n in cexec("ls", f"{root}/jobs").split()
             if not n.startswith(".") and n != "gpu-slots.json"]
    assert names == [job_a] or sorted(names) == sorted([job_a, "current"]), names
    assert status()["job_id"] == job_a


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_mid_launch_says_the_job_was_not_launched_and_what_was_stopped(
        root, tmp_path, isolated_env, signame):
    job_a = deploy(tmp_path, "a", STUBBORN)["job_id"]  # ignores SIGINT: the stop takes 30 s
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "opsctl", "deploy", "--host", "sandbox", "--ct", CT, "--playbook",
         str(book(tmp_path, "b", "import time\ntime.sleep(300)")), "--replace", "--no-wait"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: cexec("sh", "-c", f"test -e {root}/jobs/{job_a}/cancel_requested && echo y"),
             what="the replace to begin stopping the old job")
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=60)
    text = err.decode()
    assert proc.returncode == {"SIGTERM": errors.TERMINATED, "SIGHUP": errors.HANGUP}[signame], text
    assert f"deploy terminated by {signame} during launch" in text, text
    assert "was not launched and will not be" in text, text
    assert f"job {job_a} had already been sent the stop signal" in text, text
    assert "Traceback" not in text
    cexec("pkill", "-KILL", "-f", "signal[.]SIG_IGN")  # see the Ctrl-C test above
    launch = f"remote_payload[.]agent --root {root} launch"
    wait_for(lambda: cexec("sh", "-c", f"pgrep -f '{launch}' || echo gone").strip() == "gone",
             timeout=60, what="the interrupted launch to end in the container")
    names = [n for n in cexec("ls", f"{root}/jobs").split()
             if not n.startswith(".") and n != "gpu-slots.json"]
    assert sorted(set(names) - {"current"}) == [job_a], names


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_once_the_job_is_launched_names_it_and_the_exact_stop_command(
        root, tmp_path, isolated_env, signame):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    never = {"event": "never-sent"}  # the deploy waits for health until the signal
    proc = subprocess.Popen(
        [sys.executable, "-m", "opsctl", "deploy", "--host", "sandbox", "--ct", CT, "--playbook",
         str(book(tmp_path, "sig", "import time\ntime.sleep(300)", healthy_when=never))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def launched() -> str | None:
        names = cexec("sh", "-c", f"ls {root}/jobs 2>/dev/null || true").split()
        return next((n for n in names if n.startswith("sig-")), None)

    job = wait_for(launched, timeout=60, what="the job dir in the container")
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=60)
    text = " ".join(err.decode().split())  # the console wraps long lines
    assert proc.returncode == {"SIGTERM": errors.TERMINATED, "SIGHUP": errors.HANGUP}[signame], text
    assert f"terminated by {signame}" in text and "Traceback" not in text, text
    command = f"opsctl stop --host sandbox --ct {CT} --job {job}"
    assert job in text and command in text, text
    assert not watch.is_terminal(status(job))  # it keeps running: the message is the way out
    res = run(*command.split()[1:], "--grace", "1")  # the printed command, as printed
    assert res.exit_code == 0, res.output
    assert status(job)["state"] == "CANCELLED"


def test_stop_on_a_terminal_of_a_running_job_whose_status_is_cut_short_still_ends_it(
        root, tmp_path, monkeypatch):
    for where in ("opsctl.cli.jobs.interactive", "opsctl.cli.app.interactive"):
        monkeypatch.setattr(where, lambda: True)  # a person answers "y"
    first = deploy(tmp_path, "cut", "import time\ntime.sleep(300)")  # quiet: no rewrite
    job_id, pid = first["job_id"], first["status"]["pid"]
    cexec("truncate", "-s", "17", f"{root}/jobs/{job_id}/status.json")
    res = run("stop", "--host", "sandbox", "--ct", CT, "--job", job_id, "--grace", "1",
              input="y\n")
    assert f"stop job {job_id} (its record is damaged" in res.output, res.output
    assert res.exit_code in (0, errors.REMOTE_FAILED), res.output  # CANCELLED, or said so
    assert res.exit_code == 0 or "none is left" in res.output, res.output
    assert cexec("sh", "-c", f"test -e /proc/{pid} && echo alive || echo gone").strip() == "gone"


# --- 12. the deploy verdict ---------------------------------------------------------------


def test_deploy_of_a_job_that_finishes_before_the_first_poll_says_it_finished(root, tmp_path):
    res = run("deploy", "--host", "sandbox", "--ct", CT, "--playbook",
              str(book(tmp_path, "quick", "print('done')")), "--poll", "1")
    assert res.exit_code == 0, res.output
    assert "finished SUCCEEDED (exit code 0)" in res.output, res.output
    assert "training is running" not in res.output
