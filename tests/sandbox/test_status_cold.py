"""The first `opsctl status` of a session (no mux) goes over the OpenSSH client, trusts only the
keys opsctl's own connection accepts, and says exactly what the full path says
(opsctl/remote/sshcall.py, opsctl/remote/hostkeys.py, opsctl/cli/statusonce.py)."""

from __future__ import annotations

import base64
import hmac
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli, statusonce
from opsctl.cli.jsonout import print_json
from opsctl.remote import hostkeys, models, sshcall
from remote_payload.agent import diagnosis
from remote_payload.probes import stackdump
from tests.paths import REPO


def _blob(kind: str, body: bytes) -> str:
    raw = len(kind).to_bytes(4, "big") + kind.encode() + len(body).to_bytes(4, "big") + body
    return base64.b64encode(raw).decode()


KEY_A = _blob("ssh-ed25519", b"A" * 32)
KEY_B = _blob("ssh-ed25519", b"B" * 32)
KEY_R = _blob("ecdsa-sha2-nistp256", b"R" * 65)
NAME = "[10.0.0.1]:2222"


def _fp(b64: str) -> str:
    return hostkeys.fingerprint(base64.b64decode(b64))


def _hashed(name: str) -> str:
    salt = b"s" * 20
    mac = hmac.new(salt, name.encode(), "sha1").digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


# --- which keys ssh may accept: those the paramiko path accepts -----------------------------

class TestAcceptedKeys:
    def accepted(self, tmp_path: Path, text: str, pinned: str | None = None):
        kh = tmp_path / "known_hosts"
        kh.write_text(text)
        return hostkeys.accepted(kh, NAME, pinned)

    def test_the_hosts_own_line_by_name_or_by_hash(self, tmp_path):
        assert self.accepted(tmp_path, f"other ssh-ed25519 {KEY_B}\n{NAME} ssh-ed25519 {KEY_A}\n") \
            == [("ssh-ed25519", KEY_A)]
        assert self.accepted(tmp_path, f"{_hashed(NAME)} ssh-ed25519 {KEY_A}\n") \
            == [("ssh-ed25519", KEY_A)]
        assert self.accepted(tmp_path, f"{_hashed('10.0.0.1')} ssh-ed25519 {KEY_A}\n") is None

    def test_a_pin_keeps_only_the_pinned_key(self, tmp_path):
        text = f"{NAME} ssh-ed25519 {KEY_A}\n{NAME} ecdsa-sha2-nistp256 {KEY_R}\n"
        assert self.accepted(tmp_path, text, _fp(KEY_A)) == [("ssh-ed25519", KEY_A)]
        assert self.accepted(tmp_path, text, _fp(KEY_B)) is None, "a pin nobody matches: paramiko path"

    def test_revoked_keys_cert_authorities_and_wildcards_are_never_passed_on(self, tmp_path):
        revoked = f"{NAME} ssh-ed25519 {KEY_A}\n@revoked * ssh-ed25519 {KEY_A}\n"
        assert self.accepted(tmp_path, revoked) is None
        assert self.accepted(tmp_path, f"@cert-authority * ssh-ed25519 {KEY_A}\n") is None
        assert self.accepted(tmp_path, f"[10.0.0.*]:2222 ssh-ed25519 {KEY_A}\n") is None

    def test_two_keys_of_one_type_or_a_broken_key_leave_it_to_paramiko(self, tmp_path):
        assert self.accepted(tmp_path, f"{NAME} ssh-ed25519 {KEY_A}\n{NAME} ssh-ed25519 {KEY_B}\n") is None
        assert self.accepted(tmp_path, f"{NAME} ssh-ed25519 !!!\n") is None
        assert self.accepted(tmp_path, f"{NAME} ssh-rsa {KEY_A}\n") is None, "blob of another type"
        assert hostkeys.accepted(tmp_path / "missing", NAME, None) is None


def test_the_private_known_hosts_holds_exactly_the_accepted_keys(isolated_env, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{NAME},10.0.0.1 ssh-ed25519 {KEY_A}\n")
    path = hostkeys.private_file(kh, NAME, None)
    assert path is not None and path.read_text() == f"{NAME} ssh-ed25519 {KEY_A}\n"
    path.write_text(f"{NAME} ssh-ed25519 {KEY_B}\n")  # tampered: rewritten, not trusted
    assert hostkeys.private_file(kh, NAME, None).read_text() == f"{NAME} ssh-ed25519 {KEY_A}\n"


def test_diagnosis_loads_the_dump_parser_only_for_text_both_dump_headers_contain():
    for rx in (stackdump._THREAD_RE, stackdump._STACK_RE):
        assert re.escape(diagnosis._DUMP_HEADER).replace("\\ ", " ") in rx.pattern, rx.pattern


# --- the click-free command line takes only what click would read the same way ---------------

@pytest.mark.parametrize("argv, expected", [
    (["status", "--json"], {"as_json": True}),
    (["status"], {}),
    (["status", "--host", "pve1", "--ct", "0200", "--json"], {"host": "pve1", "ctid": 200, "as_json": True}),
    (["status", "--host=pve1", "--ct=201", "--accept-new-host-key"],
     {"host": "pve1", "ctid": 201, "accept_new_host_key": True}),
])
def test_a_plain_status_command_line_skips_click(argv, expected):
    base = {"host": None, "ctid": None, "accept_new_host_key": False, "job_id": None,
            "lines": statusonce.DEFAULT_LINES, "as_json": False}
    assert statusonce.parse(argv) == {**base, **expected}


@pytest.mark.parametrize("argv", [
    ["jobs"], ["status", "job-1"], ["status", "--follow"], ["status", "--json", "--json"],
    ["status", "--host"], ["status", "--host", "--json"], ["status", "--host="], ["status", "--ct", "-1"],
    ["status", "--ct", "2e2"], ["status", "--ct", "٢٠٠"], ["status", "--json=1"], ["status", "-n", "5"],
    ["status", "--help"], ["status", "--", "--json"], ["--version"],
])
def test_anything_else_is_parsed_by_click(argv):
    assert statusonce.parse(argv) is None


# --- the ssh call's own reader (os.posix_spawnp, no subprocess) --------------------------------

def _spawned(script: str, limit: float | None = 10.0) -> sshcall.SshCall:
    """An SshCall around ``sh -c script``, spawned as :func:`sshcall.start` spawns ssh."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.posix_spawnp("sh", ["sh", "-c", script], os.environ, file_actions=[
        (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)])
    os.close(out_w)
    os.close(err_w)
    return sshcall.SshCall(pid, out_r, err_r, "h", "cmd", ["pct", "exec"], limit, "agent status")


def test_the_call_collects_both_streams_and_the_exit_status():
    with _spawned("head -c 200000 /dev/zero; printf err >&2; exit 3") as call:
        result = call.result()
    assert result is not None
    assert (result.rc, len(result.stdout), result.stderr, result.via) == (3, 200000, b"err", "openssh")


def test_ssh_failing_itself_is_no_answer():
    with _spawned("exit 255") as call:
        assert call.result() is None


def test_no_answer_by_the_deadline_kills_ssh_and_says_so():
    call = _spawned("sleep 30", limit=0.3)
    with pytest.raises(errors.DeadlineExceeded, match=r"did not answer within 0\.3 s"), call:
        call.result()
    with pytest.raises(ChildProcessError):
        os.waitpid(call.pid, os.WNOHANG)  # killed and reaped


def test_a_call_left_uncollected_is_killed():
    with _spawned("sleep 30") as call:
        pass
    with pytest.raises(ChildProcessError):
        os.waitpid(call.pid, os.WNOHANG)


# --- through the sandbox --------------------------------------------------------------------

SPY = r"""
import json, os, sys
reply_only = ("dataclasses", "inspect", "subprocess", "opsctl.remote.transport",
              "opsctl.remote.leanreply", "opsctl.cli.jsonout", "remote_payload.wire")
before_ssh = []
def on_spawn(event, args):
    if event in ("os.posix_spawn", "subprocess.Popen") and not before_ssh \
            and os.path.basename(os.fsdecode(args[0])) == "ssh":
        before_ssh.append([m for m in reply_only if m in sys.modules])
sys.addaudithook(on_spawn)
from opsctl.remote import sshcall
results = []
real = sshcall.SshCall.result
def spy(self):
    r = real(self)
    results.append(None if r is None else {"rc": r.rc, "stdout": r.stdout.decode()})
    return r
sshcall.SshCall.result = spy
def exit_now(code):  # a status that succeeded ends with os._exit: report first
    raise SystemExit(code)
os._exit = exit_now
from opsctl.cli import main
sys.argv = ["opsctl", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
heavy = ("pydantic", "yaml", "paramiko", "fabric", "rich", "click")
sys.stderr.write("\nSPY " + json.dumps({
    "code": code, "loaded": [m for m in heavy if m in sys.modules], "ssh": results,
    "before_ssh": before_ssh}) + "\n")
"""


def _spied(*args: str) -> tuple[str, str, dict]:
    env = {**os.environ, "OPSCTL_MUX": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SPY, *args], capture_output=True, text=True,
                          env=env, timeout=60)
    err, spy = proc.stderr.rsplit("\nSPY ", 1)
    return proc.stdout, err, json.loads(spy)


@pytest.fixture
def deployed(sandbox, isolated_env: Path, tmp_path: Path):
    """A long job in ct 200 (a private root, so no other test's job), mux off."""
    from tests.sandbox_plugin import use_private_root

    use_private_root(sandbox, isolated_env, "/opt/opsctl-cold")
    book = tmp_path / "long.yaml"
    book.write_text(json.dumps({"name": "cold-status", "timeout_s": 60, "command": [
        "python3", "-c", "import time\nprint('x', flush=True)\ntime.sleep(120)\n"]}))
    res = CliRunner().invoke(cli, ["deploy", "--host", "sandbox", "--ct", "200", "--playbook",
                                   str(book), "--replace", "--no-wait"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    yield sandbox
    CliRunner().invoke(cli, ["stop", "--grace", "1"])


def test_the_first_status_goes_over_openssh_at_once_with_no_heavy_import_and_prints_the_full_paths_document(
        deployed, capsys):
    _spied("status", "--json")  # builds the reply shape cache (pydantic, once per OPSCTL_HOME)
    out, _, spy = _spied("status", "--json")
    assert spy["code"] == 0, out
    assert spy["loaded"] == [], f"the first status imported {spy['loaded']}"
    assert spy["before_ssh"] == [[]], "ssh starts before what only the reply needs is loaded"
    (result,) = spy["ssh"]
    assert result is not None and result["rc"] == 0, "it went over ssh"
    data = json.loads(result["stdout"].strip().splitlines()[-1])["data"]
    print_json(models.JobStatus.model_validate(data).model_dump(mode="json"))
    assert out == capsys.readouterr().out, "the same JSON document, byte for byte"
    assert json.loads(out)["name"] == "cold-status"


def test_a_refusal_over_openssh_is_the_full_paths_error_document(deployed, missing_ct, isolated_env):
    target = ("status", "--json", "--host", "sandbox", "--ct", str(missing_ct))
    cold, cold_err, spy = _spied(*target)
    assert spy["ssh"] and spy["ssh"][0] is not None, "pct's refusal came back over ssh"
    (isolated_env / "cache" / "targets.json").unlink()
    full, full_err, full_spy = _spied(*target)
    assert full_spy["ssh"] == [], "no cached target: the full path"
    assert spy["code"] == full_spy["code"] == errors.ContainerMissing.exit_code
    assert json.loads(cold) == json.loads(full)
    assert json.loads(cold)["error"]["type"] == "ContainerMissing"
    assert cold_err.strip() == full_err.strip()


def test_a_changed_host_key_is_refused_over_openssh_with_exit_12_and_the_full_paths_message(
        sandbox, isolated_env, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sandbox.port} " + " ".join(
        Path(f"{other}.pub").read_text().split()[:2]) + "\n")
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "h.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": sandbox.port, "user": "root", "known_hosts": str(known),
        "identity_file": str(sandbox.identity_file), "containers": {200: {}}}}}))
    full, full_err, full_spy = _spied("status", "--json", "--host", "h", "--ct", "200")
    assert full_spy["ssh"] == [], "no cached target yet: the full path, which caches it"
    cold, cold_err, cold_spy = _spied("status", "--json", "--host", "h", "--ct", "200")
    assert cold_spy["ssh"] == [None], "ssh refused the key, and the full path took over"
    assert cold_spy["code"] == full_spy["code"] == errors.HOST_KEY
    assert json.loads(cold) == json.loads(full)
    assert "CHANGED" in json.loads(cold)["error"]["message"]
    assert cold_err.strip() == full_err.strip()
