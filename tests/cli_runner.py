"""How tests run the opsctl CLI in-process: click's runner, exceptions not caught.

``catch_exceptions=False`` makes a traceback fail the test where it happened instead of
hiding in ``result.exception``; modules that run commands import ``run_cli`` (most as
``run``) rather than keeping their own copy of these two lines. A test that calls click's
``CliRunner`` itself gets click's default instead (docs/development.md).
"""

from __future__ import annotations

import typing as t

from click.testing import CliRunner, Result

from opsctl.cli import cli


def run_cli(*args: str, input: str | bytes | None = None,
            env: t.Mapping[str, str | None] | None = None) -> Result:
    """``opsctl ARGS...`` in this process, with ``input`` on stdin and ``env`` over os.environ."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, input=input, env=env)
