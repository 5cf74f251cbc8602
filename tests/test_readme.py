"""README.md says what the code does: its exit-code table lists exactly ``errors.EXIT_CODES``."""

from __future__ import annotations

import re
from pathlib import Path

from opsctl import errors

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_exit_code_table_lists_every_exit_code_and_no_other():
    text = README.read_text(encoding="utf-8")
    table = text[text.index("## Exit codes"):text.index("## Input limits")]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == set(errors.EXIT_CODES)
