"""The fast ``status`` path, in one room: how a plain ``opsctl status`` answers in about the
time of a raw ``ssh … pct exec`` (docs/benchmarks.md, Operations speed).

In the order a command meets them:

- :mod:`.launchrecord`: the console script's first step. A record of the last status's
  command line and exact ``ssh`` argv, valid while nothing it was derived from changed,
  starts that ``ssh`` before the rest of opsctl is even imported.
- :mod:`.entry`: a plain ``status [--json] [--host H] [--ct N]`` is served here without
  importing click or any command family; anything else goes to the full CLI.
- :mod:`.fetch`: the status through a live multiplexer or OpenSSH, with the target from
  :mod:`.targetcache` (no YAML read), and the reply read by :mod:`.leanreply` (no pydantic)
  when it is exactly what the models would return; otherwise the full path, on the same reply.
- :mod:`.trace`: ``OPSCTL_TRACE=1`` says where one command's time went.

Each module keeps the layer of what it does (``tests/unit/test_architecture.py``,
``ROOM_LAYERS``): nothing here is a shortcut around the checks the full path makes.
"""
