"""Put the pure-python wheels shipped in ``remote_payload/wheels`` on ``sys.path``.

The container may have no internet and no pip, so libtmux travels with the
payload. A pure-python wheel is a zip archive that zipimport can load straight
from the ``.whl``; the shipped wheels go first so the tested version wins over
whatever happens to be installed.
"""

from __future__ import annotations

import glob
import os
import sys

WHEELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "wheels")


def add_wheels(wheels_dir: str = WHEELS_DIR) -> list[str]:
    """Prepend every ``*.whl`` in ``wheels_dir`` to ``sys.path``; return the ones added."""
    added = []
    for whl in sorted(glob.glob(os.path.join(wheels_dir, "*.whl"))):
        if whl not in sys.path:
            sys.path.insert(0, whl)
            added.append(whl)
    return added
