"""The sandbox: this machine as an emulated Proxmox host (:mod:`.host`) and its pct stand-in (:mod:`.pct`)."""

from __future__ import annotations
