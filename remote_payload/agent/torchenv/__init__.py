"""Torch builds and compile caches inside the container. Stdlib only.

Each torch build lives in its own venv ``<root>/envs/torch-<version>-<variant>/`` and
``<root>/envs/current`` is a symlink switched atomically, so a swap is reversible in
one rename and a broken install never touches the build that works. Compile caches
live in ``<root>/cache/<fingerprint>/`` so two builds never share (and hide bugs
behind) one cache.

The launch path needs only two calls::

    env.update(torchenv.job_env(root))        # cache dirs, build name, mega-cache path
    python = torchenv.current_python(root)    # None when no build is installed
"""

from __future__ import annotations

from remote_payload.agent.torchenv.caches import job_env
from remote_payload.agent.torchenv.layout import current_python

__all__ = ["current_python", "job_env"]
