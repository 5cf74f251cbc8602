"""Inventory: names or bare addresses; bad files are reported with file:line."""

from __future__ import annotations

import pytest

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
