"""The sudoers rule the docs give for a non-root opsctl user: the pct subcommands opsctl runs,
nothing else (``pct push``/``pull`` would amount to host root)."""

from __future__ import annotations

import re

from opsctl.config.sudoers import PCT_SUBCOMMANDS, sudoers_rule
from tests.paths import REPO


def test_every_pct_subcommand_opsctl_runs_is_in_the_rule():
    used = set()
    for path in (REPO / "opsctl").rglob("*.py"):
        if "sandbox" in path.parts:  # the stand-in itself answers every subcommand
            continue
        used |= set(re.findall(r'\["pct", "([a-z]+)"', path.read_text(encoding="utf-8")))
    assert used, "the scan found opsctl's pct calls"
    assert used <= set(PCT_SUBCOMMANDS), sorted(used - set(PCT_SUBCOMMANDS))


def test_the_rule_allows_no_subcommand_that_copies_or_changes_host_files():
    rule = sudoers_rule("admin")
    for sub in ("push", "pull", "set", "destroy", "create", "restore", "mount", "enter"):
        assert f"pct {sub}" not in rule
    assert "/usr/sbin/pct exec *" in rule and rule.startswith("admin ALL=(root) NOPASSWD: ")
    assert "/usr/sbin/pct," not in rule + ",", "pct alone (any subcommand) is never allowed"


def test_the_docs_give_exactly_this_rule():
    for page, user in (("getting-started.md", "admin"), ("contracts.md", "<user>")):
        text = (REPO / "docs" / page).read_text(encoding="utf-8")
        assert f"`{sudoers_rule(user)}`" in text, page
