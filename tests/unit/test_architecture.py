"""The import graph keeps the layers the folder tree shows.

Every import counts, also the ones inside functions (a lazy import that points upwards is
still an upward arrow). The layers, top to bottom::

    opsctl.cli      click + rich; the only package that imports them (rich: cli/render.py alone)
    opsctl.ops      use cases: deploy, jobs, watch, torch, hosts     opsctl.sandbox
    opsctl.remote   transport, mux, agent client, payload, reply shapes
    opsctl.state    run-time state: the remembered target
    opsctl.config   paths, yaml, inventory, playbooks, torch builds
    opsctl.errors   the error tree                       remote_payload.wire (stdlib only)

opsctl imports from the container side only the modules both sides share, each stdlib only
(:data:`SHARED_WITH_OPSCTL`): the wire contract, the file writer, the bounded reader, the
`/proc` reader, the tar sync, GPU facts.

Each module's layer is the package it sits in. The container side (``remote_payload``) never
imports ``opsctl``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

ROOT = REPO
PACKAGES = ("opsctl", "remote_payload")

# A module may import from its own layer and the ones listed (transitively below it).
LAYERS: dict[str, set[str]] = {
    "opsctl.cli": {"opsctl.ops", "opsctl.sandbox", "opsctl.remote", "opsctl.state", "opsctl.config",
                   "opsctl.errors", "opsctl.interrupts"},
    "opsctl.ops": {"opsctl.remote", "opsctl.state", "opsctl.config", "opsctl.errors"},
    "opsctl.sandbox": {"opsctl.config", "opsctl.errors"},
    "opsctl.remote": {"opsctl.config", "opsctl.errors"},
    "opsctl.state": {"opsctl.config", "opsctl.errors"},  # run-time state: the remembered target
    "opsctl.config": {"opsctl.errors"},
    "opsctl.errors": set(),
    "opsctl.interrupts": {"opsctl.errors"},  # the console script's signal handlers
}

#: The container side's modules opsctl may import: stdlib only, shared by both sides.
SHARED_WITH_OPSCTL = ("remote_payload.wire", "remote_payload.wire_shapes",
                      "remote_payload.safe_write", "remote_payload.tarsync",
                      "remote_payload.gpufacts", "remote_payload.procgroup",
                      "remote_payload.limits", "remote_payload.torchindex",
                      "remote_payload.boundedread", "remote_payload.procfs")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "wheels" not in path.parts:
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports (a ``from pkg import sub`` names ``pkg.sub``)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                while target not in MODULES and "." in target:  # `import pkg.mod.attr`
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    out.add(target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str | None:
    return next((lay for lay in LAYERS if module == lay or module.startswith(lay + ".")), None)


def test_every_opsctl_module_is_in_a_layer():
    loose = sorted(m for m in MODULES if m.startswith("opsctl.") and _layer(m) is None
                   and m != "opsctl.__main__")
    assert loose == [], f"modules outside cli/ops/remote/state/config/sandbox/errors: {loose}"


def test_imports_only_point_down_the_layers():
    upward = []
    for mod, deps in GRAPH.items():
        layer = _layer(mod)
        if layer is None:
            continue
        for dep in deps:
            dep_layer = _layer(dep)
            if dep_layer is not None and dep_layer != layer and dep_layer not in LAYERS[layer]:
                upward.append(f"{mod} -> {dep}")
    assert upward == [], "imports against the layers:\n" + "\n".join(sorted(upward))


def test_only_the_cli_imports_click_and_rich():
    offenders = []
    for mod, path in MODULES.items():
        if mod.startswith("opsctl.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{mod}: {n}" for n in names if n.split(".")[0] in ("click", "rich")]
    assert offenders == []


def test_every_rich_view_is_in_render_the_only_module_that_imports_rich():
    importers = []
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "rich" for n in names):
                importers.append(mod)
    assert sorted(set(importers)) == ["opsctl.cli.render"]


def test_the_container_side_never_imports_opsctl():
    offenders = [f"{m} -> {d}" for m, deps in GRAPH.items() if m.startswith("remote_payload")
                 for d in deps if d.startswith("opsctl")]
    assert offenders == []


def _third_party(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    third_party = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        third_party += [n for n in names if n.split(".")[0] not in sys.stdlib_module_names
                        and n.split(".")[0] not in PACKAGES]
    return third_party


def test_the_wire_contract_is_stdlib_only():
    """wire.py is imported on both sides; it may not pull either side in (only the shared
    file writer, which is stdlib only too)."""
    assert GRAPH["remote_payload.wire"] <= {"remote_payload.safe_write"}
    assert _third_party("remote_payload.wire") == []


def test_the_file_writer_is_stdlib_only_and_imports_nothing_of_the_project():
    """safe_write.py is imported by the CLI, the agent (Python 3.10) and the trainer; it
    reads its markers with the bounded reader, which is stdlib only too."""
    assert GRAPH["remote_payload.safe_write"] <= {"remote_payload.boundedread"}
    assert _third_party("remote_payload.safe_write") == []


def test_the_bounded_reader_and_the_proc_reader_are_stdlib_only():
    """Both sides import them, and the self-contained programs (``opsctl exec``'s guard, the
    payload unpacker) carry their text: they import nothing of the project but each other
    and the caps."""
    assert GRAPH["remote_payload.boundedread"] == set()
    assert GRAPH["remote_payload.procfs"] <= {"remote_payload.boundedread",
                                               "remote_payload.limits"}
    assert GRAPH["remote_payload.limits"] == set()
    for module in ("remote_payload.boundedread", "remote_payload.procfs"):
        assert _third_party(module) == []


def test_opsctl_imports_only_the_shared_modules_of_the_container_side():
    def shared(dep: str) -> bool:
        return any(dep == m or dep.startswith(m + ".") for m in SHARED_WITH_OPSCTL)

    offenders = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if m.startswith("opsctl")
                       for d in deps if d.startswith("remote_payload") and not shared(d))
    assert offenders == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_import_cycles():
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("package", ["opsctl", "remote_payload"])
def test_no_cycles_between_the_packages_of_one_side(package):
    """One level below the top: ``opsctl.cli``, ``opsctl.ops``…; ``remote_payload.agent``…
    """
    def group(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for mod, deps in GRAPH.items():
        if mod.startswith(package + "."):
            graph.setdefault(group(mod), set()).update(
                group(d) for d in deps if d.startswith(package + ".") and group(d) != group(mod))
    assert _cycles(graph) == []
