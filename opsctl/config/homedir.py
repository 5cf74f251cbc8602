"""Where opsctl keeps local state (``$OPSCTL_HOME``, default ``~/.opsctl``), with nothing
imported but ``os``: the one place this is decided (:func:`opsctl.config.paths.home` wraps it).

Why a module apart from :mod:`.paths`: the first `opsctl status` of a session reads its launch
record (:mod:`opsctl.remote.launchrecord`) before anything else is imported, and
:mod:`.paths` brings ``pathlib`` and ``typing`` (~5 ms of a ~20 ms start; docs/benchmarks.md).
"""

from __future__ import annotations

import os

ENV_HOME = "OPSCTL_HOME"


def home() -> str:
    """``$OPSCTL_HOME``, else ``~/.opsctl`` (as a string)."""
    return os.environ.get(ENV_HOME) or os.path.join(os.path.expanduser("~"), ".opsctl")
