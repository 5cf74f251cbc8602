"""The launch record: the first `opsctl status` of a session starts its ``ssh`` before the rest
of opsctl loads, only while nothing it was derived from changed, and never says anything the
normal path would not (opsctl/remote/launchrecord.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.remote import launchrecord
from tests.paths import REPO

WORDS = ["status", "--json"]


# --- the record itself (no sandbox: a shell stands in for ssh) ------------------------------

@pytest.fixture
def recorded(isolated_env: Path, tmp_path: Path, monkeypatch) -> Path:
    """A record for ``status --json`` whose "ssh" prints ``started``, derived from one file."""
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "inventory.yaml"
    source.write_text("hosts: {}\n")
    launchrecord.store(WORDS, ["sh", "-c", "echo started"], [str(source)], None)
    return source


def _output(launched: launchrecord.Launched | None) -> bytes | None:
    if launched is None:
        return None
    pid, out, err, _ = launched.adopt()
    os.waitpid(pid, 0)
    data = os.read(out, 1024)
    os.close(out)
    os.close(err)
    return data


def test_a_record_that_still_holds_starts_its_ssh_at_once(recorded):
    assert _output(launchrecord.launch(WORDS)) == b"started\n"
    assert os.stat(launchrecord.path()).st_mode & 0o777 == 0o600, "argv only, but private"


@pytest.mark.parametrize("change", ["other words", "file edited", "file removed", "env",
                                    "directory", "mux socket"])
def test_anything_it_was_derived_from_changed_starts_nothing(recorded, tmp_path, monkeypatch,
                                                             change):
    words = WORDS
    if change == "other words":
        words = ["status", "--json", "--ct", "201"]
    elif change == "file edited":
        recorded.write_text("hosts: {}\n")  # same bytes, a new stat
    elif change == "file removed":
        recorded.unlink()
    elif change == "env":
        monkeypatch.setenv("OPSCTL_INVENTORY", str(tmp_path))
    elif change == "directory":
        monkeypatch.chdir(recorded.parent.parent)
    else:
        sock = tmp_path / "mux.sock"
        launchrecord.store(WORDS, ["sh", "-c", "echo started"], [str(recorded)], str(sock))
        assert _output(launchrecord.launch(WORDS)) == b"started\n", "no socket: ssh"
        sock.touch()
    assert launchrecord.launch(words) is None


@pytest.mark.parametrize("damage", ["not json", "wrong shape", "mode 0644", "a symlink",
                                    "someone else's"])
def test_a_corrupt_or_foreign_record_is_ignored(recorded, tmp_path, damage):
    record = Path(launchrecord.path())
    if damage == "not json":
        record.write_bytes(b"\x00{not json")
    elif damage == "wrong shape":
        doc = json.loads(record.read_text())
        doc["entries"][0]["ssh"] = "sh -c 'echo started'"
        record.write_text(json.dumps(doc))
    elif damage == "mode 0644":
        record.chmod(0o644)
    elif damage == "a symlink":
        real = tmp_path / "elsewhere.json"
        record.rename(real)
        record.symlink_to(real)
    else:
        if os.getuid() != 0:
            pytest.skip("chown needs root")
        os.chown(record, 65534, 65534)
    assert launchrecord.launch(WORDS) is None


def test_an_ssh_nobody_adopted_is_killed_and_reaped(isolated_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    launchrecord.store(WORDS, ["sleep", "30"], [], None)
    launched = launchrecord.launch(WORDS)
    assert launched is not None
    launched.discard()
    launched.discard()  # idempotent
    with pytest.raises(ChildProcessError):
        os.waitpid(launched.pid, os.WNOHANG)


# --- through the sandbox --------------------------------------------------------------------

SPY = r"""
import json, os, sys
spawns = []
def on_spawn(event, args):
    if event == "os.posix_spawn" and os.path.basename(os.fsdecode(args[0])) == "ssh":
        spawns.append({"from_record": "opsctl.ops.quickstatus" not in sys.modules,
                       "loaded": [m for m in ("click", "pydantic", "yaml", "rich", "paramiko",
                                              "opsctl.cli.statusonce") if m in sys.modules]})
sys.addaudithook(on_spawn)
from opsctl.remote import sshcall
results = []
real = sshcall.SshCall.result
def spy(self):
    r = real(self)
    results.append({"adopted": self.adopted, "stdout": None if r is None else r.stdout.decode()})
    return r
sshcall.SshCall.result = spy
def exit_now(code):
    raise SystemExit(code)
os._exit = exit_now
from opsctl.cli import main
sys.argv = ["opsctl", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
sys.stderr.write("\nSPY " + json.dumps({"code": code, "spawns": spawns, "ssh": results}) + "\n")
"""


def _spied(*args: str, env: dict[str, str] | None = None) -> tuple[str, str, dict]:
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SPY, *args], capture_output=True, text=True,
                          env=env, timeout=60)
    err, spy = proc.stderr.rsplit("\nSPY ", 1)
    return proc.stdout, err, json.loads(spy)


def _lane(spy: dict) -> str:
    """How the status went: "record" (ssh started from it and adopted), "ssh", or "full"."""
    if not spy["ssh"]:
        return "full"
    return "record" if spy["spawns"][0]["from_record"] and spy["ssh"][0]["adopted"] else "ssh"


def _printed_from_its_reply(out: str, spy: dict) -> bool:
    """``out`` is, byte for byte, what the full path prints for the reply this run got."""
    data = json.loads(spy["ssh"][-1]["stdout"].strip().splitlines()[-1])["data"]
    proc = subprocess.run([sys.executable, "-c", "import json, sys\n"
                           "from opsctl.cli.jsonout import print_json\n"
                           "from opsctl.remote.models import JobStatus\n"
                           "print_json(JobStatus.model_validate(json.load(sys.stdin)).model_dump(mode='json'))"],
                          input=json.dumps(data), capture_output=True, text=True, check=True)
    return out == proc.stdout


@pytest.fixture(scope="module")
def home(sandbox, tmp_path_factory: pytest.TempPathFactory):
    """One running job for the module (a private root and home, mux off)."""
    from tests.sandbox_plugin import private_home

    home = tmp_path_factory.mktemp("record-home")
    with private_home(sandbox, home, "/opt/opsctl-record"):
        known = home / "known_hosts"  # its own copy: a test rewrites it
        known.write_bytes(Path(sandbox.known_hosts_file).read_bytes())
        inv = home / "inventory" / "sandbox.yaml"
        doc = yaml.safe_load(inv.read_text())
        doc["hosts"]["sandbox"]["known_hosts"] = str(known)
        inv.write_text(yaml.safe_dump(doc))
        book = home / "long.yaml"
        book.write_text(json.dumps({"name": "record-status", "timeout_s": 120, "command": [
            "python3", "-c", "import time\nprint('x', flush=True)\ntime.sleep(300)\n"]}))
        res = CliRunner().invoke(cli, ["deploy", "--host", "sandbox", "--ct", "200", "--playbook",
                                       str(book), "--replace", "--no-wait"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        yield home
        CliRunner().invoke(cli, ["stop", "--grace", "1"])


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    return {"OPSCTL_HOME": str(home), "OPSCTL_INVENTORY_DIRS": str(home / "inventory"),
            "OPSCTL_MUX": "0"}


def _until_record(env: dict[str, str], runs: int = 3) -> list[str]:
    """The lanes of ``status --json`` run until one comes from the record (at most ``runs``)."""
    lanes = []
    for _ in range(runs):
        _, err, spy = _spied(*WORDS, env=env)
        assert spy["code"] == 0, err
        lanes.append(_lane(spy))
        if lanes[-1] == "record":
            break
    return lanes


def test_with_nothing_changed_ssh_starts_before_click_or_pydantic_and_prints_the_same_bytes(
        env, home):
    _until_record(env)
    out, _, spy = _spied(*WORDS, env=env)
    assert _lane(spy) == "record"
    assert spy["spawns"][0]["loaded"] == [], "ssh started before anything but the record loaded"
    assert _printed_from_its_reply(out, spy), "the same document as the full path, byte for byte"
    assert json.loads(out)["name"] == "record-status"
    (home / "cache" / "launch.json").unlink()
    out, _, spy = _spied(*WORDS, env=env)
    assert _lane(spy) == "ssh" and _printed_from_its_reply(out, spy), "and without the record"


@pytest.mark.parametrize("change", ["inventory", "known_hosts", "last target", "env", "mode"])
def test_a_change_is_a_miss_and_the_record_is_rewritten(env, home, change):
    _until_record(env)
    record = home / "cache" / "launch.json"
    before = record.read_bytes()
    extra: dict[str, str] = {}
    if change == "inventory":
        inv = home / "inventory" / "sandbox.yaml"
        inv.write_bytes(inv.read_bytes())
    elif change == "known_hosts":
        kh = home / "known_hosts"
        kh.write_bytes(kh.read_bytes())
    elif change == "last target":
        lt = home / "last-target.json"
        lt.write_bytes(lt.read_bytes())
    elif change == "env":
        extra = {"OPSCTL_INVENTORY": str(home)}  # read only without OPSCTL_INVENTORY_DIRS
    else:
        record.chmod(0o644)
    lanes = _until_record({**env, **extra})
    assert lanes[0] != "record" and lanes[-1] == "record", lanes
    assert record.stat().st_mode & 0o777 == 0o600
    if change != "mode":  # (rewritten with the same stats: the same bytes)
        assert record.read_bytes() != before, "stamped again"


def test_a_changed_host_key_fails_as_without_a_record(sandbox, home, isolated_env, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(Path(sandbox.known_hosts_file).read_text())
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "h.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": sandbox.port, "user": "root", "known_hosts": str(known),
        "identity_file": str(sandbox.identity_file), "root": "/opt/opsctl-record",
        "containers": {200: {}}}}}))
    target = ("status", "--json", "--host", "h", "--ct", "200")
    lanes = []
    for _ in range(3):
        _, err, spy = _spied(*target)
        lanes.append(_lane(spy))
    assert lanes == ["full", "ssh", "record"], err
    # the server's key changes: no stat sees that. Both known_hosts files now hold another key,
    # and the record, stamped again, still matches everything it was derived from.
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    line = f"[127.0.0.1]:{sandbox.port} " + " ".join(Path(f"{other}.pub").read_text().split()[:2])
    known.write_text(line + "\n")
    (entry,) = json.loads(Path(launchrecord.path()).read_text())["entries"]
    private = next(a.split("=", 1)[1] for a in entry["ssh"] if a.startswith("UserKnownHostsFile="))
    Path(private).write_text(line + "\n")
    launchrecord.store(entry["words"], entry["ssh"], [f for f, _ in entry["files"]], entry["mux_socket"])
    cold, cold_err, spy = _spied(*target)
    assert spy["spawns"][0]["from_record"], "ssh started from the record"
    assert spy["code"] == errors.HOST_KEY
    Path(launchrecord.path()).unlink()
    full, full_err, full_spy = _spied(*target)
    assert not full_spy["spawns"][0]["from_record"]
    assert full_spy["code"] == errors.HOST_KEY
    assert json.loads(cold) == json.loads(full) and "CHANGED" in json.loads(cold)["error"]["message"]
    assert cold_err.strip() == full_err.strip()
    assert not Path(launchrecord.path()).exists(), "a failed status keeps no record"

