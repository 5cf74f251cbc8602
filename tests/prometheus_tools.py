"""Debian's ``prometheus`` and ``promtool`` for the tests that need them (scripts/bootstrap
installs both): the path, or a skip naming what is missing (a failure under ``$CI`` or
``$OPSCTL_REQUIRE_SANDBOX``, as for the sandbox's prerequisites)."""

from __future__ import annotations

import os
import shutil

import pytest


def need(tool: str) -> str:
    """The path of ``tool`` (``prometheus`` or ``promtool``)."""
    path = shutil.which(tool)
    if path is None:
        reason = f"{tool} unavailable (apt: prometheus; scripts/bootstrap installs it)"
        if os.environ.get("CI") or os.environ.get("OPSCTL_REQUIRE_SANDBOX"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return path
