"""The queue's rules as pure functions: the ``--gpus`` spec, GPU slot assignment,
which queued job starts or is cancelled, reordering, the queue file read back from disk, and
pipeline playbooks. Property tests (hypothesis) for every parser of untrusted text."""

from __future__ import annotations

import json
import typing as t

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opsctl import errors
from opsctl.cli import cli
from opsctl.config.pipeline import Pipeline, load_any, resolve
from opsctl.config.playbook import Playbook
from remote_payload import wire
from remote_payload.agent import jobqueue as q

# --- the --gpus spec -------------------------------------------------------------------------


class TestGpuSpec:
    @pytest.mark.parametrize(("text", "want"), [
        ("4", 4), (" 8 ", 8), ("0,1,3", [0, 1, 3]), ("3,", [3]), ("7, 6", [7, 6]),
    ])
    def test_a_count_or_a_list_of_slots(self, text: str, want: t.Any) -> None:
        assert wire.parse_gpu_request(text, 8) == want

    @pytest.mark.parametrize(("text", "why"), [
        ("0", "at least 1"), ("99999", "more GPUs than exist"), ("1,1", "given twice"),
        ("-1", "a count"), ("8,", "does not exist"), ("", "a count"), (",", "separated by commas"),
        ("1.5", "a count"), ("0x3", "a count"), ("٣", "a count"), ("1,,2", "separated"),
        ("4 gpus", "a count"), ("1" * 5000, "too long"), ("0," + "1" * 5000, "too long"),
        ("0,0", "given twice"), (str(10**9), "too long"),
    ])
    def test_hostile_specs_are_refused_with_a_reason(self, text: str, why: str) -> None:
        with pytest.raises(ValueError, match=why):
            wire.parse_gpu_request(text, 8)

    @given(st.text(max_size=40))
    @settings(max_examples=200)
    def test_any_text_is_a_valid_request_or_a_ValueError(self, text: str) -> None:
        try:
            got = wire.parse_gpu_request(text, 8)
        except ValueError:
            return
        if isinstance(got, int):
            assert 1 <= got <= 8
        else:
            assert got and len(set(got)) == len(got) and all(0 <= g < 8 for g in got)

    @pytest.mark.parametrize("value", [0, -1, 99999, [1, 1], [], True, [True], "4", 1.5, [-1]])
    def test_the_playbook_refuses_what_the_flag_refuses(self, value: t.Any) -> None:
        with pytest.raises(ValidationError):
            Playbook(name="p", command=["true"], gpus=value)

    def test_the_playbook_takes_a_count_or_a_list(self) -> None:
        assert Playbook(name="p", command=["true"], gpus=4).job_spec("j", root="/r")["gpus"] == 4
        assert Playbook(name="p", command=["true"], gpus=[0, 2]).job_spec("j", root="/r")["gpus"] \
            == [0, 2]


# --- slots and the plan ----------------------------------------------------------------------

holders_st = st.dictionaries(st.sampled_from([f"h{i}" for i in range(5)]),
                             st.one_of(st.none(), st.lists(st.integers(0, 7), unique=True,
                                                           max_size=8)), max_size=3)
request_st = st.one_of(st.none(), st.integers(1, 8),
                       st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))


class TestAssign:
    def test_a_count_gets_the_lowest_free_slots(self) -> None:
        assert q.assign(4, 8, {"a": [0, 1]}) == (True, [2, 3, 4, 5])

    def test_a_job_that_asks_for_more_than_is_free_waits(self) -> None:
        assert q.assign(7, 8, {"a": [0, 1]}) == (False, None)

    def test_the_whole_container_fits_only_when_nothing_runs(self) -> None:
        assert q.assign(None, 8, {}) == (True, None)
        assert q.assign(None, 8, {"a": [3]}) == (False, None)
        assert q.assign(1, 8, {"a": None}) == (False, None)

    @given(request_st, holders_st)
    def test_what_is_given_is_free_and_is_what_was_asked(self, request: t.Any, holders: t.Any) -> None:
        fits, got = q.assign(request, 8, holders)
        held = {g for h in holders.values() for g in (h or ())}
        if not fits:
            return
        if request is None:
            assert got is None and not holders
        else:
            assert got is not None and not set(got) & held
            assert len(got) == (request if isinstance(request, int) else len(request))


queue_st = st.lists(st.tuples(request_st, st.one_of(st.none(), st.integers(0, 9))),
                    min_size=1, max_size=10)
done_st = st.dictionaries(st.sampled_from(["d0", "d1", "d2"]),
                          st.sampled_from(["SUCCEEDED", "FAILED", "CANCELLED", "LOST", "RUNNING"]))


class TestPlan:
    def test_a_failed_dependency_cancels_the_chain_behind_it(self) -> None:
        p = q.plan(["b", "c"], {}, {"b": "a", "c": "b"}, {"a": "FAILED"}, 8, {})
        assert p.start == [] and p.cancel == [("b", "dependency a FAILED"),
                                              ("c", "dependency b CANCELLED")]

    def test_a_job_waiting_for_gpus_holds_back_the_jobs_behind_it(self) -> None:
        p = q.plan(["big", "small"], {"big": 8, "small": 1}, {}, {}, 8, {"run": [0]})
        assert p.start == []

    def test_a_job_waiting_for_its_dependency_holds_back_nobody(self) -> None:
        p = q.plan(["b", "c"], {"b": 1, "c": 1}, {"b": "a"}, {"a": "RUNNING"}, 8, {})
        assert p.start == [("c", [0])]

    def test_four_and_four_run_side_by_side(self) -> None:
        p = q.plan(["a", "b"], {"a": 4, "b": 4}, {}, {}, 8, {})
        assert p.start == [("a", [0, 1, 2, 3]), ("b", [4, 5, 6, 7])]

    @given(queue_st, done_st, holders_st)
    @settings(max_examples=150)
    def test_the_plan_keeps_every_rule(self, jobs: t.Any, done: dict[str, str],
                                       holders: t.Any) -> None:
        order = [f"q{i}" for i in range(len(jobs))]
        requests = {j: r for j, (r, _) in zip(order, jobs, strict=True)}
        # a dependency: a finished/running job, or an earlier queued one
        afters: dict[str, str | None] = {}
        for i, (j, (_, dep)) in enumerate(zip(order, jobs, strict=True)):
            afters[j] = None if dep is None else (
                order[dep] if dep < i else ["d0", "d1", "d2", "gone"][dep % 4])
        states = {**done, **{j: "QUEUED" for j in order}}
        p = q.plan(order, requests, afters, states, 8, holders)
        started = dict(p.start)
        cancelled = dict(p.cancel)
        assert not set(started) & set(cancelled)
        for j in started:  # its dependency succeeded
            assert afters[j] is None or states.get(afters[j]) == "SUCCEEDED"
        held = {g for h in holders.values() for g in (h or ())}
        given: list[int] = []
        for slots in started.values():  # no GPU slot is given twice, nor one that is held
            given += slots if slots is not None else list(range(8))
        if started:
            assert len(given) == len(set(given)) and not set(given) & held
            assert None not in holders.values()
        for j, why in cancelled.items():  # and only when its dependency will never succeed
            dep = afters[j]
            assert dep is not None and why.startswith(f"dependency {dep} ")
            assert dep in cancelled or states.get(dep) in (None, "FAILED", "CANCELLED", "LOST")


# --- reordering and the file ------------------------------------------------------------------


class TestMove:
    def test_a_job_moves_before_or_after_another(self) -> None:
        assert q.moved(["a", "b", "c"], "c", "a", True, {}) == ["c", "a", "b"]
        assert q.moved(["a", "b", "c"], "a", "c", False, {}) == ["b", "c", "a"]

    @pytest.mark.parametrize(("job", "anchor", "why"), [
        ("a", "a", "itself"), ("x", "a", "not queued"), ("b", "a", "dependency loop"),
    ])
    def test_a_move_that_cannot_be_is_refused(self, job: str, anchor: str, why: str) -> None:
        with pytest.raises(ValueError, match=why):
            q.moved(["a", "b"], job, anchor, True, {"b": "a"})

    @given(st.permutations(["a", "b", "c", "d"]), st.sampled_from("abcd"), st.sampled_from("abcd"),
           st.booleans())
    def test_a_move_is_a_reordering(self, order: list[str], job: str, anchor: str,
                                    before: bool) -> None:
        try:
            new = q.moved(order, job, anchor, before, {})
        except ValueError:
            assert job == anchor
            return
        assert sorted(new) == sorted(order)
        assert new.index(job) == new.index(anchor) + (-1 if before else 1)


json_st = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                          max_size=4),
                       max_leaves=20)


class TestLegacyQueueFile:
    """An older agent's ``jobs/queue.json``: read once for its order and slot count."""

    @given(st.one_of(json_st, st.fixed_dictionaries(
        {"version": st.just(1), "order": st.lists(st.text(max_size=10), max_size=3),
         "slots": json_st, "holders": st.dictionaries(st.text(max_size=10), json_st, max_size=3)})))
    @settings(max_examples=150)
    def test_what_is_read_back_from_disk_is_an_order_or_a_ValueError(self, raw: t.Any) -> None:
        try:
            doc = q.parse_legacy(raw)
        except ValueError:
            return
        assert len(set(doc.order)) == len(doc.order)
        assert doc.slots is None or 0 <= doc.slots <= wire.MAX_GPU_SLOTS

    def test_its_holders_are_ignored_they_are_derived_from_the_job_dirs(self) -> None:
        raw = {"version": 1, "order": ["a-1", "b-2", "a-1"], "slots": 8,
               "holders": {"r-1": [0, 1], "w-1": None}}
        assert q.parse_legacy(raw) == q.LegacyQueue(["a-1", "b-2"], 8)

    @pytest.mark.parametrize("raw", [
        [], {"version": 2}, {"version": 1, "order": ["../x"], "slots": 8, "holders": {}},
        {"version": 1, "order": [], "slots": -1, "holders": {}},
        {"version": 1, "order": "a-1", "slots": 8},
    ])
    def test_a_damaged_queue_file_is_refused(self, raw: t.Any) -> None:
        with pytest.raises(ValueError):
            q.parse_legacy(raw)


class TestGpuRequestsThatCanNeverFit:
    @pytest.mark.parametrize(("request_", "total", "why"), [
        (4, 2, "more GPUs than exist"), ([3], 2, "does not exist"),
        ([0, 1], 0, "GPU count is not known"), (1, 0, "GPU count is not known"),
    ])
    def test_a_request_past_the_containers_slots_has_a_reason(self, request_: t.Any, total: int,
                                                              why: str) -> None:
        reason = wire.gpu_request_unfit(request_, total)
        assert reason is not None and why in reason

    @pytest.mark.parametrize(("request_", "total"), [(None, 0), (None, 8), (2, 2), ([1], 2)])
    def test_a_request_within_the_slots_fits(self, request_: t.Any, total: int) -> None:
        assert wire.gpu_request_unfit(request_, total) is None

    def test_a_job_that_no_longer_fits_fails_and_the_jobs_behind_it_move_on(self) -> None:
        p = q.plan(["big", "dep", "small"], {"big": 4, "dep": None, "small": 1},
                   {"dep": "big"}, {}, 2, {})
        assert p.fail == [("big", "gpus 4: more GPUs than exist (the container has 2 GPU "
                                  "slot(s))")]
        assert p.cancel == [("dep", "dependency big FAILED")]
        assert p.start == [("small", [0])]


# --- pipelines ----------------------------------------------------------------------------------


def _pipe(steps: t.Any) -> Pipeline:
    return Pipeline.model_validate({"name": "p", "steps": steps})


class TestPipeline:
    def test_the_bundled_dflash_chain_is_regenerate_train_export_eval_in_a_chain(self) -> None:
        pipe = load_any("dflash-chain")
        assert isinstance(pipe, Pipeline)
        steps = resolve(pipe)
        assert [s.name for s in steps] == ["regenerate", "train", "export", "eval"]
        assert [s.after for s in steps] == [None, 0, 1, 2]
        assert steps[0].book.command[3:6] == ["--nproc-per-node", "8", "-m"]
        assert "regenerate" in steps[0].book.command
        assert steps[1].book.command[-4:] == ["--data", "/opt/opsctl/data/dflash-regen",
                                               "--target-path", "/models/Qwen3-8B"]
        assert "export" in steps[2].book.command and "eval" in steps[3].book.command

    @pytest.mark.parametrize(("steps", "why"), [
        ([], "at least 1"),
        ([{"playbook": "a", "after": "previous"}], "first step"),
        ([{"playbook": "a", "after": "b"}, {"playbook": "b", "after": "a"}], "later step"),
        ([{"playbook": "a", "after": "a"}], "names itself"),
        ([{"playbook": "a", "after": "nosuch"}], "no earlier step"),
        ([{"playbook": "a"}, {"playbook": "a"}], "two steps are named"),
        ([{"playbook": "a"}] * 10_000, "at most 64"),
        ([{"playbook": "a", "gpus": 0}], "at least 1"),
        ([{"playbook": "a", "command": ["x"]}], "Extra inputs"),
    ])
    def test_a_hostile_pipeline_is_refused_with_a_reason(self, steps: t.Any, why: str) -> None:
        with pytest.raises(ValidationError, match=why):
            _pipe(steps)

    @given(st.lists(st.fixed_dictionaries(
        {"playbook": st.sampled_from(["a", "b", "c", ""])},
        optional={"after": st.one_of(st.sampled_from(["previous", "a", "b", "c"]), json_st),
                  "name": json_st, "args": json_st, "gpus": json_st}), max_size=5))
    @settings(max_examples=150)
    def test_any_steps_are_a_pipeline_without_cycles_or_a_validation_error(self, steps: t.Any) -> None:
        try:
            pipe = _pipe(steps)
        except ValidationError:
            return
        deps = pipe.dependencies()
        assert all(d is None or d < i for i, d in enumerate(deps))

    def test_a_step_cannot_be_a_pipeline(self, tmp_path: t.Any) -> None:
        inner = tmp_path / "inner.yaml"
        inner.write_text("name: inner\nsteps: [{playbook: dflash-export}]\n")
        with pytest.raises(errors.ConfigError, match="a step is one playbook"):
            resolve(_pipe([{"playbook": str(inner)}]))


# --- the command line refuses before connecting ---------------------------------------------------


class TestQueueCli:
    @pytest.mark.parametrize("spec", ["0", "-1", "1,1", "99999", "x"])
    def test_a_bad_gpus_spec_exits_2_without_connecting(self, spec: str) -> None:
        res = CliRunner().invoke(cli, ["queue", "add", "--host", "10.9.9.9", "--ct", "200",
                                       "--playbook", "dflash-export", "--gpus", spec])
        assert res.exit_code == 2 and "--gpus" in res.output

    def test_move_needs_exactly_one_place(self) -> None:
        res = CliRunner().invoke(cli, ["queue", "move", "--host", "10.9.9.9", "--ct", "200", "j-1"])
        assert res.exit_code == 2 and "exactly one of --before" in res.output

    def test_a_job_id_with_a_slash_is_refused_before_connecting(self) -> None:
        res = CliRunner().invoke(cli, ["queue", "rm", "--host", "10.9.9.9", "--ct", "200", "../x"])
        assert res.exit_code == 2


class TestQueueAddInterrupted:
    def test_ctrl_c_while_the_container_queues_names_every_job_id(self) -> None:
        import types

        from opsctl.ops import queue as queue_ops

        calls: list[tuple[str, bytes | None]] = []

        class Agent:
            def ensure_payload(self, force: bool = False) -> None:
                calls.append(("payload", None))

            def call(self, verb: str, *args: str, timeout: float = 60,
                     stdin: bytes | None = None) -> t.Any:
                calls.append((verb, stdin))
                raise KeyboardInterrupt

        host = types.SimpleNamespace(root="/opt/opsctl", label="h", containers={200: None},
                                     notify_urls=lambda ct: [], target_spec=lambda ct: None,
                                     direct=False)
        tgt = t.cast(t.Any, types.SimpleNamespace(host=host, ctid=200, label="h ct 200", name="h",
                                                  flags=["--host", "h", "--ct", "200"],
                                                  agent=Agent()))
        book = Playbook(name="p", command=["true"])
        with pytest.raises(errors.Interrupted) as exc:
            queue_ops.add(tgt, [queue_ops.QueuedStep(book), queue_ops.QueuedStep(book, 0)])
        sent = json.loads(t.cast(bytes, calls[-1][1]))["specs"]
        ids = [s["job_id"] for s in sent]
        assert sent[1]["after"] == ids[0]  # a step's dependency is the earlier step's job id
        assert all(i in exc.value.message for i in ids) and "all or none" in exc.value.message


# --- a queued job's torch build (its playbook's torch:) ------------------------------------


class _TorchAgent:
    """A scripted agent: ``envs`` lists no build; ``swap`` (install-only) runs or is Ctrl-C'd."""

    def __init__(self, interrupt_swap: bool = False) -> None:
        self.calls: list[tuple[str, tuple[str, ...], bytes | None]] = []
        self.interrupt_swap = interrupt_swap

    def ensure_payload(self, force: bool = False) -> None:
        self.calls.append(("payload", (), None))

    def call(self, verb: str, *args: str, timeout: float = 60, stdin: bytes | None = None,
             on_stderr: t.Any = None) -> t.Any:
        self.calls.append((verb, args, stdin))
        if verb == "envs":
            return {"builds": [], "current": None}
        if verb == "swap":
            if self.interrupt_swap:
                raise KeyboardInterrupt
            return {"action": "install-only", "build": "torch-2.13.0-cpu", "previous": None,
                    "dry_run": False, "path": "/opt/opsctl/envs/torch-2.13.0-cpu",
                    "log_path": None, "verification": None, "install_seconds": 1.0,
                    "switch_seconds": None, "current": None, "seconds": 1.0}
        empty = {"jobs": [], "slots": None, "holders": [], "damaged": []}
        return {"added": [json.loads(t.cast(bytes, stdin))["specs"][0]["job_id"]],
                "started": [], "cancelled": [], "queue": empty,
                "boot_hook": {"kind": "none", "path": None, "warning": "no boot hook here"}}


def _torch_target(agent: _TorchAgent) -> t.Any:
    import types

    host = types.SimpleNamespace(root="/opt/opsctl", label="h", containers={200: None},
                                 notify_urls=lambda ct: [], torch_builds=None,
                                 target_spec=lambda ct: None, direct=False)
    return types.SimpleNamespace(host=host, ctid=200, label="h ct 200", agent=agent,
                                 inventory=types.SimpleNamespace(torch_builds=None))


def test_queue_add_installs_the_playbooks_torch_build_and_the_job_records_it() -> None:
    from opsctl.ops import queue as queue_ops

    agent = _TorchAgent()
    book = Playbook(name="p", command=["true"], torch={"variant": "cpu"})
    report = queue_ops.add(_torch_target(agent), [queue_ops.QueuedStep(book)])
    swaps = [args for verb, args, _ in agent.calls if verb == "swap"]
    assert len(swaps) == 1 and "--install-only" in swaps[0]
    [sent] = [json.loads(t.cast(bytes, stdin))["specs"] for verb, _, stdin in agent.calls
              if verb == "queue-add"]
    assert sent[0]["torch_build"] == "torch-2.13.0-cpu"
    assert report.notes == ["no boot hook here"] and report.boot_hook == {
        "kind": "none", "path": None, "warning": "no boot hook here"}


def test_ctrl_c_while_the_torch_build_installs_queues_nothing() -> None:
    from opsctl.ops import queue as queue_ops

    agent = _TorchAgent(interrupt_swap=True)
    book = Playbook(name="p", command=["true"], torch={"variant": "cpu"})
    with pytest.raises(errors.Interrupted) as exc:
        queue_ops.add(_torch_target(agent), [queue_ops.QueuedStep(book)])
    assert "nothing is queued" in exc.value.message
    assert "queue-add" not in [verb for verb, _, _ in agent.calls]


def test_a_job_on_another_build_waits_while_any_job_is_live_and_holds_back_the_rest() -> None:
    p = q.plan(["new", "small"], {"new": 1, "small": 1}, {}, {}, 8, {"live": [0]},
               {"new": "torch-2.14.0-cpu"}, "torch-2.13.0-cpu")
    assert p.start == [] and p.cancel == []


def test_with_nothing_live_it_starts_and_the_jobs_behind_it_run_on_its_build() -> None:
    p = q.plan(["new", "any", "old"], {"new": 1, "any": 1, "old": 1}, {}, {}, 8, {},
               {"new": "torch-2.14.0-cpu", "old": "torch-2.13.0-cpu"}, "torch-2.13.0-cpu")
    assert [j for j, _ in p.start] == ["new", "any"]  # old waits: new now runs on 2.14


def test_a_job_on_the_current_build_starts_beside_live_jobs() -> None:
    p = q.plan(["same"], {"same": 1}, {}, {}, 8, {"live": [0]}, {"same": "torch-2.13.0-cpu"},
               "torch-2.13.0-cpu")
    assert p.start == [("same", [1])]


@given(st.text(max_size=120))
def test_a_build_name_the_agent_accepts_is_one_safe_path_component(name: str) -> None:
    if q.wire_build_ok(name):
        assert name.startswith("torch-") and "/" not in name and ".." not in name
        assert name not in (".", "..") and "\x00" not in name


class _CurrentBuildAgent(_TorchAgent):
    """``envs``: the playbook's build is already current."""

    def call(self, verb: str, *args: str, timeout: float = 60, stdin: bytes | None = None,
             on_stderr: t.Any = None) -> t.Any:
        if verb == "envs":
            self.calls.append((verb, args, stdin))
            return {"builds": [], "current": "torch-2.13.0-cpu"}
        return super().call(verb, *args, timeout=timeout, stdin=stdin, on_stderr=on_stderr)


def test_deploy_sends_a_playbooks_requirements_although_its_torch_build_is_current() -> None:
    """The agent decides (it rebuilds a build that lacks them); deploy never skips the call."""
    from opsctl.ops import deploy as deploy_ops

    agent = _CurrentBuildAgent()
    book = Playbook(name="p", command=["true"], torch={"variant": "cpu"},
                    requirements=["transformers==5.24.0"])
    steps: list[dict[str, t.Any]] = []
    deploy_ops._prepare_torch(_torch_target(agent), book, steps, None, replace=False)
    [swap] = [args for verb, args, _ in agent.calls if verb == "swap"]
    assert "transformers==5.24.0" in swap
    assert steps[-1]["step"] == "torch" and steps[-1]["requirements"] == ["transformers==5.24.0"]
    plain = _CurrentBuildAgent()
    deploy_ops._prepare_torch(_torch_target(plain), Playbook(name="p", command=["true"],
                                                             torch={"variant": "cpu"}),
                              [], None, replace=False)
    assert "swap" not in [verb for verb, _, _ in plain.calls]  # nothing asked: nothing to do
