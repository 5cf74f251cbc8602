"""The command line (click only): one module per command family, rich views in :mod:`.render`."""

from __future__ import annotations

from opsctl.cli.jobs import cli, main

__all__ = ["cli", "main"]
