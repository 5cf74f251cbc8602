"""The trainer keeps the bytecode of a torch env that cannot keep its own in the build's cache
folder, never next to the sources, and changes nothing anywhere else."""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload.trainer import bytecode
from tests import live_processes
from tests.paths import REPO
from tests.waiting import wait_for


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A package ``fakepkg`` on sys.path, its folder read-only, no bytecode anywhere."""
    root = tmp_path / "site"
    (root / "fakepkg").mkdir(parents=True)
    (root / "fakepkg" / "__init__.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    os.chmod(root / "fakepkg", 0o555)
    yield root
    os.chmod(root / "fakepkg", 0o755)


def _env(tmp_path, **extra: str) -> dict[str, str]:
    return {"OPSCTL_CACHE_DIR": str(tmp_path / "cache"), **extra}


def test_a_read_only_env_gets_its_bytecode_kept_in_the_cache_folder(pkg, tmp_path, monkeypatch):
    if os.geteuid() == 0:  # root may write into a 0555 folder: answer as a read-only mount does
        real = os.access
        monkeypatch.setattr(bytecode.os, "access", lambda p, m: real(p, m) and "fakepkg" not in str(p))
    env = _env(tmp_path)
    got = bytecode.cache_bytecode("fakepkg", env)
    assert got == str(tmp_path / "cache" / "pycache") == sys.pycache_prefix
    assert env["PYTHONPYCACHEPREFIX"] == got and "PYTHONDONTWRITEBYTECODE" not in env


def test_bytecode_that_cannot_be_written_next_to_the_sources_goes_to_the_cache(pkg, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE=1
    env = _env(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert bytecode.cache_bytecode("fakepkg", env) == str(tmp_path / "cache" / "pycache")
    assert sys.dont_write_bytecode is False


def test_a_writable_env_is_left_to_python(pkg, tmp_path):
    os.chmod(pkg / "fakepkg", 0o755)
    env = _env(tmp_path)
    assert bytecode.cache_bytecode("fakepkg", env) is None
    assert sys.pycache_prefix is None and "PYTHONPYCACHEPREFIX" not in env


def test_bytecode_shipped_with_the_sources_is_used_as_it_is(pkg, tmp_path, monkeypatch):
    os.chmod(pkg / "fakepkg", 0o755)
    import py_compile

    py_compile.compile(str(pkg / "fakepkg" / "__init__.py"), doraise=True)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode.cache_bytecode("fakepkg", _env(tmp_path)) is None


def test_stale_shipped_bytecode_does_not_count(pkg, tmp_path, monkeypatch):
    os.chmod(pkg / "fakepkg", 0o755)
    import py_compile

    src = pkg / "fakepkg" / "__init__.py"
    py_compile.compile(str(src), doraise=True)
    src.write_text("VALUE = 43  # edited after compiling\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode.cache_bytecode("fakepkg", _env(tmp_path)) is not None


@pytest.mark.parametrize("env", [{"OPSCTL_PYCACHE": "off"}, {"OPSCTL_PYCACHE": " OFF "}])
def test_the_switch_leaves_python_as_configured(pkg, tmp_path, monkeypatch, env):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode.cache_bytecode("fakepkg", {**_env(tmp_path), **env}) is None
    assert sys.pycache_prefix is None


def test_a_prefix_the_user_chose_stands(pkg, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "mine"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode.cache_bytecode("fakepkg", _env(tmp_path)) is None
    assert sys.pycache_prefix == str(tmp_path / "mine")


def test_a_cache_folder_it_cannot_make_costs_only_the_speed_up(pkg, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert bytecode.cache_bytecode("fakepkg", {"OPSCTL_CACHE_DIR": str(blocker)}) is None
    assert sys.pycache_prefix is None


@pytest.mark.parametrize("name", ["no_such_package_xyz", "os.path", ""])
def test_a_package_it_cannot_find_changes_nothing(tmp_path, monkeypatch, name):
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode.cache_bytecode(name, _env(tmp_path)) is None


def test_a_process_started_so_keeps_every_module_it_imports_out_of_the_source_tree(tmp_path):
    """A real interpreter under PYTHONDONTWRITEBYTECODE: the second start finds the bytecode
    the first one wrote under the cache folder; nothing appears next to the sources."""
    site = tmp_path / "site"
    (site / "fakepkg").mkdir(parents=True)
    (site / "fakepkg" / "__init__.py").write_text("from . import sub\n")
    (site / "fakepkg" / "sub.py").write_text("X = 1\n")
    code = textwrap.dedent("""
        import sys
        from remote_payload.trainer.bytecode import cache_bytecode
        print(cache_bytecode("fakepkg"))
        import fakepkg, os
        print(os.environ.get("PYTHONPYCACHEPREFIX"))
    """)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}", "PYTHONDONTWRITEBYTECODE": "1",
           "OPSCTL_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("PYTHONPYCACHEPREFIX", None)
    env.pop("OPSCTL_PYCACHE", None)
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=60, check=True)
    prefix = str(tmp_path / "cache" / "pycache")
    assert first.stdout.split() == [prefix, prefix]
    cached = importlib.util.cache_from_source(str(site / "fakepkg" / "sub.py"))
    tagged = os.path.basename(cached)
    kept = list((tmp_path / "cache" / "pycache").rglob(tagged))
    assert len(kept) == 1 and not list(site.rglob("__pycache__"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 2**40), st.integers(0, 2**40))
def test_the_pyc_header_reader_takes_any_bytes(head, mtime, size):
    assert bytecode.header_matches(head, mtime, size) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_a_timestamp_header_matches_only_its_own_source(mtime, size):
    head = importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, mtime, size)
    assert bytecode.header_matches(head, mtime, size)
    assert not bytecode.header_matches(head, mtime + 1, size)
    assert not bytecode.header_matches(head, mtime, size + 1)
    assert not bytecode.header_matches(b"\0\0\0\0" + head[4:], mtime, size)


# --- a cold prefix is filled in parallel --------------------------------------------------


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """A package ``fakecold`` of a few modules (one of them in a ``tests`` folder), and an
    empty prefix that Python uses (``sys.pycache_prefix``), as ``cache_bytecode`` leaves it."""
    site = tmp_path / "site"
    pkg = site / "fakecold"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "tests").mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("B = 2\n")
    (pkg / "tests" / "test_x.py").write_text("X = 3\n")
    prefix = tmp_path / "cache" / "pycache"
    prefix.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    return pkg, prefix


def _kept(prefix, source) -> bool:
    """Whether current bytecode of ``source`` lies under ``prefix``."""
    pyc = importlib.util.cache_from_source(str(source))
    return pyc.startswith(str(prefix)) and bytecode.pyc_is_current(pyc, str(source))


def _wait_unlocked(prefix, timeout: float = 60.0) -> None:
    """Until no primer holds ``prefix`` (the child holds the lock while it runs)."""
    import fcntl

    fd = os.open(prefix / ".priming", os.O_RDWR)

    def locked() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    try:
        assert wait_for(locked, timeout, interval=0.05), "the primer never finished"
    finally:
        os.close(fd)


def test_a_cold_prefix_gets_every_module_compiled_by_one_child(cold):
    pkg, prefix = cold
    child = bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",))
    assert child is not None and child.wait(timeout=60) == 0
    for src in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        assert _kept(prefix, pkg / src), src
    assert not _kept(prefix, pkg / "tests" / "test_x.py")  # never imported by a trainer
    assert not list(pkg.rglob("__pycache__"))  # nothing next to the sources


def test_a_warm_prefix_is_not_compiled_again(cold):
    _pkg, prefix = cold
    first = bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",))
    assert first is not None and first.wait(timeout=60) == 0
    assert bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",)) is None


def test_a_prefix_being_primed_gets_no_second_primer(cold):
    import fcntl

    _pkg, prefix = cold
    held = os.open(prefix / ".priming", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another rank's primer
        assert bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",)) is None
    finally:
        os.close(held)


@pytest.mark.parametrize("workers", [0, -3])
def test_no_workers_no_primer(cold, workers):
    _pkg, prefix = cold
    assert bytecode.prime(str(prefix), dict(os.environ), workers, packages=("fakecold",)) is None
    assert not (prefix / ".priming").exists()


@pytest.mark.parametrize("names", [("no_such_package_xyz",), ("os",), ()])
def test_nothing_to_prime_starts_nothing(cold, names):
    _pkg, prefix = cold
    assert bytecode.prime(str(prefix), dict(os.environ), 2, packages=names) is None


def test_a_prefix_it_cannot_write_costs_only_the_speed_up(cold, tmp_path):
    _pkg, _prefix = cold
    gone = tmp_path / "no" / "such" / "prefix"
    assert bytecode.prime(str(gone), dict(os.environ), 2, packages=("fakecold",)) is None


def test_a_module_that_does_not_compile_leaves_the_others_compiled(cold):
    pkg, prefix = cold
    (pkg / "broken.py").write_text("def (:\n")
    child = bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",))
    assert child is not None
    child.wait(timeout=60)  # compileall says 1; the trainer never looks: only a speed-up
    assert _kept(prefix, pkg / "a.py") and _kept(prefix, pkg / "sub" / "b.py")


@pytest.mark.parametrize(("cpus", "primed"), [(16, True), (bytecode.PRIME_MIN_CPUS, True),
                                              (2, False), (None, False)])
def test_the_trainer_primes_a_cold_prefix_only_with_cores_to_spare(pkg, tmp_path, monkeypatch,
                                                                   cpus, primed):
    if os.geteuid() == 0:  # as in the first test: a read-only mount, even for root
        real = os.access
        monkeypatch.setattr(bytecode.os, "access", lambda p, m: real(p, m) and "fakepkg" not in str(p))
    monkeypatch.setattr(bytecode.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(bytecode, "PRIME_PACKAGES", ("fakepkg",))
    prefix = bytecode.cache_bytecode("fakepkg", _env(tmp_path))
    assert prefix is not None
    lock = tmp_path / "cache" / "pycache" / ".priming"
    assert lock.exists() is primed
    if primed:
        _wait_unlocked(tmp_path / "cache" / "pycache")
        assert _kept(prefix, pkg / "fakepkg" / "__init__.py")


def test_a_primer_stopped_midway_leaves_whole_bytecode_and_frees_the_prefix(cold):
    """Ctrl-C to the primer ends its whole group: what it wrote is whole (Python writes
    each pyc atomically), and the next start may prime again."""
    import signal
    import time

    pkg, prefix = cold
    for i in range(400):
        (pkg / f"m{i}.py").write_text("".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(50)))
    child = bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",))
    assert child is not None
    time.sleep(0.3)  # scenario: Ctrl-C lands while the primer is compiling
    child.send_signal(signal.SIGINT)
    child.wait(timeout=60)
    _wait_unlocked(prefix, timeout=10)
    for pyc in prefix.rglob("*.pyc"):
        head = pyc.read_bytes()[:16]
        assert len(head) == 16 and head[:4] == importlib.util.MAGIC_NUMBER, pyc
    again = bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",))
    if again is not None:  # the package's __init__ was not reached: still cold, primed again
        assert again.wait(timeout=120) == 0


def _primer_tree(prefix) -> set[int]:
    """Live processes of the primer of ``prefix`` (the primer, compileall, its workers): each
    carries ``PYTHONPYCACHEPREFIX=<prefix>`` in its environment."""
    return live_processes.with_env(f"PYTHONPYCACHEPREFIX={prefix}")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT", "SIGKILL"])
def test_a_primer_killed_midway_leaves_no_worker_holding_the_prefix(cold, sig):
    """The primer alone holds the prefix's lock: its compileall workers never do. Ended by a
    signal it can handle, it ends their whole group; killed outright, it frees the lock at
    once and the next primer ends the workers it left before it starts its own."""
    import signal

    from tests.waiting import wait_for

    pkg, prefix = cold
    for i in range(1500):
        (pkg / f"m{i}.py").write_text("".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(80)))
    child = bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",))
    assert child is not None
    wait_for(lambda: len(_primer_tree(prefix)) >= 4, 30, what="the primer's workers")
    first = _primer_tree(prefix)
    os.kill(child.pid, getattr(signal, sig))
    child.wait(timeout=30)
    if sig != "SIGKILL":
        assert wait_for(lambda: not (_primer_tree(prefix) & first), 10), _primer_tree(prefix)
    _wait_unlocked(prefix, timeout=5)  # the lock is free at once, whatever is left
    for pyc in prefix.rglob("*.pyc"):  # cold again, so the next start primes
        pyc.unlink()
    again = bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",))
    assert again is not None  # a fresh primer takes the prefix
    assert wait_for(lambda: not (_primer_tree(prefix) & first), 10), "a killed primer's workers"
    again.end()
    assert wait_for(lambda: not _primer_tree(prefix), 10), _primer_tree(prefix)


def test_compileall_killed_alone_takes_its_workers_with_it(cold):
    """A SIGKILL of compileall itself (not of the primer) leaves workers that no one waits
    for: the primer ends its whole group as soon as compileall is gone, and frees the prefix."""
    import signal

    from tests.waiting import wait_for

    pkg, prefix = cold
    for i in range(1500):
        (pkg / f"m{i}.py").write_text("".join(f"def f{j}(x):\n    return x + {j}\n" for j in range(80)))
    child = bytecode.prime(str(prefix), dict(os.environ), 2, packages=("fakecold",))
    assert child is not None

    def compileall_pid() -> int | None:
        for pid in _primer_tree(prefix):
            with open(f"/proc/{pid}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) == child.pid:
                    return pid
        return None

    wait_for(lambda: len(_primer_tree(prefix)) >= 4, 30, what="the primer's workers")
    target = wait_for(compileall_pid, 10, what="compileall")
    os.kill(target, signal.SIGKILL)
    assert child.wait(timeout=30) == 128 + signal.SIGKILL  # compileall's end, reported
    assert wait_for(lambda: not _primer_tree(prefix), 10), _primer_tree(prefix)
    _wait_unlocked(prefix, timeout=5)
