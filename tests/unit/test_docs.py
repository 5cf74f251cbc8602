"""The docs say what the code does: the README stays a short front page, every link in it
resolves, every docs page is in the site's navigation, and the generated pages cover
everything they are generated from (``docs/hooks/generated.py``)."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
import yaml

from opsctl import errors
from remote_payload import wire
from remote_payload.agent import diagnosis
from tests.paths import REPO

ROOT = REPO
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_generated", DOCS / "hooks" / "generated.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_generated", module)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_page_of_at_most_250_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)


def test_the_readme_has_exactly_the_two_setup_commands_in_its_first_40_lines():
    head = "\n".join(README.read_text(encoding="utf-8").splitlines()[:40])
    commands = re.findall(r"^\./scripts/\w+", head, re.M)
    assert commands == ["./scripts/demo", "./scripts/test"], commands


def test_every_local_link_in_the_readme_and_the_docs_resolves():
    pages = [README, *DOCS.rglob("*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def _sentences(text: str) -> list[str]:
    """The prose sentences of a page: headings, tables, code and markers left out."""
    out: list[str] = []
    in_code = False
    for para in text.split("\n\n"):
        lines = []
        for line in para.splitlines():
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if not in_code and not line.lstrip().startswith(("#", "|", "<!--")):
                lines.append(line)
        out += re.split(r"(?<=[.!?])\s+", " ".join(" ".join(lines).split()))
    return out


def test_no_long_sentence_is_printed_twice_on_a_page():
    repeated = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        seen: set[str] = set()
        for sentence in _sentences(page.read_text(encoding="utf-8")):
            if len(sentence) >= 100 and sentence in seen:
                repeated.append(f"{page.relative_to(ROOT)}: {sentence[:80]}…")
            seen.add(sentence)
    assert repeated == []


def test_the_threat_model_is_in_the_docs_and_linked_from_the_front_page_and_the_architecture():
    assert (DOCS / "threat-model.md").is_file()
    for page in ("index.md", "architecture.md"):
        assert "(threat-model.md)" in (DOCS / page).read_text(encoding="utf-8"), page


def test_every_module_and_test_the_threat_model_names_exists():
    text = (DOCS / "threat-model.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:opsctl|remote_payload|tests)/[\w/]+\.py)`", text))
    assert named, "the threat model names the module and the test of each rule"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert missing == []


def test_every_docs_page_is_in_the_navigation_and_every_nav_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = set(_nav_pages(config["nav"]))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert nav == pages


def test_the_exit_code_page_lists_every_exit_code_and_no_other():
    table = _hooks().exit_codes()
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == set(errors.EXIT_CODES)


def test_every_diagnosis_id_has_a_meaning_and_a_fix_on_the_troubleshooting_page():
    by_id = {sig.cause: sig for sig in diagnosis.SIGNATURES}
    assert set(by_id) == set(wire.DIAGNOSIS_IDS)
    undocumented = [cause for cause, sig in by_id.items() if not (sig.match.__doc__ or "").strip()]
    assert undocumented == []
    text = _hooks().diagnosis_sections()
    assert [m for m in re.findall(r"^### `(\w+)`", text, re.M)] == list(wire.DIAGNOSIS_IDS)


def test_the_module_map_lists_every_module_with_its_docstring():
    rows = dict(_hooks().module_rows())
    assert "opsctl.cli.app" in rows and "remote_payload.wire" in rows
    missing = sorted(name for name, line in rows.items() if line == "(no docstring)")
    assert missing == []


def test_an_unknown_generated_block_is_an_error_not_a_silent_gap():
    with pytest.raises(ValueError, match="unknown generated block"):
        _hooks().render("<!-- generated: nosuch -->\n")


def test_the_contract_page_has_a_table_for_every_reply_and_event_shape():
    from remote_payload import wire_shapes

    text = _hooks().wire_shapes()
    titles = set(re.findall(r"^### (\w+)$", text, re.M))
    wanted = {s.__name__ for s in [*wire_shapes.REPLY_SHAPES.values(), *wire_shapes.EVENT_SHAPES.values()]}
    assert wanted <= titles
    assert "<!-- generated: wire-shapes -->" in (DOCS / "contracts.md").read_text(encoding="utf-8")


def test_the_trainer_page_lists_every_trainer_flag():
    import dataclasses

    from remote_payload.trainer.config import TrainArgs

    text = _hooks().trainer_flags()
    flags = set(re.findall(r"^\| `(--[a-z0-9-]+)` \|", text, re.M))
    assert flags == {"--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainArgs)}
    assert "<!-- generated: trainer-flags -->" in (DOCS / "trainer.md").read_text(encoding="utf-8")
