"""MkDocs hook: the parts of the docs that would drift if they were written by hand.

A page holds a marker line ``<!-- generated: NAME -->`` and this hook replaces it, at build
time, with text made from the code itself:

- ``exit-codes``: the table of :data:`opsctl.errors.EXIT_CODES`;
- ``module-map``: every module of ``opsctl`` and ``remote_payload`` with the first line of its
  docstring, read with :mod:`ast` (nothing is imported, so a module with heavy imports costs
  nothing and a missing docstring shows as such);
- ``diagnosis``: a section per id of :data:`remote_payload.wire.DIAGNOSIS_IDS`, with the
  severity, the meaning (the signature's predicate docstring) and the fix (its hint) that
  ``status`` shows, from ``remote_payload/agent/diagnosis.py``'s ``SIGNATURES``.

MkDocs' own hook mechanism is used (``hooks:`` in ``mkdocs.yml``) rather than a plugin
package: three small generators do not justify a dependency. ``tests/test_docs.py`` runs the
same functions, so a broken generator fails the tests as well as ``mkdocs build --strict``.
"""

from __future__ import annotations

import ast
import re
import sys
import typing as t
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)
PACKAGES = ("opsctl", "remote_payload")


def _import_root() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def exit_codes() -> str:
    _import_root()
    from opsctl import errors

    rows = ["| code | meaning |", "| --- | --- |"]
    rows += [f"| {code} | {meaning} |" for code, meaning in sorted(errors.EXIT_CODES.items())]
    rows.append("| *n* | `opsctl exec` and `opsctl shell`: the remote command's (shell's) own exit "
                "code; `opsctl attach`: tmux's |")
    return "\n".join(rows)


def _first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc:
        return "(no docstring)"
    return doc.strip().splitlines()[0].replace("|", "\\|")


def module_rows() -> list[tuple[str, str]]:
    """(dotted module name, first docstring line) of every module, packages first."""
    rows = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "wheels" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            rows.append((name, _first_line(path)))
    return sorted(rows)


def module_map() -> str:
    rows = ["| module | what it is for |", "| --- | --- |"]
    rows += [f"| `{name}` | {line} |" for name, line in module_rows()]
    return "\n".join(rows)


def diagnosis_sections() -> str:
    """One section per signature of the agent's diagnosis table: id, severity, meaning, fix.

    The meaning is the predicate's docstring and the fix the row's hint, so the page says
    exactly what ``status`` would."""
    _import_root()
    from remote_payload import wire
    from remote_payload.agent import diagnosis

    by_id = {sig.cause: sig for sig in diagnosis.SIGNATURES}
    out = []
    for cause in wire.DIAGNOSIS_IDS:
        sig = by_id[cause]
        meaning = " ".join((sig.match.__doc__ or "").split()).replace("``", "`")
        out.append(f"### `{cause}`\n\n*{sig.severity}*. {meaning}\n\n**Fix:** {sig.hint}\n")
    return "\n".join(out)


GENERATORS: dict[str, t.Callable[[], str]] = {
    "exit-codes": exit_codes, "module-map": module_map, "diagnosis": diagnosis_sections,
}


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced; an unknown marker name is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, **_: t.Any) -> str:
    return render(markdown)
