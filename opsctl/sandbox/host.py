"""A local emulated Proxmox host: loopback sshd + real LXC containers + a `pct` stand-in.

``up()`` makes this machine answer like a Proxmox node: an OpenSSH server on 127.0.0.1 (own
host key, own client key, free port) whose sessions find ``pct`` on their PATH, and real LXC
containers (Debian's ``lxc`` + ``debootstrap``, own rootfs and PID namespace) that share the
host network so they reach 127.0.0.1 services like a bridged Proxmox container would.
Everything lives in ``$OPSCTL_HOME/sandbox/`` (containers in its own lxcpath, so several
sandboxes never clash) and ``up`` writes ``$OPSCTL_HOME/inventory/sandbox.yaml`` so every
command works against it exactly as against a real host.

Layout of the state dir::

    sshd_config  ssh_host_ed25519_key  id_ed25519  authorized_keys  known_hosts  sshd.pid
    bin/pct      lxc/base (template, never started)  lxc/<ctid>  sandbox.json  .lock
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import typing as t
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from opsctl.config import paths
from opsctl.config.sudoers import sudoers_rule
from opsctl.errors import ConfigError, ContainerError, OpsctlError
from remote_payload import safe_write, wire

HOST = "127.0.0.1"
USER = "root"
DEFAULT_CONTAINERS: tuple[int, ...] = (200,)
#: The inventory name of the sandbox's direct target: the same loopback sshd, commands run on
#: this machine itself (``enter: direct``), next to the containers of ``sandbox``.
DIRECT_HOST = "sandbox-direct"
BASE = "base"  # template container; real ones are cheap `lxc-copy`s of it
RELEASE = "bookworm"
PACKAGES = ("python3", "python3-venv", "tmux", "procps")
# Installed on first start (kept apart so existing sandboxes catch up): torch.compile on CPU
# needs a C++ compiler in the container, as inductor builds its kernels there; `opsctl push`
# and `pull` use rsync when the container has it (opsctl/remote/filesync.py), as most
# Proxmox templates do not by default (their tar fallback is tested with a switch).
LATE_PACKAGES = ("g++", "python3-dev", "rsync")
_LATE_MARKER = "var/lib/opsctl-sandbox-packages"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
APT_INSTALL = ("apt-get install -y lxc lxc-templates debootstrap rsync distro-info wget "
               "openssh-server openssh-client tmux")
PCT_SOURCE = Path(__file__).with_name("pct.py")
# Units that must not run in a container sharing the host's network namespace: its sshd
# would bind the host's port 22, and ifupdown would act on the host's interfaces.
MASKED_UNITS = ("ssh.service", "sshd.service", "ssh.socket", "networking.service",
                "apt-daily.timer", "apt-daily-upgrade.timer")
SSHD_START_TIMEOUT_S = 10.0
PVE_CONFIG_LINES = ("lxc.environment = TERM=linux",)
CONTAINER_BOOT_TIMEOUT_S = 60  # a loaded 2-core machine booting three sandboxes at once
#: `systemctl is-system-running` states after boot: "degraded" is booted with a failed unit
BOOTED_STATES = frozenset({"running", "degraded"})
#: states that waiting longer will not turn into a booted container. "offline" is not one:
#: systemctl prints it when it cannot reach PID 1's bus, as right after ``lxc-start`` (PID 1
#: not yet up) or while a container stopped a moment ago is still going away (``sandbox
#: down`` then ``up`` at once), so it is asked again like "Failed to connect to bus"
FAILED_BOOT_STATES = frozenset({"maintenance", "stopping"})


@dataclass(frozen=True)
class SandboxInfo:
    """How to reach the sandbox host; everything a transport or a test needs."""

    port: int
    identity_file: Path
    known_hosts_file: Path
    host_key_fingerprint: str  # "SHA256:..." as OpenSSH prints it
    containers: tuple[int, ...]
    pct_path: Path
    state_dir: Path
    lxc_path: Path
    inventory_file: Path
    host: str = HOST
    user: str = USER

    def ssh_argv(self, command: str | None = None) -> list[str]:
        """argv for the OpenSSH client, strict host key checking against our known_hosts."""
        argv = ["ssh", "-i", str(self.identity_file), "-p", str(self.port),
                "-o", f"UserKnownHostsFile={self.known_hosts_file}",
                "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
                f"{self.user}@{self.host}"]
        return argv if command is None else [*argv, command]


@dataclass(frozen=True)
class SandboxStatus:
    """Liveness of a sandbox that was set up: sshd and each container's LXC state."""

    info: SandboxInfo
    sshd_running: bool
    containers: dict[int, str]  # ctid -> "running" | "stopped"
    #: the containers ``up`` was asked to run (and not asked to stop since)
    wanted_running: tuple[int, ...] = DEFAULT_CONTAINERS

    @property
    def healthy(self) -> bool:
        """sshd runs and so does every container ``up`` was asked to run. Any other container
        may be stopped, as on a Proxmox host: one made stopped for a test, or one that a
        ``pct stop`` stopped, is no fault of the sandbox."""
        return self.sshd_running and all(
            self.containers.get(c) == "running" for c in self.wanted_running)


@dataclass(frozen=True)
class _Layout:
    """Every path of one sandbox, derived from its state dir."""

    home: Path
    state_dir: Path

    @classmethod
    def of(cls, home: Path | None) -> _Layout:
        root = opsctl_home(home)
        return cls(home=root, state_dir=root / "sandbox")

    def __getattr__(self, name: str) -> Path:
        files = {"lxc_path": "lxc", "bin_dir": "bin", "pct_path": "bin/pct",
                 "sshd_config": "sshd_config", "host_key": "ssh_host_ed25519_key",
                 "client_key": "id_ed25519", "authorized_keys": "authorized_keys",
                 "known_hosts": "known_hosts", "pid_file": "sshd.pid", "sshd_log": "sshd.log",
                 "lock_file": ".lock", "state_file": "sandbox.json"}
        if name not in files:
            raise AttributeError(name)
        return self.state_dir / files[name]

    @property
    def inventory_file(self) -> Path:
        return self.home / "inventory" / "sandbox.yaml"


def opsctl_home(home: Path | None = None) -> Path:
    """``home``, else opsctl's own (``$OPSCTL_HOME``, else ``~/.opsctl``)."""
    return Path(home).absolute() if home is not None else paths.home().absolute()


# ---------------------------------------------------------------- prerequisites


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}")


def check_prerequisites() -> list[str]:
    """What this machine lacks to run the sandbox, each as an actionable sentence."""
    missing: list[str] = []
    if os.geteuid() != 0:
        missing.append("the sandbox needs root (LXC containers and sshd): run it as root "
                       "or with sudo")
    tools = {"lxc-create": "lxc", "lxc-attach": "lxc", "lxc-copy": "lxc",
             "lxc-start": "lxc", "lxc-info": "lxc", "debootstrap": "debootstrap",
             "rsync": "rsync",  # the debian template and lxc-copy copy rootfs with it
             "sshd": "openssh-server", "ssh-keygen": "openssh-client", "ssh": "openssh-client"}
    for tool, package in tools.items():
        if _which(tool) is None:
            missing.append(f"`{tool}` is not installed: apt-get install -y {package}")
    if not Path("/usr/share/lxc/templates/lxc-debian").is_file():
        missing.append("the LXC debian template /usr/share/lxc/templates/lxc-debian is "
                       "missing: apt-get install -y lxc-templates (or lxc)")
    return missing


def _require_prerequisites() -> None:
    missing = check_prerequisites()
    if missing:
        raise ConfigError("sandbox prerequisites missing: " + "; ".join(missing),
                          hint=f"{APT_INSTALL}  (as root)")


# ---------------------------------------------------------------- public API


def up(home: Path | None = None,
       containers: Sequence[int] = DEFAULT_CONTAINERS,
       template_from: Path | None = None) -> SandboxInfo:
    """Bring the sandbox up (idempotent): keys, sshd, pct, running containers, inventory.

    Reuses what exists: a second call only checks liveness (well under 2 s). A dead sshd or
    a stopped container is started again. ``template_from`` names another sandbox home whose
    template this one copies instead of building its own (the test suite's parallel workers:
    one debootstrap and one apt run for all of them, made under that sandbox's lock).

    Raises:
        ConfigError: prerequisites are missing (not root, lxc/sshd/debootstrap absent).
        ContainerError: creating or starting a container failed (log path attached).
        OpsctlError: sshd did not come up (its log path attached).
    """
    _require_prerequisites()
    layout = _Layout.of(home)
    source = _Layout.of(template_from) if template_from is not None else None
    with _locked(layout):
        _ensure_keys(layout)
        _install_pct(layout)
        if source is not None and source.lxc_path != layout.lxc_path:
            _ensure_base(layout, source)
        for ctid in containers:
            _ensure_container(layout, _ctid(ctid), running=True)
            _want_running(layout, _ctid(ctid), True)
        port = _ensure_sshd(layout)
        info = _make_info(layout, port)
        write_inventory(info, layout.home)
        return info


def ensure_container(ctid: int, running: bool = True, home: Path | None = None) -> int:
    """Make container ``ctid`` exist in the sandbox and be running or stopped; returns it.

    A new container is an ``lxc-copy`` of the sandbox's template (about 2 s).

    Raises:
        ConfigError: prerequisites missing or ``ctid`` below 100.
        ContainerError: LXC failed (log path attached).
    """
    _require_prerequisites()
    layout = _Layout.of(home)
    ctid = _ctid(ctid)
    with _locked(layout):
        _ensure_container(layout, ctid, running=running)
        state = _read_state(layout)
        if "port" in state:
            write_inventory(_make_info(layout, int(state["port"])), layout.home)
    return ctid


def remove_container(ctid: int, home: Path | None = None) -> None:
    """Stop and delete container ``ctid`` if it exists (e.g. to test a missing container)."""
    layout = _Layout.of(home)
    with _locked(layout):
        if _container_exists(layout, str(ctid)):
            _lxc(layout, "lxc-stop", str(ctid), "--kill", check=False)
            _lxc(layout, "lxc-destroy", str(ctid))
        _want_running(layout, ctid, False)


def down(home: Path | None = None) -> None:
    """Stop the containers and sshd; keep keys, containers and inventory for the next up.

    Waits for a template being made or copied (another sandbox copying this one's) to be
    done: stopping it midway would leave a half-made template behind."""
    layout = _Layout.of(home)
    if not layout.state_dir.is_dir():
        return
    with _locked(layout), _locked(layout, "template.lock"):
        for name in _container_names(layout, include_base=True):
            if _container_state(layout, name) == "running":
                _lxc(layout, "lxc-stop", name, "--kill", check=False)
        end_direct_sessions(home)
        _stop_sshd(layout)


def end_direct_sessions(home: Path | None = None) -> list[str]:
    """End the tmux sessions of the direct target's jobs (they run on this machine, so
    stopping the containers does not end them): those whose directory is under its root.
    Returns the sessions ended."""
    tmux = _which("tmux")
    if tmux is None:
        return []
    socket = wire.DEFAULT_TMUX_SOCKET
    root = str(direct_root(_Layout.of(home).state_dir)) + "/"
    ended = []
    listed = subprocess.run([tmux, "-L", socket, "list-sessions", "-F",
                             "#{session_path}\t#{session_name}"],
                            capture_output=True, text=True, check=False, timeout=10)
    for line in listed.stdout.splitlines():
        path, _, name = line.partition("\t")
        if (path + "/").startswith(root) and name:
            subprocess.run([tmux, "-L", socket, "kill-session", "-t", f"={name}"],
                           capture_output=True, check=False, timeout=10)
            ended.append(name)
    return ended


def destroy(home: Path | None = None) -> None:
    """Remove everything: containers, sshd, keys, sudo user, state dir and the inventory entry."""
    layout = _Layout.of(home)
    _remove_sudo_user(layout)
    if layout.state_dir.is_dir():
        down(home)
        with _locked(layout):
            for name in _container_names(layout, include_base=True):
                _lxc(layout, "lxc-destroy", name, check=False)
        shutil.rmtree(layout.state_dir, ignore_errors=True)
    layout.inventory_file.unlink(missing_ok=True)


def sudo_user_name(state_dir: Path) -> str:
    """The sandbox's non-root SSH user (one per sandbox: user names are machine-wide)."""
    return "opsctl-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]


def ensure_sudo_user(home: Path | None = None) -> str:
    """A non-root SSH user whose sudoers rule is exactly the one the docs give for a Proxmox
    node (:func:`opsctl.config.sudoers.sudoers_rule`: the pct subcommands opsctl runs), with
    the stand-in's path; it logs in with the sandbox's client key. Returns the user name.

    Raises:
        ConfigError: sudo is not installed, or the sandbox was never brought up.
    """
    layout = _Layout.of(home)
    if _which("sudo") is None or _which("visudo") is None:
        raise ConfigError("the sandbox's non-root user needs sudo: apt-get install -y sudo")
    if not layout.pct_path.is_file():
        raise ConfigError("the sandbox is not set up", hint="opsctl sandbox up")
    name = sudo_user_name(layout.state_dir)
    with _locked(layout):
        if subprocess.run(["id", "-u", name], capture_output=True, check=False).returncode != 0:
            # password "*": no password login, but not "locked" (sshd refuses locked accounts);
            # home in /home: the sandbox home may sit in a directory only root can enter
            _run(["useradd", "--system", "--create-home", "--home-dir", f"/home/{name}",
                  "--shell", "/bin/sh", "--password", "*", name])
        ssh_dir = Path(f"/home/{name}/.ssh")
        ssh_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(layout.authorized_keys, ssh_dir / "authorized_keys")
        _run(["chown", "-R", f"{name}:", str(ssh_dir)])
        rule = sudoers_rule(name, str(layout.pct_path)) + "\n"
        sudoers = _sudoers_file(layout)
        if not sudoers.is_file() or sudoers.read_text() != rule:
            tmp = sudoers.with_name(f".{sudoers.name}.tmp")  # sudo skips names with a dot
            tmp.write_text(rule)
            tmp.chmod(0o440)
            _run(["visudo", "-c", "-q", "-f", str(tmp)])
            os.replace(tmp, sudoers)
    return name


def _sudoers_file(layout: _Layout) -> Path:
    return Path("/etc/sudoers.d") / sudo_user_name(layout.state_dir)


def _remove_sudo_user(layout: _Layout) -> None:
    _sudoers_file(layout).unlink(missing_ok=True)
    name = sudo_user_name(layout.state_dir)
    if subprocess.run(["id", "-u", name], capture_output=True, check=False).returncode == 0:
        _run(["userdel", "--remove", name], check=False)


def info(home: Path | None = None) -> SandboxInfo | None:
    """What ``up`` set up last, or None; does not check liveness (see ``status``)."""
    layout = _Layout.of(home)
    state = _read_state(layout)
    if "port" not in state or not layout.client_key.is_file():
        return None
    return _make_info(layout, int(state["port"]))


def status(home: Path | None = None) -> SandboxStatus | None:
    """Liveness of sshd and of each container, or None when the sandbox was never set up."""
    current = info(home)
    if current is None:
        return None
    layout = _Layout.of(home)
    states = {ctid: _container_state(layout, str(ctid)) for ctid in current.containers}
    return SandboxStatus(info=current, sshd_running=_sshd_pid(layout) is not None,
                         containers=states, wanted_running=_wanted_running(layout))


def direct_root(state_dir: Path) -> Path:
    """The opsctl root of the sandbox's direct host (:data:`DIRECT_HOST`): on this machine,
    inside the sandbox's own state dir."""
    return state_dir / "direct-root"


def write_inventory(info: SandboxInfo, home: Path | None = None) -> Path:
    """Write ``<home>/inventory/sandbox.yaml`` for ``info`` (tests point other homes at it)."""
    path = opsctl_home(home) / "inventory" / "sandbox.yaml"
    lines = ["# written by `opsctl sandbox up`; rewritten on every up",
             "hosts:", "  sandbox:", f"    address: {info.host}", f"    port: {info.port}",
             f"    user: {info.user}", f"    identity_file: {info.identity_file}",
             f"    known_hosts: {info.known_hosts_file}",
             f'    host_key_fingerprint: "{info.host_key_fingerprint}"', "    containers:"]
    lines += [f"      {ctid}: {{gpus: 0, playbook: dflash-cpu-smoke}}" for ctid in info.containers]
    # the PyTorch index is out of reach here: the CPU build comes as a wheelhouse from this
    # machine's pip (which finds torch==2.13.0 in its local cache)
    lines += ["    torch_builds:", "      cpu: {wheelhouse: true}"]
    # the same sshd as a plain SSH server: commands run on this machine itself, with an
    # opsctl root private to this sandbox (never this machine's /opt/opsctl)
    lines += [f"  {DIRECT_HOST}:", f"    address: {info.host}", f"    port: {info.port}",
              f"    user: {info.user}", f"    identity_file: {info.identity_file}",
              f"    known_hosts: {info.known_hosts_file}",
              f'    host_key_fingerprint: "{info.host_key_fingerprint}"', "    enter: direct",
              f"    root: {direct_root(info.state_dir)}",
              "    target: {gpus: 0, playbook: dflash-cpu-smoke}",
              "    torch_builds:", "      cpu: {wheelhouse: true}"]
    _write_atomic(path, "\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------- keys, pct, state


@contextlib.contextmanager
def _locked(layout: _Layout, name: str | None = None) -> Iterator[None]:
    """One process at a time changes a sandbox (parallel test sessions share one); ``name``:
    a lock file of its own in the state dir, for a part other sandboxes use (its template)."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    with open(layout.state_dir / name if name else layout.lock_file, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ctid(ctid: int) -> int:
    if isinstance(ctid, bool) or not isinstance(ctid, int) or ctid < 100:
        raise ConfigError(f"container id must be an integer >= 100, got {ctid!r}")
    return ctid


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """The inventory entry, keys and sshd config: :func:`safe_write.write_text`."""
    safe_write.write_text(path, text, mode=mode, make_parents=True)


def _read_state(layout: _Layout) -> dict[str, t.Any]:
    try:
        data = json.loads(layout.state_file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(layout: _Layout, **changes: t.Any) -> None:
    """Change some keys of ``sandbox.json`` and keep the others (the port, the containers
    ``up`` runs); the caller holds the sandbox's lock."""
    _write_atomic(layout.state_file, json.dumps({**_read_state(layout), **changes}) + "\n")


def _wanted_running(layout: _Layout) -> tuple[int, ...]:
    """The containers ``up`` was asked to run; a sandbox.json without the record (or with a
    damaged one) means :data:`DEFAULT_CONTAINERS`."""
    listed = _read_state(layout).get("wanted_running")
    if not isinstance(listed, list):
        return DEFAULT_CONTAINERS
    return tuple(sorted({c for c in listed if isinstance(c, int) and not isinstance(c, bool)}))


def _want_running(layout: _Layout, ctid: int, wanted: bool) -> None:
    """Record that ``up`` runs ``ctid`` (or, asked stopped or removed, no longer does)."""
    now = set(_wanted_running(layout))
    if (ctid in now) != wanted:
        _write_state(layout, wanted_running=sorted(now ^ {ctid}))


def _run(argv: Sequence[str], *, log: Path | None = None, timeout: float | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": SYSTEM_PATH, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(list(argv), capture_output=True, text=True, env=env,
                            timeout=timeout, check=False)
    if log is not None:
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}[rc={result.returncode}]\n")
    if check and result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise ContainerError(f"`{' '.join(argv)}` failed (rc={result.returncode}): "
                             + " | ".join(tail),
                             log_path=str(log) if log else None)
    return result


def _ensure_keys(layout: _Layout) -> None:
    layout.state_dir.chmod(0o755)
    for key, comment in ((layout.host_key, "opsctl-sandbox-host"),
                         (layout.client_key, "opsctl-sandbox-client")):
        if not key.is_file() or not key.with_suffix(".pub").is_file():
            key.unlink(missing_ok=True)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
    pub = layout.client_key.with_suffix(".pub").read_text()
    if not layout.authorized_keys.is_file() or layout.authorized_keys.read_text() != pub:
        _write_atomic(layout.authorized_keys, pub, 0o600)


def _host_key_line(layout: _Layout) -> tuple[str, str]:
    """(``ssh-ed25519 AAAA...``, ``SHA256:...``) of the sandbox host key."""
    keytype, blob = layout.host_key.with_suffix(".pub").read_text().split()[:2]
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return f"{keytype} {blob}", "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _install_pct(layout: _Layout) -> None:
    """Copy (not link) pct into bin/, so it finds the lxcpath next to itself."""
    source = PCT_SOURCE.read_bytes()
    if not layout.pct_path.is_file() or layout.pct_path.read_bytes() != source:
        layout.bin_dir.mkdir(parents=True, exist_ok=True)
        tmp = layout.pct_path.with_name(".pct.tmp")
        tmp.write_bytes(source)
        tmp.chmod(0o755)
        os.replace(tmp, layout.pct_path)


def _make_info(layout: _Layout, port: int) -> SandboxInfo:
    _, fingerprint = _host_key_line(layout)
    ctids = tuple(sorted(int(n) for n in _container_names(layout)))
    return SandboxInfo(port=port, identity_file=layout.client_key,
                       known_hosts_file=layout.known_hosts, host_key_fingerprint=fingerprint,
                       containers=ctids, pct_path=layout.pct_path, state_dir=layout.state_dir,
                       lxc_path=layout.lxc_path, inventory_file=layout.inventory_file)


# ---------------------------------------------------------------- sshd


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    """Nobody listens on ``port``. Connections still open to a previous sshd do not count:
    sshd binds with SO_REUSEADDR too, so a restart keeps the inventory's port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _sshd_pid(layout: _Layout) -> int | None:
    """PID of *our* sshd (pid file + cmdline naming our config), else None."""
    try:
        pid = int(layout.pid_file.read_text().strip())
        # sshd rewrites its title ("sshd: /usr/sbin/sshd -f <config> ... [listener]").
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return None
    return pid if b"-f " + str(layout.sshd_config).encode() + b" " in cmdline + b" " else None


def _sshd_config(layout: _Layout, port: int) -> str:
    # SHLVL=1: bash sources ~/.bashrc for a command sshd runs only when it is the top-level
    # shell (bash's shell.c: ``run_by_ssh ... && shell_level < 2``). The sandbox stands in for a
    # Proxmox host, whose root has a stock start-up; this machine's root may not (a pyenv
    # ``init`` costs ~0.2 s of CPU per remote command and its rehash races, printing to stderr).
    env = (f"PATH={layout.bin_dir}:{SYSTEM_PATH} OPSCTL_SANDBOX_LXCPATH={layout.lxc_path} "
           "SHLVL=1")
    return "\n".join([
        "# opsctl sandbox sshd: loopback only, key auth only, pct on PATH",
        f"Port {port}", f"ListenAddress {HOST}", f"HostKey {layout.host_key}",
        f"PidFile {layout.pid_file}",
        # the sudo user reads its own copy (sshd opens the file as the user)
        f"AuthorizedKeysFile {layout.authorized_keys} .ssh/authorized_keys",
        f"AllowUsers root {sudo_user_name(layout.state_dir)}", "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        # The state dir may sit under a world-writable /tmp (pytest); the keys are ours.
        "StrictModes no",
        # Tests and `status --follow` open many short connections at once.
        "MaxSessions 100", "MaxStartups 200:30:400", "LoginGraceTime 30", "UseDNS no",
        "PrintMotd no", "PrintLastLog no", "Subsystem sftp internal-sftp",
        f"SetEnv {env}", "",
    ])


def _ensure_sshd(layout: _Layout) -> int:
    state = _read_state(layout)
    port = int(state.get("port", 0))
    pid = _sshd_pid(layout)
    config_ok = port and layout.sshd_config.is_file() and \
        layout.sshd_config.read_text() == _sshd_config(layout, port)
    if pid is not None and config_ok:
        _write_known_hosts(layout, port)
        return port
    if pid is not None:
        _stop_sshd(layout)
    if not port or not _port_free(port):
        port = _free_port()
    _write_atomic(layout.sshd_config, _sshd_config(layout, port))
    _write_state(layout, port=port)
    _write_known_hosts(layout, port)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    sshd = _which("sshd") or "/usr/sbin/sshd"
    _run([sshd, "-t", "-f", str(layout.sshd_config)], log=layout.sshd_log)
    layout.pid_file.unlink(missing_ok=True)
    # sshd daemonizes itself; it outlives this process (and test sessions) on purpose.
    _run([sshd, "-f", str(layout.sshd_config), "-E", str(layout.sshd_log)], log=layout.sshd_log)
    deadline = time.monotonic() + SSHD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _sshd_pid(layout) is not None and _accepts(port):
            return port
        time.sleep(0.05)
    raise OpsctlError(f"sandbox sshd did not start on {HOST}:{port}",
                      hint=f"see {layout.sshd_log}", log_path=str(layout.sshd_log))


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def _write_known_hosts(layout: _Layout, port: int) -> None:
    key, _ = _host_key_line(layout)
    text = f"[{HOST}]:{port} {key}\n"
    if not layout.known_hosts.is_file() or layout.known_hosts.read_text() != text:
        _write_atomic(layout.known_hosts, text)


def _stop_sshd(layout: _Layout) -> None:
    pid = _sshd_pid(layout)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    layout.pid_file.unlink(missing_ok=True)


# ---------------------------------------------------------------- containers


def _lxc(layout: _Layout, tool: str, name: str, *args: str,
         check: bool = True, timeout: float | None = 600) -> subprocess.CompletedProcess[str]:
    log = layout.state_dir / "lxc.log"
    return _run([tool, "-P", str(layout.lxc_path), "-n", name, *args],
                log=log if check else None, timeout=timeout, check=check)


def _container_exists(layout: _Layout, name: str) -> bool:
    return (layout.lxc_path / name / "config").is_file()


def _container_names(layout: _Layout, include_base: bool = False) -> list[str]:
    if not layout.lxc_path.is_dir():
        return []
    return sorted(p.name for p in layout.lxc_path.iterdir()
                  if (p.name.isdigit() or (include_base and p.name == BASE))
                  and (p / "config").is_file())


def _container_state(layout: _Layout, name: str) -> str:
    if not _container_exists(layout, name):
        return "missing"
    out = _lxc(layout, "lxc-info", name, "-s", "-H", check=False).stdout.strip()
    return "running" if out == "RUNNING" else "stopped"


def _ensure_container(layout: _Layout, ctid: int, running: bool) -> None:
    name = str(ctid)
    if not _container_exists(layout, name):
        _ensure_base(layout)
        shutil.rmtree(layout.lxc_path / name, ignore_errors=True)  # a half-made copy
        _lxc(layout, "lxc-copy", BASE, "-N", name)
    _ensure_pve_config_lines(layout.lxc_path / name / "config")
    if not running:  # asked stopped: no longer one the sandbox's health counts
        _want_running(layout, ctid, False)
    state = _container_state(layout, name)
    if running and state != "running":
        _start(layout, name)
    if running:
        _ensure_late_packages(layout, name)
    elif not running and state == "running":
        _lxc(layout, "lxc-stop", name, "--kill")


def _start(layout: _Layout, name: str) -> None:
    _lxc(layout, "lxc-start", name)
    _lxc(layout, "lxc-wait", name, "-s", "RUNNING", "-t", "10")
    _wait_booted(layout, name)


def _wait_booted(layout: _Layout, name: str) -> None:
    """Return once the container's systemd has finished booting.

    Until then its ``systemd-tmpfiles-setup`` may still empty /tmp (Debian's tmp.conf:
    ``D /tmp``, removed at boot), taking with it whatever a caller put there right away: a
    test's opsctl root half-deleted under a running deploy. ``systemctl is-system-running
    --wait`` waits for that, but only once PID 1's bus is up: right after ``lxc-start`` it
    fails at once ("Failed to connect to bus"), so it is asked again until it answers.

    Raises:
        ContainerError: the boot did not finish within :data:`CONTAINER_BOOT_TIMEOUT_S`, or
            ended in a state no test can use (the last answer is named).
    """
    started = time.monotonic()
    deadline = started + CONTAINER_BOOT_TIMEOUT_S
    answer = "no answer"
    while (left := deadline - time.monotonic()) > 0:
        try:
            result = _lxc(layout, "lxc-attach", name, "--clear-env", "--", "systemctl",
                          "is-system-running", "--wait", check=False, timeout=left)
        except subprocess.TimeoutExpired:
            break
        state = result.stdout.strip()
        answer = state or (result.stderr.strip().splitlines() or ["no answer"])[-1]
        if state in BOOTED_STATES:
            return
        if state in FAILED_BOOT_STATES:
            raise ContainerError(
                f"sandbox container {name} ended its boot in state {state} after "
                f"{time.monotonic() - started:.0f} s (systemctl is-system-running: {answer})",
                hint=f"lxc-attach -P {layout.lxc_path} -n {name} -- systemctl --failed")
        time.sleep(0.2)  # the loop's condition keeps the deadline
    raise ContainerError(f"sandbox container {name} did not finish booting within "
                         f"{CONTAINER_BOOT_TIMEOUT_S} s (systemctl is-system-running: {answer})",
                         hint=f"lxc-attach -P {layout.lxc_path} -n {name} -- systemctl "
                              "list-jobs  (what is still starting)")


def _ensure_pve_config_lines(config: Path) -> None:
    """Lines Proxmox writes into every container's LXC config (sandboxes made before catch up).

    pve-container src/PVE/LXC.pm update_lxc_config: `lxc.environment = TERM=linux`, which
    lxc-attach applies even with --clear-env (lxc src/lxc/attach.c
    lxc_attach_set_environment), so every `pct exec` command sees TERM=linux.
    """
    lines = config.read_text().splitlines()
    missing = [line for line in PVE_CONFIG_LINES if line not in lines]
    if missing:
        config.write_text("\n".join([*lines, *missing]) + "\n")


def _ensure_late_packages(layout: _Layout, name: str) -> None:
    """apt-get install :data:`LATE_PACKAGES` once per container (the network is the host's)."""
    marker = layout.lxc_path / name / "rootfs" / _LATE_MARKER
    wanted = " ".join(LATE_PACKAGES)
    if marker.is_file() and marker.read_text().strip() == wanted:
        return
    script = ("export PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive; "
              'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" '
              # the template is copied for every container: no downloaded .debs or lists in it
              '&& apt-get clean && rm -rf /var/lib/apt/lists/*')
    _lxc(layout, "lxc-attach", name, "--clear-env", "--", "sh", "-c", script, "sh",
         *LATE_PACKAGES, timeout=900)
    marker.write_text(wanted + "\n")


def _ensure_base(layout: _Layout, source: _Layout | None = None) -> None:
    """Create the template container once: debootstrap (cached in /var/cache/lxc) + apt, with
    :data:`LATE_PACKAGES` too, so its copies need no apt run of their own. With ``source``,
    copy that sandbox's template (made first if it is not there yet). Only the template's own
    lock is held meanwhile, never the source sandbox's: its tests go on while others copy."""
    ready = layout.lxc_path / BASE / ".opsctl-ready"
    with _locked(layout, "template.lock"):
        if _container_exists(layout, BASE) and ready.is_file():
            return
        layout.lxc_path.mkdir(parents=True, exist_ok=True)
        if (layout.lxc_path / BASE).exists():
            # a half-made base may still run (a boot wait that failed): lxc-destroy refuses a
            # running container, and a rootfs made anew under it leaves that container
            # running on a deleted tree (no /dev/null, no systemctl: never booted)
            _lxc(layout, "lxc-stop", BASE, "--kill", check=False)
            _lxc(layout, "lxc-destroy", BASE, check=False)
            shutil.rmtree(layout.lxc_path / BASE, ignore_errors=True)
        if source is None:
            _make_base(layout)
        else:
            _ensure_base(source)
            with _locked(source, "template.lock"):
                _run(["lxc-copy", "-P", str(source.lxc_path), "-n", BASE, "-p",
                      str(layout.lxc_path), "-N", BASE], log=layout.state_dir / "lxc.log",
                     timeout=600, check=True)
        ready.write_text("ok\n")  # last: a half-made template is made again


def _make_base(layout: _Layout) -> None:
    _lxc(layout, "lxc-create", BASE, "-t", "debian", "--", "-r", RELEASE,
         f"--packages={','.join(PACKAGES)}", timeout=1800)
    _configure_base(layout.lxc_path / BASE)
    try:
        _start(layout, BASE)  # inside: a boot that fails still leaves the base stopped
        _ensure_late_packages(layout, BASE)
    finally:
        _lxc(layout, "lxc-stop", BASE, "--kill", check=False)


def _configure_base(ct_dir: Path) -> None:
    """No bridge here: share the host network; unconfined AppArmor; nothing touching it."""
    config = ct_dir / "config"
    kept = [line for line in config.read_text().splitlines()
            if not line.strip().startswith(("lxc.net.", "lxc.apparmor."))]
    kept += ["", "# opsctl sandbox: share the host network (no bridge), like a bridged CT "
             "reaches the host", "lxc.net.0.type = none", "lxc.apparmor.profile = unconfined"]
    config.write_text("\n".join(kept) + "\n")
    rootfs = ct_dir / "rootfs"
    # Never dhclient/ifdown: this network namespace is the host's.
    (rootfs / "etc/network/interfaces").write_text(
        "# opsctl sandbox: no interfaces here, the container shares the host's network\n")
    systemd = rootfs / "etc/systemd/system"
    for unit in MASKED_UNITS:
        for wants in systemd.glob(f"*.wants/{unit}"):
            wants.unlink()
        target = systemd / unit
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to("/dev/null")
    for missing in [tool for tool in ("python3", "tmux") if not (rootfs / "usr/bin" / tool).exists()]:
        raise ContainerError(f"sandbox template lacks {missing} after lxc-create",
                             log_path=str(ct_dir.parent.parent / "lxc.log"))
