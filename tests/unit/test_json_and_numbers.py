"""JSON and numbers, as pure logic: strict JSON, finite ranges, one-line errors.

Honest messages, no tracebacks, shell completion and the dashboard run real processes and
sockets on 127.0.0.1 (``tests/agent/test_cli_and_dashboard_local.py``); a NaN-loss job,
`host trust` and `swap-torch --dry-run` against the real sandbox are in
``tests/sandbox/test_json_trust_and_dry_run_sandbox.py``.
"""

from __future__ import annotations

import errno
import json
import math
import re
import typing as t

import click
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl import errors
from opsctl.cli import cli, params, plots
from opsctl.cli.jsonout import print_json
from opsctl.config import envfile, playbook
from opsctl.errors import ConfigError
from remote_payload import wire
from tests.paths import REPO

ENV_SETTINGS = settings(max_examples=150, deadline=None,
                        suppress_health_check=[HealthCheck.function_scoped_fixture])


def strict_loads(text: str) -> t.Any:
    """A strict JSON parser: NaN / Infinity are refused, as JavaScript's JSON.parse does."""
    def refuse(word: str) -> t.NoReturn:
        raise ValueError(f"not JSON: {word}")
    return json.loads(text, parse_constant=refuse)


# --- 5. JSON and numbers ------------------------------------------------------------------


class TestJsonAndNumbers:
    def test_json_never_contains_nan_or_infinity(self, capsys):
        doc = {"loss": float("nan"), "steps": [1.0, float("inf"), {"x": -float("inf")}],
               "fine": 0.5, "nonfinite": ["earlier"]}
        print_json(doc)
        out = strict_loads(capsys.readouterr().out)
        assert out["loss"] is None and out["steps"] == [1.0, None, {"x": None}]
        assert out["fine"] == 0.5
        assert out["nonfinite"] == ["earlier", "loss", "steps[1]", "steps[2].x"]
        # the agent's reply and an event line take the same road
        line = wire.format_event("step", step=3, loss=float("nan"))
        assert strict_loads(line) == {"event": "step", "step": 3, "loss": None,
                                      "nonfinite": ["loss"]}
        # a regression (something that bypasses the sanitiser) fails loudly, not silently
        with pytest.raises(ValueError):
            json.dumps(float("nan"), allow_nan=False)

    @pytest.mark.parametrize("args", [
        ["status", "--json=1"], ["--json", "completion", "bash"], ["--json=yes", "hosts"],
        ["--json", "status", "--poll", "1e308"], ["--json", "no-such-command"],
    ])
    def test_a_script_asking_for_json_always_gets_one_document(self, args):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == errors.USAGE, res.output
        doc = strict_loads(res.stdout)
        assert doc["ok"] is False and doc["error"]["exit_code"] == errors.USAGE

    def test_json_before_the_command_is_the_commands_json(self, isolated_env):
        res = CliRunner().invoke(cli, ["--json", "hosts"])
        assert res.exit_code == 0, res.output
        assert strict_loads(res.stdout) == {"ok": True, "hosts": []}

    def test_numeric_options_have_finite_ranges(self):
        found = params.numeric_params(cli)
        assert len(found) >= 15
        raw = [f"{path} {p.name}" for path, p in found
               if not isinstance(p.type, params.Number | params.ContainerId)]
        assert raw == [], "every numeric option has a params.Number range"
        # README's list is exactly the code's
        page = (REPO / "docs" / "input-limits.md").read_text()
        block = re.search(r"<!-- numeric-options:begin -->\n(.*?)<!-- numeric-options:end -->",
                          page, re.S)
        assert block is not None
        assert block.group(1).splitlines() == params.ranges(cli)

    @pytest.mark.parametrize("args", [
        ["status", "--follow", "--poll", "1e308"], ["status", "--poll", "nan"],
        ["status", "--poll", "inf"], ["status", "--poll", "0"], ["status", "--poll", "0x10"],
        ["status", "--all", "--deadline", "-1"], ["status", "--all", "--parallel", "0"],
        ["status", "--all", "--parallel", "1e3"], ["logs", "--tail", "1.5"],
        ["logs", "--offset", "99999999999999999999"], ["stop", "--grace", "1e400"],
        ["status", "--ct", "5"], ["status", "--ct", "1000000000"], ["dashboard", "--port", "70000"],
        ["dashboard", "--refresh", "-inf"], ["dashboard", "--doctor-every", "nan"],
        ["dashboard", "--doctor-every", "-1"], ["dashboard", "--doctor-every", "1e9"],
        ["dashboard", "--doctor-every", "0.001"], ["dashboard", "--doctor-every", "59.9"],
        ["plot", "--width", "3"], ["exec", "--timeout", "nan", "true"],
        ["tensorboard", "--refresh", "nan"], ["tensorboard", "--refresh", "1e308"],
        ["tensorboard", "--refresh", "-1"], ["tensorboard", "--refresh", "inf"],
        ["tensorboard", "--port", "-1"], ["tensorboard", "--port", "70000"],
    ])
    def test_an_absurd_number_is_one_line_and_exit_2_before_connecting(self, args):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == errors.USAGE, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)
        assert [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")], res.stderr

    @given(st.one_of(st.text(max_size=40), st.floats(allow_nan=True, allow_infinity=True),
                     st.integers(min_value=-10**30, max_value=10**30)))
    @settings(max_examples=300, deadline=None)
    def test_a_number_option_gives_a_number_in_its_range_or_a_usage_error(self, value):
        for kind in (params.POLL, params.COUNT, params.SECONDS_OR_ZERO, params.PORT, params.OFFSET,
                     params.PULL_EVERY):
            try:
                got = kind.convert(value, None, None)
            except click.BadParameter as exc:
                assert "\n" not in exc.format_message()
                continue
            assert math.isfinite(got) and kind.low <= got <= kind.high
            assert not (kind.low_open and got == kind.low)
            assert isinstance(got, int) if kind.integer else isinstance(got, float)

    @pytest.mark.parametrize("field", [
        "timeout_s: .inf", "timeout_s: .nan", "timeout_s: 1e308", "hang_after_s: -1",
        "max_duration_s: .inf", "expect_tok_s: 1e300", "phase_budgets_s: {compile: .inf}",
        "gpus: [100000]", "restart: {max_restarts: 1000000}", "restart: {max_restarts: 1, on: [256]}",
    ])
    def test_playbook_numbers_have_finite_ranges(self, tmp_path, field):
        p = tmp_path / "p.yaml"
        p.write_text(f"name: p\ncommand: [python3, -c, pass]\n{field}\n")
        with pytest.raises(ConfigError):
            playbook.load(p)

    @pytest.mark.parametrize("field", ["connect_timeout_s: .inf", "connect_timeout_s: 1e308",
                                       "connect_timeout_s: .nan", "port: 0"])
    def test_inventory_numbers_have_finite_ranges(self, isolated_env, field):
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        (inv / "h.yaml").write_text(f"hosts:\n  h:\n    address: 127.0.0.1\n    {field}\n")
        res = CliRunner().invoke(cli, ["hosts", "--check"])
        assert res.exit_code == errors.USAGE, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)

    @given(st.text(max_size=400))
    @ENV_SETTINGS
    def test_any_yaml_text_is_a_playbook_or_a_config_error(self, tmp_path, text):
        p = tmp_path / "any.yaml"
        p.write_text(text, encoding="utf-8")
        try:
            book = playbook.load(p)
        except ConfigError as exc:
            assert str(exc).strip()
            return
        assert isinstance(book, playbook.Playbook)
        assert math.isfinite(book.timeout_s) and 0 < book.timeout_s <= playbook.MAX_WAIT_S

    @given(st.dictionaries(st.sampled_from(["name", "command", "timeout_s", "hang_after_s",
                                            "max_duration_s", "gpus", "restart", "env"]),
                           st.one_of(st.none(), st.booleans(), st.floats(), st.integers(),
                                     st.text(max_size=20), st.lists(st.integers(), max_size=3),
                                     st.dictionaries(st.text(max_size=8), st.integers(), max_size=2)),
                           max_size=8))
    @ENV_SETTINGS
    def test_any_playbook_mapping_is_a_playbook_or_a_config_error(self, tmp_path, doc):
        p = tmp_path / "any.yaml"
        p.write_text(yaml.safe_dump(doc), encoding="utf-8")
        try:
            playbook.load(p)
        except ConfigError:
            pass

    @given(st.binary(max_size=300))
    @ENV_SETTINGS
    def test_any_env_file_is_variables_or_a_config_error(self, tmp_path, data):
        p = tmp_path / "job.env"
        p.write_bytes(data)
        try:
            got = envfile.load(p)
        except ConfigError as exc:
            assert str(exc).strip() and "\n" not in str(exc).strip()
            return
        for name, value in got.items():
            assert re.fullmatch(wire.ENV_NAME_PATTERN, name) and "\0" not in value

    def test_plot_png_never_claims_an_unwritten_file(self, tmp_path, monkeypatch):
        # special files and missing directories: refused before anything is fetched
        for target in ("/dev/full", str(tmp_path / "no" / "such" / "dir" / "x.png"), str(tmp_path)):
            with pytest.raises(ConfigError):
                plots.check_output_path(target)
            res = CliRunner().invoke(cli, ["plot", "--host", "127.0.0.1:1", "--ct", "200",
                                           "--png", target])
            assert res.exit_code == errors.USAGE, (target, res.output)
            assert "written to" not in res.output
        # a full disk mid-write: the old file stays whole, no temp file is left, no "written"
        out = tmp_path / "chart.png"
        out.write_bytes(b"old chart")

        def half_then_full(f: t.BinaryIO) -> None:
            f.write(b"\x89PNG half")
            raise OSError(errno.ENOSPC, "No space left on device")

        with pytest.raises(ConfigError, match="No space left on device"):
            plots.write_file_atomic(str(out), half_then_full)
        assert out.read_bytes() == b"old chart"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.png"]
        plots.write_file_atomic(str(out), lambda f: f.write(b"new chart"))
        assert out.read_bytes() == b"new chart"


