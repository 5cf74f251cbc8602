"""docs/architecture.md says what the code is: its layer diagram names exactly the layers
``tests/unit/test_architecture.py`` enforces, in their order; what opsctl imports from the
container side is the shared part the page names, standard library only; the agent's verb
table is generated from the agent's own; the container side is linted as Python 3.10."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from tests.paths import REPO
from tests.unit.test_architecture import GRAPH, LAYERS, MODULES, SHARED_WITH_OPSCTL, _third_party
from tests.unit.test_docs import _hooks

PAGE = REPO / "docs" / "architecture.md"

#: What opsctl may import from remote_payload: the contract, the writer and the parsers both
#: sides share (one list, in the layer test).
SHARED = SHARED_WITH_OPSCTL


def _diagram() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text[text.index("```\n") + 4:text.index("\n```", text.index("```\n"))]


def _shared(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in SHARED)


def test_the_diagram_names_every_layer_and_no_other():
    named = re.findall(r"^\s+(opsctl\.[a-z]+)\b", _diagram(), re.M)
    named += re.findall(r"\s(opsctl\.[a-z]+) \(this machine", _diagram())
    assert sorted(set(named)) == sorted(LAYERS)


def test_the_diagram_draws_the_layers_top_down_in_the_order_their_imports_allow():
    order = [m for m in re.findall(r"^\s+(opsctl\.[a-z]+)\b", _diagram(), re.M)]
    for upper_index, upper in enumerate(order):
        for lower in order[upper_index + 1:]:
            assert upper not in LAYERS[lower], f"{lower} is drawn below {upper} but may import it"


def test_the_diagram_names_every_top_level_part_of_the_container_side():
    container_side = _diagram().split("remote_payload (", 1)[1]
    parts = {m.split(".")[1] for m in MODULES if m.startswith("remote_payload.")}
    missing = sorted(p for p in parts - {"wheels"} if not re.search(rf"\b{p}\b", container_side))
    assert missing == []


def test_opsctl_imports_from_the_container_side_only_the_shared_modules():
    offenders = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if m.startswith("opsctl")
                       for d in deps if d.startswith("remote_payload") and not _shared(d))
    assert offenders == []


def test_the_page_names_the_shared_modules_in_one_list_that_is_exactly_the_tested_one():
    text = PAGE.read_text(encoding="utf-8")
    (listed,) = re.findall(r"<!-- shared-modules -->(.*?)<!-- /shared-modules -->", text, re.S)
    assert sorted(re.findall(r"`([a-z_]+)`", listed)) == sorted(m.split(".", 1)[1] for m in SHARED)
    # no second list to drift: elsewhere the page names at most two shared modules in a row
    names = "|".join(m.split(".", 1)[1] for m in SHARED)
    run = rf"`(?:{names})`(?:,? (?:and )?`(?:{names})`){{2,}}"
    assert re.findall(run, text.replace(listed, "")) == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _shared(m)))
def test_a_shared_module_is_standard_library_and_imports_only_shared_modules(module):
    assert _third_party(module) == []
    assert sorted(d for d in GRAPH[module] if not _shared(d)) == []


def test_the_agent_verb_table_holds_every_verb_the_agent_dispatches():
    from remote_payload.agent.__main__ import VERBS

    table = _hooks().agent_verb_table()
    assert sorted(re.findall(r"`([a-z-]+)`", table.split("\n", 2)[2].replace("`remote_payload", ""))) \
        == sorted(VERBS)
    assert "<!-- generated: agent-verbs -->" in PAGE.read_text(encoding="utf-8")


def test_ruff_reads_the_container_side_as_python_3_10():
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["ruff"]["per-file-target-version"] == {"remote_payload/**/*.py": "py310"}


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_syntax_newer_than_3_10_fails_the_lint_in_remote_payload_only():
    code = "try:\n    pass\nexcept* ValueError:\n    pass\n"

    def lint(path: str) -> str:
        return subprocess.run(["ruff", "check", "--no-cache", "--stdin-filename", path, "-"],
                              input=code, capture_output=True, text=True, cwd=REPO).stdout

    assert "Python 3.10" in lint("remote_payload/agent/new_module.py")
    assert "Python 3.10" not in lint("opsctl/ops/new_module.py")
