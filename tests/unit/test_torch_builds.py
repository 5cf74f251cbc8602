"""The local builds table: defaults, overrides, pins, agent arguments, wheelhouse download."""

from __future__ import annotations

import sys
import typing as t
from pathlib import Path

import pytest

from opsctl.config.torch_builds import (
    DEFAULT_INDEX,
    TorchBuild,
    TorchPin,
    load_table,
    remote_wheelhouse_dir,
    swap_args,
)
from opsctl.errors import ConfigError, TorchEnvError
from opsctl.ops.wheelhouse import prepare_wheelhouse
from tests.wheel_index import build_fake_torches, serve_index, write_simple_index


def test_shipped_defaults_cover_the_incident_builds() -> None:
    table = load_table()
    assert {"cpu", "cu128", "cu130"} <= set(table.variants())
    cu130 = table.resolve("cu130")
    assert (cu130.pin, cu130.name) == ("2.11.0+cu130", "torch-2.11.0-cu130")
    assert cu130.index_url == "https://download.pytorch.org/whl/cu130"
    assert cu130.requirement == "torch==2.11.0+cu130" and cu130.expected_cuda == "13.0"
    assert table.resolve("cpu").expected_cuda is None


def test_unknown_variant_lists_the_known_ones() -> None:
    table = load_table()
    with pytest.raises(ConfigError) as exc:
        table.resolve("cu999")
    assert "unknown torch variant 'cu999'" in exc.value.message
    assert "known variants: cpu, cu126, cu128, cu130" in exc.value.message
    with pytest.raises(ConfigError, match="known variants"):
        TorchPin.parse("rocm6.2", table.variants())


def test_pin_takes_a_variant_or_release_plus_variant() -> None:
    assert TorchPin.parse("cu130") == TorchPin("cu130")
    assert TorchPin.parse("2.11.0+cu130") == TorchPin("cu130", "2.11.0")
    table = load_table()
    assert table.resolve("2.10.0+cu128").pin == "2.10.0+cu128"
    assert table.resolve(TorchPin("cu128"), version="2.12.0").name == "torch-2.12.0-cu128"
    with pytest.raises(ConfigError, match="two torch versions"):
        table.resolve("2.10.0+cu128", version="2.12.0")


def test_version_with_local_tag_is_refused_with_an_example() -> None:
    with pytest.raises(ConfigError) as exc:
        load_table().resolve("cu130", version="2.11.0+cu130")
    assert exc.value.hint == "opsctl swap-torch cu130 --version 2.11.0"


def test_inventory_and_host_override_field_by_field() -> None:
    table = load_table(
        {"cu130": {"index_url": "https://mirror.example/whl/cu130"}, "cu124": {"version": 2.6}},
        {"cpu": {"wheelhouse": True}, "cu130": {"version": "2.12.0"}})
    cu130 = table.resolve("cu130")
    assert (cu130.version, cu130.index_url) == ("2.12.0", "https://mirror.example/whl/cu130")
    assert table.resolve("cu124").pin == "2.6+cu124"  # YAML number coerced to text
    cpu = table.resolve("cpu")
    assert cpu.wheelhouse and cpu.version == "2.13.0"
    assert cpu.index_url == DEFAULT_INDEX.format(variant="cpu")


def test_bad_table_rows_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"torch_builds\.cu130\.wheelhous"):
        load_table({"cu130": {"wheelhous": True}})
    with pytest.raises(ConfigError, match="no version"):
        load_table({"cu999": {"index_url": "x"}})
    with pytest.raises(ConfigError, match="cpu' or 'cuNNN"):
        load_table({"gpu": {"version": "2.11.0"}})


def test_swap_args_for_index_and_wheelhouse_builds() -> None:
    build = TorchBuild("cu130", "2.11.0", "https://download.pytorch.org/whl/cu130")
    assert swap_args(build, requirements=["transformers==5.24"], dry_run=True) == [
        "--variant", "cu130", "--version", "2.11.0",
        "--index-url", "https://download.pytorch.org/whl/cu130",
        "--requirement", "transformers==5.24", "--dry-run"]
    cpu = TorchBuild("cpu", "2.13.0", DEFAULT_INDEX.format(variant="cpu"), wheelhouse=True)
    where = remote_wheelhouse_dir("/opt/opsctl/", cpu)
    assert where == "/opt/opsctl/wheelhouse/torch-2.13.0-cpu"
    assert swap_args(cpu, wheelhouse_dir=where)[-2:] == ["--wheelhouse", where]
    with pytest.raises(ConfigError, match="wheelhouse"):
        swap_args(cpu)


@pytest.fixture(scope="module")
def fake_index(tmp_path_factory: pytest.TempPathFactory) -> t.Iterator[str]:
    base = tmp_path_factory.mktemp("idx")
    write_simple_index(str(base / "index"), build_fake_torches(str(base / "wheels")))
    with serve_index(str(base / "index")) as url:
        yield url


def test_prepare_wheelhouse_downloads_the_exact_pin(fake_index: str, tmp_path: Path) -> None:
    build = TorchBuild("cu130", "2.11.0", "unused", wheelhouse=True,
                       download_index_url=fake_index)
    lines: list[str] = []
    wh = prepare_wheelhouse(build, tmp_path / "wh", on_line=lines.append)
    assert [f.name for f in wh.files] == ["torch-2.11.0+cu130-py3-none-any.whl"]
    assert wh.torch_version == "2.11.0+cu130" and wh.total_bytes > 0
    assert wh.log_path.is_file() and any("Saved" in line for line in lines)


def test_prepare_wheelhouse_failure_carries_the_log(fake_index: str, tmp_path: Path) -> None:
    build = TorchBuild("cu130", "2.99.0", "unused", wheelhouse=True,
                       download_index_url=fake_index)
    with pytest.raises(TorchEnvError) as exc:
        prepare_wheelhouse(build, tmp_path / "wh", pip=(sys.executable, "-m", "pip", "--isolated"))
    assert exc.value.log_path is not None and Path(exc.value.log_path).is_file()
