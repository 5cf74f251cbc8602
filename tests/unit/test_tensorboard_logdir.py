"""``opsctl tensorboard`` reads the logdir from the job's own (untrusted) event lines: only what
the trainer writes is taken, and nothing else is ever pulled."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opsctl.errors import ConfigError
from opsctl.ops import tensorboard as tb
from tests.waiting import wait_for


def _line(**fields: object) -> str:
    return json.dumps({"event": "trackers", **fields}, separators=(",", ":"))


def test_the_last_trackers_event_names_the_logdir():
    text = "\n".join([_line(tensorboard="/runs/a/tensorboard"), '{"event":"step","step":1}',
                      _line(tensorboard="/runs/b/tensorboard")])
    assert tb.announced_logdir(text) == "/runs/b/tensorboard"


def test_a_line_written_like_the_wrappers_is_found_by_the_grep_pattern():
    assert _line(tensorboard="/x/tensorboard", _at=1.0).startswith(tb.TRACKERS_LINE)


@pytest.mark.parametrize("text", ["", '{"event":"step"}', _line(wandb="/w"), _line(tensorboard=3)])
def test_no_tensorboard_in_the_events_is_none(text):
    assert tb.announced_logdir(text) is None


@pytest.mark.parametrize("path", ["/", "/etc", "relative/tensorboard", "/a/../etc/tensorboard",
                                  "/a//tensorboard", "/a/tensorboard/", "/a/tensorboard\nx",
                                  "/root/.ssh"])
def test_a_logdir_the_trainer_would_not_write_is_refused(path):
    with pytest.raises(ValueError, match="not an absolute <dir>/tensorboard"):
        tb.announced_logdir(_line(tensorboard=path))


@given(st.text(max_size=200))
def test_any_job_output_gives_none_a_trainer_logdir_or_a_value_error(text):
    try:
        got = tb.announced_logdir(text)
    except ValueError:
        return
    assert got is None or (got.startswith("/") and got.endswith("/tensorboard")), got


@given(st.text(max_size=80))
def test_any_announced_path_is_taken_only_in_the_trainers_shape(path):
    try:
        got = tb.announced_logdir(_line(tensorboard=path))
    except ValueError:
        return
    assert got == path and path.startswith("/") and path.rsplit("/", 1)[1] == "tensorboard", path
    assert ".." not in path.split("/")


def test_a_port_in_use_is_refused_and_port_0_picks_a_free_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="in use"):
            tb.check_port(s.getsockname()[1])
    assert tb.check_port(0) > 0


def test_a_host_label_becomes_a_safe_directory_name():
    assert tb._safe("root@10.1.2.6:2222") == "root_10.1.2.6_2222"
    assert tb._safe("../..") == ".._.." and "/" not in tb._safe("a/b")
    assert tb._safe("..") == tb._safe(".") == tb._safe("") == "host"


@pytest.mark.parametrize("link_at", ["tensorboard", "tensorboard/host-ct200", "tensorboard/host-ct200/job1"])
def test_a_link_anywhere_in_the_copys_path_is_refused_and_nothing_is_written_through_it(
        isolated_env, tmp_path, link_at):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = isolated_env / link_at
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        tb.check_local_dir(isolated_env / "tensorboard" / "host-ct200" / "job1")
    assert list(elsewhere.iterdir()) == []


def test_the_copys_own_path_without_links_is_taken(isolated_env):
    tb.check_local_dir(isolated_env / "tensorboard" / "host-ct200" / "job1")  # nothing there yet
    (isolated_env / "tensorboard" / "host-ct200" / "job1").mkdir(parents=True)
    tb.check_local_dir(isolated_env / "tensorboard" / "host-ct200" / "job1")


def test_a_second_signal_while_the_server_is_ended_is_ignored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    ended = []
    with pytest.raises(tb.Stopped), tb.stop_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for(lambda: False, 5)  # the handler raises at once
        finally:  # the cleanup (Server.stop) sees more signals and still runs to its end
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGINT)
            ended.append(True)
    assert ended == [True]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_before_the_server_is_owned_is_raised_once_it_is():
    """A signal while the TensorBoard process is being started would leave it running: it
    is held until the server object that ends it exists, then raised."""
    with pytest.raises(tb.Stopped), tb.stop_on_signals(armed=False) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the second is ignored, also once armed
        started = True  # the server's start runs to its end
        signals.arm()
    assert started


def test_sigterm_and_sighup_are_handled_wherever_ctrl_c_is():
    assert issubclass(tb.Stopped, KeyboardInterrupt)


def test_a_file_where_the_copys_directory_goes_is_one_line(isolated_env):
    (isolated_env / "tensorboard").write_text("mine")
    with pytest.raises(ConfigError, match=r"cannot make .* for the TensorBoard copy"):
        tb.make_local_dir(isolated_env / "tensorboard" / "host-ct200" / "job1")
    assert (isolated_env / "tensorboard").read_text() == "mine"


def test_a_server_that_cannot_start_is_one_line_and_leaves_no_open_file(monkeypatch, tmp_path):
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-such-python"))
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ConfigError, match="cannot start tensorboard here: No such file"):
        tb.Server(tmp_path, 0)
    assert len(os.listdir("/proc/self/fd")) == before
