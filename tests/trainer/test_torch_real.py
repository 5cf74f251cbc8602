"""The real install path with the real CPU torch 2.13.0: ONE install for the whole module.

pip's own configuration on these machines finds a cached ``torch-2.13.0+cpu`` wheel while
the PyTorch index is unreachable, so this is the air-gapped path: ``pip download`` on the
operator's side into a wheelhouse, then the agent installs it with ``--no-index
--find-links``, verifies it (including a real ``torch.compile``), and wires its caches.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import types

import pytest

from opsctl.config.torch_builds import load_table, swap_args
from opsctl.ops.wheelhouse import prepare_wheelhouse
from remote_payload.agent.torchenv import current_python, job_env
from tests.agent.test_torch_swap import agent

pytestmark = pytest.mark.slow

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
def real(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    base = tmp_path_factory.mktemp("real-torch")
    build = load_table(host_builds={"cpu": {"wheelhouse": True}}).resolve("cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPSCTL_HOME", str(base / "home"))
        t0 = time.monotonic()
        wheelhouse = prepare_wheelhouse(build, base / "wheelhouse")
        download_s = time.monotonic() - t0
    root = base / "root"
    reply, install_s = agent(root, "swap", *swap_args(build, wheelhouse_dir=str(wheelhouse.directory)))
    print(f"\nreal torch: wheelhouse {download_s:.1f}s ({wheelhouse.total_bytes / 1e6:.0f} MB, "
          f"{len(wheelhouse.files)} wheels); install+verify {install_s:.1f}s")
    return types.SimpleNamespace(root=root, reply=reply, wheelhouse=wheelhouse, build=build)


def test_real_cpu_torch_installs_from_a_wheelhouse_and_passes_verification(real) -> None:
    assert real.wheelhouse.torch_version == "2.13.0+cpu"
    assert real.reply["ok"], real.reply
    data = real.reply["data"]
    assert (data["action"], data["build"]) == ("install", "torch-2.13.0-cpu")
    checks = {c["name"]: c for c in data["verification"]["checks"]}
    assert checks["version"]["ok"] and "'2.13.0+cpu'" in checks["version"]["detail"]
    assert checks["cuda-version"]["ok"] and "None" in checks["cuda-version"]["detail"]
    assert checks["compile"]["ok"] and not checks["compile"]["skipped"]  # a real torch.compile
    facts = data["verification"]["facts"]
    assert (facts["torch"], facts["cuda"], facts["fake"]) == ("2.13.0+cpu", None, False)
    assert current_python(str(real.root)) == str(real.root / "envs/torch-2.13.0-cpu/bin/python")
    leftover = [n for n in os.listdir(real.root / "envs") if n.startswith(".building")]
    assert leftover == []


def test_real_build_cache_dirs_are_the_ones_torch_uses(real) -> None:
    env = job_env(str(real.root))
    fp = env["OPSCTL_CACHE_FINGERPRINT"]
    assert fp.startswith("torch2.13.0+cpu-cudanone-triton") and fp.endswith("-nogpu-py3.11.7")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(real.root / "cache" / fp / "inductor")
    probe = ("import json, os, torch._inductor.runtime.cache_dir_utils as c; "
             "print(json.dumps([c.cache_dir(), os.environ['TRITON_CACHE_DIR']]))")
    python = current_python(str(real.root))
    assert python is not None
    out = subprocess.run([python, "-c", probe], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out) == [env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]]


# The cache seed with this real build (a cold compile, then a seeded one that only hits) is
# tests/sandbox/test_torch_sandbox.py::test_cache_seed_on_the_sandbox_proves_reuse_with_hit_counters,
# through the CLI, the agent and the container.
