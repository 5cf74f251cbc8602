"""Everything a container sends back lands through the one receiver
(:mod:`opsctl.remote.receiver`): an AST walk over ``opsctl/`` fails on a new path around it.

- every ``tarsync.receive`` call on this machine passes ``writer=`` (the confined receiver);
  its default writes by path, for the container's side of a push only;
- every rsync run whose source is in the container (``rsync.remote_spec(...)`` as its SRC)
  passes ``receiving_here=True`` (``--safe-links``, the skip lines parsed) and is followed by
  ``receiver.confine`` in the same function.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import REPO


def _calls(name: str) -> list[tuple[Path, ast.FunctionDef, ast.Call]]:
    """Each call of ``name`` with the module-level function holding it."""
    out = []
    for path in sorted((REPO / "opsctl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:  # module level
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and ast.unparse(node.func) == name:
                    out.append((path, fn, node))
    return out


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_every_local_unpack_of_the_tar_stream_goes_through_the_confined_receiver():
    calls = _calls("tarsync.receive")
    assert calls, "the pull's tar path no longer calls tarsync.receive: update this guard"
    for path, _fn, call in calls:
        assert _kw(call, "writer") is not None, f"{path}:{call.lineno} unpacks without writer="


def test_every_rsync_from_the_container_receives_by_the_receivers_rules():
    pulls = [(p, fn, c) for p, fn, c in _calls("rsync.run")
             if len(c.args) >= 3 and ast.unparse(c.args[2]).startswith("rsync.remote_spec")]
    assert pulls, "no rsync pull found: update this guard"
    for path, fn, call in pulls:
        flag = _kw(call, "receiving_here")
        assert isinstance(flag, ast.Constant) and flag.value is True, f"{path}:{call.lineno}"
        assert "_confine(" in ast.unparse(fn) or "receiver.confine(" in ast.unparse(fn), \
            f"{path}:{call.lineno}: rsync's local result is not checked by receiver.confine"
