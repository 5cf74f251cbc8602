"""The one way tests run the opsctl CLI in-process: click's runner, exceptions not caught.

``catch_exceptions=False`` makes a traceback fail the test where it happened instead of
hiding in ``result.exception``; every module that runs commands imports ``run_cli`` (most as
``run``) rather than keeping its own copy of these two lines.
"""

from __future__ import annotations

import typing as t

from click.testing import CliRunner, Result

from opsctl.cli import cli


def run_cli(*args: str, input: str | bytes | None = None,
            env: t.Mapping[str, str | None] | None = None) -> Result:
    """``opsctl ARGS...`` in this process, with ``input`` on stdin and ``env`` over os.environ."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, input=input, env=env)
