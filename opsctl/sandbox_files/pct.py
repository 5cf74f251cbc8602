#!/usr/bin/python3
"""pct stand-in for the opsctl sandbox: Proxmox's `pct` verbs mapped onto plain LXC.

Messages and exit codes follow pve-container (src/PVE/CLI/pct.pm, API2/LXC/Status.pm) and
pve-common's PVE::CLIHandler: every failure is a Perl `die` or `exit(-1)`, so it exits 255.
`exec` replaces itself with `lxc-attach` (no buffering, the command's exit code passes
through), exactly as pct.pm does. Containers live in the sandbox's own lxcpath, found from
$OPSCTL_SANDBOX_LXCPATH or next to this script (<state_dir>/bin/pct -> <state_dir>/lxc).
Stdlib only; it runs as root on the sandbox host.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
from pathlib import Path

EXIT_ERROR = 255  # Perl `die` / CLIHandler `exit(-1)`
CLONE_NEWNS = 0x00020000
PVE_CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"  # PVE::CLIHandler::run_cli_handler sets this
# pct.pm `exec`/`enter`: "keep-env" defaults to 1 on PVE 8 with a FIXME to flip it to 0 for
# PVE 9. The sandbox follows DESIGN.md (--clear-env); callers pass --keep-env explicitly anyway.
KEEP_ENV_DEFAULT = os.environ.get("OPSCTL_SANDBOX_PCT_KEEP_ENV", "0") == "1"

USAGE = {
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",
    "list": "pct list",
    "pull": "pct pull <vmid> <path> <destination> [OPTIONS]",
    "push": "pct push <vmid> <file> <destination> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "status": "pct status <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
}
BOOLEANS = {"1": True, "on": True, "yes": True, "true": True,
            "0": False, "off": False, "no": False, "false": False}


class Die(Exception):
    """A Perl `die` in pct: message on stderr, exit 255."""


def lxc_path() -> str:
    env = os.environ.get("OPSCTL_SANDBOX_LXCPATH")
    if env:
        return env
    return str(Path(__file__).resolve().parent.parent / "lxc")


def nodename() -> str:
    return socket.gethostname().split(".")[0]


def param_error(verb: str, name: str, message: str) -> Die:
    return Die(f"400 Parameter verification failed.\n{name}: {message}\n\n{USAGE[verb]}")


def parse_vmid(verb: str, raw: str | None) -> str:
    if raw is None:
        raise Die(f"400 not enough arguments\n{USAGE[verb]}")
    if not raw.isdigit() or raw.startswith("0"):
        raise param_error(verb, "vmid", f"type check ('integer') failed - got '{raw}'")
    if int(raw) < 100:
        raise param_error(verb, "vmid", "invalid format - value must be at least 100")
    return raw


def parse_bool(verb: str, name: str, raw: str) -> bool:
    value = BOOLEANS.get(raw.lower())
    if value is None:
        raise param_error(verb, name, f"type check ('boolean') failed - got '{raw}'")
    return value


def parse_options(verb: str, args: list[str], allowed: set[str],
                  stop_at_positional: bool = False) -> tuple[dict[str, str], list[str]]:
    """Getopt-style `--name value` / `--name=value` parsing; returns (options, rest)."""
    options: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i + 1:])
            break
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.lstrip("-").partition("=")
            if name not in allowed:
                raise Die(f"Unknown option: {name}\n400 unable to parse option\n{USAGE[verb]}")
            if not eq:
                if i + 1 >= len(args):
                    raise Die(f"Option {name} requires an argument\n"
                              f"400 unable to parse option\n{USAGE[verb]}")
                i += 1
                value = args[i]
            options[name] = value
        elif stop_at_positional:
            rest.extend(args[i:])
            break
        else:
            rest.append(arg)
        i += 1
    return options, rest


def config_file(vmid: str) -> Path:
    return Path(lxc_path()) / vmid / "config"


def load_config(vmid: str) -> Path:
    """PVE::AbstractConfig::load_config: the container must exist on this node."""
    path = config_file(vmid)
    if not path.is_file():
        raise Die(f"Configuration file 'nodes/{nodename()}/lxc/{vmid}.conf' does not exist")
    return path


def lxc(tool: str, vmid: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool, "-P", lxc_path(), "-n", vmid, *args],
                          capture_output=True, text=True, check=False)


def check_running(vmid: str) -> bool:
    if not config_file(vmid).is_file():
        return False
    return lxc("lxc-info", vmid, "-s", "-H").stdout.strip() == "RUNNING"


def init_pid(vmid: str) -> int:
    out = lxc("lxc-info", vmid, "-p", "-H").stdout.strip()
    if not out.isdigit():
        raise Die(f"unable to get PID for CT {vmid} (not running?)")
    return int(out)


def container_name(config: Path) -> str:
    for line in config.read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "lxc.uts.name":
            return value.strip()
    return ""


def enter_mount_namespace(pid: int) -> None:
    """Open paths from inside the container, like pct push/pull (no host symlink escapes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNS) != 0:
            raise Die("failed to enter the container's mount namespace")
    finally:
        os.close(fd)
    os.chdir("/")


def create_file(path: str, perms: str | None, user: str | None, group: str | None) -> int:
    """pct.pm create_file: explicit perms (octal default), optional owner; truncates."""
    mode = None
    if perms is not None:
        text = perms if perms.startswith("0") else "0" + perms
        try:
            mode = int(text, 16) if text.lower().startswith("0x") else int(text, 8)
        except ValueError:
            raise Die(f"invalid mode: '{perms}'") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    except OSError as e:
        raise Die(f"failed to create file: {path}: {e.strerror}") from None
    if mode is not None:
        os.fchmod(fd, mode)
    if user is not None or group is not None:
        st = os.fstat(fd)
        os.fchown(fd, owner_id(user, "uid") if user else st.st_uid,
                  owner_id(group, "gid") if group else st.st_gid)
    return fd


def owner_id(name: str, kind: str) -> int:
    if name.isdigit():
        return int(name)
    import grp
    import pwd
    try:
        return pwd.getpwnam(name).pw_uid if kind == "uid" else grp.getgrnam(name).gr_gid
    except KeyError:
        raise Die(f"failed to get {kind} for: {name}") from None


def copy_fd(src: int, dst: int) -> None:
    while chunk := os.read(src, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]


def cmd_exec(args: list[str]) -> int:
    vmid = parse_vmid("exec", args[0] if args else None)
    options, extra = parse_options("exec", args[1:], {"keep-env"}, stop_at_positional=True)
    keep_env = KEEP_ENV_DEFAULT
    if "keep-env" in options:
        keep_env = parse_bool("exec", "keep-env", options["keep-env"])
    load_config(vmid)
    if not check_running(vmid):
        raise Die(f"container '{vmid}' not running!")
    if not extra:
        raise Die("missing command")
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):  # pct.pm clean_environment
        os.environ.pop(name, None)
    os.environ["PATH"] = PVE_CLI_PATH
    argv = ["lxc-attach", "-P", lxc_path(), "-n", vmid,
            "--keep-env" if keep_env else "--clear-env", "--", *extra]
    sys.stdout.flush()
    os.execvp(argv[0], argv)
    return EXIT_ERROR  # not reached


def cmd_status(args: list[str]) -> int:
    options, rest = parse_options("status", args, {"verbose"})
    vmid = parse_vmid("status", rest[0] if rest else None)
    config = load_config(vmid)
    state = "running" if check_running(vmid) else "stopped"
    if "verbose" in options and parse_bool("status", "verbose", options["verbose"]):
        stat = {"name": container_name(config), "status": state, "type": "lxc", "vmid": vmid}
        if state == "running":
            stat["pid"] = str(init_pid(vmid))
        for key in sorted(stat):
            print(f"{key}: {stat[key]}")
    else:
        print(f"status: {state}")
    return 0


def cmd_list(args: list[str]) -> int:
    if args:
        raise Die(f"400 too many arguments\n{USAGE['list']}")
    root = Path(lxc_path())
    rows = []
    for entry in root.iterdir() if root.is_dir() else ():
        if entry.name.isdigit() and (entry / "config").is_file():
            state = "running" if check_running(entry.name) else "stopped"
            rows.append((int(entry.name), state, container_name(entry / "config")))
    if not rows:
        return 0
    line = "{:<10} {:<10} {:<12} {:<20}"
    print(line.format("VMID", "Status", "Lock", "Name"))
    for vmid, state, name in sorted(rows):
        print(line.format(vmid, state, "", name))
    return 0


def cmd_start(args: list[str]) -> int:
    _, rest = parse_options("start", args, {"skiplock", "debug"})
    vmid = parse_vmid("start", rest[0] if rest else None)
    load_config(vmid)
    if check_running(vmid):
        raise Die(f"CT {vmid} already running")
    started = lxc("lxc-start", vmid)
    if started.returncode != 0:
        raise Die(f"startup for container '{vmid}' failed\n{started.stderr.strip()}")
    lxc("lxc-wait", vmid, "-s", "RUNNING", "-t", "10")
    return 0


def cmd_stop(args: list[str]) -> int:
    _, rest = parse_options("stop", args, {"skiplock", "overrule-shutdown", "timeout"})
    vmid = parse_vmid("stop", rest[0] if rest else None)
    if not check_running(vmid):  # Status.pm vm_stop checks this before loading the config
        raise Die(f"CT {vmid} not running")
    # A hard stop, like Proxmox's `pct stop`; never a clean shutdown, whose scripts would
    # act on the network namespace this container shares with the host.
    stopped = lxc("lxc-stop", vmid, "--kill")
    if stopped.returncode != 0:
        raise Die(f"stopping container '{vmid}' failed\n{stopped.stderr.strip()}")
    return 0


def cmd_push(args: list[str]) -> int:
    options, rest = parse_options("push", args, {"perms", "user", "group"})
    vmid = parse_vmid("push", rest[0] if rest else None)
    if len(rest) < 3:
        raise Die(f"400 not enough arguments\n{USAGE['push']}")
    if len(rest) > 3:
        raise Die(f"400 too many arguments\n{USAGE['push']}")
    _, file, dest = rest
    if not check_running(vmid):
        raise Die("can only push files to a running CT")
    load_config(vmid)
    try:
        src = os.open(file, os.O_RDONLY)
    except OSError:
        raise Die(f"failed to open {file} for reading") from None
    enter_mount_namespace(init_pid(vmid))
    dst = create_file(dest, options.get("perms"), options.get("user"), options.get("group"))
    copy_fd(src, dst)
    os.close(dst)
    return 0


def cmd_pull(args: list[str]) -> int:
    options, rest = parse_options("pull", args, {"perms", "user", "group"})
    vmid = parse_vmid("pull", rest[0] if rest else None)
    if len(rest) < 3:
        raise Die(f"400 not enough arguments\n{USAGE['pull']}")
    if len(rest) > 3:
        raise Die(f"400 too many arguments\n{USAGE['pull']}")
    _, path, dest = rest
    if not check_running(vmid):
        raise Die("can only pull files from a running VM")
    pid = init_pid(vmid)
    dst = create_file(dest, options.get("perms"), options.get("user"), options.get("group"))
    enter_mount_namespace(pid)
    try:
        src = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise Die(f"failed to open {path}: {e.strerror}") from None
    copy_fd(src, dst)
    os.close(dst)
    return 0


VERBS = {"exec": cmd_exec, "list": cmd_list, "pull": cmd_pull, "push": cmd_push,
         "start": cmd_start, "status": cmd_status, "stop": cmd_stop}


def usage_error(reason: str) -> int:
    """PVE::CLIHandler $abort: short usage on stderr, exit(-1)."""
    lines = [f"ERROR: {reason}", "USAGE: pct <COMMAND> [ARGS] [OPTIONS]", ""]
    lines += [f"       {USAGE[verb]}" for verb in sorted(USAGE)]
    sys.stderr.write("\n".join(lines) + "\n")
    return EXIT_ERROR


def main(argv: list[str]) -> int:
    if not argv:
        return usage_error("no command specified")
    verb, args = argv[0], argv[1:]
    if verb == "help":
        print("USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n")
        print("\n".join(f"       {USAGE[v]}" for v in sorted(USAGE)))
        return 0
    handler = VERBS.get(verb)
    if handler is None:
        return usage_error(f"unknown command 'pct {verb}'")
    try:
        return handler(args)
    except Die as e:
        sys.stdout.flush()
        sys.stderr.write(f"{e}\n")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
