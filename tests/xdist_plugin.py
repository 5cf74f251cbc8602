"""pytest plugin: how ``./scripts/test`` spreads the suite over pytest-xdist workers.

Why: most of the suite waits rather than computes (ssh round trips, jobs reaching a state,
grace periods, polls), so on the 2 cores CI has, three workers finish the suite in far less
wall time than one; the measured table is in docs/development.md. ``./scripts/test``
runs ``pytest -n 3 --dist loadgroup`` (``OPSCTL_TEST_WORKERS=0`` runs it in one process);
a plain ``python3 -m pytest tests/unit/test_x.py`` is unaffected by this plugin.

What may run at the same time, and what may not:

- Each worker has its own sandbox (``tests/sandbox_plugin.py``: own sshd, own containers), so
  tests of different workers never share a container, a job root or a tmux server there.
- The unit of work is one test module (``--dist loadgroup`` with every module its own group,
  added here): its module-scoped fixtures (a deployed job, a wheel index, an installed torch)
  are made once and its tests run in file order in one worker, as in a plain run. A module
  that sets ``pytest.mark.xdist_group(NAME)`` itself shares a worker with every other module
  of that group, in collection order (see :data:`REAL_TORCH_GROUP`).
- Units start longest first (:data:`LONGEST_FIRST`, measured with ``--durations=0``) so that
  no long module starts last and runs alone; everything else keeps collection order.
"""

from __future__ import annotations

import os

import pytest

# Modules that use the real CPU torch build in container 200's default root: one worker, so
# its sandbox's /opt/opsctl gets the build once (tests/shared_torch.py installs it once per
# session and links it into every other sandbox that needs it). A new module that needs real
# torch in ct 200's default root joins it.
REAL_TORCH_GROUP = "real-torch-ct200"
# The README demo and the cache checks on the same real build (tests/sandbox/test_torch_sandbox.py):
# a group of their own, so that after the session's one install they run beside the two-rank
# jobs in another worker (its sandbox links the build: seconds) instead of after them in one.
REAL_TORCH_DEMO_GROUP = "real-torch-demo"

# Work units measured longest (``--durations=0`` of a 3-worker run: seconds per unit, under
# load); order only, not a limit. The rest keep collection order.
LONGEST_FIRST = (
    # builds the session's sandbox template (debootstrap + apt: ~2 min of a core on a fresh
    # machine) and its one real torch install, while the other workers run the modules that
    # need no sandbox (next): started before them, a sandbox module would only wait for that
    # template, a core idle (2026-12-02, a cold LXC cache: 14 min 14 s before, 13 min 45 s after)
    REAL_TORCH_GROUP,  # ~330 s: the template, the session's one real install, two-rank jobs
    "test_trainer_run",  # ~90 s: gloo ranks training on CPU
    "test_whole_chain_cpu",  # ~65 s: its own sshd and this machine as a direct target
    "test_probe",  # ~75 s: a real flex-attention compile
    "test_torch_swap",  # ~90 s: fake builds, a real venv and pip each
    "test_dflash_recipe",  # ~50 s: the CPU end-to-end recipe
    "test_trainer_hf_export",  # ~45 s warm; its first run builds 3 transformers venvs (~3 min)
    "test_startup",  # ~45 s: the base commit's trainer beside this one
    "test_agent_jobs",  # ~45 s
    "test_agent_queue",  # ~40 s
    # then the sandbox modules, longest first; those that link the real build the first
    # group installs come after two others, by when that install is done
    "test_deploy_and_job_wrapper_sandbox",  # ~100 s
    "test_cli_sandbox",  # ~90 s
    "test_multinode_sandbox",  # ~170 s: two torchrun nodes
    REAL_TORCH_DEMO_GROUP,  # ~130 s: the demo, a cache seed, the build's cache dirs
    "test_direct_target_sandbox",  # ~70 s: both kinds of host; links the real build too
    "test_files_nothing_lost_sandbox",  # ~90 s: every push/pull edge, rsync and tar
    "test_tensorboard_sandbox",  # ~90 s: real TensorBoard servers, signals at each stage
    "test_goodput_sandbox",  # ~60 s: a crash, a restart and a re-deploy of one run
    "test_queue_sandbox",  # ~50 s
    "test_babysitting_sandbox",  # ~55 s
    "test_exec_streams_and_endings_sandbox",  # 200 MB streamed twice, deadlines, Ctrl-C
    "test_doctor_sandbox",  # a stopped container, a silent host, /dev/kmsg, a full tmpfs
    "test_json_trust_and_dry_run_sandbox",  # a NaN job, host trust, swap-torch --dry-run
    "test_dashboard_browser",  # a real browser
    "test_torch_sandbox",  # its fake-build tests
    "test_files_sandbox",  # ~30 s
)


def _group_of(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else item.nodeid


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker, before any test imports torch
        # 3 workers share 2 cores: one intra-op thread per in-process torch (the spawned
        # trainers already get OMP_NUM_THREADS=1) instead of OpenMP threads spinning against
        # each other; measured on tests/trainer/test_trainer_run.py in 3 workers: 74 s -> 60 s
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    # registered here too, so --strict-markers accepts it where xdist is not installed
    config.addinivalue_line("markers", "xdist_group(name): run in the same xdist worker as the group")
    if config.getoption("dist", "no") == "loadgroup":
        # xdist would otherwise start the units with the most tests first, not the longest
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the mark into the node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # only workers collect for the scheduler; xdist sets their "dist" to "no" and "loadgroup"
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group_of(item)))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # sort is stable: within a group, and among unranked groups, collection order stays
    items.sort(key=lambda item: rank.get(_group_of(item), len(rank)))
