"""Rules the test suite itself keeps, checked by reading its sources.

A test that waits for a state (a file to appear, a job to reach a state, a port to open) polls
through ``tests/waiting.py``'s ``wait_for``: a bare sleep either waits too long on a fast
machine or too little on a loaded one. A sleep that is part of the scenario (a job that must
be running for a while, a window for something that must never happen, a rate) says so on its
line with ``# scenario:``. Sleeps inside job scripts (string literals) are not calls and are
not checked. (No issue numbers in names: ``tests/unit/test_no_history_in_names.py``.)
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import REPO

TESTS = REPO / "tests"
ALLOW = "# scenario:"


def _sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.parts)


def _sleep_calls(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every call named ``sleep`` in ``path``'s code, not in its strings."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "sleep":
            found.append((node.lineno, lines[node.lineno - 1]))
    return found


def test_every_sleep_in_the_suite_is_part_of_its_scenario_and_says_so() -> None:
    bare = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
            for p in _sources() for n, line in _sleep_calls(p) if ALLOW not in line]
    assert bare == [], ("poll with tests.waiting.wait_for, or say why the sleep is the scenario "
                        f"with '{ALLOW} ...' on its line:\n" + "\n".join(bare))


def test_the_sleep_finder_sees_calls_and_skips_job_scripts(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import time\nfrom time import sleep\nSCRIPT = 'time.sleep(60)'\n"
                     "time.sleep(1)\nsleep(2)  # scenario: a rate\n")
    assert [n for n, _ in _sleep_calls(probe)] == [4, 5]

