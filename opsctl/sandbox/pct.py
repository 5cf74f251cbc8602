#!/usr/bin/env -S PYTHONCOERCECLOCALE=0 /usr/bin/python3 -S
"""pct stand-in for the opsctl sandbox: Proxmox's `pct` verbs mapped onto plain LXC.

It is the contract every sandbox test relies on, so it mirrors the real thing as read in
pve-container (src/PVE/CLI/pct.pm at 94f5585, 5.x/PVE 9), pve-common (src/PVE/JSONSchema.pm
get_options, src/PVE/CLIHandler.pm, src/PVE/RESTHandler.pm cli_handler, src/PVE/Exception.pm,
at f665029) and lxc (src/lxc/attach.c, src/lxc/tools/lxc_attach.c at e7b855a51); the source of
each behaviour is named beside it. In short:

- a failure is a Perl `die` outside any eval, so the exit code is Perl's: `$!` (the errno left
  by the last failed system call) if non-zero, else 255; a missing container exits 2 (ENOENT
  from the cluster filesystem), never 255. Callers must go by the message, not the rc.
- options are parsed by Getopt::Long in its default permute mode until `--`.
- `exec` replaces itself with `lxc-attach` (no buffering, the command's exit code passes
  through), exactly as pct.pm does.

Containers live in the sandbox's own lxcpath, found from $OPSCTL_SANDBOX_LXCPATH or next to this
script (<state_dir>/bin/pct -> <state_dir>/lxc). $OPSCTL_SANDBOX_PVE_CONTAINER_VERSION makes it
behave like an older pve-container (before 5.0.9: no `--keep-env`). Stdlib only; runs as root.

The shebang turns off Python's C-locale coercion (PEP 538), which would otherwise put
LC_CTYPE=C.UTF-8 into the environment that `lxc-attach --keep-env` passes into the container.

Every remote command of every sandbox test starts this script (~3,000 a suite run), so it
starts lean: no ``site`` (``-S``; stdlib only), ``_locale`` rather than ``locale`` (which
imports ``re``), ``os.path`` rather than ``pathlib``, ``ctypes`` imported only by
the verbs that use it, ``os.uname`` for the node name: measured 73 -> 61 ms of CPU per
``pct exec`` (``subprocess``, which ``lxc-info`` needs, still imports ``locale``).
"""

from __future__ import annotations

import _locale
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterable

os.environ.pop("PYTHONCOERCECLOCALE", None)  # set by our shebang only; never passed on

EXIT_ERROR = 255  # Perl `die` with $! == 0 and $? == 0 (perldoc -f die)
CLONE_NEWNS = 0x00020000
PVE_CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"  # pve-common CLIHandler.pm run_cli_handler
# pct.pm `exec` (line 240) and `enter` (line 199): `$param->{'keep-env'} // 1`. The FIXME to
# flip the default to 0 "with pve 9" was never done: PVE 9 still keeps the environment.
KEEP_ENV_DEFAULT = True
# pve-container debian/changelog 5.0.9 (2024-03-15): "pct: add keep-env option to the 'enter'
# and 'exec' command" (commit 069553d). Older hosts (all of PVE 7, PVE 8.0/8.1 not updated since
# March 2024) answer `Unknown option: keep-env`.
KEEP_ENV_SINCE = (5, 0, 9)
PCT_PM = "/usr/share/perl5/PVE/CLI/pct.pm"  # where Debian installs it; Perl names it in `die`

USAGE = {
    "config": "pct config <vmid> [OPTIONS]",
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",
    "list": "pct list",
    "pull": "pct pull <vmid> <path> <destination> [OPTIONS]",
    "push": "pct push <vmid> <file> <destination> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "status": "pct status <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
}
# pve-common JSONSchema.pm parse_boolean
BOOLEANS = {"1": True, "on": True, "yes": True, "true": True,
            "0": False, "off": False, "no": False, "false": False}


def pve_container_version() -> tuple[int, ...]:
    raw = os.environ.get("OPSCTL_SANDBOX_PVE_CONTAINER_VERSION", "")
    try:
        return tuple(int(x) for x in raw.split(".")) if raw else (6, 0, 0)
    except ValueError:
        return (6, 0, 0)


class Die(Exception):
    """A Perl `die` in pct: message on stderr, exit code `$!` (errno) or 255 (perldoc -f die).

    ``perl_suffix``: the message had no trailing newline in the Perl source, so Perl appends
    ` at <file> line <N>.` (perldoc -f die).
    """

    def __init__(self, message: str, *, errno_: int = 0, perl_line: int | None = None):
        if perl_line is not None:
            message += f" at {PCT_PM} line {perl_line}."
        super().__init__(message)
        self.rc = errno_ or EXIT_ERROR


def lxc_path() -> str:
    env = os.environ.get("OPSCTL_SANDBOX_LXCPATH")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "lxc")


def nodename() -> str:
    return os.uname().nodename.split(".")[0]


def param_error(verb: str, name: str, message: str) -> Die:
    """pve-common Exception.pm raise_param_exc, stringified with the short usage appended
    (RESTHandler.pm cli_handler: a 400 gets `usage_str(..., 'short')`)."""
    return Die(f"400 Parameter verification failed.\n{name}: {message}\n\n{USAGE[verb]}")


def bad_request(verb: str, message: str) -> Die:
    """JSONSchema.pm get_options `raise(..., code => HTTP_BAD_REQUEST)` + short usage."""
    return Die(f"400 {message}\n{USAGE[verb]}")


def parse_vmid(verb: str, raw: str | None) -> str:
    """pve-common JSONSchema.pm: `pve-vmid` is an integer >= 100 (RESTHandler validates)."""
    if raw is None:
        raise bad_request(verb, "not enough arguments")
    if not raw.isdigit() or raw.startswith("0"):
        raise param_error(verb, "vmid", f"type check ('integer') failed - got '{raw}'")
    if int(raw) < 100:
        raise param_error(verb, "vmid", "invalid format - value must be at least 100")
    return raw


def decode_locale(arg: str) -> str:
    """JSONSchema.pm get_options: `decode('locale', ...)` of every argument after Getopt.

    Perl decodes the argv bytes with the session's locale (LC_ALL, else LC_CTYPE, else LANG;
    an unknown locale falls back to "C", i.e. ASCII), replacing what does not decode with
    U+FFFD, and exec() later writes the decoded string out as UTF-8. So under LANG=C every
    non-ASCII byte arrives in the container as U+FFFD; only a UTF-8 locale is byte-exact.
    """
    raw = os.fsencode(arg)
    name = next((os.environ[k] for k in ("LC_ALL", "LC_CTYPE", "LANG") if os.environ.get(k)), "C")
    try:
        _locale.setlocale(_locale.LC_CTYPE, name)
        codeset = _locale.nl_langinfo(_locale.CODESET)
    except _locale.Error:  # type: ignore[attr-defined]  # locale.Error is _locale's
        codeset = "ANSI_X3.4-1968"  # Perl: "Falling back to the standard locale ("C")"
    finally:
        _locale.setlocale(_locale.LC_CTYPE, "C")
    try:
        text = raw.decode(codeset, "replace")
    except LookupError:
        text = raw.decode("ascii", "replace")
    return os.fsdecode(text.encode("utf-8", "surrogateescape"))


def parse_bool(verb: str, name: str, raw: str) -> bool:
    """JSONSchema.pm get_options: a bare boolean flag ('') is 1, else parse_boolean."""
    if raw == "":
        return True
    value = BOOLEANS.get(raw.lower())
    if value is None:
        raise bad_request(verb, "unable to parse boolean option")
    return value


def parse_options(verb: str, args: list[str], booleans: Iterable[str] = (),
                  strings: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """Getopt::Long as pve-common JSONSchema.pm get_options configures it; -> (options, rest).

    - default config, so permute mode: options are taken from anywhere until `--`, the
      non-options are kept in order for the positional parameters (`pct exec 200 ls -la`
      fails on `-la`; `pct exec 200 -- ls -la` does not);
    - `prefix_pattern=(--|-)`: `-x` and `--x` are both options; no bundling;
    - booleans are `name:s` (optional value: the next argument unless it looks like an
      option), other properties `name=s` (mandatory value, taken even if it starts with `-`);
    - default auto_abbrev and ignore_case: a unique prefix names an option;
    - every unknown option is warned about (`Unknown option: x`), then parsing fails with
      `400 unable to parse option`.
    """
    booleans, known = set(booleans), {*booleans, *strings}
    options: dict[str, str] = {}
    rest: list[str] = []
    failed = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            rest.extend(args[i:])
            break
        if not arg.startswith("-") or arg == "-":
            rest.append(arg)  # permute: a non-option does not stop option parsing
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        given, eq, value = body.partition("=")
        name = given.lower()
        matches = [k for k in known if k == name] or [k for k in known if k.startswith(name)]
        if len(matches) != 1:
            if matches:
                sys.stderr.write(f"Option {given} is ambiguous ({', '.join(sorted(matches))})\n")
            else:
                sys.stderr.write(f"Unknown option: {name}\n")
            failed = True
            continue
        name = matches[0]
        if not eq:
            if name in booleans:
                if i < len(args) and not (args[i].startswith("-") and args[i] != "-"):
                    value = args[i]
                    i += 1
                else:
                    value = ""
            elif i < len(args):
                value = args[i]
                i += 1
            else:
                sys.stderr.write(f"Option {given} requires an argument\n")
                failed = True
                continue
        options[name] = value
    if failed:
        raise bad_request(verb, "unable to parse option")
    options = {k: decode_locale(v) for k, v in options.items()}
    rest = [decode_locale(a) for a in rest]
    for name in booleans & options.keys():
        options[name] = "1" if parse_bool(verb, name, options[name]) else "0"
    return options, rest


def positionals(verb: str, rest: list[str], names: int) -> list[str]:
    """JSONSchema.pm get_options: arg_param are filled in order; leftovers are an error."""
    if len(rest) < names:
        raise bad_request(verb, "not enough arguments")
    if len(rest) > names:
        raise bad_request(verb, "too many arguments")
    return rest


def config_file(vmid: str) -> str:
    return os.path.join(lxc_path(), vmid, "config")


def load_config(vmid: str) -> str:
    """pve-guest-common AbstractConfig.pm load_config: the container must exist on this node.

    The config is read from the cluster filesystem (pmxcfs), which fails with ENOENT; the
    `die` runs outside any eval with `$!` still ENOENT, so pct exits 2 (not 255).
    """
    path = config_file(vmid)
    if not os.path.isfile(path):
        raise Die(f"Configuration file 'nodes/{nodename()}/lxc/{vmid}.conf' does not exist",
                  errno_=errno.ENOENT)
    return path


def lxc(tool: str, vmid: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool, "-P", lxc_path(), "-n", vmid, *args],
                          capture_output=True, text=True, check=False)


def check_running(vmid: str) -> bool:
    if not os.path.isfile(config_file(vmid)):
        return False
    return lxc("lxc-info", vmid, "-s", "-H").stdout.strip() == "RUNNING"


def init_pid(vmid: str) -> int:
    out = lxc("lxc-info", vmid, "-p", "-H").stdout.strip()
    if not out.isdigit():
        raise Die(f"unable to get PID for CT {vmid} (not running?)")
    return int(out)


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def container_name(config: str) -> str:
    for line in read_lines(config):
        key, _, value = line.partition("=")
        if key.strip() == "lxc.uts.name":
            return value.strip()
    return ""


def enter_mount_namespace(pid: int) -> None:
    """Open paths from inside the container, like pct push/pull (no host symlink escapes)."""
    import ctypes  # push/pull only: not paid by every exec

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


# errno left in `$!` when pct dies because a container is not running: PVE::LXC check_running
# -> list_active_containers reads /proc/net/unix, and Perl's open() probes every new handle
# with an ioctl that fails with ENOTTY. Not a contract (it varies with what ran last); it is
# deliberately neither 0 nor 255 so that callers classify by the message.
NOT_RUNNING_ERRNO = errno.ENOTTY


def cmd_exec(args: list[str]) -> int:
    """pct.pm `exec` (register_method name => 'exec', lines 214-257)."""
    booleans = {"keep-env"} if pve_container_version() >= KEEP_ENV_SINCE else set()
    # cmddef `exec => [__PACKAGE__, 'exec', ['vmid', 'extra-args']]`; extra-args is also an
    # `=s@` option (get_standard_option('extra-args') is an array property)
    options, rest = parse_options("exec", args, booleans, {"extra-args"})
    vmid = parse_vmid("exec", rest[0] if rest else None)
    extra = rest[1:]
    keep_env = options.get("keep-env", "1" if KEEP_ENV_DEFAULT else "0") == "1"  # line 240
    load_config(vmid)  # line 243
    if not check_running(vmid):  # line 244
        raise Die(f"container '{vmid}' not running!", errno_=NOT_RUNNING_ERRNO)
    if not extra:  # line 246: `die "missing command"` (no newline: Perl appends where)
        raise Die("missing command", perl_line=246)
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):  # pct.pm clean_environment (line 162)
        os.environ.pop(name, None)
    os.environ["PATH"] = PVE_CLI_PATH
    # lines 250-253: lxc-attach -n <vmid> --keep-env|--clear-env -- extra-args; exec()
    argv = ["lxc-attach", "-P", lxc_path(), "-n", vmid,
            "--keep-env" if keep_env else "--clear-env", "--", *extra]
    sys.stdout.flush()
    # Perl's exec() leaves signal dispositions at their defaults; Python ignores SIGPIPE and
    # SIGXFSZ, and an ignored signal stays ignored across exec: restore them, or every
    # `yes | head` in the container would run on after its reader left.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    os.execvp(argv[0], argv)
    return EXIT_ERROR  # not reached


def cmd_status(args: list[str]) -> int:
    """pct.pm `status` (line 47): `status: <state>`, or every field with --verbose."""
    options, rest = parse_options("status", args, {"verbose"})
    (vmid_raw,) = positionals("status", rest, 1) if rest else (None,)
    vmid = parse_vmid("status", vmid_raw)
    config = load_config(vmid)
    state = "running" if check_running(vmid) else "stopped"
    if options.get("verbose") == "1":
        stat = {"name": container_name(config), "status": state, "type": "lxc", "vmid": vmid}
        if state == "running":
            stat["pid"] = str(init_pid(vmid))
        for key in sorted(stat):
            print(f"{key}: {stat[key]}")
    else:
        print(f"status: {state}")
    return 0


#: The stand-in's /etc/pve/lxc/<vmid>.conf: an optional ``pve.conf`` beside the LXC config
#: (a test writes GPU passthrough entries there); without it, the keys Proxmox derives.
PVE_CONF = "pve.conf"
#: Raw LXC keys that a PVE config carries through (and pct config prints after the rest).
RAW_LXC_KEYS = ("lxc.cgroup2.devices.allow", "lxc.mount.entry")


def cmd_config(args: list[str]) -> int:
    """pct.pm cmddef `config` (the entry right after `list`'s, line 1057): the keys sorted,
    `digest` and `lxc` left out, one `$k: $v` a line; then each raw `lxc.*` entry as
    `$key: $value` in file order."""
    _, rest = parse_options("config", args, {"current"}, {"snapshot"})
    (vmid_raw,) = positionals("config", rest, 1) if rest else (None,)
    vmid = parse_vmid("config", vmid_raw)
    config = load_config(vmid)
    keys: dict[str, str] = {}
    raw: list[tuple[str, str]] = []
    pve = os.path.join(os.path.dirname(config), PVE_CONF)
    if os.path.isfile(pve):  # PVE/LXC/Config.pm parse_pct_config: `key: value`, raw lxc.* in order
        for line in read_lines(pve):
            key, sep, value = line.partition(":")
            if not sep or line.lstrip().startswith("#"):
                continue
            if key.strip().startswith("lxc."):
                raw.append((key.strip(), value.strip()))
            else:
                keys[key.strip()] = value.strip()
    else:
        keys = {"arch": "amd64", "hostname": container_name(config), "ostype": "debian"}
        for line in read_lines(config):
            key, _, value = line.partition("=")
            if key.strip() in RAW_LXC_KEYS:
                raw.append((key.strip(), value.strip()))
    for key in sorted(keys):
        if key not in ("digest", "lxc"):
            print(f"{key}: {keys[key]}")
    for key, value in raw:
        print(f"{key}: {value}")
    return 0


def cmd_list(args: list[str]) -> int:
    """pct.pm cmddef `list` (line 1057): printf "%-10s %-10s %-12s %-20s\n", nothing if empty."""
    _, rest = parse_options("list", args)
    if rest:
        raise bad_request("list", "too many arguments")
    root = lxc_path()
    rows = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        config = os.path.join(root, name, "config")
        if name.isdigit() and os.path.isfile(config):
            state = "running" if check_running(name) else "stopped"
            rows.append((int(name), state, container_name(config)))
    if not rows:
        return 0
    line = "{:<10} {:<10} {:<12} {:<20}"
    print(line.format("VMID", "Status", "Lock", "Name"))
    for vmid, state, name in sorted(rows):
        print(line.format(vmid, state, "", name))
    return 0


def cmd_start(args: list[str]) -> int:
    """API2/LXC/Status.pm vm_start: `CT <vmid> already running` (line 162)."""
    _, rest = parse_options("start", args, {"skiplock", "debug"})
    vmid = parse_vmid("start", positionals("start", rest, 1)[0] if rest else None)
    load_config(vmid)
    if check_running(vmid):
        raise Die(f"CT {vmid} already running", errno_=NOT_RUNNING_ERRNO)
    started = lxc("lxc-start", vmid)
    if started.returncode != 0:
        raise Die(f"startup for container '{vmid}' failed\n{started.stderr.strip()}")
    lxc("lxc-wait", vmid, "-s", "RUNNING", "-t", "10")
    return 0


def cmd_stop(args: list[str]) -> int:
    """API2/LXC/Status.pm vm_stop: `CT <vmid> not running` (line 264), before load_config."""
    _, rest = parse_options("stop", args, {"skiplock", "overrule-shutdown"}, {"timeout"})
    vmid = parse_vmid("stop", positionals("stop", rest, 1)[0] if rest else None)
    if not check_running(vmid):
        raise Die(f"CT {vmid} not running", errno_=NOT_RUNNING_ERRNO)
    # A hard stop, like Proxmox's `pct stop`; never a clean shutdown, whose scripts would
    # act on the network namespace this container shares with the host.
    stopped = lxc("lxc-stop", vmid, "--kill")
    if stopped.returncode != 0:
        raise Die(f"stopping container '{vmid}' failed\n{stopped.stderr.strip()}")
    return 0


def cmd_push(args: list[str]) -> int:
    """pct.pm `push` (line 694)."""
    options, rest = parse_options("push", args, set(), {"perms", "user", "group"})
    vmid = parse_vmid("push", rest[0] if rest else None)
    _, file, dest = positionals("push", rest, 3)
    if not check_running(vmid):  # line 752
        raise Die("can only push files to a running CT", errno_=NOT_RUNNING_ERRNO)
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
    """pct.pm `pull` (line 608)."""
    options, rest = parse_options("pull", args, set(), {"perms", "user", "group"})
    vmid = parse_vmid("pull", rest[0] if rest else None)
    _, path, dest = positionals("pull", rest, 3)
    if not check_running(vmid):  # line 664: no newline, so Perl appends where it died
        raise Die("can only pull files from a running VM", errno_=NOT_RUNNING_ERRNO,
                  perl_line=664)
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


VERBS = {"config": cmd_config, "exec": cmd_exec, "list": cmd_list, "pull": cmd_pull, "push": cmd_push,
         "start": cmd_start, "status": cmd_status, "stop": cmd_stop}


def usage_error(reason: str) -> int:
    """pve-common CLIHandler.pm $abort: short usage on stderr, exit(-1) = 255."""
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
    except Die as e:  # uncaught: Perl prints the message and exits with $! or 255
        sys.stdout.flush()
        sys.stderr.write(f"{e}\n")
        return e.rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
