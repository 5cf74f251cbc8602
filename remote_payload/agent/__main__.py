"""Agent entry point: parse argv, run one verb, print one JSON document.

Verb modules are imported lazily (only the one asked for) so that a `status`
round trip pays for no imports it does not use.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import sys
import traceback

from remote_payload import wire
from remote_payload.agent.common import AgentFailure

# verb name -> module exposing add_arguments(parser) and run(args) -> JSON-able data
VERBS: dict[str, str] = {
    "env": "remote_payload.agent.verbs_env",
    "launch": "remote_payload.agent.verbs_jobs",
    "status": "remote_payload.agent.verbs_jobs",
    "logs": "remote_payload.agent.verbs_jobs",
    "stop": "remote_payload.agent.verbs_jobs",
    "stacks": "remote_payload.agent.verbs_jobs",
    "jobs": "remote_payload.agent.verbs_jobs",
    "abort": "remote_payload.agent.verbs_jobs",  # an interrupted deploy (issue 15)
    "history": "remote_payload.agent.history",  # plot data (issue 17)
    # torch builds and caches (issue 3)
    "envs": "remote_payload.agent.verbs_torch",
    "swap": "remote_payload.agent.verbs_torch",
    "cache-info": "remote_payload.agent.verbs_torch",
    "cache-clear": "remote_payload.agent.verbs_torch",
    "cache-seed": "remote_payload.agent.verbs_torch",
    # compile-race probe (issue 5)
    "probe": "remote_payload.agent.verbs_probe",
}

DEFAULT_ROOT = "/opt/opsctl"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="remote_payload.agent")
    parser.add_argument("--root", default=os.environ.get("OPSCTL_ROOT", DEFAULT_ROOT))
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; output is always JSON")
    parser.add_argument("--tmux-socket", default=os.environ.get("OPSCTL_TMUX_SOCKET", "opsctl"),
                        help="tmux socket name (tmux -L) the job sessions live on")
    parser.add_argument("verb", choices=sorted(VERBS))
    known, rest = parser.parse_known_args(argv)
    verb = known.verb
    try:
        module = importlib.import_module(VERBS[verb])
        sub = argparse.ArgumentParser(prog=f"remote_payload.agent {verb}")
        sub.add_argument("--json", action="store_true")
        module.add_arguments(verb, sub)
        args = sub.parse_args(rest)
        args.root = known.root
        args.tmux_socket = known.tmux_socket
        args.verb = verb
        data = module.run(verb, args)
        reply = wire.ok_reply(verb, data)
        rc = 0
    except AgentFailure as exc:
        reply = wire.error_reply(verb, exc.type, exc.message, **exc.fields)
        rc = wire.AGENT_ERROR_RC
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            reply, rc = _crashed(verb, exc), wire.AGENT_ERROR_RC
        else:  # a full disk is the container's state, not an agent bug: say which disk
            reply = wire.error_reply(
                verb, "DiskFull", f"disk full in the container: {exc.strerror}"
                f"{' (' + str(exc.filename) + ')' if exc.filename else ''}; {verb} could not "
                "write its records", path=exc.filename, root=known.root)
            rc = wire.AGENT_ERROR_RC
    except SystemExit as exc:  # argparse error: still one JSON document
        reply = wire.error_reply(verb, "UsageError", f"bad arguments for {verb}: {rest!r}",
                                 code=exc.code)
        rc = wire.AGENT_ERROR_RC
    except Exception as exc:  # a bug in the agent: say so, with the traceback
        reply, rc = _crashed(verb, exc), wire.AGENT_ERROR_RC
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return rc


def _crashed(verb: str, exc: BaseException) -> dict[str, object]:
    return wire.error_reply(verb, "AgentCrashed", f"{type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc()[-4000:])


if __name__ == "__main__":
    sys.exit(main())
