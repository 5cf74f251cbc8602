"""A direct host (inventory ``enter: direct``): the SSH host is the target itself.

Pure spelling and inventory rules here; the commands run against the real sandbox's direct
target in tests/sandbox/test_direct_target_sandbox.py.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.config import inventory
from opsctl.errors import ConfigError
from opsctl.remote import entry
from opsctl.remote.command import GUARD_PREFIX, host_command
from opsctl.remote.transport import container_command
from tests.cli_runner import run_cli
from tests.unit.test_cli_help import COMMANDS, _argv

#: a direct host nothing listens for: a command that contacted it would fail as a transport
#: error (exit 10), never as the usage error a refused --ct is
DIRECT_YAML = """hosts:
  gpu1:
    address: 127.0.0.1
    port: 1
    enter: direct
    root: /srv/opsctl
    target: {gpus: 2, playbook: dflash-cpu-smoke}
  pve1:
    address: 127.0.0.2
    port: 1
    containers: {200: {gpus: 1}}
"""


def _inventory(tmp: Path, text: str) -> inventory.Inventory:
    (tmp / "hosts.yaml").write_text(text)
    return inventory.load([tmp])


@pytest.fixture
def inv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> inventory.Inventory:
    d = tmp_path / "inv"
    d.mkdir()
    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(d))
    return _inventory(d, DIRECT_YAML)


def test_every_enter_value_of_the_inventory_has_exactly_one_entry():
    assert set(entry.ENTRIES) == set(inventory.ENTER_KINDS)
    assert all(e.name == name for name, e in entry.ENTRIES.items())


def test_a_direct_command_is_the_argv_itself_under_the_hosts_deadline(inv):
    gpu1 = inv.resolve("gpu1")
    entered = entry.of(gpu1).argv(inventory.DIRECT_CTID, ["python3", "-c", "print('a b')"],
                                  timeout=30)
    assert entered == ["python3", "-c", "print('a b')"]
    command = host_command(entered, timeout=30, sudo=gpu1.sudo, pct_path=gpu1.pct_path)
    assert shlex.split(command) == ["env", "LC_ALL=C.UTF-8", "timeout", "-k", "2", "33",
                                    "python3", "-c", "print('a b')"]
    assert "pct" not in shlex.split(command)


def test_a_pct_command_is_spelled_as_before(inv):
    pve1 = inv.resolve("pve1")
    assert entry.of(pve1).argv(200, ["true"], timeout=5) == [
        "pct", "exec", "200", "--keep-env", "0", "--", "timeout", "-k", "2", "5", "true"]


def test_opsctl_exec_on_a_direct_host_runs_under_the_guard_without_pct(inv):
    entered = entry.of(inv.resolve("gpu1")).argv(0, ["sleep", "1"], timeout=9, guard=True)
    assert tuple(entered[:3]) == GUARD_PREFIX and entered[-3:] == ["9", "sleep", "1"]


def test_the_openssh_command_of_push_pull_and_shell_has_no_pct_on_a_direct_host(inv):
    command = container_command(inv.resolve("gpu1"), 0, ["rsync", "--server", "."], step="rsync")
    assert shlex.split(command) == ["env", "LC_ALL=C.UTF-8", "rsync", "--server", "."]


def test_a_direct_hosts_one_target_carries_what_a_container_entry_would(inv):
    gpu1 = inv.resolve("gpu1")
    assert gpu1.direct and gpu1.targets() == {0: gpu1.target}
    assert gpu1.target_spec(0) is not None and gpu1.target_spec(0).gpus == 2  # type: ignore[union-attr]
    assert gpu1.target_label(0) == "gpu1"
    assert inv.resolve("pve1").target_label(200) == "pve1 ct 200"


def test_a_direct_host_needs_no_sudo_rule_because_nothing_runs_under_sudo(inv):
    gpu1 = inv.resolve("gpu1").model_copy(update={"user": "alice"})
    command = container_command(gpu1, 0, ["pct", "list"], step="x")  # even a program named pct
    assert "sudo" not in shlex.split(command)


#: a value of each field only a pct host has (the keys are held to the inventory's list)
PCT_VALUES = {"containers": "{200: {gpus: 1}}", "sudo": "true", "pct_path": "/usr/sbin/pct",
              "node": "pve1"}


def test_the_refused_fields_are_exactly_the_pct_only_ones():
    assert set(PCT_VALUES) == set(inventory.PCT_ONLY_FIELDS)


@pytest.mark.parametrize("field, value", sorted(PCT_VALUES.items()))
def test_a_direct_host_given_a_field_of_pct_hosts_is_refused_in_one_line(tmp_path, field, value):
    with pytest.raises(ConfigError) as exc:
        _inventory(tmp_path, f"hosts:\n  gpu1:\n    address: 127.0.0.1\n    enter: direct\n"
                             f"    {field}: {value}\n")
    message = exc.value.message
    assert "\n" not in message and f"{tmp_path / 'hosts.yaml'}:2: hosts.gpu1:" in message
    assert field in message and "enter: direct" in message


def test_a_pct_host_given_a_direct_target_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as exc:
        _inventory(tmp_path, "hosts:\n  pve1:\n    address: 127.0.0.1\n    target: {gpus: 1}\n")
    assert "\n" not in exc.value.message and "containers:" in exc.value.message


def test_an_unknown_enter_value_is_refused_naming_the_ones_there_are(tmp_path):
    with pytest.raises(ConfigError) as exc:
        _inventory(tmp_path, "hosts:\n  h:\n    address: 127.0.0.1\n    enter: docker\n")
    message = exc.value.message
    assert "\n" not in message and "hosts.h.enter" in message
    assert "'direct'" in message and "'pct'" in message


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=30))
def test_any_enter_text_other_than_the_kinds_is_a_one_line_config_error(text):
    if text in inventory.ENTER_KINDS:
        return
    try:
        inventory.HostSpec.model_validate({"address": "127.0.0.1", "enter": text})
    except Exception as exc:  # pydantic's error: the file loader makes it one line
        assert type(exc).__name__ == "ValidationError"
    else:
        raise AssertionError(f"enter {text!r} was accepted")


@pytest.mark.parametrize("root", ["opsctl", "~/opsctl", "/a\nb"])
def test_a_root_that_is_not_one_absolute_path_is_refused(tmp_path, root):
    with pytest.raises(ConfigError):
        _inventory(tmp_path, f"hosts:\n  h:\n    address: 127.0.0.1\n    root: {json.dumps(root)}\n")


def test_a_ct_for_a_direct_host_is_refused_in_one_line_before_anything_is_contacted(inv):
    result = run_cli("status", "--host", "gpu1", "--ct", "200")
    assert result.exit_code == ConfigError.exit_code, result.output
    assert "gpu1 is a direct host (enter: direct)" in result.output
    assert "takes no --ct (given 200)" in result.output


def test_a_remembered_direct_target_is_used_without_flags_and_a_later_ct_is_refused(inv):
    from opsctl.ops import jobs
    from opsctl.state import last_target

    last_target.save(last_target.LastTarget(host="gpu1", ctid=inventory.DIRECT_CTID))
    with jobs.open_target(None, None) as tgt:
        assert (tgt.name, tgt.ctid, tgt.label) == ("gpu1", 0, "gpu1")
        assert tgt.flags == ["--host", "gpu1"]
    with pytest.raises(ConfigError, match="takes no --ct"):
        jobs.open_target(None, 201)


def test_a_proxmox_host_named_without_ct_asks_for_ct_never_says_nothing_is_remembered(inv):
    """The remembered target is a direct host; ``--host pve1`` alone (or its address, which
    may be the direct host's too) has no container: the line asks for ``--ct``, never claims
    nothing was remembered."""
    from opsctl.state import last_target

    last_target.save(last_target.LastTarget(host="gpu1", ctid=inventory.DIRECT_CTID))
    result = run_cli("status", "--host", "pve1")
    assert result.exit_code == 2, result.output
    assert "--host pve1 is a Proxmox host, so --ct says which" in result.output, result.output
    assert "nothing remembered" not in result.output and "on gpu1" in result.output


@pytest.mark.parametrize("damage", ["fifo", "link to /dev/zero", "link to a good copy",
                                    "ctid 1e400", "ctid true", "not json"])
def test_a_damaged_remembered_target_is_nothing_remembered_never_a_hang_or_a_traceback(
        inv, tmp_path, damage):
    """``last-target.json`` as something ``save`` never writes: read as "nothing remembered"
    (one line, exit 2), never waited on (a FIFO), read without end (``/dev/zero``), followed
    (a link) or a traceback (a ctid no int holds)."""
    import os

    from opsctl.state import last_target

    good = json.dumps({"host": "gpu1", "ctid": 0})
    where = last_target.path()
    where.parent.mkdir(parents=True, exist_ok=True)
    if damage == "fifo":
        os.mkfifo(where)
    elif damage == "link to /dev/zero":
        where.symlink_to("/dev/zero")
    elif damage == "link to a good copy":
        (tmp_path / "copy.json").write_text(good)
        where.symlink_to(tmp_path / "copy.json")
    else:
        where.write_text({"ctid 1e400": '{"host": "gpu1", "ctid": 1e400}',
                          "ctid true": '{"host": "gpu1", "ctid": true}', "not json": "{"}[damage])
    assert last_target.load() is None
    result = run_cli("status")
    assert result.exit_code == 2 and "no target" in result.output, result.output


#: commands whose examples stop at an earlier one-line refusal in a test run, with why
EARLIER_REFUSAL = {"opsctl attach": "it needs a terminal and says so before it resolves a target"}


def _targeted_examples() -> list[tuple[str, list[str]]]:
    """Every example line of every command that takes ``--host`` and ``--ct``."""
    found = []
    for name, cmd in COMMANDS:
        opts = {o for p in cmd.params for o in p.opts}
        if not {"--host", "--ct"} <= opts or name in EARLIER_REFUSAL:
            continue
        for example in getattr(cmd, "examples", ()):
            argv = _argv(example)
            if "--host" in argv and "--ct" in argv:
                found.append((name, argv))
    return found


TARGETED_EXAMPLES = _targeted_examples()


def _on_direct_host(argv: list[str]) -> list[str]:
    out = list(argv[1:])
    out[out.index("--host") + 1] = "gpu1"
    return out


@pytest.mark.parametrize("name, argv", TARGETED_EXAMPLES, ids=[" ".join(a) for _, a in TARGETED_EXAMPLES])
def test_every_targeted_commands_example_refuses_a_ct_on_a_direct_host(inv, name, argv):
    """Walk of the CLI tree: each command, run as its own example with the host swapped for a
    direct one, refuses the ``--ct`` with the one-line usage error, having contacted nothing
    (the host's port has no server: a contact would be a transport error)."""
    result = run_cli(*_on_direct_host(argv), input="")
    assert result.exit_code == ConfigError.exit_code, (name, result.output)
    assert "is a direct host (enter: direct)" in result.output, result.output
    assert "Traceback" not in result.output


def test_the_walk_found_the_targeted_commands():
    names = {n for n, _ in TARGETED_EXAMPLES}
    assert {"opsctl status", "opsctl deploy", "opsctl exec", "opsctl doctor", "opsctl push",
            "opsctl pull", "opsctl shell"} <= names, sorted(names)


def test_a_direct_host_in_a_multi_node_run_is_refused_in_one_line(inv):
    """``--nodes HOST:CT`` names containers: a direct host has none to name."""
    result = run_cli("deploy", "--nodes", "gpu1:200,pve1:200", "--playbook", "dflash-cpu-smoke")
    assert result.exit_code == ConfigError.exit_code, result.output
    assert "gpu1 is a direct host (enter: direct)" in result.output
    assert "Traceback" not in result.output


def test_deploy_on_a_direct_host_needs_no_ct_and_takes_the_targets_playbook(inv):
    from opsctl.ops import deploy

    assert deploy.default_playbook(inv.resolve("gpu1"), inventory.DIRECT_CTID) == "dflash-cpu-smoke"
    with pytest.raises(ConfigError) as exc:
        deploy.default_playbook(inv.resolve("gpu1").model_copy(update={"target": None}), 0)
    assert exc.value.message.endswith("names none for gpu1")
    assert "set target.playbook in the inventory" in (exc.value.hint or "")


def test_the_device_node_fix_on_a_direct_host_makes_the_nodes_on_the_host_not_in_an_lxc_config():
    from remote_payload.agent import doctor

    nodes = {"/dev/nvidia0": (195, 0), "/dev/nvidiactl": (195, 255)}
    direct = doctor.check_device_nodes("570.1", nodes, direct=True)
    assert direct["status"] == "fail" and "nvidia-modprobe -u -c=0" in direct["fix"]
    assert "pct" not in direct["fix"] and "/etc/pve" not in direct["fix"]
    lxc = doctor.check_device_nodes("570.1", nodes, ctid="200")
    assert "/etc/pve/lxc/200.conf" in lxc["fix"]


def test_only_the_entry_spells_how_a_command_enters_the_target():
    """``pct exec`` (``pct_argv``) and the exec guard (``guard_argv``) are put in front of a
    command in one place, :mod:`opsctl.remote.entry`, so a kind of host is one entry there."""
    import ast

    from tests.paths import REPO

    callers = set()
    for path in (REPO / "opsctl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("pct_argv", "guard_argv"):
                    callers.add(path.relative_to(REPO).as_posix())
    # command.py: pct_argv runs the guard for pct, where both are defined
    assert callers == {"opsctl/remote/entry.py", "opsctl/remote/command.py"}, callers
