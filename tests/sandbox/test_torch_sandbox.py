"""`opsctl swap-torch`, `envs`, `cache` and the demo deploy, through the real sandbox.

The fake-torch index runs on this machine's 127.0.0.1; the container shares the host's
network (as a bridged Proxmox container would reach a mirror), so pip in the container
installs from it. Each module uses its own opsctl root in the container so the shared
`/opt/opsctl` (whose current build the demo job uses) is never touched by fake builds.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import typing as t
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from opsctl import errors
from opsctl.cli import cli
from tests.paths import REPO
from tests.shared_torch import install_reply, real_cpu_build_in_default_root
from tests.wheel_index import build_fake_torches, closed_port_url, serve_index, write_simple_index
from tests.xdist_plugin import REAL_TORCH_DEMO_GROUP

pytestmark = pytest.mark.sandbox
# the tests on /opt/opsctl's real CPU build run in one worker (tests/shared_torch.py links the
# session's one real install into its sandbox); the fake-build tests above them, on a private
# root, run anywhere
real_torch = pytest.mark.xdist_group(REAL_TORCH_DEMO_GROUP)

WARMUP = '''
"""Stand-in warm-up entry point: real torch.compile + mega-cache save/load (CPU)."""
import argparse, json, time
import torch
from torch._dynamo.utils import counters

p = argparse.ArgumentParser()
p.add_argument("--warmup-only", action="store_true")
p.add_argument("--save-cache-artifacts")
p.add_argument("--load-cache-artifacts")
a = p.parse_args()
if a.load_cache_artifacts:
    with open(a.load_cache_artifacts, "rb") as f:
        torch.compiler.load_cache_artifacts(f.read())
step = torch.compile(lambda x, w: torch.nn.functional.gelu(x @ w).sum(-1))
t0 = time.monotonic()
step(torch.randn(4, 8), torch.randn(8, 8))
secs = time.monotonic() - t0
if a.save_cache_artifacts:
    with open(a.save_cache_artifacts, "wb") as f:
        f.write(torch.compiler.save_cache_artifacts()[0])
cache = {f"{g}.{k}": v for g in ("inductor", "aot_autograd") for k, v in counters[g].items()
         if "cache" in k}
print(json.dumps({"event": "compile", "name": "step", "seconds": round(secs, 3), "cache": cache}))
'''


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> t.Iterator[str]:
    base = tmp_path_factory.mktemp("index")
    wheels = build_fake_torches(str(base / "wheels"))
    write_simple_index(str(base / "index"), wheels)
    with serve_index(str(base / "index")) as url:
        yield url


@pytest.fixture(scope="module")
def private_root(sandbox) -> t.Iterator[str]:
    root = f"/opt/opsctl-test-torch-{os.getpid()}"
    yield root
    lxc = str(sandbox.lxc_path)
    os.system(f"lxc-attach -P {lxc} -n 200 -- rm -rf {root}")


@pytest.fixture
def torch_target(sandbox, isolated_env: Path, index_url: str, private_root: str) -> str:
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(sandbox.inventory_file.read_text())
    host = doc["hosts"]["sandbox"]
    host["root"] = private_root
    host["torch_builds"] = {v: {"index_url": index_url} for v in ("cu126", "cu128", "cu130")}
    (inv / "sandbox.yaml").write_text(yaml.safe_dump(doc))
    return "sandbox"


def opsctl(*args: str) -> t.Any:
    return CliRunner().invoke(cli, list(args))


def valid(name: str, stdout: str) -> dict[str, t.Any]:
    """``stdout`` as a document of ``opsctl schema NAME`` (asserted valid against it)."""
    from opsctl.cli import schemas

    doc = json.loads(stdout)
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in Draft202012Validator(schemas.document_schema(name)).iter_errors(doc)]
    assert problems == []
    return t.cast(dict[str, t.Any], doc)


def swap(variant: str, *extra: str) -> t.Any:
    return opsctl("swap-torch", variant, "--host", "sandbox", "--ct", "200", "--json", *extra)


def test_swap_installs_verifies_switches_and_records_history(torch_target):
    res = swap("cu128")
    assert res.exit_code == 0, res.output
    first = valid("swap-torch", res.stdout)
    assert (first["action"], first["current"]) == ("install", "torch-2.11.0-cu128")
    res = swap("cu130")
    assert json.loads(res.stdout)["current"] == "torch-2.11.0-cu130"

    start = time.monotonic()
    res = swap("cu128")
    elapsed = time.monotonic() - start
    back = valid("swap-torch", res.stdout)
    assert (back["action"], back["current"]) == ("switch", "torch-2.11.0-cu128")
    assert elapsed <= 2.0 + 1.0, f"switch back took {elapsed:.2f}s (target 2 s on the sandbox)"

    envs = json.loads(opsctl("envs", "--host", "sandbox", "--ct", "200", "--json").stdout)
    assert {b["name"] for b in envs["builds"]} == {"torch-2.11.0-cu128", "torch-2.11.0-cu130"}
    assert envs["current"] == "torch-2.11.0-cu128"
    assert [h["to"] for h in envs["history"]][-3:] == ["torch-2.11.0-cu128", "torch-2.11.0-cu130",
                                                       "torch-2.11.0-cu128"]


def test_a_build_that_fails_verification_leaves_the_current_build_in_place(torch_target):
    assert swap("cu128").exit_code == 0
    res = swap("cu126")
    assert res.exit_code == errors.TORCH_ENV, res.output
    assert "verify" in res.stderr and "full output:" in res.stderr
    envs = json.loads(opsctl("envs", "--host", "sandbox", "--ct", "200", "--json").stdout)
    assert envs["current"] == "torch-2.11.0-cu128"
    assert "torch-2.11.0-cu126" not in {b["name"] for b in envs["builds"]}
    assert envs["in_progress_or_leftover"] == []


def test_an_unknown_variant_lists_the_known_ones(torch_target):
    res = swap("cu999")
    assert res.exit_code == errors.USAGE
    assert "known variants: cpu, cu126, cu128, cu130" in res.stderr


def test_an_unreachable_index_is_a_clear_error_and_changes_nothing(torch_target):
    assert swap("cu128").exit_code == 0
    res = swap("cu130", "--index-url", closed_port_url(), "--reinstall")
    assert res.exit_code == errors.TORCH_ENV
    assert "unreachable" in res.stderr.lower() or "refused" in res.stderr.lower()
    envs = json.loads(opsctl("envs", "--host", "sandbox", "--ct", "200", "--json").stdout)
    assert envs["current"] == "torch-2.11.0-cu128"


def test_every_build_gets_its_own_cache_fingerprint(torch_target):
    assert swap("cu128").exit_code == 0
    a = json.loads(opsctl("cache", "info", "--host", "sandbox", "--ct", "200", "--json").stdout)
    assert swap("cu130").exit_code == 0
    b = json.loads(opsctl("cache", "info", "--host", "sandbox", "--ct", "200", "--json").stdout)
    assert a["current_fingerprint"] != b["current_fingerprint"]
    assert "cu128" in a["current_fingerprint"] and "cu130" in b["current_fingerprint"]
    res = opsctl("cache", "clear", "--all", "--host", "sandbox", "--ct", "200", "--json")
    assert res.exit_code == 0, res.output


def test_a_new_build_is_verified_before_a_running_job_is_replaced(torch_target, tmp_path):
    """Nothing lost: a build that fails verification leaves the running job running."""
    assert swap("cu128").exit_code == 0

    def book(name: str, variant: str) -> str:
        p = tmp_path / f"{name}.yaml"
        p.write_text(json.dumps({"name": name, "command": ["python3", "-c", "import time; time.sleep(300)"],
                                 "torch": {"variant": variant, "version": "2.11.0"}}))
        return str(p)

    first = opsctl("deploy", "--host", "sandbox", "--ct", "200", "--playbook", book("a", "cu128"),
                   "--replace", "--json")
    assert first.exit_code == 0, first.output
    running = json.loads(first.stdout)["job_id"]

    bad = opsctl("deploy", "--host", "sandbox", "--ct", "200", "--playbook", book("b", "cu126"),
                 "--replace", "--json")
    assert bad.exit_code == errors.TORCH_ENV, bad.output
    st = json.loads(opsctl("status", "--host", "sandbox", "--ct", "200", "--job", running,
                           "--json").stdout)
    assert st["state"] == "RUNNING", "the running job must survive a failed build"

    good = opsctl("deploy", "--host", "sandbox", "--ct", "200", "--playbook", book("c", "cu130"),
                  "--replace", "--json")
    assert good.exit_code == 0, good.output
    torch_step = next(s for s in json.loads(good.stdout)["steps"] if s["step"] == "torch")
    assert torch_step["build"] == "torch-2.11.0-cu130"
    old = json.loads(opsctl("status", "--host", "sandbox", "--ct", "200", "--job", running,
                            "--json").stdout)
    assert old["state"] == "CANCELLED"
    envs = json.loads(opsctl("envs", "--host", "sandbox", "--ct", "200", "--json").stdout)
    assert envs["current"] == "torch-2.11.0-cu130"
    # installed (or already present) while the job ran; then only the switch
    assert (envs["history"][-1]["action"], envs["history"][-1]["to"]) == ("switch", "torch-2.11.0-cu130")
    opsctl("stop", "--host", "sandbox", "--ct", "200", "--grace", "2")


@pytest.fixture(scope="module")
def real_build(sandbox, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The real CPU build current in ct 200's /opt/opsctl (tests/shared_torch.py: installed once
    per session by ``swap-torch``, linked into every other sandbox that needs it)."""
    real_cpu_build_in_default_root(sandbox, tmp_path_factory.mktemp("real-build-home"))


@pytest.mark.slow
@real_torch
def test_the_demo_deploys_the_real_cpu_torch_and_trains(sandbox, real_build: None,
                                                         isolated_env: Path):
    """The README demo on the real CPU build (current already: see ``real_build``): the deploy
    finds it, then runs the DFlash smoke job."""
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    # no --playbook: the sandbox inventory names the bundled CPU smoke playbook for ct 200
    res = opsctl("deploy", "--host", "sandbox", "--ct", "200", "--replace", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["outcome"] in ("healthy", "terminal")
    st = json.loads(opsctl("status", "--follow", "--json", "--poll", "1").stdout)
    assert (st["state"], st["exit_code"]) == ("SUCCEEDED", 0)
    assert st["last_step"]["step"] == 40 and st["last_step"]["loss"] < 6.5
    # its plot ends at the loss it ended at, and has a row per step event (every 5 steps)
    plot = valid("plot", opsctl("plot", "--json").stdout)["history"]
    assert plot["last"]["loss"]["v"] == st["last_step"]["loss"]
    assert plot["steps"]["step"] == list(range(5, 41, 5))
    info = json.loads(opsctl("cache", "info", "--json").stdout)
    assert info["current_build"] == "torch-2.13.0-cpu"
    assert info["current_fingerprint"].startswith("torch2.13.0+cpu-cudanone")


@pytest.mark.slow
@real_torch
def test_cache_seed_on_the_sandbox_proves_reuse_with_hit_counters(sandbox, real_build: None,
                                                                    isolated_env: Path,
                                                                    tmp_path: Path):
    """Runs after the demo test installed the real CPU build as /opt/opsctl's current one."""
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    book = tmp_path / "seedme.yaml"
    book.write_text(json.dumps({"name": "seedme", "command": ["python3", "-c", WARMUP],
                                "torch": {"variant": "cpu", "version": "2.13.0"}}))
    res = opsctl("cache", "seed", "--host", "sandbox", "--ct", "200", "--playbook", str(book),
                 "--json")
    assert res.exit_code == 0, res.output
    doc = valid("cache seed", res.stdout)
    assert doc["reuse_proven"] is True
    assert doc["cold"]["counters"].get("inductor.fxgraph_cache_miss", 0) >= 1
    assert doc["seeded"]["counters"].get("inductor.fxgraph_cache_hit", 0) >= 1
    assert doc["seeded"]["counters"].get("inductor.fxgraph_cache_miss", 0) == 0
    assert doc["artifact_bytes"] > 0
    size = opsctl("exec", "--host", "sandbox", "--ct", "200", "--", "stat", "-c", "%s", doc["artifact"])
    assert int(size.stdout) == doc["artifact_bytes"], size.output
    info = json.loads(opsctl("cache", "info", "--host", "sandbox", "--ct", "200", "--json").stdout)
    current = [c for c in info["caches"] if c["current"]]
    assert current and current[0]["mega_cache"]


@pytest.mark.slow
@real_torch
def test_redeploying_over_a_running_job_leaves_a_current_build_alone(sandbox, real_build: None,
                                                                     isolated_env: Path,
                                                                     tmp_path: Path):
    """After the demo: the cpu build is current, so --replace only replaces the job."""
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    long = tmp_path / "long.yaml"
    long.write_text(json.dumps({"name": "long", "command": ["python3", "-c",
                                                             "import time; time.sleep(300)"]}))
    assert opsctl("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(long),
                  "--replace", "--no-wait").exit_code == 0
    smoke = str(REPO / "playbooks" / "dflash-cpu-smoke.yaml")
    refused = opsctl("deploy", "--host", "sandbox", "--ct", "200", "--playbook", smoke, "--no-wait")
    assert refused.exit_code == errors.REMOTE_FAILED and "--replace" in refused.output
    res = opsctl("deploy", "--host", "sandbox", "--ct", "200", "--playbook", smoke, "--replace",
                 "--no-wait", "--json")
    assert res.exit_code == 0, res.output
    steps = json.loads(res.stdout)["steps"]
    assert {"step": "torch", "build": "torch-2.13.0-cpu", "action": "noop"}.items() <= \
        next(s for s in steps if s["step"] == "torch").items()
    opsctl("stop", "--grace", "5")


@pytest.mark.slow
@real_torch
def test_the_real_cpu_build_installs_from_a_wheelhouse_and_passes_verification(real_build: None,
                                                                               sandbox):
    """The air-gapped path with the real torch 2.13.0+cpu: ``pip download`` on this side into a
    wheelhouse (pip finds the cached wheel while the PyTorch index is out of reach), pushed, then
    ``pip install --no-index --find-links`` in the container and a verification that includes a
    real ``torch.compile``. The session's one real install (tests/shared_torch.py) recorded
    ``swap-torch --json``'s reply."""
    reply = install_reply()
    assert (reply["action"], reply["build"]) == ("install", "torch-2.13.0-cpu"), reply
    wheelhouse = reply["wheelhouse"]  # every wheel sent, or found in the container already
    assert wheelhouse["files"] >= 1 and wheelhouse["sent"] + wheelhouse["present"] == wheelhouse["files"]
    checks = {c["name"]: c for c in reply["verification"]["checks"]}
    assert checks["version"]["ok"] and "'2.13.0+cpu'" in checks["version"]["detail"]
    assert checks["cuda-version"]["ok"] and "None" in checks["cuda-version"]["detail"]
    assert checks["compile"]["ok"] and not checks["compile"]["skipped"]  # a real torch.compile
    facts = reply["verification"]["facts"]
    assert (facts["torch"], facts["cuda"], facts["fake"]) == ("2.13.0+cpu", None, False)
    assert reply["path"].endswith("/envs/torch-2.13.0-cpu")


@pytest.mark.slow
@real_torch
def test_the_real_builds_cache_dirs_are_the_ones_torch_uses(real_build: None, sandbox,
                                                          isolated_env: Path, tmp_path: Path):
    """A job on the real build compiles into the build's own cache: torch's inductor resolves
    its cache dir to the job env's TORCHINDUCTOR_CACHE_DIR, under the build's fingerprint."""
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    probe = ("import json, os, torch._inductor.runtime.cache_dir_utils as c; "
             "print('CACHE ' + json.dumps([c.cache_dir(), os.environ['TRITON_CACHE_DIR'], "
             "os.environ['TORCHINDUCTOR_CACHE_DIR'], os.environ['OPSCTL_CACHE_FINGERPRINT']]))")
    book = tmp_path / "cachedirs.yaml"
    book.write_text(json.dumps({"name": "cachedirs", "command": ["python", "-c", probe],
                                "torch": {"variant": "cpu", "version": "2.13.0"}}))
    res = opsctl("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--replace",
                 "--json")
    assert res.exit_code == 0, res.output
    st = json.loads(opsctl("status", "--follow", "--json", "--poll", "1").stdout)
    assert (st["state"], st["exit_code"]) == ("SUCCEEDED", 0), st
    line = next(x for x in opsctl("logs").stdout.splitlines() if x.startswith("CACHE "))
    resolved, triton, inductor, fp = json.loads(line[len("CACHE "):])
    assert fp.startswith("torch2.13.0+cpu-cudanone-triton") and "-nogpu-py3." in fp, fp
    assert resolved == inductor == f"/opt/opsctl/cache/{fp}/inductor"
    assert triton.startswith(f"/opt/opsctl/cache/{fp}/")
