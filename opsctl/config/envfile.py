"""``deploy --env-file F``: secret values from a file of ``NAME=value`` lines.

The format is the common subset of Docker's ``--env-file`` and dotenv: ``NAME=value`` per line,
an optional leading ``export``, ``#`` comments and blank lines, and one pair of matching outer
quotes (``'...'`` or ``"..."``) stripped from the value, which is otherwise taken verbatim
(no ``$VAR`` expansion, no escapes, no multi-line values). Written here rather than taken from
python-dotenv because that is all a list of secrets needs, and a parser that expands
variables could turn one secret into another. Errors name ``file:line`` and the variable,
never a value.
"""

from __future__ import annotations

import re
from pathlib import Path

from opsctl.errors import ConfigError
from remote_payload import wire

MAX_BYTES = 1 << 20
_LINE = re.compile(rf"(?:export\s+)?(?P<name>{wire.ENV_NAME_PATTERN})=(?P<value>.*)")


def load(path: str | Path) -> dict[str, str]:
    """The variables in ``path``.

    Raises:
        ConfigError: unreadable, too large, not UTF-8, or a line that is not ``NAME=value``.
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise ConfigError(f"--env-file {p}: not a regular file")
        if p.stat().st_size > MAX_BYTES:
            raise ConfigError(f"--env-file {p}: larger than {MAX_BYTES} bytes")
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"--env-file {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--env-file {p}: not UTF-8") from None
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            name = line.split("=", 1)[0].strip()[:40] if "=" in line else "(no '=')"
            raise ConfigError(f"{p}:{n}: not a NAME=value line (name {name!r})",
                              hint="one NAME=value per line; # starts a comment")
        value = m["value"]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[m["name"]] = value
    return out
