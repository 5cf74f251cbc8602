"""Files the sandbox installs on its emulated Proxmox host (the `pct` stand-in)."""

from __future__ import annotations
