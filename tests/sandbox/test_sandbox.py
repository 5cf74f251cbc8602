"""The sandbox behaves like a Proxmox host: real sshd, real LXC containers, pct's contract.

Everything goes through the OpenSSH client against the sandbox sshd, with strict host key
checking, exactly as opsctl talks to a real node.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.errors import ConfigError
from opsctl.sandbox import host as sandbox_mod
from tests.sandbox_plugin import sandbox_home

NODE = socket.gethostname().split(".")[0]
PVE_ERROR = 255  # PVE::CLIHandler: exit(-1), or a Perl die with errno 0
ENOENT = 2  # pct's die after the cluster filesystem said ENOENT: Perl exits with errno
ENOTTY = 25  # the errno a real pct happens to leave when it dies on a stopped container
UTF8 = ["env", "LC_ALL=C.UTF-8"]  # real pct decodes argv with the session's locale
START_STOP_CT = 202  # only this module starts and stops it


def ssh(info: sandbox_mod.SandboxInfo, argv: list[str], stdin: bytes = b"",
        timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(info.ssh_argv(shlex.join(argv)), input=stdin, capture_output=True,
                          timeout=timeout, check=False)


def pct_exec(info: sandbox_mod.SandboxInfo, ctid: int, argv: list[str],
             stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return ssh(info, [*UTF8, "pct", "exec", str(ctid), "--", *argv], stdin=stdin)


# ---------------------------------------------------------------- the host


def test_pct_is_on_the_path_of_ssh_commands(sandbox):
    result = ssh(sandbox, ["sh", "-c", "command -v pct"])
    assert result.stdout.decode().strip() == str(sandbox.pct_path), result


def test_known_hosts_pins_the_host_key_that_ssh_keygen_reports(sandbox):
    line = sandbox.known_hosts_file.read_text()
    assert line.startswith(f"[127.0.0.1]:{sandbox.port} ssh-ed25519 "), line
    printed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f",
                              str(sandbox.state_dir / "ssh_host_ed25519_key.pub")],
                             capture_output=True, text=True, check=True).stdout
    assert printed.split()[1] == sandbox.host_key_fingerprint


def test_a_wrong_known_hosts_entry_is_refused(sandbox, tmp_path):
    other = tmp_path / "known_hosts"
    key = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                          str(tmp_path / "k")], check=True)
    assert key.returncode == 0
    blob = (tmp_path / "k.pub").read_text().split()[:2]
    other.write_text(f"[127.0.0.1]:{sandbox.port} {' '.join(blob)}\n")
    argv = [a.replace(str(sandbox.known_hosts_file), str(other)) for a in sandbox.ssh_argv("true")]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert result.returncode == 255, result
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr


def test_up_writes_the_inventory_entry(sandbox):
    doc = yaml.safe_load(sandbox.inventory_file.read_text())
    host = doc["hosts"]["sandbox"]
    # every container the sandbox has now, including those other tests made after the session
    # fixture ran (201 of `stopped_ct`): the fixture's value is a snapshot, the file is not
    sandbox = sandbox_mod.info(sandbox_home())
    assert host == {
        "address": "127.0.0.1", "port": sandbox.port, "user": "root",
        "identity_file": str(sandbox.identity_file), "known_hosts": str(sandbox.known_hosts_file),
        "host_key_fingerprint": sandbox.host_key_fingerprint,
        "containers": {ct: {"gpus": 0, "playbook": "dflash-cpu-smoke"} for ct in sandbox.containers},
        # the PyTorch index is unreachable here: the CPU build travels as a wheelhouse
        "torch_builds": {"cpu": {"wheelhouse": True}},
    }
    assert 200 in host["containers"]


def test_up_is_idempotent_and_fast_when_already_up(sandbox):
    started = time.monotonic()
    again = sandbox_mod.up(sandbox_home(), containers=(200,))
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"second up took {elapsed:.2f}s"
    assert (again.port, again.host_key_fingerprint) == (sandbox.port, sandbox.host_key_fingerprint)
    assert sandbox_mod.status(sandbox_home()).containers[200] == "running"


def test_a_stopped_container_up_never_started_leaves_the_sandbox_healthy(sandbox, stopped_ct):
    state = sandbox_mod.status(sandbox_home())
    assert state.containers[stopped_ct] == "stopped" and 200 in state.wanted_running
    assert stopped_ct not in state.wanted_running
    assert state.healthy, state
    sandbox_mod.up(sandbox_home(), containers=(200,))  # up leaves a stopped container alone
    again = sandbox_mod.status(sandbox_home())
    assert again.containers[stopped_ct] == "stopped" and again.healthy, again


def test_missing_prerequisites_are_named_with_the_apt_command(monkeypatch):
    monkeypatch.setattr(sandbox_mod, "_which", lambda tool: None)
    missing = sandbox_mod.check_prerequisites()
    assert any("`lxc-attach` is not installed: apt-get install -y lxc" in m for m in missing)
    assert any("`sshd` is not installed: apt-get install -y openssh-server" in m for m in missing)
    with pytest.raises(ConfigError) as err:
        sandbox_mod.up(Path("/nonexistent-opsctl-home"))
    assert "debootstrap" in err.value.message
    assert err.value.hint.startswith("apt-get install -y lxc lxc-templates debootstrap rsync")


# ---------------------------------------------------------------- pct exec


@pytest.mark.parametrize("code", [0, 1, 3, 42, 255])
def test_exec_passes_the_exit_code_through(sandbox, code):
    assert pct_exec(sandbox, 200, ["sh", "-c", f"exit {code}"]).returncode == code


def test_exec_reports_a_signal_death_as_128_plus_signal(sandbox):
    assert pct_exec(sandbox, 200, ["sh", "-c", "kill -9 $$"]).returncode == 137


HOSTILE = ["", " ", "a b", "'", '"', "\\", "$(id)", "`id`", "; rm -rf /tmp/x", "&& true",
           "a\nb", "*", "?[a]", "~", "-n", "--", "--keep-env", "ünï©ødé ✓", "\t\r", "$HOME"]


def _argv_echo(info: sandbox_mod.SandboxInfo, args: list[str]) -> list[str]:
    script = ("import os, sys; sys.stdout.buffer.write("
              "b'\\0'.join(os.fsencode(a) for a in sys.argv[1:]))")
    result = pct_exec(info, 200, ["python3", "-c", script, *args])  # under a UTF-8 locale
    assert result.returncode == 0, result
    return [b.decode("utf-8", "surrogateescape") for b in result.stdout.split(b"\0")] \
        if args else []


def test_exec_passes_hostile_argv_through_byte_exactly(sandbox):
    assert _argv_echo(sandbox, HOSTILE) == HOSTILE


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                        max_size=12), min_size=1, max_size=4))
def test_exec_round_trips_any_argv(sandbox, args):
    assert _argv_echo(sandbox, args) == args


def test_exec_passes_stdin_stdout_and_stderr_byte_exactly(sandbox):
    payload = bytes(range(256)) * 2048 + os.urandom(4096)
    result = pct_exec(sandbox, 200, ["sh", "-c", "cat; printf 'to-stderr\\n' >&2"], stdin=payload)
    assert result.returncode == 0
    assert result.stdout == payload
    assert result.stderr == b"to-stderr\n"


def test_exec_runs_in_the_containers_own_pid_namespace(sandbox):
    inside = pct_exec(sandbox, 200, ["readlink", "/proc/self/ns/pid"]).stdout.decode().strip()
    assert inside != os.readlink("/proc/self/ns/pid")
    init = pct_exec(sandbox, 200, ["cat", "/proc/1/comm"]).stdout.decode().strip()
    assert init == "systemd", init


def test_exec_runs_in_the_containers_own_rootfs(sandbox, tmp_path):
    marker = Path("/var/tmp") / f"opsctl-sandbox-marker-{uuid.uuid4().hex}"
    marker.write_text("host")
    try:
        assert pct_exec(sandbox, 200, ["test", "-e", str(marker)]).returncode == 1
    finally:
        marker.unlink()
    inside = f"/root/opsctl-marker-{uuid.uuid4().hex}"
    assert pct_exec(sandbox, 200, ["touch", inside]).returncode == 0
    assert not Path(inside).exists()
    pct_exec(sandbox, 200, ["rm", "-f", inside])


def test_exec_keeps_the_environment_unless_keep_env_is_0_even_on_pve_9(sandbox):
    cleared = ssh(sandbox, ["pct", "exec", "200", "--keep-env", "0", "--", "env"]).stdout
    default = pct_exec(sandbox, 200, ["env"]).stdout  # pct.pm: `keep-env // 1`, FIXME never done
    kept = ssh(sandbox, ["pct", "exec", "200", "--keep-env", "1", "--", "env"]).stdout
    assert b"SSH_CONNECTION=" not in cleared
    assert b"SSH_CONNECTION=" in default
    assert b"SSH_CONNECTION=" in kept
    assert sorted(cleared.decode().splitlines()) == [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=linux",
        "container=lxc"]


def test_exec_sets_term_linux_from_the_container_config_even_with_a_cleared_environment(sandbox):
    # PVE writes `lxc.environment = TERM=linux` into every container's config
    config = (sandbox.lxc_path / "200" / "config").read_text().splitlines()
    assert "lxc.environment = TERM=linux" in config
    result = ssh(sandbox, ["pct", "exec", "200", "--keep-env", "0", "--", "sh", "-c", "echo $TERM"])
    assert result.stdout == b"linux\n"


def test_exec_starts_commands_with_sigpipe_at_its_default(sandbox):
    status = pct_exec(sandbox, 200, ["grep", "SigIgn", "/proc/self/status"]).stdout.decode()
    ignored = int(status.split()[1], 16)
    assert not ignored & (1 << (13 - 1)), status  # SIGPIPE is signal 13
    # so a writer whose reader went away dies of SIGPIPE instead of writing on forever
    result = pct_exec(sandbox, 200, ["sh", "-c", "yes | head -c 1 >/dev/null; echo done"])
    assert result.stdout == b"done\n"


def test_exec_parses_options_in_permute_mode_until_double_dash(sandbox):
    # Getopt::Long: `-la` after the vmid is an option, not the command's argument
    bad = ssh(sandbox, ["pct", "exec", "200", "ls", "-la", "/"])
    assert bad.returncode == PVE_ERROR
    assert bad.stderr == (b"Unknown option: la\n400 unable to parse option\n"
                          b"pct exec <vmid> [<extra-args>] [OPTIONS]\n")
    assert ssh(sandbox, ["pct", "exec", "200", "--", "ls", "-la", "/"]).returncode == 0
    # options may come before the vmid, and a plain word needs no `--`
    before = ssh(sandbox, ["pct", "exec", "--keep-env", "0", "200", "--", "sh", "-c", "echo $TERM"])
    assert before.stdout == b"linux\n"
    assert ssh(sandbox, ["pct", "exec", "200", "true"]).returncode == 0


def test_exec_rejects_a_keep_env_value_that_is_not_a_boolean(sandbox):
    result = ssh(sandbox, ["pct", "exec", "200", "--keep-env", "maybe", "--", "true"])
    assert result.returncode == PVE_ERROR
    assert result.stderr.startswith(b"400 unable to parse boolean option\n")


def test_pve_container_before_5_0_9_has_no_keep_env(sandbox):
    old = ["env", "OPSCTL_SANDBOX_PVE_CONTAINER_VERSION=5.0.8"]
    result = ssh(sandbox, [*old, "pct", "exec", "200", "--keep-env", "0", "--", "true"])
    assert result.returncode == PVE_ERROR
    assert result.stderr.splitlines()[:2] == [b"Unknown option: keep-env",
                                              b"400 unable to parse option"]
    assert ssh(sandbox, [*old, "pct", "exec", "200", "--", "true"]).returncode == 0


def test_exec_decodes_argv_with_the_session_locale(sandbox):
    word = "ünï ✓"
    echo = ["pct", "exec", "200", "--", "printf", "%s", word]
    assert ssh(sandbox, ["env", "LC_ALL=C.UTF-8", *echo]).stdout == word.encode()
    # under the C locale every non-ASCII byte becomes U+FFFD, as Perl's decode('locale') does
    c_locale = ssh(sandbox, ["env", "LC_ALL=C", *echo]).stdout.decode()
    assert c_locale == "".join("\ufffd" * len(ch.encode()) if ord(ch) > 127 else ch for ch in word)


def test_the_container_runs_python_311_and_tmux(sandbox):
    result = pct_exec(sandbox, 200, ["sh", "-c", "python3 --version && tmux -V"])
    assert result.returncode == 0, result
    assert result.stdout.decode().startswith("Python 3.11."), result.stdout
    assert b"tmux 3" in result.stdout


def test_the_container_reaches_services_on_host_loopback(sandbox):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"hello from the host\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    script = (f"import socket; s = socket.create_connection(('127.0.0.1', {port}), 5); "
              "print(s.recv(100).decode(), end='')")
    result = pct_exec(sandbox, 200, ["python3", "-c", script])
    server.close()
    assert result.stdout == b"hello from the host\n", result


# ---------------------------------------------------------------- pct errors


def test_exec_in_a_missing_container_says_its_config_does_not_exist_and_exits_2(sandbox, missing_ct):
    result = pct_exec(sandbox, missing_ct, ["true"])
    assert result.returncode == ENOENT
    assert result.stderr.decode() == \
        f"Configuration file 'nodes/{NODE}/lxc/{missing_ct}.conf' does not exist\n"
    assert result.stdout == b""


def test_exec_in_a_stopped_container_says_not_running(sandbox, stopped_ct):
    result = pct_exec(sandbox, stopped_ct, ["true"])
    assert result.returncode == ENOTTY  # errno-dependent on a real host: never rely on it
    assert result.stderr.decode() == f"container '{stopped_ct}' not running!\n"
    assert result.stdout == b""


def test_exec_without_a_command_is_refused_with_perls_location_suffix(sandbox):
    result = ssh(sandbox, ["pct", "exec", "200"])
    assert (result.returncode, result.stderr) == (
        PVE_ERROR, b"missing command at /usr/share/perl5/PVE/CLI/pct.pm line 246.\n")


def test_an_unknown_verb_prints_usage_and_exits_255(sandbox):
    result = ssh(sandbox, ["pct", "frobnicate", "200"])
    assert result.returncode == PVE_ERROR
    lines = result.stderr.decode().splitlines()
    assert lines[:2] == ["ERROR: unknown command 'pct frobnicate'",
                         "USAGE: pct <COMMAND> [ARGS] [OPTIONS]"]
    assert "       pct exec <vmid> [<extra-args>] [OPTIONS]" in lines


def test_a_bad_vmid_fails_parameter_verification(sandbox):
    result = ssh(sandbox, ["pct", "status", "abc"])
    assert result.returncode == PVE_ERROR
    assert result.stderr.decode().startswith(
        "400 Parameter verification failed.\nvmid: type check ('integer') failed - got 'abc'\n")


# ---------------------------------------------------------------- status, list, push, pull


def test_status_says_running_or_stopped(sandbox, stopped_ct):
    assert ssh(sandbox, ["pct", "status", "200"]).stdout == b"status: running\n"
    assert ssh(sandbox, ["pct", "status", str(stopped_ct)]).stdout == b"status: stopped\n"


def test_status_of_a_missing_container_fails_like_proxmox(sandbox, missing_ct):
    result = ssh(sandbox, ["pct", "status", str(missing_ct)])
    assert result.returncode == ENOENT
    assert b"does not exist" in result.stderr


def test_list_prints_proxmox_table(sandbox, stopped_ct):
    result = ssh(sandbox, ["pct", "list"])
    lines = result.stdout.decode().splitlines()
    assert lines[0] == f"{'VMID':<10} {'Status':<10} {'Lock':<12} {'Name':<20}"
    assert f"{'200':<10} {'running':<10} {'':<12} {'200':<20}" in lines
    assert f"{stopped_ct:<10} {'stopped':<10} {'':<12} {stopped_ct!s:<20}" in lines


def test_push_then_pull_round_trips_bytes_and_perms(sandbox, tmp_path):
    src = tmp_path / "blob"
    src.write_bytes(os.urandom(300_000))
    dest = f"/root/pushed-{uuid.uuid4().hex}"
    pushed = ssh(sandbox, ["pct", "push", "200", str(src), dest, "--perms", "0640"])
    assert pushed.returncode == 0, pushed
    mode = pct_exec(sandbox, 200, ["stat", "-c", "%a", dest]).stdout.decode().strip()
    assert mode == "640"
    back = tmp_path / "back"
    assert ssh(sandbox, ["pct", "pull", "200", dest, str(back)]).returncode == 0
    assert back.read_bytes() == src.read_bytes()
    pct_exec(sandbox, 200, ["rm", "-f", dest])


def test_push_to_a_stopped_container_is_refused(sandbox, stopped_ct, tmp_path):
    src = tmp_path / "f"
    src.write_text("x")
    result = ssh(sandbox, ["pct", "push", str(stopped_ct), str(src), "/root/f"])
    assert (result.returncode, result.stderr) == \
        (ENOTTY, b"can only push files to a running CT\n")


def test_a_container_the_sandbox_starts_has_finished_booting(sandbox):
    """What a test puts in /tmp right after the start stays: the container's boot empties /tmp
    (systemd-tmpfiles, `D /tmp`), and once wiped a fresh opsctl root mid-deploy. Asked straight
    through lxc-attach (milliseconds), not ssh, so a boot still under way is seen."""
    ct = sandbox_mod.ensure_container(START_STOP_CT, running=False, home=sandbox_home())

    def attach(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["lxc-attach", "-P", str(sandbox.lxc_path), "-n", str(ct),
                               "--clear-env", "--", *argv], capture_output=True, text=True,
                              timeout=30, check=False)

    try:
        sandbox_mod.ensure_container(ct, running=True, home=sandbox_home())
        assert attach("systemctl", "is-system-running").stdout in ("running\n", "degraded\n")
        assert attach("sh", "-c", "mkdir -p /tmp/early/deep && echo kept > /tmp/early/deep/f"
                      ).returncode == 0
        assert pct_exec(sandbox, ct, ["cat", "/tmp/early/deep/f"]).stdout == b"kept\n"
    finally:
        sandbox_mod.ensure_container(ct, running=False, home=sandbox_home())


def test_start_and_stop_change_the_status(sandbox):
    ct = str(sandbox_mod.ensure_container(START_STOP_CT, running=False, home=sandbox_home()))
    assert ssh(sandbox, ["pct", "start", ct]).returncode == 0
    assert ssh(sandbox, ["pct", "status", ct]).stdout == b"status: running\n"
    again = ssh(sandbox, ["pct", "start", ct])
    assert (again.returncode, again.stderr) == (ENOTTY, f"CT {ct} already running\n".encode())
    assert ssh(sandbox, ["pct", "stop", ct]).returncode == 0
    assert ssh(sandbox, ["pct", "status", ct]).stdout == b"status: stopped\n"
    twice = ssh(sandbox, ["pct", "stop", ct])
    assert (twice.returncode, twice.stderr) == (ENOTTY, f"CT {ct} not running\n".encode())
