"""The agent reads opsctl's own ``status`` command line without argparse
(``remote_payload/agent/__main__.py``: :func:`plain_status`, every poll); whatever it
accepts, it reads exactly as the argparse path does, and it hands everything else over."""

from __future__ import annotations

import contextlib
import importlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.ops import watch
from opsctl.remote import command
from remote_payload.agent import __main__ as agent_main

JOBS = importlib.import_module("remote_payload.agent.verbs.jobs")
VALUES = st.sampled_from(["20", "007", "0", "-1", "+3", "٣", "", "/opt/x", "job-1", "status",
                          "--json", "-x", "a b"])
OPTIONS = st.sampled_from(["--root", "--tmux-socket", "--lines", "--job"]).flatmap(
    lambda opt: VALUES.map(lambda v: [opt, v]))
ODD = st.sampled_from([["status"], ["logs"], ["--"], ["--lin", "5"], ["--root=/r"], ["--lines=5"],
                       ["--job"], ["--json"]])


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """Lines shaped like opsctl's: ``status`` and options in any order, some twice or odd."""
    groups = [["status"], *draw(st.lists(OPTIONS, max_size=4)), *draw(st.lists(st.just(["--json"]),
                                                                               max_size=1))]
    groups += draw(st.lists(ODD, max_size=1))
    return [w for g in draw(st.permutations(groups)) for w in g]


def _argparse_reading(argv: list[str]) -> dict[str, object] | None:
    """What the argparse path makes of ``argv`` for ``status``; None: it refuses, or
    another verb."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            known, rest = agent_main._top_parser().parse_known_args(argv)
            if known.verb != "status":
                return None
            return vars(agent_main._verb_args("status", JOBS, known, rest))
        except SystemExit:
            return None


@pytest.mark.parametrize("job", [None, "j-1"])
def test_the_command_line_opsctl_sends_is_read_without_argparse(job):
    sent = command.agent_argv("/opt/opsctl", "status", *watch.status_args(job, 20))
    argv = sent[sent.index("remote_payload.agent") + 1:]
    plain = agent_main.plain_status(argv)
    assert plain is not None, argv
    assert vars(plain) == _argparse_reading(argv)


@settings(max_examples=400, deadline=None)
@given(command_lines())
def test_whatever_the_plain_reader_takes_it_reads_as_argparse_does(argv):
    plain = agent_main.plain_status(argv)
    if plain is not None:
        assert vars(plain) == _argparse_reading(argv), argv


def test_a_line_a_word_off_the_plain_shape_goes_to_argparse():
    for argv in (["status", "--lines=5"], ["status", "--lin", "5"], ["--lines", "5", "status"],
                 ["status", "--job", "a", "--job", "b"], ["status", "--lines", "-1"], ["logs"],
                 ["status", "status"], ["status", "--job"]):
        assert agent_main.plain_status(argv) is None, argv
