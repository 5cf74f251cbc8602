"""Plant a stand-in agent in the sandbox container: the hostile, mute and lingering agents of
the sandbox tests, put where the inventory's root says the payload is, so the real CLI, SSH and
``pct exec`` talk to it exactly as they would to opsctl's own agent."""

from __future__ import annotations

import json

#: writes ``{relative path: text}`` (stdin) under the root given as argv[1]
_WRITE = """\
import json, os, sys
root = sys.argv[1]
for rel, text in json.load(sys.stdin).items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
"""


def plant_agent(root: str, main: str, extra: dict[str, str] | None = None) -> None:
    """Write a payload whose agent ``__main__`` is ``main`` (plus ``extra`` files, paths relative
    to ``root``) into container 200 of the sandbox under ``root``."""
    from opsctl.config import inventory as inventory_mod
    from opsctl.remote.transport import Remote

    files = {"payload/remote_payload/__init__.py": "",
             "payload/remote_payload/agent/__init__.py": "",
             "payload/remote_payload/agent/__main__.py": main, **(extra or {})}
    with Remote(inventory_mod.load().resolve("sandbox"), use_mux=False) as r:
        res = r.pct_exec(200, ["python3", "-c", _WRITE, root], stdin=json.dumps(files).encode(),
                         timeout=30)
    assert res.rc == 0, res.stderr
