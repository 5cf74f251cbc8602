"""Probes that answer one question about the container's torch build, as their own process.

``compile_race``: does concurrent first-call ``torch.compile`` hang or fail here?
Run ``python -u -m remote_payload.probes.compile_race --help``.
"""

from __future__ import annotations
