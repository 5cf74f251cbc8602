"""The whole chain on one machine, as a new user runs it: an OpenSSH server on 127.0.0.1, the
machine itself as a direct target (``enter: direct``), and the real CLI from trust to probe.

    # on a GPU machine (what tests/gpu/prepare_whole_chain.sh put in .gpucarry/):
    python3 tests/gpu/whole_chain.py --out /tmp/chain.json --debs .gpucarry/debs \\
        --wheels .gpucarry/wheels
    # here, on CPU, against this machine's own OpenSSH (tests/gpu/test_whole_chain_cpu.py):
    python3 tests/gpu/whole_chain.py --out /tmp/chain.json --sshd-prefix / --device cpu --preset tiny

What it runs, each step asserted, in this order (one JSON of timings and results, ``--out``,
written also when a check fails):

1. ``opsctl host trust -y`` prints the sshd's own host key fingerprint and records it;
2. ``opsctl doctor --json``: ssh ok, the Proxmox-only rows "not applicable", on a GPU machine
   the GPU rows ok;
3. ``opsctl deploy`` of a one-GPU trainer playbook this script writes (random target weights,
   synthetic data, no downloads) and the time until it is healthy;
4. ``opsctl status --json`` against the trainer's own ``events.jsonl`` (the last step's loss
   and tok/s) and against ``nvidia-smi`` (GPU name, memory);
5. ``opsctl stacks`` shows the trainer's Python frames;
6. a goodput scenario: the playbook's restart policy runs the first attempt again after one
   injected crash (``--debug-fault raise``, on the first attempt only), the second attempt
   resumes from its checkpoint; ``opsctl stop``, then a re-deploy (``--resume auto`` on the
   trainer's command line) under a new job id resumes from the stop's checkpoint; then
   ``opsctl goodput --json`` (where the CLI has it) and the ``checkpoint`` events' ``blocked_s``;
7. ``opsctl stop``, and no process of the job left (``nvidia-smi --query-compute-apps`` on a
   GPU, this run's paths in no process's command line anywhere);
8. ``opsctl probe compile-race``: the guarded mode passes.

Everything it starts is its own: the sshd (its pid, ended at exit), a tmux server on a socket
of its own name (ended at exit), the jobs under a private opsctl root, ``OPSCTL_HOME`` and
``OPSCTL_INVENTORY_DIRS`` in a private work directory; it contacts 127.0.0.1 only. NCCL's
NVLink multicast stays off in every process (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``: the lent machines' KINDS.md says why).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import typing as t
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
HOST = "chain"
PROXMOX_ROWS = ("pct", "container-running", "ct-config-devices")
#: doctor's rows that a GPU machine with a working driver and torch passes
GPU_ROWS = ("host-driver", "host-device-nodes", "container-libraries", "container-device-nodes",
            "gpu-count", "torch-matmul", "leftover-gpu-processes")

#: The job's command runs the trainer through this: the first attempt (no marker file yet)
#: gets ``--debug-fault raise`` at the chosen step, the restart and every later deploy do not,
#: so the policy's one restart resumes and runs on. argv: MARKER STEP -- TRAINER-ARGV...
ONCE_FAULT = """
import os, sys
marker, step = sys.argv[1], sys.argv[2]
argv = sys.argv[4:]
if not os.path.exists(marker):
    open(marker, "w").close()
    argv = argv + ["--debug-fault", "raise", "--debug-fault-step", step]
os.execvp(argv[0], argv)
"""


class ChainFailed(Exception):
    """One check did not hold (the JSON says which, with its evidence)."""


class Chain:
    """The run's record and the means to run opsctl the way a user does."""

    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.a = a
        self.work = work
        self.t0 = time.monotonic()
        self.doc: dict[str, t.Any] = {
            "what": "tests/gpu/whole_chain.py", "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                         time.gmtime()),
            "args": {k: v for k, v in vars(a).items()}, "timings_s": {}, "checks": [],
            "results": {}, "ok": False}
        self.env: dict[str, str] = {}
        self.opsctl: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.failed: list[str] = []
        self.tmux_socket = f"opsctl-chain-{uuid.uuid4().hex[:8]}"

    # -- the record ---------------------------------------------------------------------
    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def check(self, name: str, ok: bool, *, fatal: bool = True, **evidence: t.Any) -> None:
        """One asserted check, recorded either way. A failed one fails the run; ``fatal``
        ends it at once (the next steps need what it checked), else the run goes on so one
        device run shows every step's figures."""
        self.doc["checks"].append({"name": name, "ok": bool(ok), "at_s": self.elapsed(), **evidence})
        print(f"[{self.elapsed():7.1f}s] {'ok  ' if ok else 'FAIL'} {name} "
              f"{json.dumps(evidence, default=str)[:400]}", flush=True)
        if not ok:
            self.failed.append(name)
            if fatal:
                raise ChainFailed(f"{name}: {json.dumps(evidence, default=str)[:2000]}")

    @contextlib.contextmanager
    def timed(self, name: str) -> t.Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.doc["timings_s"][name] = round(time.monotonic() - start, 2)

    def write(self) -> None:
        self.doc["total_s"] = self.elapsed()
        out = Path(self.a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str) + "\n")
        tmp.replace(out)

    # -- running things -----------------------------------------------------------------
    def run(self, argv: list[str], *, timeout: float, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                                  env=env or self.env, cwd=cwd or self.work)
        except subprocess.TimeoutExpired as exc:
            self.check(f"{argv[0]} finished within {timeout:.0f} s", False, argv=argv,
                       stdout=str(exc.stdout)[-2000:], stderr=str(exc.stderr)[-2000:])
            raise  # unreachable: check raised

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``opsctl ARGS`` in a process of its own, as a user's shell runs it."""
        proc = self.run([*self.opsctl, *args], timeout=timeout)
        print(f"[{self.elapsed():7.1f}s] opsctl {' '.join(args)} -> {proc.returncode}", flush=True)
        return proc

    def cli_json(self, *args: str, timeout: float = 120) -> tuple[int, dict[str, t.Any]]:
        proc = self.cli(*args, "--json", timeout=timeout)
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            self.check(f"opsctl {args[0]} --json prints one JSON document", False,
                       rc=proc.returncode, stdout=proc.stdout[-2000:], stderr=proc.stderr[-2000:])
        return proc.returncode, doc

    def wait(self, what: str, probe: t.Callable[[], t.Any], timeout: float,
             interval: float = 1.0, evidence: t.Callable[[], t.Any] | None = None) -> t.Any:
        """``probe()``'s first true value, polled until ``timeout`` (a hang is a failure)."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            got = probe()
            if got:
                self.check(what, True, waited_s=round(time.monotonic() - start, 2))
                return got
            if time.monotonic() > deadline:
                self.check(what, False, waited_s=timeout, evidence=evidence() if evidence else None)
            time.sleep(interval)  # scenario: polling a real job's progress

    def tmux_server_pid(self) -> int | None:
        """The pid of this run's own tmux server (its command line names the job's paths)."""
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            out = subprocess.run(["tmux", "-L", self.tmux_socket, "list-sessions", "-F", "#{pid}"],
                                 capture_output=True, text=True, timeout=20, check=False).stdout
            return int(out.split()[0]) if out.split() else None
        return None

    def stop_all(self) -> None:
        """End what this run started, by pid and by its own tmux socket only."""
        if self.env:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["tmux", "-L", self.tmux_socket, "kill-server"], capture_output=True,
                               timeout=20, check=False)
            # the server's socket file stays behind it; this run's name is its own
            tmpdir = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
            with contextlib.suppress(OSError):
                (tmpdir / self.tmux_socket).unlink()
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                if proc.poll() is None:
                    with contextlib.suppress(OSError):
                        os.killpg(proc.pid, signal.SIGKILL)
        # what the target side still runs for a CLI that was cut short (an agent verb whose
        # client is gone runs on to its own deadline): by pid, each naming this run's own
        # private work directory in its command line
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = [p["pid"] for p in processes_naming(str(self.work))]
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            if left and sig == signal.SIGTERM:
                time.sleep(2)  # scenario: SIGTERM's grace before the SIGKILL of what is left


# -- the OpenSSH server -------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


OPENSSH_DEBS = ("openssh-server_", "openssh-client_", "openssh-sftp-server_")
SSH_BINARIES = ("usr/sbin/sshd", "usr/bin/ssh", "usr/bin/ssh-keygen")


def unpack_debs(debs: Path, prefix: Path) -> dict[str, t.Any]:
    """``dpkg -x`` the OpenSSH .debs of ``debs`` into ``prefix`` and the library .debs beside
    them into ``prefix/libs-all``; only the libraries this machine lacks (``ldd`` says "not
    found") are linked into ``prefix/libs`` (what LD_LIBRARY_PATH names), so the machine's own
    libraries are used wherever it has them. Nothing is installed system-wide."""
    found = sorted(debs.glob("*.deb"))
    ours = [d for d in found if d.name.startswith(OPENSSH_DEBS)]
    if len(ours) < 2:
        raise ChainFailed(f"no OpenSSH .debs in {debs}: run tests/gpu/prepare_whole_chain.sh first")
    prefix.mkdir(parents=True, exist_ok=True)
    every = prefix / "libs-all"
    for deb in found:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(prefix if deb in ours else every)], check=True)
    libs = prefix / "libs"
    libs.mkdir(exist_ok=True)
    offered = {f.name: f for f in every.rglob("*.so*") if f.is_file() or f.is_symlink()}
    borrowed: list[str] = []
    for _ in range(4):  # a borrowed library may need one the machine lacks too
        out = subprocess.run(["ldd", *(str(prefix / b) for b in SSH_BINARIES)], capture_output=True,
                             text=True, check=False, env={**os.environ, "LD_LIBRARY_PATH": str(libs)}).stdout
        missing = sorted({ln.split()[0] for ln in out.splitlines() if "not found" in ln})
        if not missing:
            break
        lacking = [m for m in missing if m not in offered]
        if lacking:
            raise ChainFailed(f"the OpenSSH binaries need {', '.join(lacking)}, which neither this "
                              f"machine nor {debs} has: add its package to prepare_whole_chain.sh")
        for name in missing:
            (libs / name).symlink_to(offered[name].resolve())
            borrowed.append(name)
    return {"debs": [d.name for d in found], "borrowed_libraries": borrowed}


def tool_env(prefix: Path) -> dict[str, str]:
    """PATH and LD_LIBRARY_PATH for the OpenSSH binaries of ``prefix`` (``/``: the system's)."""
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    if prefix != Path("/"):
        env["LD_LIBRARY_PATH"] = ":".join([str(prefix / "libs"),
                                           *filter(None, [env.get("LD_LIBRARY_PATH")])])
        env["PATH"] = f"{prefix / 'usr/bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def privsep(ch: Chain) -> dict[str, t.Any]:
    """sshd's privilege-separation user and directory, created if this machine lacks them
    (a root-only step: as another user the check says what is missing)."""
    made: dict[str, t.Any] = {}
    if subprocess.run(["getent", "passwd", "sshd"], capture_output=True, check=False).returncode != 0:
        if os.geteuid() != 0:
            ch.check("the sshd privilege-separation user exists", False,
                     why="no user sshd and not root: create it (useradd -r sshd)")
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/run/sshd",
                        "--shell", "/usr/sbin/nologin", "sshd"], check=True)
        made["user"] = "sshd"
    if not Path("/run/sshd").is_dir():
        Path("/run/sshd").mkdir(mode=0o755, parents=True)
        made["dir"] = "/run/sshd"
    return made


def start_sshd(ch: Chain, prefix: Path) -> dict[str, t.Any]:
    """A key-only sshd on a free 127.0.0.1 port, config, keys and logs in the work dir."""
    ssh = ch.work / "ssh"
    ssh.mkdir(mode=0o700)
    env = tool_env(prefix)
    keygen = str(prefix / "usr/bin/ssh-keygen")
    for name in ("host_key", "id_ed25519"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"whole-chain {name}",
                        "-f", str(ssh / name)], check=True, env=env)
    (ssh / "authorized_keys").write_text((ssh / "id_ed25519.pub").read_text())
    fp = subprocess.run([keygen, "-l", "-E", "sha256", "-f", str(ssh / "host_key.pub")],
                        capture_output=True, text=True, check=True, env=env).stdout.split()[1]
    made = privsep(ch)
    port = free_port()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    # the sessions' environment: this process's PATH (the python3 with torch is the job's),
    # multicast off, the run's own tmux server, and bash's start-up files left alone
    session = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GPU_ENV,
               "OPSCTL_TMUX_SOCKET": ch.tmux_socket, "SHLVL": "1"}
    config = "\n".join([
        "# whole_chain.py: loopback only, key auth only", f"Port {port}", "ListenAddress 127.0.0.1",
        f"HostKey {ssh / 'host_key'}", f"PidFile {ssh / 'sshd.pid'}",
        f"AuthorizedKeysFile {ssh / 'authorized_keys'}", f"AllowUsers {user}",
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "MaxSessions 100",
        "MaxStartups 200:30:400", "LoginGraceTime 30", "UseDNS no", "PrintMotd no",
        "PrintLastLog no", "Subsystem sftp internal-sftp",
        "SetEnv " + " ".join(f"{k}={v}" for k, v in session.items()), ""])
    (ssh / "sshd_config").write_text(config)
    sshd = str(prefix / "usr/sbin/sshd")
    test = subprocess.run([sshd, "-t", "-f", str(ssh / "sshd_config")], capture_output=True,
                          text=True, env=env, check=False)
    ch.check("sshd accepts its config", test.returncode == 0, stderr=test.stderr[-2000:])
    log = (ssh / "sshd.log").open("wb")
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(ssh / "sshd_config")], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    ch.procs.append(proc)

    def listening() -> bool:
        if proc.poll() is not None:
            ch.check("sshd runs", False, rc=proc.returncode,
                     log=(ssh / "sshd.log").read_text(errors="replace")[-2000:])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    ch.wait("sshd listens on 127.0.0.1", listening, 15, interval=0.1)
    version = subprocess.run([sshd, "-V"], capture_output=True, text=True, env=env, check=False)
    return {"port": port, "user": user, "fingerprint": fp, "privsep_made": made,
            "version": (version.stderr or version.stdout).strip()[:200], "identity": str(ssh / "id_ed25519"),
            "known_hosts": str(ssh / "known_hosts"), "tool_env": env}


# -- opsctl itself --------------------------------------------------------------------------
def install_opsctl(ch: Chain, wheels: Path | None) -> list[str]:
    """The ``opsctl`` a user gets: with ``--wheels``, ``pip install --no-index`` of this checkout
    into a venv (``--system-site-packages``: what the image has counts), or into a folder on
    PYTHONPATH where this python makes no venv (a python that is itself a venv, without
    ensurepip underneath); without, this python with the checkout on PYTHONPATH (its
    dependencies already installed)."""
    if wheels is None:
        ch.env["PYTHONPATH"] = str(REPO)
        ch.doc["results"]["install"] = {"how": "checkout on PYTHONPATH"}
        return [sys.executable, "-m", "opsctl"]
    venv = ch.work / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True, check=False)
    pip_args = ["install", "--no-index", "--no-cache-dir", "--find-links", str(wheels.resolve())]
    if made.returncode == 0:
        py = str(venv / "bin" / "python")
        argv = [py, "-m", "pip", *pip_args, str(REPO)]
        how = "venv --system-site-packages"
    else:
        site = ch.work / "site"
        py = sys.executable
        argv = [py, "-m", "pip", *pip_args, "--target", str(site), str(REPO)]
        ch.env["PYTHONPATH"] = str(site)
        how = f"pip --target (no venv: {made.stderr.strip()[-200:]})"
    with ch.timed("install"):
        pip = ch.run(argv, timeout=300)
    ch.check("pip installs opsctl from the wheels alone", pip.returncode == 0,
             how=how, stdout=pip.stdout[-1500:], stderr=pip.stderr[-1500:])
    ch.doc["results"]["install"] = {"how": how}
    return [py, "-m", "opsctl"]


def write_inventory(ch: Chain, sshd: dict[str, t.Any], gpus: int) -> Path:
    inv = ch.work / "inventory"
    inv.mkdir()
    doc = {"hosts": {HOST: {
        "address": "127.0.0.1", "port": sshd["port"], "user": sshd["user"],
        "identity_file": sshd["identity"], "known_hosts": sshd["known_hosts"], "enter": "direct",
        "root": str(ch.work / "root"), "target": {"gpus": gpus, "description": "whole_chain.py"}}}}
    (inv / "chain.yaml").write_text(json.dumps(doc, indent=1) + "\n")  # JSON is YAML
    return inv


def trainer_argv(a: argparse.Namespace, out_dir: Path) -> list[str]:
    """The trainer's command line: random target weights, synthetic data, one process."""
    argv = ["python3", "-m", "remote_payload.trainer", "--preset", a.preset, "--device", a.device,
            "--data", "synthetic", "--steps", str(a.steps), "--log-every", "1",
            "--ckpt-every", str(a.ckpt_every), "--keep-last", "1", "--resume", "auto",
            "--out-dir", str(out_dir)]
    if a.device == "cuda":
        # the 8-GPU playbook's drafter shape on one GPU (benchmarks/startup.py's FULL)
        return [*argv, "--block-size", "32", "--max-anchors", "64", "--seq-buckets", "3072",
                "--token-budget", "49152"]
    return [*argv, "--attn", "sdpa", "--compile", "off", "--warmup-steps", "5", "--lr", "3e-3",
            "--token-budget", "768", "--seq-buckets", "48,96"]


def write_playbook(ch: Chain, marker: Path, out_dir: Path) -> Path:
    a = ch.a
    env = {**GPU_ENV, "OMP_NUM_THREADS": "2" if a.device == "cpu" else "4"}
    if a.device == "cuda":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    book = {
        "name": "whole-chain", "description": f"whole_chain.py: {a.preset} on one {a.device}",
        "command": ["python3", "-c", ONCE_FAULT, str(marker), str(a.crash_step), "--",
                    *trainer_argv(a, out_dir)],
        "env": env, "healthy_when": {"event": "step"}, "timeout_s": a.healthy_timeout,
        "restart": {"max_restarts": 1, "on": ["failed"]},
        "gpus": 1 if a.device == "cuda" else None, "cache": "keep"}
    path = ch.work / "whole-chain.yaml"
    path.write_text(json.dumps(book, indent=1) + "\n")
    return path


# -- what the job's own files say -----------------------------------------------------------
def events(ch: Chain, job_id: str) -> list[dict[str, t.Any]]:
    path = ch.work / "root" / "jobs" / job_id / "events.jsonl"
    out: list[dict[str, t.Any]] = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if isinstance(ev, dict):
                    out.append(ev)
    return out


def of_kind(evs: list[dict[str, t.Any]], kind: str) -> list[dict[str, t.Any]]:
    return [e for e in evs if e.get("event") == kind]


def nvidia_smi(*query: str) -> list[list[str]] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True,
                          text=True, timeout=60, check=False)
    if proc.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]


def processes_naming(text: str, besides: t.Collection[int] = ()) -> list[dict[str, t.Any]]:
    """Processes whose command line contains ``text`` (read from /proc; none is touched),
    apart from ``besides``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in (os.getpid(), *besides):
            continue
        with contextlib.suppress(OSError):
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in cmd:
                found.append({"pid": int(d.name), "cmdline": cmd[:300]})
    return found


# -- the steps --------------------------------------------------------------------------------
def step_trust(ch: Chain, sshd: dict[str, t.Any]) -> None:
    with ch.timed("trust"):
        proc = ch.cli("host", "trust", "--host", HOST, "-y")
    ch.check("host trust prints the sshd's fingerprint and records it",
             proc.returncode == 0 and sshd["fingerprint"] in proc.stdout + proc.stderr
             and Path(sshd["known_hosts"]).is_file(),
             rc=proc.returncode, output=(proc.stdout + proc.stderr)[-1500:], expected=sshd["fingerprint"])
    ch.doc["results"]["trust"] = {"fingerprint": sshd["fingerprint"]}


def step_doctor(ch: Chain) -> None:
    with ch.timed("doctor"):
        rc, doc = ch.cli_json("doctor", "--host", HOST, timeout=300)
    rows = {r["name"]: r for r in doc.get("rows", [])}
    ch.doc["results"]["doctor"] = {"rc": rc, "rows": {k: {"status": v.get("status"),
                                                          "reason": v.get("reason")}
                                                      for k, v in rows.items()}}
    ch.check("doctor: ssh ok", rows.get("ssh", {}).get("status") == "ok", row=rows.get("ssh"))
    for name in PROXMOX_ROWS:
        row = rows.get(name, {})
        ch.check(f"doctor: {name} is not applicable on a direct host", row.get("status") == "skip"
                 and str(row.get("reason", "")).startswith("not applicable"), row=row)
    failed = {k: v for k, v in rows.items() if v.get("status") == "fail"}
    ch.check("doctor: no row fails", not failed, fatal=False, failed=failed)
    if ch.a.device == "cuda":
        for name in GPU_ROWS:
            ch.check(f"doctor: {name} ok", rows.get(name, {}).get("status") == "ok", fatal=False,
                     row=rows.get(name))


def step_deploy(ch: Chain, book: Path) -> str:
    start = time.monotonic()
    with ch.timed("deploy_to_healthy"):
        rc, doc = ch.cli_json("deploy", "--host", HOST, "--playbook", str(book), "-y",
                              timeout=ch.a.healthy_timeout + 120)
    ch.check("deploy: the job is healthy", rc == 0 and bool(doc.get("job_id")), rc=rc, reply=doc)
    job = str(doc["job_id"])
    evs = events(ch, job)
    startup = of_kind(evs, "startup")
    ch.doc["results"]["deploy"] = {"job_id": job, "healthy_s": round(time.monotonic() - start, 2),
                                   "reply_state": doc.get("state"),
                                   "startup": startup[0] if startup else None}
    return job


def step_status(ch: Chain, job: str) -> None:
    """status --json against the events file it is derived from and against nvidia-smi: the
    same last step (polled until both sides show the same step, as the job moves on)."""
    seen: dict[str, t.Any] = {}

    def agree() -> dict[str, t.Any] | None:
        rc, st = ch.cli_json("status", "--host", HOST)
        steps = of_kind(events(ch, job), "step")
        last = st.get("last_step") or {}
        seen.update(status=st, last_event=steps[-1] if steps else None)
        if rc == 0 and steps and last.get("step") == steps[-1].get("step"):
            return st
        return None

    with ch.timed("status"):
        st = ch.wait("status shows the events file's last step", agree, 60, interval=0.5)
    ev = seen["last_event"]
    last = st["last_step"]
    ch.check("status: loss and tok/s are the trainer's own", st.get("state") == "RUNNING"
             and last.get("loss") == ev.get("loss") and last.get("tok_s") == ev.get("tok_s"),
             status_last_step=last, event=ev, state=st.get("state"))
    result: dict[str, t.Any] = {"state": st.get("state"), "last_step": last, "event": ev}
    smi = nvidia_smi("--query-gpu=index,name,memory.total,memory.used")
    gpus = st.get("gpus") or []
    result["status_gpus"] = gpus
    result["nvidia_smi"] = smi
    if ch.a.device == "cuda":
        ch.check("status: GPU rows are there", bool(gpus) and bool(smi), fatal=False, gpus=gpus, smi=smi)
        by_index = {int(r[0]): r for r in smi or []}
        for g in gpus:
            row = by_index.get(int(g.get("index", -1)))
            same = row is not None and g.get("name") == row[1] and \
                abs(float(g.get("mem_total_mib") or -1) - float(row[2])) < 1
            ch.check(f"status: GPU {g.get('index')} as nvidia-smi says", same, fatal=False,
                     status=g, nvidia_smi=row)
    ch.doc["results"]["status"] = result


def step_stacks(ch: Chain, job: str) -> None:
    with ch.timed("stacks"):
        # on a fast CPU run the injected crash can land between two attempts: a job with no
        # python process at that moment is asked again (the restart's process), a few times
        for _ in range(5):
            proc = ch.cli("stacks", "--host", HOST, "--timeout", "30", timeout=120)
            if proc.returncode == 0 or "has no python process" not in proc.stderr:
                break
            time.sleep(1.0)  # scenario: the restart starts its process within a second or two
    # the job's Python frames; the trainer's own once it is past its imports (a restarted
    # attempt on a fast CPU run may still be importing torch when it is asked)
    ch.check("stacks shows the job's Python frames", proc.returncode == 0 and
             'File "' in proc.stdout, fatal=False, rc=proc.returncode,
             stdout=proc.stdout[-1500:], stderr=proc.stderr[-1000:])
    ch.doc["results"]["stacks"] = {"rc": proc.returncode, "chars": len(proc.stdout),
                                   "trainer_frames": "remote_payload/trainer" in proc.stdout}


def step_goodput(ch: Chain, job: str, book: Path) -> str:
    """The crash, the policy's restart and its resume; a stop and a re-deploy that resumes."""
    a = ch.a
    res: dict[str, t.Any] = {}

    def second_attempt() -> dict[str, t.Any] | None:
        """The restarted attempt's resume event, or ``{}`` once it has trained without one
        (its ``startup`` event comes after its first step)."""
        evs = events(ch, job)
        got = of_kind(evs, "resume")
        if got:
            return got[-1]
        return {"none": True} if len(of_kind(evs, "startup")) >= 2 else None

    def where() -> dict[str, t.Any]:
        st = ch.cli_json("status", "--host", HOST)[1]
        return {k: st.get(k) for k in ("state", "attempt", "restarts", "last_step", "diagnosis")}

    with ch.timed("crash_to_resume"):
        resume = ch.wait("the restart policy runs the job again after the crash", second_attempt,
                         a.healthy_timeout + 60, evidence=where)
    ch.check("the restart resumed from a checkpoint before the crash", 0 < int(resume.get("step", 0))
             <= a.crash_step, fatal=False, resume=resume, crash_step=a.crash_step)
    res["restart_resume"] = resume
    after = int(resume.get("step", 0))

    def stepped() -> bool:
        return any(int(e.get("step", 0)) > after for e in of_kind(events(ch, job)[-50:], "step")
                   if e.get("_at", 0) >= resume.get("_at", 0))

    ch.wait("the restarted attempt trains on", stepped, a.healthy_timeout)
    time.sleep(a.goodput_s)  # scenario: the second attempt trains for the phase's length
    rc, st = ch.cli_json("status", "--host", HOST)
    res["status_after_restart"] = {k: st.get(k) for k in ("state", "attempt", "restarts",
                                                           "last_step", "goodput")}
    with ch.timed("stop_after_restart"):
        rc, stop = ch.cli_json("stop", "--host", HOST, "--grace", str(a.stop_grace),
                               timeout=a.stop_grace + 120)
    ch.check("stop ends the restarted job", rc == 0, rc=rc, reply=stop)
    stopped_at = max((int(e.get("step", 0)) for e in of_kind(events(ch, job), "step")), default=0)
    with ch.timed("redeploy_to_healthy"):
        rc, doc = ch.cli_json("deploy", "--host", HOST, "--playbook", str(book), "-y",
                              timeout=a.healthy_timeout + 120)
    ch.check("the re-deploy is healthy under a new job id", rc == 0
             and doc.get("job_id") not in (None, job), rc=rc, reply=doc)
    job2 = str(doc["job_id"])
    again = of_kind(events(ch, job2), "resume")
    ch.check("the re-deploy resumed from the stop's checkpoint", bool(again)
             and int(again[0]["step"]) >= stopped_at - 1 and int(again[0]["step"]) > after,
             resume=again[:1], stopped_at=stopped_at)
    res["redeploy"] = {"job_id": job2, "resume": again[0]}
    time.sleep(a.redeploy_s)  # scenario: the re-deployed attempt trains for the phase's length
    blocked = [{"job": j, "step": e.get("step"), "blocked_s": e.get("blocked_s"),
                "write_s": e.get("write_s"), "deferred": e.get("deferred")}
               for j in (job, job2) for e in of_kind(events(ch, j), "checkpoint")]
    res["checkpoints"] = blocked
    has_goodput = any(line.split()[:1] == ["goodput"] for line in ch.cli("--help").stdout.splitlines())
    if has_goodput:
        with ch.timed("goodput"):
            rc, gp = ch.cli_json("goodput", "--host", HOST, timeout=120)
        ch.check("goodput: one run across the crash, the restart and the re-deploy", rc == 0
                 and job in json.dumps(gp) and job2 in json.dumps(gp), fatal=False, rc=rc,
                 reply=json.dumps(gp)[:3000])
        res["goodput"] = gp
        causes = gp.get("causes") if isinstance(gp.get("causes"), dict) else {}
        total = sum(v for v in causes.values() if isinstance(v, (int, float)))
        wall = gp.get("wall_s") if isinstance(gp.get("wall_s"), (int, float)) else 0.0
        ch.check("goodput: the causes add up to the wall time", abs(total - wall) <= 1.0,
                 fatal=False, causes_s=round(total, 3), wall_s=wall)
        lost = sum(int(x.get("lost_steps") or 0) for x in gp.get("attempts") or []
                   if isinstance(x, dict))
        ch.check("goodput: the crash lost the steps after the checkpoint it resumed from",
                 lost == a.crash_step - after, fatal=False, lost_steps=lost,
                 expected=a.crash_step - after)
        text = ch.cli("goodput", "--host", HOST, timeout=120)
        res["goodput_text"] = text.stdout[-6000:]
        line = ch.cli("status", "--host", HOST, timeout=120)
        res["status_goodput_line"] = [x for x in line.stdout.splitlines() if "goodput" in x][:2]
    else:
        res["goodput"] = {"skipped": "this opsctl has no goodput command"}
    ch.doc["results"]["goodput_scenario"] = res
    return job2


def step_stop(ch: Chain, job: str) -> None:
    a = ch.a
    with ch.timed("stop"):
        rc, stop = ch.cli_json("stop", "--host", HOST, "--grace", str(a.stop_grace),
                               timeout=a.stop_grace + 120)
    ch.check("stop ends the job", rc == 0, rc=rc, reply=stop)
    rc, st = ch.cli_json("status", "--host", HOST)
    ch.check("status: the job is over", st.get("state") in ("CANCELLED", "SUCCEEDED"), state=st.get("state"))
    tag = str(ch.work / "root")
    # the tmux server stays (its panes are dead): its first client's command line names the root
    server = ch.tmux_server_pid()

    def left() -> dict[str, t.Any]:
        # opsctl's own connection multiplexer (this side of the SSH link) names the root in
        # the host spec it was started with: it is the client's, not the job's
        procs = [p for p in processes_naming(tag, [server] if server else [])
                 if "opsctl.remote.mux_server" not in str(p.get("cmdline", ""))]
        return {"processes": procs,
                "compute_apps": nvidia_smi("--query-compute-apps=pid,process_name,used_memory")}

    with ch.timed("stop_to_no_process"):
        ch.wait("no process of the job is left", lambda: not any(left().values()), 60,
                interval=0.5, evidence=left)
    ch.doc["results"]["stop"] = {"reply": stop, "compute_apps": nvidia_smi(
        "--query-compute-apps=pid,process_name,used_memory")}


def step_probe(ch: Chain) -> None:
    """The compile-race probe, each mode's deadline what the budget has left (an unguarded
    hang costs its whole deadline)."""
    a = ch.a
    if a.probe_modes == "none":
        ch.doc["results"]["probe"] = {"skipped": "--probe-modes none"}
        return
    modes = a.probe_modes.split(",")
    left = a.budget_s - ch.elapsed()
    per_mode = a.probe_timeout or max(30.0, min(120.0, (left - 30) / len(modes)))
    args = ["probe", "compile-race", "--host", HOST, "--device", a.device, "--modes", a.probe_modes,
            "--threads", str(a.probe_threads), "--timeout", f"{per_mode:.0f}"]
    if a.device == "cpu":
        args.append("--no-backward")  # CPU flex_attention has no backward
    with ch.timed("probe_compile_race"):
        rc, doc = ch.cli_json(*args, timeout=per_mode * len(modes) * 2 + 180)
    got = doc.get("modes") if isinstance(doc.get("modes"), dict) else {}
    ch.doc["results"]["probe"] = {"rc": rc, "timeout_per_mode_s": round(per_mode), "status": doc.get(
        "status"), "verdict": doc.get("verdict"), "modes": {
            m: {k: v.get(k) for k in ("status", "elapsed_s", "wall_s", "device", "backward")}
            for m, v in got.items() if isinstance(v, dict)}}
    guarded = got.get("guarded") or {}
    ch.check("probe compile-race: the guarded mode passes", guarded.get("status") == "ok",
             fatal=False, rc=rc,
             guarded={k: guarded.get(k) for k in ("status", "elapsed_s", "threads")},
             verdict=doc.get("verdict"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the one JSON of timings and results")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--steps", type=int, default=100000, help="the trainer's --steps (it is stopped first)")
    p.add_argument("--ckpt-every", type=int, default=0, help="default: 20 on cuda, 10 on cpu")
    p.add_argument("--crash-step", type=int, default=0,
                   help="the first attempt's --debug-fault step (default: 1.5 x --ckpt-every)")
    p.add_argument("--goodput-s", type=float, default=15.0,
                   help="how long the restarted attempt trains before the stop and re-deploy")
    p.add_argument("--redeploy-s", type=float, default=10.0,
                   help="how long the re-deployed attempt trains before the goodput ledger is read")
    p.add_argument("--budget-s", type=float, default=540.0, help="the whole run must fit in this")
    p.add_argument("--hard-limit-s", type=float, default=0.0,
                   help="past this the run is cut short, its JSON still written and what it "
                        "started ended (default: --budget-s + 45, inside a 600-s device command)")
    p.add_argument("--healthy-timeout", type=float, default=300.0)
    p.add_argument("--stop-grace", type=float, default=60.0)
    p.add_argument("--probe-modes", default="",
                   help="default: unguarded,guarded on cuda; guarded on cpu (a slow CPU compiles "
                        "three flex_attention graphs for minutes); none: no probe")
    p.add_argument("--probe-threads", type=int, default=0, help="default: 3 on cuda, 2 on cpu")
    p.add_argument("--probe-timeout", type=float, default=0.0,
                   help="seconds per probe mode (default: what the budget leaves, 30 to 120)")
    p.add_argument("--sshd-prefix", type=Path, default=None,
                   help="where usr/sbin/sshd and usr/bin/ssh* live (/: this machine's OpenSSH)")
    p.add_argument("--debs", type=Path, default=None,
                   help="OpenSSH .debs to dpkg -x into a private prefix (instead of --sshd-prefix)")
    p.add_argument("--wheels", type=Path, default=None,
                   help="install opsctl into a venv from these wheels (default: this checkout as is)")
    p.add_argument("--work", type=Path, default=None, help="work dir (default: a fresh temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    a = p.parse_args(argv)
    a.ckpt_every = a.ckpt_every or (20 if a.device == "cuda" else 10)
    a.crash_step = a.crash_step or a.ckpt_every + a.ckpt_every // 2
    a.probe_modes = a.probe_modes or ("unguarded,guarded" if a.device == "cuda" else "guarded")
    a.probe_threads = a.probe_threads or (3 if a.device == "cuda" else 2)
    if (a.sshd_prefix is None) == (a.debs is None):
        p.error("give one of --sshd-prefix and --debs")
    a.hard_limit_s = a.hard_limit_s or a.budget_s + 45

    def cut_short(signum: int, frame: t.Any) -> None:
        raise ChainFailed(f"past the hard limit of {a.hard_limit_s:.0f} s")

    def ended_by(signum: int, frame: t.Any) -> None:  # the finally below ends what it started
        raise ChainFailed(f"ended by {signal.Signals(signum).name}")

    signal.signal(signal.SIGALRM, cut_short)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, ended_by)
    signal.alarm(max(1, int(a.hard_limit_s)))
    work = Path(tempfile.mkdtemp(prefix="whole-chain-", dir=a.work)).resolve()
    work.chmod(0o755)
    ch = Chain(a, work)
    rc = 1
    try:
        ch.doc["results"]["machine"] = {
            "python": sys.version.split()[0], "platform": sys.platform, "cpus": os.cpu_count(),
            "gpus": nvidia_smi("--query-gpu=index,name,driver_version,memory.total")}
        with ch.timed("setup"):
            prefix = a.sshd_prefix or work / "prefix"
            if a.debs is not None:
                ch.doc["results"]["openssh_prefix"] = unpack_debs(a.debs.resolve(), prefix)
            sshd = start_sshd(ch, prefix.resolve())
            ch.doc["results"]["sshd"] = {k: v for k, v in sshd.items() if k != "tool_env"}
            ch.env = {**tool_env(prefix.resolve()), **GPU_ENV,
                      "OPSCTL_HOME": str(work / "home"), "OPSCTL_TMUX_SOCKET": ch.tmux_socket,
                      "OPSCTL_INVENTORY_DIRS": str(write_inventory(ch, sshd, 1 if a.device == "cuda" else 0)),
                      "NO_COLOR": "1", "COLUMNS": "160"}
            ch.opsctl = install_opsctl(ch, a.wheels)
            version = ch.cli("--version")
            ch.check("opsctl --version", version.returncode == 0, output=version.stdout + version.stderr)
            ch.doc["results"]["opsctl_version"] = version.stdout.strip()
        step_trust(ch, sshd)
        step_doctor(ch)
        book = write_playbook(ch, work / "first-attempt-faulted", work / "runs" / "chain")
        job = step_deploy(ch, book)
        step_status(ch, job)
        step_stacks(ch, job)
        job2 = step_goodput(ch, job, book)
        step_stop(ch, job2)
        step_probe(ch)
        ch.check(f"the whole chain fits in {a.budget_s:.0f} s", ch.elapsed() <= a.budget_s,
                 fatal=False, total_s=ch.elapsed())
        ch.doc["ok"] = not ch.failed
        rc = 0 if not ch.failed else 1
    except ChainFailed as exc:
        ch.doc["failure"] = str(exc)
    except Exception as exc:  # the record says what broke, then the traceback goes to stderr
        ch.doc["failure"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        signal.alarm(0)
        if ch.opsctl and not ch.doc["ok"]:
            with contextlib.suppress(Exception):
                ch.cli("stop", "--host", HOST, "--grace", "5", timeout=120)
        ch.stop_all()
        ch.doc["failed_checks"] = ch.failed
        ch.write()
        print(f"whole chain: {'ok' if ch.doc['ok'] else 'FAILED'} in {ch.elapsed():.1f} s -> {a.out}",
              flush=True)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
