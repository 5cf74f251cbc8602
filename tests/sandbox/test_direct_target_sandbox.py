"""The same commands against both kinds of target, through the real sandbox: an LXC container
behind the pct stand-in (``sandbox`` ct 200) and the SSH host itself (``sandbox-direct``,
``enter: direct``: the same loopback sshd, commands run on this machine, its opsctl root a
private directory of this test)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import typing as t
import uuid
from pathlib import Path

import pytest
import yaml

from opsctl.sandbox import host as sandbox_mod
from tests import waiting
from tests.cli_runner import run_cli as run
from tests.sandbox_plugin import sandbox_home

pytestmark = pytest.mark.sandbox
wait_for = functools.partial(waiting.wait_for, timeout=30.0, interval=0.3)

KINDS = {"lxc": ["--host", "sandbox", "--ct", "200"], "direct": ["--host", sandbox_mod.DIRECT_HOST]}

#: ends the tmux sessions of the jobs under root $1 (their panes are dead after the stop)
END_SESSIONS = """
tmux -L opsctl list-sessions -F '#{session_path} #{session_name}' 2>/dev/null |
while read -r path name; do
  case "$path" in "$1"/*) tmux -L opsctl kill-session -t "=$name" ;; esac
done
true
"""

TRAINER = """
import json, time
def ev(**k): print(json.dumps(k), flush=True)
ev(event="phase", phase="training")
for step in range(1, 400):
    ev(event="step", step=step, loss=10.0 / step, tok_s=1000.0)
    time.sleep(0.2)
"""


def _playbook(tmp_path: Path, name: str, code: str) -> Path:
    """A playbook that runs ``python3 -u -c code``, healthy once started."""
    book = tmp_path / f"{name}.json"
    book.write_text(json.dumps({"name": name, "command": ["python3", "-u", "-c", code],
                                "timeout_s": 60, "healthy_when": {"started": True}}))
    return book


def valid(name: str, stdout: str) -> dict[str, t.Any]:
    """``stdout`` as the one JSON document ``opsctl schema NAME`` describes (checked)."""
    from jsonschema import Draft202012Validator

    schema = json.loads(run("schema", *name.split()).stdout)
    doc = json.loads(stdout)
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in Draft202012Validator(schema).iter_errors(doc)]
    assert problems == [], (name, problems)
    return t.cast(dict[str, t.Any], doc)


def private_roots(sandbox: sandbox_mod.SandboxInfo, home: Path) -> dict[str, str]:
    """Both sandbox hosts in ``home``'s inventory, each with an opsctl root of this test's
    own; the roots by host name."""
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(Path(sandbox.inventory_file).read_text())
    tag = uuid.uuid4().hex[:8]
    roots = {"sandbox": f"/tmp/opsctl-direct-test-{tag}",
             sandbox_mod.DIRECT_HOST: str(sandbox_mod.direct_root(sandbox.state_dir) / tag)}
    for name, root in roots.items():
        doc["hosts"][name]["root"] = root
    (inv / "sandbox.yaml").write_text(yaml.safe_dump(doc))
    return roots


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest, sandbox: sandbox_mod.SandboxInfo,
         isolated_env: Path) -> tuple[str, list[str], str]:
    """(kind, its target flags, its opsctl root): each test's own root on either kind."""
    roots = private_roots(sandbox, isolated_env)
    flags = KINDS[request.param]
    yield request.param, flags, roots[flags[1]]
    run("stop", *flags, "--grace", "1")
    if request.param == "direct":
        # a finished job's tmux session stays until the next launch prunes it; on this
        # machine's own tmux server, the test's sessions go with the test
        run("exec", *flags, "--", "sh", "-c", END_SESSIONS, "_", roots[flags[1]])
    run("exec", *flags, "--", "rm", "-rf", roots[flags[1]])


def test_exec_is_byte_exact_with_its_exit_code_on_both_kinds(kind):
    _, flags, _ = kind
    hostile = "a b'c\"$(x)`y`\\ ünï\tend"
    res = run("exec", *flags, "--", "python3", "-c",
              "import sys; sys.stdout.write(sys.argv[1]); sys.exit(7)", hostile)
    assert res.exit_code == 7, res.output
    assert res.stdout == hostile


def test_a_job_deploys_reports_logs_lists_and_stops_on_both_kinds(kind, tmp_path):
    name, flags, root = kind
    book = tmp_path / "steps.yaml"
    book.write_text(json.dumps({"name": "steps", "timeout_s": 60, "healthy_when": {"event": "step"},
                                "command": ["python3", "-c", TRAINER]}))
    res = run("deploy", *flags, "--playbook", str(book), "--json")
    assert res.exit_code == 0, res.output
    job_id = valid("deploy", res.stdout)["job_id"]
    st = valid("status", run("status", *flags, "--json").stdout)
    assert (st["job_id"], st["state"]) == (job_id, "RUNNING")
    # the remembered target: no flags at all, and a direct one has no --ct in it
    again = run("status", "--json")
    assert json.loads(again.stdout)["job_id"] == job_id, again.output
    logs = wait_for(lambda: (lambda r: r if '"step": 3' in r.stdout else None)(
        run("logs", *flags, "--tail", "50")), what="three steps in the log")
    assert '"event": "step"' in logs.stdout
    jobs = valid("jobs", run("jobs", *flags, "--json").stdout)
    assert job_id in json.dumps(jobs)
    stop = run("stop", *flags, "--grace", "1", "--json")
    assert stop.exit_code == 0, stop.output
    valid("stop", stop.stdout)
    final = json.loads(run("status", *flags, "--json").stdout)
    assert final["state"] in ("CANCELLED", "FAILED"), final
    if name == "direct":  # the job, its records and its payload are on this machine
        assert (Path(root) / "jobs" / job_id).is_dir()


def test_push_and_pull_round_trip_on_both_kinds(kind, tmp_path):
    _, flags, root = kind
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(bytes(range(256)) * 64)
    (src / "sp ace ü.txt").write_text("x\n")
    dest = f"{root}/work"
    res = run("push", str(src), dest, *flags, "-y")
    assert res.exit_code == 0, res.output
    back = tmp_path / "back"
    res = run("pull", dest, str(back), *flags, "-y")
    assert res.exit_code == 0, res.output
    got = back if (back / "a.bin").exists() else back / "work"
    for f in src.iterdir():
        assert hashlib.sha256((got / f.name).read_bytes()).digest() == \
            hashlib.sha256(f.read_bytes()).digest()


def test_doctor_says_not_applicable_for_proxmox_rows_only_on_a_direct_host(kind):
    name, flags, _ = kind
    res = run("doctor", *flags, "--json")
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in valid("doctor", res.stdout)["rows"]}
    proxmox = ("pct", "container-running", "ct-config-devices")
    if name == "direct":
        for row in proxmox:
            assert rows[row]["status"] == "skip" and rows[row]["reason"].startswith(
                "not applicable: a direct host"), rows[row]
    else:
        assert rows["pct"]["status"] in ("ok", "warn") and rows["container-running"]["status"] == "ok"
    assert rows["ssh"]["status"] == "ok" and rows["disk-free"]["status"] in ("ok", "warn")


def test_a_ct_for_the_sandboxs_direct_host_is_refused(sandbox, isolated_env):
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    res = run("exec", "--host", sandbox_mod.DIRECT_HOST, "--ct", "200", "--", "true")
    assert res.exit_code == 2 and "takes no --ct" in res.output
    # the fleet view too: a --ct that no selected host can have is refused, never a row that
    # says the host was reached when nothing was sent
    res = run("status", "--all", "--host", sandbox_mod.DIRECT_HOST, "--ct", "200")
    assert res.exit_code == 2 and "takes no --ct" in res.output, res.output
    res = run("status", "--all", "--host", "sandbox*", "--ct", "999", "--json")
    rows = {r["host"]: r for r in valid("status --all", res.stdout)["rows"]}
    direct = rows[sandbox_mod.DIRECT_HOST]
    assert direct["reachable"] is None and "no container matches --ct" in direct["note"], direct


TICK = """
import time
for i in range(3000):
    print(f"tick {i:04d}", flush=True)
    time.sleep(0.2)
"""


def _pty(*args: str) -> t.Any:
    pexpect = pytest.importorskip("pexpect")
    return pexpect.spawn(sys.executable, ["-m", "opsctl", *args], timeout=30,
                         env={**os.environ, "TERM": "xterm"}, dimensions=(40, 120))


def test_attach_and_shell_work_on_a_terminal_on_both_kinds(kind, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    _, flags, _ = kind
    book = _playbook(tmp_path, "tick", TICK)
    res = run("deploy", *flags, "--playbook", str(book), "--json")
    assert res.exit_code == 0, res.output
    term = _pty("attach", *flags)
    term.expect(rb"tick \d{4}")  # the job's own tmux pane, on this terminal
    term.send(b"\x02d")  # Ctrl-b d: tmux's detach
    term.expect(rb"\[detached")
    term.expect(pexpect.EOF)
    term.close()
    assert term.exitstatus == 0
    shell = _pty("shell", *flags)
    shell.expect(rb"[#$] ")
    shell.sendline(b"echo answer=$((6*7)); test -t 0 && echo on-a-tty; exit 3")
    shell.expect(rb"answer=42")
    shell.expect(rb"on-a-tty")
    shell.expect(pexpect.EOF)
    shell.close()
    assert shell.exitstatus == 3


def test_the_fleet_view_lists_the_direct_host_as_its_own_one_target(sandbox, isolated_env):
    private_roots(sandbox, isolated_env)
    res = run("status", "--all", "--host", "sandbox*", "--json")
    rows = {(r["host"], r["ctid"]) for r in valid("status --all", res.stdout)["rows"]}
    assert (sandbox_mod.DIRECT_HOST, 0) in rows and ("sandbox", 200) in rows, res.output
    table = run("status", "--all", "--host", sandbox_mod.DIRECT_HOST)
    assert sandbox_mod.DIRECT_HOST in table.stdout and " host " in table.stdout, table.output
    hosts = {h["name"]: h for h in json.loads(run("hosts", "--check", "--json").stdout)["hosts"]}
    direct = hosts[sandbox_mod.DIRECT_HOST]
    assert direct["reachable"] and direct["detail"] == "direct host: the target is the host itself"


def test_a_direct_host_whose_ssh_user_is_not_root_needs_no_sudo(sandbox, isolated_env):
    """The sandbox's non-root user as a direct host: nothing runs under sudo, and its opsctl
    root is a directory it owns; exec, doctor and a job work as for root."""
    user = sandbox_mod.ensure_sudo_user(sandbox_home())
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(Path(sandbox.inventory_file).read_text())
    spec = doc["hosts"][sandbox_mod.DIRECT_HOST]
    spec.update(user=user, root=f"/home/{user}/opsctl-{uuid.uuid4().hex[:8]}")
    (inv / "sandbox.yaml").write_text(yaml.safe_dump(doc))
    flags = ["--host", sandbox_mod.DIRECT_HOST]
    who = run("exec", *flags, "--", "id", "-un")
    assert (who.exit_code, who.stdout.strip()) == (0, user), who.output
    doctor = run("doctor", *flags, "--json")
    assert doctor.exit_code == 0, doctor.output
    book = isolated_env / "steps.json"
    book.write_text(json.dumps({"name": "steps", "timeout_s": 60, "healthy_when": {"event": "step"},
                                "command": ["python3", "-c", TRAINER]}))
    try:
        res = run("deploy", *flags, "--playbook", str(book), "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(run("status", *flags, "--json").stdout)["state"] == "RUNNING"
    finally:
        run("stop", *flags, "--grace", "1")
        run("exec", *flags, "--", "sh", "-c", END_SESSIONS, "_", spec["root"])
        run("exec", *flags, "--", "rm", "-rf", spec["root"])
    # the default root (/opt/opsctl) is not the user's: the refusal says what to set
    del spec["root"]
    (inv / "sandbox.yaml").write_text(yaml.safe_dump(doc))
    denied = run("deploy", *flags, "--playbook", str(book))
    assert denied.exit_code == 25, denied.output
    assert f"{user} cannot write /opt/opsctl" in denied.output and "set `root:`" in denied.output
    # sudo: true on a direct host is refused, naming why, before anything is sent
    spec["sudo"] = True
    (inv / "sandbox.yaml").write_text(yaml.safe_dump(doc))
    refused = run("exec", *flags, "--", "true")
    assert refused.exit_code == 2 and "enter: direct" in refused.output and "sudo" in refused.output


@pytest.mark.slow
def test_the_cpu_smoke_playbook_trains_on_the_direct_host(sandbox, isolated_env):
    """The README demo on a direct host, in its default root (the sandbox's own): the deploy
    makes the real CPU torch build current there, then trains, and the job's report, log and
    list read as on a container. The session's one real install is linked in when it is
    published (``tests/shared_torch.py``; the install path itself is the same agent code the
    container tests run), else the deploy installs it (a minute on 2 cores)."""
    from tests.shared_torch import link_published_build

    link_published_build(sandbox_mod.direct_root(sandbox.state_dir) / "envs")
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    flags = ["--host", sandbox_mod.DIRECT_HOST]
    # no --playbook and no --ct: the inventory's target names the bundled CPU smoke playbook
    res = run("deploy", *flags, "--replace", "-y", "--json")
    assert res.exit_code == 0, res.output[-3000:]
    doc = json.loads(res.stdout)
    assert doc["outcome"] in ("healthy", "terminal") and doc["target"] == sandbox_mod.DIRECT_HOST
    st = json.loads(run("status", "--follow", "--json", "--poll", "1").stdout)
    assert (st["state"], st["exit_code"]) == ("SUCCEEDED", 0)
    assert st["last_step"]["step"] == 40 and st["last_step"]["loss"] < 6.5
    assert "done at step 40" in run("logs", *flags).stdout
    assert doc["job_id"] in run("jobs", *flags).stdout


#: a job that stop's SIGINT does not end: the agent's stop waits its grace, then SIGTERM
DEAF_TO_SIGINT = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.2)
"""


def _agent_stopping(root: str) -> bool:
    """Whether the agent's ``stop`` runs under ``root`` on this machine (the direct target)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"remote_payload.agent" in words and root.encode() in words and b"stop" in words:
            return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_cut_short_here_says_the_targets_stop_goes_on_and_it_does(sig, sandbox, isolated_env,
                                                                           tmp_path):
    """Ctrl-C or SIGTERM of ``opsctl stop`` once the target runs its stop: the target's stop
    goes on to its end, so the line says that (never "the job keeps running"), with the
    signal's code, and the job ends with no second stop."""
    root = private_roots(sandbox, isolated_env)[sandbox_mod.DIRECT_HOST]
    flags = ["--host", sandbox_mod.DIRECT_HOST]
    book = _playbook(tmp_path, "deaf", DEAF_TO_SIGINT)
    try:
        assert run("deploy", *flags, "--playbook", str(book)).exit_code == 0
        proc = subprocess.Popen([sys.executable, "-m", "opsctl", "stop", *flags, "-y", "--grace", "3"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert wait_for(lambda: _agent_stopping(root) or proc.poll() is not None, interval=0.01)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
        assert "stop the target already began goes on there" in err and "keeps running" not in err, err
        assert "Traceback" not in err, err
        ended = wait_for(lambda: (lambda d: d if d["state"] != "RUNNING" else None)(
            json.loads(run("status", *flags, "--json").stdout)), what="the job to end")
        assert ended["state"] == "CANCELLED", ended
    finally:
        run("stop", *flags, "--grace", "1")
        run("exec", *flags, "--", "sh", "-c", END_SESSIONS, "_", root)
        run("exec", *flags, "--", "rm", "-rf", root)


#: targeted commands the walk below does not run, each with why (and where it is tested)
NOT_WALKED = {
    "opsctl attach": "needs a terminal: test_attach_and_shell_work_on_a_terminal_on_both_kinds",
    "opsctl shell": "needs a terminal: test_attach_and_shell_work_on_a_terminal_on_both_kinds",
    "opsctl forward": "serves until Ctrl-C",
    "opsctl tensorboard": "serves until Ctrl-C",
    "opsctl deploy": "its example runs a GPU playbook: the job and smoke tests deploy",
    "opsctl queue add": "starts a job of a GPU playbook: the job test deploys",
    "opsctl push": "its examples send the current directory: the push/pull test",
    "opsctl pull": "the push/pull test",
    "opsctl probe compile-race": "minutes of torch.compile on CPU",
    "opsctl cache seed": "minutes of torch.compile on CPU",
    "opsctl swap-torch": "installs a torch build: the smoke test installs one on the direct host",
}


def _walked() -> list[list[str]]:
    from tests.unit.test_cli_help import COMMANDS, _argv

    found = []
    for name, cmd in COMMANDS:
        if not {"--host", "--ct"} <= {o for p in cmd.params for o in p.opts} or name in NOT_WALKED:
            continue
        example = next(a for a in map(_argv, getattr(cmd, "examples", ())) if "--ct" in a)
        at = example.index("--ct")
        argv = example[1:at] + example[at + 2:]
        argv[argv.index("--host") + 1] = sandbox_mod.DIRECT_HOST
        found.append(argv)
    return found


def test_every_targeted_command_works_or_refuses_in_one_line_on_a_direct_host(sandbox, isolated_env):
    """Each command that takes a target, run as its own first example on the direct host
    (without ``--ct``): it works, or refuses with a documented exit code, never a traceback,
    and never names a container the host does not have."""
    from opsctl import errors

    root = private_roots(sandbox, isolated_env)[sandbox_mod.DIRECT_HOST]
    walked = _walked()
    assert len(walked) >= 12, walked
    try:
        for argv in walked:
            res = run(*argv, input="")
            what = " ".join(argv)
            assert "Traceback" not in res.output, (what, res.output)
            # it reached the host: a walk of connection errors would have tested nothing
            assert res.exit_code not in (errors.TRANSPORT, errors.AUTH, errors.HOST_KEY), \
                (what, res.output)
            if argv[0] != "exec":  # exec passes the command's own exit code through
                assert res.exit_code in errors.EXIT_CODES, (what, res.exit_code, res.output)
            assert "ct 0" not in res.output and "container 0" not in res.output, (what, res.output)
            # pct's words (a refusal or a step of it), not doctor's "no pct" rows
            assert "pct exec" not in res.output and "`pct`" not in res.output, (what, res.output)
    finally:
        run("exec", "--host", sandbox_mod.DIRECT_HOST, "--", "rm", "-rf", root)


def test_the_sandbox_ends_its_direct_targets_jobs_when_it_goes_down(sandbox, isolated_env, tmp_path):
    """The direct target's jobs run on this machine: ``sandbox down`` ends their tmux
    sessions (what it ends is this function), as stopping a container ends its jobs."""
    root = private_roots(sandbox, isolated_env)[sandbox_mod.DIRECT_HOST]
    flags = ["--host", sandbox_mod.DIRECT_HOST]
    book = _playbook(tmp_path, "tick", TICK)
    try:
        job_id = json.loads(run("deploy", *flags, "--playbook", str(book), "--json").stdout)["job_id"]
        ended = sandbox_mod.end_direct_sessions(sandbox_home())
        assert any(job_id in name for name in ended), ended
        st = wait_for(lambda: (lambda d: d if d["state"] not in ("RUNNING", "PENDING") else None)(
            json.loads(run("status", *flags, "--json").stdout)), what="the job to end")
        assert st["state"] in ("FAILED", "LOST", "CANCELLED"), st
    finally:
        run("stop", *flags, "--grace", "1")
        run("exec", *flags, "--", "rm", "-rf", root)
