"""The agent's error types are defined once (``wire.ErrorType``) and each has an exit code here.

The agent names an error only through the enum (never a string literal), so the set of
types it can raise is exactly the enum; ``opsctl`` maps every member to an error family.
"""

from __future__ import annotations

import ast

import pytest

from opsctl import errors
from opsctl.remote import agent_client
from remote_payload.wire import ErrorType
from tests.paths import REPO

ROOT = REPO
PAYLOAD_SOURCES = sorted(p for p in (ROOT / "remote_payload").rglob("*.py") if "wheels" not in p.parts)


def _error_type_args() -> list[tuple[str, ast.expr]]:
    """(where, first error-type argument) of every AgentFailure(...) and error_reply(verb, ...)."""
    found = []
    for path in PAYLOAD_SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if name == "AgentFailure" and node.args:
                found.append((where, node.args[0]))
            elif name == "error_reply" and len(node.args) > 1:
                found.append((where, node.args[1]))
    return found


def test_the_agent_names_its_errors_only_through_the_enum():
    raw = [f"{where}: {ast.unparse(arg)}" for where, arg in _error_type_args()
           if not (isinstance(arg, ast.Attribute) and ast.unparse(arg.value).endswith("ErrorType")
                   and arg.attr in ErrorType.__members__)
           and not (isinstance(arg, ast.Attribute) and arg.attr == "type")]  # re-raising exc.type
    assert raw == [], "error types outside wire.ErrorType:\n" + "\n".join(raw)


def test_every_enum_member_is_raised_somewhere():
    """A member no agent raises is a name that promises an error that cannot happen."""
    raised = {arg.attr for _, arg in _error_type_args() if isinstance(arg, ast.Attribute)}
    assert set(ErrorType.__members__) - raised == set()


@pytest.mark.parametrize("etype", list(ErrorType), ids=lambda e: e.value)
def test_every_agent_error_has_an_exit_code(etype):
    family = agent_client.ERROR_FAMILIES[etype]
    assert issubclass(family, errors.AgentError)
    assert family.exit_code in errors.EXIT_CODES


def test_only_install_and_seed_failures_are_torch_env_errors():
    torch = {e for e, fam in agent_client.ERROR_FAMILIES.items() if fam.exit_code == errors.TORCH_ENV}
    assert torch == {ErrorType.TorchInstallFailed, ErrorType.CacheSeedFailed}


def test_a_member_name_is_its_wire_value():
    assert [m.name for m in ErrorType] == [m.value for m in ErrorType]
