"""Inventory: names or bare addresses; bad files are reported with file:line."""

from __future__ import annotations

import json
import typing as t

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.config import inventory
from opsctl.errors import ConfigError
from tests.paths import REPO


def test_the_shipped_inventory_has_the_users_host():
    inv = inventory.load([REPO / "inventory"])
    pve1 = inv.resolve("pve1")
    assert (pve1.address, pve1.port, pve1.user) == ("10.1.2.6", 22, "root")
    assert pve1.containers[200].gpus == 8


def test_a_bare_address_resolves_with_root_and_port_22():
    inv = inventory.load([])
    h = inv.resolve("10.1.2.6")
    assert (h.address, h.user, h.port) == ("10.1.2.6", "root", 22)
    h2 = inv.resolve("admin@127.0.0.1:2222")
    assert (h2.address, h2.user, h2.port) == ("127.0.0.1", "admin", 2222)


def test_a_bare_address_of_a_known_host_uses_its_inventory_entry():
    inv = inventory.load([REPO / "inventory"])
    assert inv.resolve("10.1.2.6").name == "pve1"


@pytest.mark.parametrize("where", ["containers:\n      50: {gpus: true}",
                                   "enter: direct\n    target: {gpus: true}",
                                   "port: true"])
def test_a_yaml_boolean_is_no_count_of_gpus_nor_a_port(tmp_path, where):
    (tmp_path / "hosts.yaml").write_text(f"hosts:\n  a:\n    address: 127.0.0.1\n    {where}\n")
    with pytest.raises(ConfigError) as exc:
        inventory.load([tmp_path])
    assert "hosts.a." in exc.value.message and "\n" not in exc.value.message


def test_a_known_hosts_address_with_another_user_keeps_its_kind_of_target(tmp_path):
    """``admin@ADDR:PORT`` of a direct host is that direct host as ``admin`` (never a fresh
    Proxmox host sent ``pct exec``), with its root; only the user differs."""
    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n  gpu1:\n    address: 127.0.0.1\n    port: 2222\n    enter: direct\n"
        "    root: /srv/opsctl\n    target: {gpus: 1}\n")
    inv = inventory.load([tmp_path])
    h = inv.resolve("admin@127.0.0.1:2222")
    assert (h.direct, h.user, h.port, h.root) == (True, "admin", 2222, "/srv/opsctl")
    assert inv.resolve("127.0.0.1:2222").name == "gpu1" and inv.resolve("gpu1").user == "root"


def test_an_unknown_name_lists_the_known_hosts():
    inv = inventory.load([REPO / "inventory"])
    with pytest.raises(ConfigError) as exc:
        inv.resolve("no such host!")
    assert "pve1" in (exc.value.hint or "")


def test_a_bad_inventory_file_names_file_line_and_field(tmp_path):
    p = tmp_path / "hosts.yaml"
    p.write_text("hosts:\n  a:\n    address: 127.0.0.1\n    containers:\n      50: {gpus: -1}\n")
    with pytest.raises(ConfigError) as exc:
        inventory.load([tmp_path])
    assert f"{p}:5: hosts.a.containers.50.gpus" in exc.value.message


def test_the_users_container_deploys_the_bundled_8gpu_trainer_by_default(monkeypatch):
    from opsctl.ops import deploy

    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(REPO / "inventory"))
    # resolved from the inventory alone: nothing is contacted
    inv = inventory.load()
    assert deploy.default_playbook(inv.resolve("10.1.2.6"), 200) == "dflash-8gpu"
    assert deploy.default_playbook(inv.resolve("pve1"), 200) == "dflash-8gpu"


def test_a_container_without_a_default_playbook_asks_for_one(tmp_path, monkeypatch):
    from opsctl.ops import deploy

    (tmp_path / "hosts.yaml").write_text("hosts:\n  lab:\n    address: 127.0.0.1\n"
                                         "    containers:\n      300: {gpus: 1}\n")
    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(tmp_path))
    with pytest.raises(ConfigError) as exc:
        deploy.default_playbook(inventory.load().resolve("lab"), 300)
    assert "dflash-cpu-smoke" in (exc.value.hint or "") and "dflash-8gpu" in (exc.value.hint or "")


# --- a fresh install dials no host; unknown names are never looked up ------


@pytest.fixture
def no_network(monkeypatch):
    """Any DNS lookup or connection fails the test (what was asked is recorded)."""
    import socket

    asked: list[tuple[object, ...]] = []

    def refuse(*args: object, **kwargs: object) -> t.NoReturn:
        asked.append(args)
        raise AssertionError(f"network/DNS used: {args!r}")

    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "create_connection"):
        monkeypatch.setattr(socket, name, refuse)
    return asked


def test_fresh_install_dials_no_host(tmp_path, monkeypatch, no_network):
    """No OPSCTL_INVENTORY*, an empty home and an empty current directory: no host at all;
    the package's example host is shown by `hosts --example`, never read."""
    from click.testing import CliRunner

    from opsctl.cli import cli
    from opsctl.config import paths

    monkeypatch.delenv("OPSCTL_INVENTORY_DIRS", raising=False)
    monkeypatch.delenv("OPSCTL_INVENTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    assert [d.origin for d in paths.inventory_search()] == ["cwd", "home"]
    assert inventory.load().hosts == {}
    listed = CliRunner().invoke(cli, ["hosts", "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout)["hosts"] == [], listed.output
    assert "no hosts" in CliRunner().invoke(cli, ["hosts"]).output
    fleet = CliRunner().invoke(cli, ["status", "--all", "--json"])
    assert fleet.exit_code == 0 and json.loads(fleet.stdout)["rows"] == [], fleet.output
    example = CliRunner().invoke(cli, ["hosts", "--example"])
    assert example.exit_code == 0 and "address: 10.1.2.6" in example.output
    assert example.output == paths.EXAMPLE_INVENTORY.read_text(encoding="utf-8")
    assert no_network == []


def test_the_checkouts_inventory_is_the_users_file_not_a_link_into_the_package():
    assert (REPO / "inventory").is_dir() and not (REPO / "inventory").is_symlink()
    assert not (REPO / "opsctl" / "bundled" / "inventory").exists()


def test_unknown_name_fails_before_any_dns_lookup(no_network, isolated_env):
    inv = inventory.load()
    for text in ("nosuch", "root@nosuch:22", "nosuch.example.com"):
        with pytest.raises(ConfigError, match=f"unknown host {text!r}") as exc:
            inv.resolve(text)
        assert str(isolated_env / "inventory") in exc.value.message, "names what was searched"
        assert "nothing was looked up" in exc.value.message
    assert no_network == []


@pytest.mark.parametrize("args", [
    ["deploy", "--nodes", "nosuch:200"], ["status", "--nodes", "nosuch:200,nosuch:201"],
    ["stop", "--nodes", "nosuch:200"], ["status", "--host", "nosuch", "--ct", "200"],
    ["exec", "--host", "nosuch", "--ct", "200", "--", "true"]])
def test_the_cli_refuses_an_unknown_name_with_exit_2_and_no_lookup(no_network, args):
    from click.testing import CliRunner

    from opsctl.cli import cli

    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert "unknown host 'nosuch'" in res.output
    assert no_network == []


def test_configured_names_still_resolve_without_a_lookup(no_network, tmp_path, monkeypatch):
    (tmp_path / "h.yaml").write_text("hosts:\n  lab:\n    address: gpu.lab.internal\n")
    inv = inventory.load([tmp_path])
    assert inv.resolve("lab").address == "gpu.lab.internal"  # the inventory names it
    assert inv.resolve("admin@gpu.lab.internal:2222").user == "admin"  # its address, too
    assert inv.resolve("localhost").address == "localhost"
    assert inv.resolve("[::1]:2222").address == "::1"
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host box\n  HostName 127.0.0.1\n")
    assert inv.resolve("box").address == "127.0.0.1"  # an ~/.ssh/config alias
    assert no_network == []


# --- the remembered target keeps its resolved address -------------------


def test_remembered_target_keeps_its_resolved_address(isolated_env, tmp_path, monkeypatch,
                                                       no_network):
    from click.testing import CliRunner

    from opsctl.cli import cli
    from opsctl.ops import jobs
    from opsctl.state import last_target

    home_inv = isolated_env / "inventory"
    home_inv.mkdir(parents=True, exist_ok=True)
    (home_inv / "sandbox.yaml").write_text("hosts:\n  sandbox:\n    address: 127.0.0.1\n"
                                           "    port: 2222\n    containers: {200: {}}\n")
    last_target.save(last_target.LastTarget("sandbox", 200, "j-1", address="root@127.0.0.1:2222"))
    with jobs.open_target(None, None) as tgt:  # as remembered: fine (nothing contacted yet)
        assert tgt.host.ssh_label() == "root@127.0.0.1:2222"
    # a project's ./inventory redefines the name: not followed silently
    project = tmp_path / "project"
    (project / "inventory").mkdir(parents=True)
    (project / "inventory" / "hosts.yaml").write_text(
        "hosts:\n  sandbox:\n    address: 127.0.0.2\n    containers: {200: {}}\n")
    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", f"{project / 'inventory'}:{home_inv}")
    with pytest.raises(ConfigError, match=r"was root@127\.0\.0\.1:2222 at the last deploy") as exc:
        jobs.open_target(None, None)
    assert "now resolves to root@127.0.0.2" in exc.value.message
    assert str(project / "inventory" / "hosts.yaml") in exc.value.message
    for args in (["status", "--json"], ["stop", "--yes"], ["logs"]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2 and "at the last deploy" in res.output, (args, res.output)
    # naming the host says which definition: the new one
    with jobs.open_target("sandbox", 200) as tgt:
        assert tgt.host.address == "127.0.0.2"
    assert no_network == []


def test_a_remembered_run_keeps_each_nodes_address(isolated_env, tmp_path, monkeypatch, no_network):
    from click.testing import CliRunner

    from opsctl.cli import cli
    from opsctl.state import last_target

    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "h.yaml").write_text("hosts:\n  a:\n    address: 127.0.0.3\n    containers: {200: {}}\n")
    last_target.save(last_target.LastTarget("a", 200, "r-1", nodes=("a:200", "a:201"),
                                            address="root@127.0.0.1",
                                            node_addresses=("root@127.0.0.1", "root@127.0.0.1")))
    res = CliRunner().invoke(cli, ["stop", "--json"])
    assert res.exit_code == 2 and "was root@127.0.0.1 at the last deploy" in res.output, res.output
    assert no_network == []


# --- property tests: host specs and inventory files are untrusted text ----------------------

_LABELS = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9-]{0,8}[A-Za-z0-9])?", fullmatch=True)


class TestHostSpecProperties:
    @settings(max_examples=300, deadline=None)
    @given(user=st.one_of(st.none(), st.from_regex(r"[a-z_][a-z0-9_.-]{0,8}", fullmatch=True)),
           address=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
           port=st.one_of(st.none(), st.integers(1, 65535)))
    def test_an_address_spec_resolves_to_its_parts(self, user, address, port):
        shown = f"[{address}]" if address.version == 6 else str(address)
        text = f"{user + '@' if user else ''}{shown}{f':{port}' if port else ''}"
        spec = inventory.load([]).resolve(text)
        assert (spec.address, spec.user, spec.port) == (str(address), user or "root", port or 22)

    @settings(max_examples=500, deadline=None)
    @given(st.text(max_size=60))
    def test_any_text_resolves_or_is_a_usage_error_and_never_a_lookup(self, text):
        import socket

        before = socket.getaddrinfo
        try:
            spec = inventory.load([]).resolve(text)
        except ConfigError as exc:
            assert exc.exit_code == 2
            return
        finally:
            assert socket.getaddrinfo is before
        assert 1 <= spec.port <= 65535
        import ipaddress

        assert spec.address == "localhost" or ipaddress.ip_address(spec.address)

    @settings(max_examples=200, deadline=None)
    @given(st.from_regex(r"[A-Za-z0-9.:\[\]@_-]{1,30}:[0-9]{1,10}", fullmatch=True))
    def test_a_port_out_of_range_is_refused_not_wrapped(self, text):
        try:
            spec = inventory.load([]).resolve(text)
        except ConfigError:
            return
        assert 1 <= spec.port <= 65535


class TestInventoryFileProperties:
    @settings(max_examples=200, deadline=None)
    @given(st.text(max_size=300))
    def test_any_file_loads_or_names_itself_in_a_usage_error(self, tmp_path_factory, text):
        d = tmp_path_factory.mktemp("inv")
        (d / "hosts.yaml").write_text(text, encoding="utf-8")
        try:
            inv = inventory.load([d])
        except ConfigError as exc:
            assert str(d / "hosts.yaml") in exc.message
            return
        assert all(isinstance(h, inventory.HostSpec) for h in inv.hosts.values())

    @settings(max_examples=200, deadline=None)
    @given(st.dictionaries(_LABELS, st.fixed_dictionaries(
        {"address": st.one_of(_LABELS, st.ip_addresses().map(str), st.text(max_size=12))},
        optional={"port": st.integers(-5, 70000), "user": st.text(max_size=8),
                  "containers": st.dictionaries(st.integers(-5, 10**10), st.just({}), max_size=2)}),
        max_size=3))
    def test_any_hosts_mapping_validates_or_names_the_field(self, tmp_path_factory, hosts):
        import yaml

        d = tmp_path_factory.mktemp("inv")
        (d / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}), encoding="utf-8")
        try:
            inv = inventory.load([d])
        except ConfigError as exc:
            assert "hosts." in exc.message
            return
        assert set(inv.hosts) == set(hosts)
        assert all(1 <= h.port <= 65535 and all(c >= 100 for c in h.containers)
                   for h in inv.hosts.values())
