"""Names and prose say what things are, not how they came to be: no file of the repository
(code, tests, docs, benchmark results, file names) refers to an issue by number, or narrates
how the present differs from an earlier state of the code. CHANGELOG.md holds the history;
``tests/fixtures`` holds data that stands for what users write, so neither is read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.paths import REPO

ISSUE_NUMBER = re.compile(r"issues? #?[0-9]+", re.IGNORECASE)
#: ``\s``, not a space: the pattern's own source must not match it.
NARRATION = re.compile(r"hardening\sround|before\sthis\schange|was\swritten\stwice|(?:until|before)\sissue",
                       re.IGNORECASE)
EXEMPT_FILES = {Path("CHANGELOG.md")}
EXEMPT_FOLDERS = (Path("tests/fixtures"),)


def _tracked_files() -> list[Path]:
    """The files git tracks (and the untracked ones it does not ignore): the repository as the
    lead merges it, without build output, virtual environments or caches."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=True).stdout
    names = [Path(n) for n in out.decode("utf-8", "surrogateescape").split("\0") if n]
    return [n for n in names if n not in EXEMPT_FILES
            and not any(folder in n.parents for folder in EXEMPT_FOLDERS)
            and (REPO / n).is_file()]


def _offending_lines(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for name in _tracked_files():
        if pattern.search(str(name)):
            found.append(f"{name} (its name)")
        data = (REPO / name).read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    return found


def test_no_file_outside_the_changelog_refers_to_an_issue_by_number():
    assert _offending_lines(ISSUE_NUMBER) == []


def test_no_file_outside_the_changelog_narrates_a_change():
    assert _offending_lines(NARRATION) == []


def test_the_scan_reads_the_code_the_docs_and_the_tests():
    names = set(_tracked_files())
    assert Path("opsctl/__init__.py") in names
    assert Path("docs/benchmarks.md") in names
    assert Path("tests/unit/test_no_history_in_names.py") in names
    assert Path("CHANGELOG.md") not in names
