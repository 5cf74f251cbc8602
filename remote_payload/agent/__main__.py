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

from remote_payload import wire
from remote_payload.agent.common import AgentFailure
from remote_payload.wire import ErrorType

# verb name -> module exposing add_arguments(parser) and run(args) -> JSON-able data
VERBS: dict[str, str] = {
    "env": "remote_payload.agent.verbs.env",
    "launch": "remote_payload.agent.verbs.jobs",
    "status": "remote_payload.agent.verbs.jobs",
    "logs": "remote_payload.agent.verbs.jobs",
    "stop": "remote_payload.agent.verbs.jobs",
    "stacks": "remote_payload.agent.verbs.jobs",
    "jobs": "remote_payload.agent.verbs.jobs",
    "abort": "remote_payload.agent.verbs.jobs",  # an interrupted deploy
    "history": "remote_payload.agent.verbs.history",  # plot data
    # torch builds and caches
    "envs": "remote_payload.agent.verbs.torch",
    "swap": "remote_payload.agent.verbs.torch",
    "cache-info": "remote_payload.agent.verbs.torch",
    "cache-clear": "remote_payload.agent.verbs.torch",
    "cache-seed": "remote_payload.agent.verbs.torch",
    # compile-race probe
    "probe": "remote_payload.agent.verbs.probe",
    # multi-node runs: address, network namespace and a free port for the rendezvous
    "net": "remote_payload.agent.verbs.net",
}

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="remote_payload.agent")
    parser.add_argument("--root", default=os.environ.get(wire.ENV_ROOT, wire.DEFAULT_ROOT))
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; output is always JSON")
    parser.add_argument("--tmux-socket",
                        default=os.environ.get(wire.ENV_TMUX_SOCKET, wire.DEFAULT_TMUX_SOCKET),
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
                verb, ErrorType.DiskFull, f"disk full in the container: {exc.strerror}"
                f"{' (' + str(exc.filename) + ')' if exc.filename else ''}; {verb} could not "
                "write its records", path=exc.filename, root=known.root)
            rc = wire.AGENT_ERROR_RC
    except SystemExit as exc:  # argparse error: still one JSON document
        reply = wire.error_reply(verb, ErrorType.UsageError, f"bad arguments for {verb}: {rest!r}",
                                 code=exc.code)
        rc = wire.AGENT_ERROR_RC
    except Exception as exc:  # a bug in the agent: say so, with the traceback
        reply, rc = _crashed(verb, exc), wire.AGENT_ERROR_RC
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return rc


def _crashed(verb: str, exc: BaseException) -> dict[str, object]:
    import traceback  # only here: `status` (every poll) never needs it (~3 ms of the agent's start)

    return wire.error_reply(verb, ErrorType.AgentCrashed, f"{type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc()[-4000:])


if __name__ == "__main__":
    sys.exit(main())
