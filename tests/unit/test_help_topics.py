"""``opsctl help exit-codes``: the terminal's exit-code table is the docs' table, from one source."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.cli import help as help_topics
from tests.cli_runner import run_cli as _invoke
from tests.unit.test_docs import _hooks


def test_the_exit_code_table_names_every_exit_code_of_errors_and_no_other():
    result = _invoke("help", "exit-codes")
    assert result.exit_code == 0
    codes = {int(m) for m in re.findall(r"^(\d+) ", result.output, re.M)}
    assert codes == set(errors.EXIT_CODES)
    assert result.output.rstrip().endswith(errors.PASSED_THROUGH.replace("`", "").rsplit(" ", 1)[-1])


def test_the_terminal_table_and_the_docs_table_say_the_same_words():
    docs_rows = _hooks().exit_codes()
    for code, meaning in help_topics.exit_code_rows():
        label = f"*{code}*" if code == "n" else code
        assert f"| {label} | " in docs_rows
        assert meaning.split()[0] in docs_rows


@pytest.mark.parametrize("width", [0, 10, 40, 80, 400])
def test_every_line_fits_the_width_asked_for_at_least_forty_columns(width):
    table = help_topics.exit_code_table(width)
    longest_word = max(len(w) for _, m in help_topics.exit_code_rows() for w in m.split())
    limit = max(40, width, help_topics.CODE_WIDTH + longest_word)
    assert all(len(line) <= limit for line in table.splitlines())
    assert {int(m) for m in re.findall(r"^(\d+) ", table, re.M)} == set(errors.EXIT_CODES)


def test_json_is_one_document_with_every_code_and_the_passed_through_one_as_null():
    for args in (("help", "exit-codes", "--json"), ("--json", "help", "exit-codes")):
        doc = json.loads(_invoke(*args).output)
        assert next(iter(doc)) == "ok" and doc["ok"] is True
        assert [row["code"] for row in doc["exit_codes"]] == [*sorted(errors.EXIT_CODES), None]


def test_help_without_a_topic_is_opsctls_own_help():
    result = _invoke("help")
    assert result.exit_code == 0
    assert "exit-codes" not in result.output.split("Commands:")[0]
    assert "Commands:" in result.output and "deploy" in result.output


@pytest.mark.parametrize("args", [("help", "nope"), ("help", "exit-codes", "--json=1"),
                                  ("help", "exit-codes", "extra"), ("help", "../../etc/passwd")])
def test_an_unknown_topic_or_a_stray_argument_is_a_usage_error(args):
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == errors.USAGE
    assert "Traceback" not in result.output
