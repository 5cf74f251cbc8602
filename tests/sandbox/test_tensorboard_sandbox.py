"""``opsctl tensorboard`` through the real sandbox: the job's event files pulled, served on
127.0.0.1 by a real TensorBoard, fetched over HTTP, and nothing left after Ctrl-C, SIGTERM
or SIGHUP.

The job in container 200 does what ``--report-to tensorboard`` does (its event file is made
here with TensorBoard's own writer, through torch's ``SummaryWriter``, and its ``trackers``
event is the trainer's); the trainer's side is tested in
``tests/trainer/test_trackers_run.py``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.cli_runner import run_cli as run
from tests.paths import REPO
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox
pytest.importorskip("tensorboard")


def _event_file(tmp_path: Path) -> tuple[str, bytes]:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(tmp_path / "tb"))
    for step in (1, 2, 3):
        w.add_scalar("train/loss", 3.0 / step, step)
    w.close()
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    return path.name, path.read_bytes()


def _job(logdir: str | None, event_file: tuple[str, bytes] | None) -> str:
    """A job that writes the event file under ``logdir/run1`` and says so as the trainer does."""
    name, data = event_file or ("", b"")
    return textwrap.dedent(f"""
        import base64, json, os
        logdir, name = {logdir!r}, {name!r}
        if logdir:
            os.makedirs(os.path.join(logdir, "run1"), exist_ok=True)
            with open(os.path.join(logdir, "run1", name), "wb") as f:
                f.write(base64.b64decode({base64.b64encode(data).decode()!r}))
            print(json.dumps({{"event": "trackers", "report_to": ["tensorboard"], "run": "run1",
                               "tensorboard": logdir}}, separators=(",", ":")), flush=True)
        print(json.dumps({{"event": "step", "step": 3, "loss": 1.0}}), flush=True)
    """)


@pytest.fixture
def deploy(sandbox, isolated_env: Path, tmp_path: Path):
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")

    def go(script: str) -> str:
        book = tmp_path / f"tb-{uuid.uuid4().hex[:6]}.yaml"
        book.write_text(json.dumps({"name": "tbjob", "command": ["python3", "-c", script],
                                    "timeout_s": 60, "healthy_when": {"event": "step"}}))
        res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--json")
        assert res.exit_code == 0, res.output
        job_id = json.loads(res.stdout)["job_id"]
        res = run("status", "--host", "sandbox", "--ct", "200", "--job", job_id, "--follow", "--json")
        assert res.exit_code == 0 and json.loads(res.stdout)["state"] == "SUCCEEDED", res.output
        return job_id

    return go


def _tensorboards(home: Path) -> list[int]:
    """TensorBoard processes serving a copy under this test's opsctl home."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tensorboard.main" in cmd and any(str(home).encode() in a for a in cmd):
                out.append(int(d.name))
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_tensorboard_serves_the_jobs_curves_on_loopback_and_leaves_nothing_running(
        deploy, isolated_env, tmp_path, sig):
    logdir = f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard"
    job_id = deploy(_job(logdir, _event_file(tmp_path)))
    p = subprocess.Popen([sys.executable, "-m", "opsctl", "tensorboard", job_id, "--host", "sandbox",
                          "--ct", "200", "--port", "0", "--refresh", "2"],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        url = wait_for(lambda: next((m.group(0) for x in lines
                                     for m in [re.search(r"http://127\.0\.0\.1:\d+/", x)] if m), None),
                       120, what=f"the URL line (stderr so far: {lines})")
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200 and b"TensorBoard" in page.read()
        tags = wait_for(lambda: _get_json(url + "data/plugin/scalars/tags"), 30, what="the scalars")
        assert "train/loss" in tags["run1"], tags
        assert _tensorboards(isolated_env), "no TensorBoard process under the test's home"
        p.send_signal(sig)
        assert p.wait(30) == 0, lines
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    reader.join(5)
    assert "tensorboard stopped" in "".join(lines), lines
    assert wait_for(lambda: not _tensorboards(isolated_env), 10), _tensorboards(isolated_env)
    port = int(url.rsplit(":", 1)[1].strip("/"))
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
    assert port > 0
    copy = isolated_env / "tensorboard"
    assert list(copy.rglob("events.out.tfevents.*")), "the pulled copy is kept"


def _get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            doc = json.loads(r.read())
    except OSError:
        return None
    return doc if doc.get("run1") else None


def test_a_job_without_tensorboard_files_is_one_line_naming_report_to(deploy):
    job_id = deploy(_job(None, None))
    res = run("tensorboard", job_id, "--host", "sandbox", "--ct", "200", "--port", "0")
    assert res.exit_code == 2, res.output
    assert f"job {job_id} has no TensorBoard event files" in res.output
    assert "--report-to tensorboard" in res.output


def test_a_logdir_the_job_announced_but_never_wrote_is_named(deploy):
    said = {"event": "trackers", "report_to": ["tensorboard"], "run": "r",
            "tensorboard": "/var/tmp/opsctl-tb-never/tensorboard"}
    step = {"event": "step", "step": 1}
    job_id = deploy(f"print({json.dumps(json.dumps(said))}); print({json.dumps(json.dumps(step))})")
    res = run("tensorboard", job_id, "--host", "sandbox", "--ct", "200", "--port", "0")
    assert res.exit_code == 2, res.output
    assert "/var/tmp/opsctl-tb-never/tensorboard does not exist" in res.output, res.output


@pytest.mark.parametrize("job", ["no-such-job-0000", "tbjob"])
def test_a_job_that_does_not_exist_or_a_prefix_of_several_is_one_line_unknown_job(deploy, job):
    """``tbjob`` is the start of every job these tests deploy: ambiguous once two exist."""
    from opsctl import errors

    deploy(_job(None, None))
    deploy(_job(None, None))
    res = run("tensorboard", job, "--host", "sandbox", "--ct", "200", "--port", "0")
    assert res.exit_code == errors.UNKNOWN_JOB, res.output
    assert "Traceback" not in res.output and res.output.strip(), res.output


def test_a_taken_port_is_refused_before_connecting(isolated_env):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        res = run("tensorboard", "--host", "nowhere", "--ct", "200", "--port", str(s.getsockname()[1]))
    assert res.exit_code == 2 and "is in use" in res.output, res.output


def test_a_logdir_that_is_a_link_in_the_container_is_refused_and_nothing_is_pulled(deploy, isolated_env):
    base = f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}"
    said = {"event": "trackers", "report_to": ["tensorboard"], "run": "r",
            "tensorboard": f"{base}/tensorboard"}
    job_id = deploy(f"import os; os.makedirs({base!r}, exist_ok=True); "
                    f"os.symlink('/etc', {base + '/tensorboard'!r}); "
                    f"print({json.dumps(json.dumps(said))}); print('{{\"event\":\"step\",\"step\":1}}')")
    res = run("tensorboard", job_id, "--host", "sandbox", "--ct", "200", "--port", "0")
    assert res.exit_code == 2, res.output
    assert f"{base}/tensorboard is a link to '/etc'; not pulled" in res.output, res.output
    assert not [p for p in (isolated_env / "tensorboard").rglob("*") if p.is_file()]


def test_a_link_inside_the_logdir_is_refused_and_nothing_is_pulled(deploy, isolated_env, tmp_path):
    logdir = f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard"
    script = _job(logdir, _event_file(tmp_path)).replace(
        "print(json.dumps({", f"os.symlink('/', {logdir + '/run2'!r}); print(json.dumps({{", 1)
    job_id = deploy(script)
    res = run("tensorboard", job_id, "--host", "sandbox", "--ct", "200", "--port", "0")
    assert res.exit_code == 2, res.output
    assert f"holds a symbolic link ('{logdir}/run2')" in res.output, res.output
    assert not [p for p in (isolated_env / "tensorboard").rglob("*") if p.is_file()]


def test_a_link_in_the_local_copys_path_is_refused_and_nothing_is_written_through_it(
        deploy, isolated_env, tmp_path):
    logdir = f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard"
    job_id = deploy(_job(logdir, _event_file(tmp_path)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (isolated_env / "tensorboard").symlink_to(elsewhere)
    res = run("tensorboard", job_id, "--host", "sandbox", "--ct", "200", "--port", "0")
    assert res.exit_code == 2, res.output
    assert "is a symbolic link" in res.output, res.output
    assert list(elsewhere.iterdir()) == []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_first_pull_stops_its_children_and_is_one_line(deploy, isolated_env, sig):
    """A logdir of 30000 tiny files: the pull is still running when the signal comes."""
    logdir = f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard"
    said = {"event": "trackers", "report_to": ["tensorboard"], "run": "r", "tensorboard": logdir}
    job_id = deploy(textwrap.dedent(f"""
        import os
        d = os.path.join({logdir!r}, "run1")
        os.makedirs(d)
        for i in range(30000):
            with open(os.path.join(d, f"events.out.tfevents.{{i}}"), "wb") as f:
                f.write(b"x")
        print({json.dumps(json.dumps(said))}, flush=True)
        print('{{"event":"step","step":1}}', flush=True)
    """))
    p = subprocess.Popen([sys.executable, "-m", "opsctl", "tensorboard", job_id, "--host", "sandbox",
                          "--ct", "200", "--port", "0"],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pulling = wait_for(lambda: [c for c in _children(p.pid)
                                    if b"rsync" in _cmdline(c) or b"tar" in _cmdline(c)],
                           60, what="the pull's child process")
        p.send_signal(sig)
        _out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "Traceback" not in err and err.strip(), err
    assert wait_for(lambda: not any(Path(f"/proc/{c}").exists() for c in pulling), 10), pulling
    assert not _tensorboards(isolated_env)


def _start(job_id: str, refresh: str = "1") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "opsctl", "tensorboard", job_id, "--host", "sandbox",
                             "--ct", "200", "--port", "0", "--refresh", refresh],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ends_clean(p: subprocess.Popen[str], home: Path, children: list[int]) -> str:
    try:
        _out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and "tensorboard stopped" in err, err
    assert "Traceback" not in err, err
    assert wait_for(lambda: not _tensorboards(home), 10), _tensorboards(home)
    assert wait_for(lambda: not any(Path(f"/proc/{c}").exists() for c in children), 10), children
    return err


def test_sigterm_while_tensorboard_starts_ends_it_and_leaves_nothing(deploy, isolated_env, tmp_path):
    job_id = deploy(_job(f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard", _event_file(tmp_path)))
    p = _start(job_id)
    wait_for(lambda: _tensorboards(isolated_env), 120, what="the local TensorBoard process")
    p.send_signal(signal.SIGTERM)
    _ends_clean(p, isolated_env, [])


def test_sigkill_of_opsctl_still_ends_its_tensorboard_server(deploy, isolated_env, tmp_path):
    """SIGKILL runs no handler: the server was started to die with its parent."""
    job_id = deploy(_job(f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard", _event_file(tmp_path)))
    p = _start(job_id)
    try:
        assert wait_for(lambda: _tensorboards(isolated_env), 120, what="the local TensorBoard process")
        p.kill()
        p.wait(10)
        assert wait_for(lambda: not _tensorboards(isolated_env), 15, what="the server to end"), \
            _tensorboards(isolated_env)
    finally:
        p.kill()
        for pid in _tensorboards(isolated_env):
            os.kill(pid, signal.SIGKILL)


def test_sighup_during_a_re_pull_stops_it_and_the_server(sandbox, isolated_env, tmp_path):
    """A running job (it waits for a file), so the copy is pulled again every second."""
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    base = f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}"
    script = _job(f"{base}/tensorboard", _event_file(tmp_path)) + textwrap.dedent(f"""
        import time
        while not os.path.exists({base + "/release"!r}):
            time.sleep(0.2)
    """)
    book = tmp_path / "tb-running.yaml"
    book.write_text(json.dumps({"name": "tbjob", "command": ["python3", "-c", script],
                                "timeout_s": 120, "healthy_when": {"event": "step"}}))
    res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--json")
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.stdout)["job_id"]
    p = _start(job_id)
    try:
        wait_for(lambda: _tensorboards(isolated_env), 120, what="the local TensorBoard process")
        pulling = wait_for(lambda: [c for c in _children(p.pid)
                                    if b"rsync" in _cmdline(c) or b"tar" in _cmdline(c)
                                    or b"ssh" in _cmdline(c)],
                           60, what="a re-pull's child process", interval=0.02)
        p.send_signal(signal.SIGHUP)
        _ends_clean(p, isolated_env, pulling)
    finally:
        run("exec", "--host", "sandbox", "--ct", "200", "--", "touch", f"{base}/release")


# --- the whole chain: the real trainer in the container, its curves served here ------------


@pytest.fixture(scope="module")
def real_build(sandbox, tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.shared_torch import real_cpu_build_in_default_root

    real_cpu_build_in_default_root(sandbox, tmp_path_factory.mktemp("real-build-home"))


def _tensorboard_site(dest: Path) -> Path:
    """TensorBoard's writer and what it imports that the CPU build's env lacks, copied from this
    machine's (same python, same platform): what a playbook's ``requirements`` would install."""
    import google.protobuf
    import tensorboard

    for mod in (tensorboard, google.protobuf):
        src = Path(mod.__file__).parent
        rel = Path(*src.parts[len(Path(tensorboard.__file__).parent.parent.parts):])
        shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
    try:
        import absl

        shutil.copytree(Path(absl.__file__).parent, dest / "absl",
                        ignore=shutil.ignore_patterns("__pycache__"))
    except ImportError:
        pass
    return dest


@pytest.mark.slow
def test_the_smoke_job_with_report_to_tensorboard_is_served_here(sandbox, real_build, isolated_env,
                                                                 tmp_path):
    import yaml

    book = yaml.safe_load((REPO / "playbooks" / "dflash-cpu-smoke.yaml").read_text())
    out = f"/var/tmp/opsctl-tb-smoke-{uuid.uuid4().hex[:8]}"
    site = _tensorboard_site(tmp_path / "tbsite")
    book["command"] = [*book["command"], "--out-dir", out, "--steps", "20", "--report-to", "tensorboard"]
    book["env"] = {**book.get("env", {}), "PYTHONPATH": "/opt/opsctl/data/tbsite"}
    book["files"] = [{"src": str(site), "dest": "/opt/opsctl/data/tbsite"}]
    path = tmp_path / "smoke-tb.yaml"
    path.write_text(yaml.safe_dump(book))
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(path), "--replace", "--json")
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.stdout)["job_id"]
    st = json.loads(run("status", "--host", "sandbox", "--ct", "200", "--job", job_id, "--follow",
                        "--json").stdout)
    assert (st["state"], st["last_step"]["step"]) == ("SUCCEEDED", 20), st["output_tail"]

    p = subprocess.Popen([sys.executable, "-m", "opsctl", "tensorboard", job_id, "--host", "sandbox",
                          "--ct", "200", "--port", "0"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True).start()
    try:
        url = wait_for(lambda: next((m.group(0) for x in lines
                                     for m in [re.search(r"http://127\.0\.0\.1:\d+/", x)] if m), None),
                       120, what=f"the URL line (stderr so far: {lines})")
        with urllib.request.urlopen(url + "data/plugin/scalars/tags", timeout=10) as r:
            tags = json.loads(r.read())
        (run_tags,) = tags.values()
        assert {"train/loss", "train/tok_s", "train/lr"} <= set(run_tags), tags
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0, lines
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert wait_for(lambda: not _tensorboards(isolated_env), 10), _tensorboards(isolated_env)


def _sh(script: str) -> None:
    res = run("exec", "--host", "sandbox", "--ct", "200", "--", "sh", "-c", script)
    assert res.exit_code == 0, res.output


def test_a_status_reply_naming_a_traversal_job_id_writes_nothing_outside_the_copies(
        deploy, isolated_env, tmp_path, monkeypatch):
    """The container answers ``status`` with ``job_id: ../../../.ssh`` and has a matching
    ``trackers`` event and logdir holding ``authorized_keys``: nothing is written outside
    ``<opsctl home>/tensorboard`` (the id is checked here too, whatever the reply check does)."""
    from opsctl.ops import watch

    real = deploy(_job(None, None))
    logdir = f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard"
    said = json.dumps({"event": "trackers", "report_to": ["tensorboard"], "run": "r",
                       "tensorboard": logdir}, separators=(",", ":"))
    _sh(f"mkdir -p /.ssh {logdir} && printf '%s\\n' '{said}' > /.ssh/events.jsonl && "
        f"echo 'ssh-ed25519 AAAA attacker' > {logdir}/authorized_keys && "
        f"echo x > {logdir}/events.out.tfevents.1")
    fetch = watch.fetch_status

    def hostile(agent, job_id, lines=20):
        doc = dict(fetch(agent, real, lines))
        doc["job_id"] = "../../../.ssh"
        return doc

    monkeypatch.setattr(watch, "fetch_status", hostile)
    aimed = isolated_env.parent / ".ssh"  # <home>/tensorboard/<host>-ct200/../../../.ssh
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    res = run("tensorboard", "--host", "sandbox", "--ct", "200", "--port", "0")
    assert res.exit_code == 25, res.output
    assert "no job id" in res.output and "Traceback" not in res.output, res.output
    assert not aimed.exists(), list(aimed.rglob("*"))
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def _peak_rss_kib(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, int, str]:
    """(exit code, peak resident KiB of the command, its stderr), measured in a fresh parent."""
    probe = ("import json, resource, subprocess, sys; "
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(json.dumps([p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN)"
             ".ru_maxrss, p.stderr[-2000:]]))")
    out = subprocess.run([sys.executable, "-c", probe, *argv], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=timeout)
    rc, rss, err = json.loads(out.stdout)
    return rc, rss, err


def test_300k_trackers_lines_cost_bounded_memory_and_the_last_one_counts(deploy, isolated_env):
    logdir = f"/var/tmp/opsctl-tb-never-{uuid.uuid4().hex[:6]}/tensorboard"
    job_id = deploy(_job(None, None))
    said = json.dumps({"event": "trackers", "report_to": ["tensorboard"], "run": "r",
                       "tensorboard": "/var/tmp/x" * 100 + "/tensorboard"}, separators=(",", ":"))
    last = json.dumps({"event": "trackers", "report_to": ["tensorboard"], "run": "r",
                       "tensorboard": logdir}, separators=(",", ":"))
    events = f"/opt/opsctl/jobs/{job_id}/events.jsonl"
    _sh(f"i=0; while [ $i -lt 300 ]; do printf '%s\\n' '{said}'; i=$((i+1)); done > /tmp/k.jsonl && "
        f"for j in $(seq 1000); do cat /tmp/k.jsonl; done >> {events} && "
        f"printf '%s\\n' '{last}' >> {events} && rm /tmp/k.jsonl")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rc, rss_kib, err = _peak_rss_kib([sys.executable, "-m", "opsctl", "tensorboard", job_id,
                                      "--host", "sandbox", "--ct", "200", "--port", "0"], env, 300)
    assert rc == 2 and f"{logdir} does not exist" in err, err  # the last event named it
    assert rss_kib < 250 * 1024, f"peak {rss_kib // 1024} MiB"


@pytest.mark.parametrize("method", ["rsync", "tar"])
def test_event_files_larger_than_the_cap_stop_the_copy_with_one_line_naming_it(
        deploy, isolated_env, tmp_path, method):
    logdir = f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard"
    job_id = deploy(_job(logdir, _event_file(tmp_path)))
    _sh(f"head -c 200000 /dev/zero > {logdir}/run1/events.out.tfevents.9.big")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPSCTL_PULLED_EVENT_BYTES": "100000",
           "OPSCTL_FILES_METHOD": method}
    p = subprocess.run([sys.executable, "-m", "opsctl", "tensorboard", job_id, "--host", "sandbox",
                        "--ct", "200", "--port", "0"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 25, p.stderr
    assert "100000" in p.stderr and "Traceback" not in p.stderr, p.stderr
    big = list((isolated_env / "tensorboard").rglob("*.big"))
    assert all(f.stat().st_size <= 100000 for f in big), big


def test_a_tensorboard_server_that_dies_ends_the_session_with_one_line(deploy, isolated_env, tmp_path):
    job_id = deploy(_job(f"/var/tmp/opsctl-tb-{uuid.uuid4().hex[:8]}/tensorboard", _event_file(tmp_path)))
    p = _start(job_id, refresh="0")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("http://127.0.0.1:" in x for x in lines), 120,
                 what=f"the URL line (stderr so far: {lines})")
        for pid in _tensorboards(isolated_env):
            os.kill(pid, signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    reader.join(5)
    err = "".join(lines)
    assert p.returncode == 2, err
    assert "exited with -9 while serving" in err and "Traceback" not in err, err

