"""Every cap of ``remote_payload/limits.py`` that can be moved is on the input-limits page,
by its variable, so the page cannot drop one."""

from __future__ import annotations

import pytest

from remote_payload import limits
from tests.paths import REPO

PAGE = REPO / "docs" / "input-limits.md"


@pytest.mark.parametrize("name", sorted(limits._ENV))
def test_each_cap_is_named_on_the_input_limits_page_by_its_variable(name):
    assert f"`{limits._ENV[name]}`" in PAGE.read_text(encoding="utf-8"), name
