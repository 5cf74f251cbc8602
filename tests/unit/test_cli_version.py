"""``opsctl --version`` answers installed and from a checkout that was never installed."""

from __future__ import annotations

import importlib.metadata
import tomllib

import pytest

from tests.cli_runner import run_cli
from tests.paths import REPO


def _tree_version() -> str:
    with (REPO / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def test_version_names_the_installed_distribution() -> None:
    result = run_cli("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"opsctl, version {importlib.metadata.version('opsctl')}"


def test_version_from_an_uninstalled_checkout_names_the_checkout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    result = run_cli("--version")
    assert result.exit_code == 0
    assert result.output.strip() == (f"opsctl, version {_tree_version()} "
                                     f"(not installed: the checkout at {REPO})")
