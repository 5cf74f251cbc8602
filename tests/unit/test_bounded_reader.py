"""The one bounded reader (``remote_payload/boundedread.py``): a regular file of at most N
bytes, never a wait on a FIFO, never a device, a link refused unless the caller follows the
user's own links."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from remote_payload import boundedread


def test_a_regular_file_within_the_cap_is_read_whole(tmp_path: Path):
    f = tmp_path / "f"
    f.write_bytes(b"abc" * 1000)
    assert boundedread.read_regular(f, 3000) == b"abc" * 1000
    assert boundedread.read_text(f, 3000) == "abc" * 1000


def test_a_file_over_the_cap_is_refused_naming_the_cap_or_cut_when_asked(tmp_path: Path):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 5000)
    with pytest.raises(boundedread.Refused) as info:
        boundedread.read_regular(f, 4999)
    assert info.value.why == boundedread.TOO_LARGE and info.value.errno == errno.EFBIG
    assert "4999 bytes" in str(info.value) and str(f) in str(info.value)
    assert boundedread.read_regular(f, 10, cut=True) == b"x" * 10


def test_a_link_is_refused_and_its_target_never_read_unless_the_caller_follows_links(
        tmp_path: Path):
    secret = tmp_path / "secret"
    secret.write_text("TOKEN-81f2")
    link = tmp_path / "current"
    link.symlink_to(secret)
    with pytest.raises(boundedread.Refused) as info:
        boundedread.read_regular(link, 100)
    assert info.value.why == boundedread.LINK and info.value.errno == errno.ELOOP
    assert "TOKEN" not in str(info.value)
    assert boundedread.read_regular(link, 100, follow_links=True) == b"TOKEN-81f2"


def test_a_fifo_is_refused_at_once_without_waiting_for_a_writer(tmp_path: Path):
    fifo = tmp_path / "current"
    os.mkfifo(fifo)
    start = time.monotonic()
    for follow in (False, True):
        with pytest.raises(boundedread.Refused) as info:
            boundedread.read_regular(fifo, 100, follow_links=follow)
        assert info.value.why == boundedread.NOT_REGULAR
    assert time.monotonic() - start < 5


def test_a_device_is_refused_even_through_a_link_the_caller_follows(tmp_path: Path):
    link = tmp_path / "known_hosts"
    link.symlink_to("/dev/zero")
    with pytest.raises(boundedread.Refused) as info:
        boundedread.read_regular(link, 100, follow_links=True)
    assert info.value.why == boundedread.NOT_REGULAR


def test_a_directory_is_refused_as_a_directory(tmp_path: Path):
    with pytest.raises(boundedread.Refused) as info:
        boundedread.read_regular(tmp_path, 100)
    assert info.value.why == boundedread.DIRECTORY


def test_a_missing_file_is_file_not_found(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        boundedread.read_regular(tmp_path / "none", 100)


def test_a_refusal_is_an_oserror_so_callers_that_survive_unreadable_files_survive_it(
        tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError):
        boundedread.read_regular(fifo, 1)


def test_proc_files_that_say_size_zero_are_read_to_their_end():
    data = boundedread.read_regular("/proc/self/cmdline", 1 << 20)
    assert data  # st_size is 0 for /proc files: never trusted
