"""A capped pull over rsync (``files.pull(max_bytes=)``, as the TensorBoard copy runs it)
stops at its cap: rsync's group is ended as soon as its progress shows the copy passing the
cap, the error names the cap, and nothing half-written is left in the destination."""

from __future__ import annotations

import pytest

from opsctl import errors
from opsctl.ops import files
from opsctl.ops.jobs import open_target
from opsctl.remote import rsync
from tests.sandbox.test_files_sandbox import run, unique

pytestmark = pytest.mark.sandbox
CT = ("--host", "sandbox", "--ct", "200")
CAP = 1_000_000


def _sh(script: str) -> None:
    res = run("exec", *CT, "--", "sh", "-c", script)
    assert res.exit_code == 0, res.output


def test_a_capped_rsync_pull_stops_at_its_cap_and_leaves_no_partial_files(target, tmp_path):
    src = unique("capped")
    _sh(f"mkdir -p /opt/opsctl/data/{src} && for i in 1 2 3 4 5 6 7 8; do "
        f"head -c 900000 /dev/urandom > /opt/opsctl/data/{src}/f$i; done")
    dest = tmp_path / "copy"
    with pytest.raises(errors.EntriesRefused) as caught:
        files.pull(open_target("sandbox", 200), src, dest, method="rsync", max_bytes=CAP)
    left = list(dest.rglob("*")) if dest.exists() else []
    on_disk = sum(p.stat().st_size for p in left if p.is_file())
    assert on_disk <= CAP, f"{on_disk} bytes written under a cap of {CAP}"
    assert f"cap of {CAP} bytes" in caught.value.message, caught.value.message
    assert not [p for p in left if rsync.PARTIAL_DIR in p.parts or p.name.startswith(".")], left


def test_a_capped_rsync_pull_under_its_cap_arrives_whole(target, tmp_path):
    src = unique("undercap")
    _sh(f"mkdir -p /opt/opsctl/data/{src} && head -c 300000 /dev/urandom > /opt/opsctl/data/{src}/a"
        f" && head -c 300000 /dev/urandom > /opt/opsctl/data/{src}/b")
    dest = tmp_path / "copy"
    tgt = open_target("sandbox", 200)
    files.pull(tgt, src, dest, method="rsync", max_bytes=CAP)
    assert sorted(p.name for p in dest.iterdir()) == ["a", "b"]
    files.pull(tgt, src, dest, method="rsync", max_bytes=CAP)  # a re-pull is under it too
