"""`opsctl status` of one job, once: the command's body, and its entry without click.

Why: `status --json` is polled by scripts and measured against a raw ``ssh … pct exec``
(docs/benchmarks.md); importing click and assembling every command family cost ~40 ms of it
for a command line that is, nearly always, ``status [--json] [--host H] [--ct N]``.
:func:`run` takes exactly that grammar (each option once, values that cannot be read as
another option) straight to :func:`status_once`, the same function the click command
calls; any other word (``--follow``, a JOB, ``--help``, a repeated option, ``--host=``
with nothing after it) returns False and click parses the whole command line as before.
Errors end as :class:`~opsctl.cli.app.OpsctlGroup` ends them (the same report, document
and exit code, :func:`opsctl.cli.app.report_error`).
"""

from __future__ import annotations

import sys
import typing as t

from opsctl.config import ctid as ctid_rule
from opsctl.config import last_target, trace
from opsctl.errors import OpsctlError

if t.TYPE_CHECKING:
    from opsctl.remote.launchrecord import Launched

DEFAULT_LINES = 20  # the click command's --lines default (opsctl/cli/jobs.py)


def status_once(host: str | None, ctid: int | None, accept_new_host_key: bool,
                job_id: str | None, lines: int, as_json: bool, *,
                early: Launched | None = None, words: list[str] | None = None) -> None:
    """One status: without pydantic or YAML where it can (opsctl/ops/quickstatus.py), else
    the full path; the same document and view either way.

    ``early``: the ``ssh`` the launch record started for command line ``words``
    (:mod:`opsctl.remote.launchrecord`); with ``words``, a status that started its own ``ssh``
    keeps a launch record for the next one.
    """
    from opsctl.ops import quickstatus

    trace.mark("imports")
    answer = quickstatus.fetch(host, ctid, job_id, lines, model=not as_json,
                               accept_new_host_key=accept_new_host_key,
                               meanwhile=_load_json_output if as_json else _load_view,
                               early=early)
    if answer is None:
        from opsctl.ops import jobs, watch

        with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
            answer = quickstatus.Answer(tgt.label, status=watch.fetch_status(tgt.agent, job_id, lines))
        trace.mark("full path")
    if as_json:  # no rich on this path: `status --json` is polled by scripts (docs/benchmarks.md)
        from opsctl.cli.jsonout import print_json

        print_json(answer.document())
        trace.mark("print")
    else:
        from opsctl.cli import render

        if answer.status is None:  # pragma: no cover - model=True always gives the model
            raise ValueError("no status model")
        render.status(render.console(), answer.label, answer.status, pane_lines=lines)
        trace.mark("render")
    quickstatus.keep_warm(answer)  # after the output: a new mux takes no CPU from this one
    trace.mark("mux spawn")
    if words is not None:
        quickstatus.remember_launch(words, answer)


# What the output needs, loaded while the first command's ssh waits for its reply
# (quickstatus.fetch's ``meanwhile``).
def _load_json_output() -> None:
    from opsctl.cli import jsonout  # noqa: F401


def _load_view() -> None:
    from opsctl.cli import render  # noqa: F401


def parse(argv: list[str]) -> dict[str, object] | None:
    """``status_once``'s arguments for a plain ``status`` command line; None for any other."""
    if argv[:1] != ["status"]:
        return None
    got: dict[str, object] = {}
    words = argv[1:]
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=")
        if name in ("--json", "--accept-new-host-key") and not eq:
            key: str = name
            got_value: object = True
        elif name in ("--host", "--ct"):
            if not eq:
                i += 1
                if i == len(words):
                    return None
                value = words[i]
            if not value or value.startswith("-"):
                return None
            if name == "--ct":
                if not ctid_rule.valid_ctid_text(value):  # click's path says why
                    return None
                got_value = int(value)
            else:
                got_value = value
            key = name
        else:
            return None
        if key in got:
            return None
        got[key] = got_value
        i += 1
    return {"host": got.get("--host"), "ctid": got.get("--ct"),
            "accept_new_host_key": bool(got.get("--accept-new-host-key")), "job_id": None,
            "lines": DEFAULT_LINES, "as_json": bool(got.get("--json"))}


def run(argv: list[str], early: Launched | None = None) -> bool:
    """Run ``argv`` if it is a plain ``status`` (then exit as click would); False otherwise.
    ``early``: the ``ssh`` the launch record started for ``argv`` (killed unless adopted).

    After success the process ends at once (:func:`_exit_now`, exit code 0).

    Raises:
        SystemExit: the command's exit code after an error.
    """
    kwargs = parse(argv)
    if kwargs is None or (kwargs["host"] is None and kwargs["ctid"] is None
                          and last_target.remembers_run()):
        return False  # click's `status` (a multi-node run's status is one row per node)
    try:
        status_once(**kwargs, early=early, words=argv)  # type: ignore[arg-type]
        sys.stdout.flush()  # here, where a closed pipe is caught
    except OpsctlError as exc:
        from opsctl.cli.app import report_error

        report_error(exc, as_json=bool(kwargs["as_json"]))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        from opsctl.cli.app import report_interrupt

        sys.exit(report_interrupt())
    except BrokenPipeError:  # `opsctl status --json | head -1`: exit 1 quietly, as click's main
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        sys.exit(1)
    finally:
        if early is not None:
            early.discard()  # not adopted (a no-op when it was)
        trace.dump()
    _exit_now(0)
    return True  # pragma: no cover - not reached


def _exit_now(code: int) -> None:
    """Flush the output and exit without the interpreter's teardown (~5 ms of a status with
    its modules loaded; docs/benchmarks.md): the answer is out, every connection and file was
    closed by its ``with``, the mux (if any) was started detached, and no exit handler of
    opsctl's has work to do."""
    import os

    sys.stdout.flush()  # (a no-op: run() flushed it, where a closed pipe is caught)
    sys.stderr.flush()
    os._exit(code)
