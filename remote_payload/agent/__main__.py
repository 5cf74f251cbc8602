"""Agent entry point: parse argv, run one verb, print one JSON document.

Verb modules are imported lazily (only the one asked for) so that a `status`
round trip pays for no imports it does not use. The command line opsctl sends for
``status`` (every poll: ``[--root R] [--tmux-socket S] status [--lines N] [--job J]
[--json]``) is read without argparse (:func:`plain_status`; importing argparse and
building its two parsers cost ~3 ms of each poll); any other command line, or one a word
off that shape, goes through argparse.

The entry stays ``python3 -S -m remote_payload.agent``: a direct script path would save
runpy (~1 ms) but an older payload, still installed in a container while a job runs,
has no such script, and a script is compiled from source on every start.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
import types
import typing as t

from remote_payload import wire
from remote_payload.agent.common import AgentFailure
from remote_payload.wire import ErrorType

if t.TYPE_CHECKING:
    import argparse

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
    # the job queue
    "queue": "remote_payload.agent.verbs.queue",
    "queue-add": "remote_payload.agent.verbs.queue",
    "queue-rm": "remote_payload.agent.verbs.queue",
    "queue-move": "remote_payload.agent.verbs.queue",
    "queue-advance": "remote_payload.agent.verbs.queue",  # the boot hook's (agent/boothook.py)
    "history": "remote_payload.agent.verbs.history",  # plot data
    "goodput": "remote_payload.agent.verbs.goodput",  # a run's wall time by cause
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
    # opsctl doctor: the container-side checks
    "doctor": "remote_payload.agent.verbs.doctor",
}

def plain_status(argv: list[str]) -> types.SimpleNamespace | None:
    """The arguments of a plain ``status`` command line, as argparse would read them; None
    for any other (a value that starts with ``-``, an option given twice, an ``=`` form,
    an abbreviation, another verb): argparse then reads it."""
    from remote_payload.agent.verbs.jobs import DEFAULT_LINES

    flags: set[str] = set()
    values: dict[str, str] = {}
    verb_seen = False
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "status" and not verb_seen:
            verb_seen = True
        elif word == "--json" and word not in flags:
            flags.add(word)
        elif (word in ("--root", "--tmux-socket") or (verb_seen and word in ("--lines", "--job"))) \
                and word not in values:
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                return None
            values[word] = argv[i + 1]
            i += 1
        else:
            return None
        i += 1
    lines = values.get("--lines", str(DEFAULT_LINES))
    if not verb_seen or not (lines.isascii() and lines.isdigit()):
        return None
    return types.SimpleNamespace(  # json: False, as argparse leaves the verb's own --json
        verb="status", json=False, job=values.get("--job"), lines=int(lines),
        root=values.get("--root", os.environ.get(wire.ENV_ROOT, wire.DEFAULT_ROOT)),
        tmux_socket=values.get("--tmux-socket",
                               os.environ.get(wire.ENV_TMUX_SOCKET, wire.DEFAULT_TMUX_SOCKET)))


def _top_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(prog="remote_payload.agent")
    parser.add_argument("--root", default=os.environ.get(wire.ENV_ROOT, wire.DEFAULT_ROOT))
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; output is always JSON")
    parser.add_argument("--tmux-socket",
                        default=os.environ.get(wire.ENV_TMUX_SOCKET, wire.DEFAULT_TMUX_SOCKET),
                        help="tmux socket name (tmux -L) the job sessions live on")
    parser.add_argument("verb", choices=sorted(VERBS))
    return parser


def _verb_args(verb: str, module: types.ModuleType, known: argparse.Namespace,
               rest: list[str]) -> argparse.Namespace:
    """The verb's own parser's reading of the words the top-level parser left.

    Raises:
        SystemExit: the verb's parser refused them.
    """
    import argparse

    sub = argparse.ArgumentParser(prog=f"remote_payload.agent {verb}")
    sub.add_argument("--json", action="store_true")
    module.add_arguments(verb, sub)
    args = sub.parse_args(rest)
    args.root = known.root
    args.tmux_socket = known.tmux_socket
    args.verb = verb
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    known: types.SimpleNamespace | argparse.Namespace | None = plain_status(argv)
    rest: list[str] = []
    if known is None:
        known, rest = _top_parser().parse_known_args(argv)
    verb = known.verb
    try:
        module = importlib.import_module(VERBS[verb])
        args = known if isinstance(known, types.SimpleNamespace) else \
            _verb_args(verb, module, known, rest)
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
    except ValueError as exc:
        from remote_payload.agent.jobrecord import DamagedRecord

        if not isinstance(exc, DamagedRecord):
            reply, rc = _crashed(verb, exc), wire.AGENT_ERROR_RC
        else:  # the job dir is left as it is: a human reads it (jobs lists it under damaged)
            reply = wire.error_reply(verb, ErrorType.DamagedRecord,
                                     f"damaged job record {exc.path}: {exc.reason}; left as it "
                                     "is", path=exc.path, reason=exc.reason)
            rc = wire.AGENT_ERROR_RC
    except SystemExit as exc:  # argparse error: still one JSON document
        reply = wire.error_reply(verb, ErrorType.UsageError, f"bad arguments for {verb}: {rest!r}",
                                 code=exc.code)
        rc = wire.AGENT_ERROR_RC
    except Exception as exc:  # a bug in the agent: say so, with the traceback
        reply, rc = _crashed(verb, exc), wire.AGENT_ERROR_RC
    sys.stdout.write(wire.dumps_strict(reply) + "\n")
    sys.stdout.flush()
    return rc


def _crashed(verb: str, exc: BaseException) -> dict[str, object]:
    import traceback  # only here: `status` (every poll) never needs it (~3 ms of the agent's start)

    return wire.error_reply(verb, ErrorType.AgentCrashed, f"{type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc()[-4000:])


if __name__ == "__main__":
    from remote_payload import procgroup

    procgroup.install_signal_handlers()  # SIGTERM/SIGHUP (pct or ssh gone) end our children
    try:
        code = main()
    except procgroup.Terminated as exc:
        code = exc.code
    # The one JSON document is out (main flushed it); skip the interpreter's teardown, ~4 ms
    # of every `status` poll: no verb leaves work behind (its threads are daemons, no exit
    # handlers), and stderr is flushed here.
    sys.stderr.flush()
    os._exit(code)
