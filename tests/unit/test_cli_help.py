"""What every command's ``--help`` promises, checked by walking the click tree: examples that
parse, the target options first, help text on every option, and no history in the CLI's
comments and docstrings."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from opsctl.cli import cli
from opsctl.cli.command import WithExamples

CLI_DIR = Path(__file__).resolve().parents[2] / "opsctl" / "cli"

#: Shell syntax an example may end with (a redirection), which is not the command's argv.
REDIRECTIONS = (">", ">>", "<", "|")


def _commands(cmd: click.Command = cli, path: tuple[str, ...] = ("opsctl",)
              ) -> list[tuple[str, click.Command]]:
    found = [(" ".join(path), cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands()
IDS = [name for name, _ in COMMANDS]
TARGET_OPTIONS = ("--host", "--ct")
TARGETED = [(name, cmd) for name, cmd in COMMANDS
            if set(TARGET_OPTIONS) & {o for p in cmd.params for o in p.opts}]


def _argv(example: str) -> list[str]:
    words = shlex.split(example)
    for i, word in enumerate(words):
        if word in REDIRECTIONS:
            words = words[:i]
            break
    return words


def _parse(argv: list[str]) -> click.Context:
    """``argv`` through click's parser, group by group, as far as the leaf command (nothing
    is invoked); a wrong option, a bad value or a missing required one raises."""
    assert argv[0] == "opsctl"
    ctx = cli.make_context("opsctl", argv[1:])
    while isinstance(ctx.command, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return ctx
        name, sub, rest = ctx.command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
    return ctx


class TestExamples:
    @pytest.mark.parametrize("name, cmd", COMMANDS, ids=IDS)
    def test_every_command_has_one_to_three_examples(self, name, cmd):
        assert isinstance(cmd, WithExamples), f"{name} is not an OpsctlCommand/OpsctlGroup"
        assert 1 <= len(cmd.examples) <= 3, f"{name}: {len(cmd.examples)} examples"

    @pytest.mark.parametrize("name, cmd", COMMANDS, ids=IDS)
    def test_every_example_parses_and_runs_the_command_or_one_of_the_groups(self, name, cmd):
        for example in cmd.examples:
            ran = _parse(_argv(example)).command_path
            assert ran == name or ran.startswith(name + " "), example

    @pytest.mark.parametrize("name, cmd", COMMANDS, ids=IDS)
    def test_help_ends_with_the_examples(self, name, cmd):
        res = CliRunner().invoke(cli, [*name.split()[1:], "--help"], prog_name="opsctl")
        assert res.exit_code == 0, res.output
        tail = res.output.rstrip("\n").split("\n\nExamples:\n")[-1].splitlines()
        assert [line.strip() for line in tail] == list(cmd.examples)

    def test_an_example_with_a_misspelt_option_fails_the_parse(self):
        with pytest.raises(click.NoSuchOption):
            _parse(_argv("opsctl status --hots pve1 --ct 200"))

    def test_an_example_with_a_bad_value_fails_the_parse(self):
        with pytest.raises(click.BadParameter):
            _parse(_argv("opsctl status --host pve1 --ct not-a-container"))

    def test_an_example_of_an_unknown_command_fails_the_parse(self):
        with pytest.raises(click.UsageError):
            _parse(_argv("opsctl statsu --host pve1"))


class TestOptions:
    @pytest.mark.parametrize("name, cmd", TARGETED, ids=[n for n, _ in TARGETED])
    def test_host_and_ct_come_first(self, name, cmd):
        options = [p.opts[0] for p in cmd.get_params(click.Context(cmd))
                   if isinstance(p, click.Option)]
        has = [o for o in TARGET_OPTIONS if o in options]
        assert options[:len(has)] == has, f"{name}: {options}"

    def test_the_help_text_lists_host_and_ct_first(self):
        out = CliRunner().invoke(cli, ["logs", "--help"]).output
        listed = [line.split()[0].rstrip(",") for line in out.split("Options:\n")[1].splitlines()
                  if line.startswith("  -")]
        assert listed[:2] == ["--host", "--ct"]

    @pytest.mark.parametrize("name, cmd", COMMANDS, ids=IDS)
    def test_every_option_has_help_text(self, name, cmd):
        bare = [p.opts[0] for p in cmd.get_params(click.Context(cmd))
                if isinstance(p, click.Option) and not (p.help or "").strip()]
        assert bare == [], f"{name}: options without help: {bare}"


#: History in a comment or docstring: an issue number, or the present explained by the past.
HISTORY = re.compile(r"\bissue\s*#?\d+|\bused to\b|\bno longer\b|\bany ?more\b|\bformerly\b",
                     re.IGNORECASE)


@pytest.mark.parametrize("path", sorted(CLI_DIR.glob("*.py")), ids=lambda p: p.name)
def test_the_cli_says_what_the_rule_is_not_what_it_was(path):
    hits = [f"{path.name}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert hits == []


def test_the_cli_reference_lists_every_commands_examples():
    import importlib.util

    docs = CLI_DIR.parents[1] / "docs"
    assert "<!-- generated: cli-examples -->" in (docs / "cli.md").read_text(encoding="utf-8")
    spec = importlib.util.spec_from_file_location("docs_generated_cli", docs / "hooks" / "generated.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    block = hooks.cli_examples().splitlines()
    for name, cmd in COMMANDS:
        start = block.index(f"# {name}")
        assert block[start + 1:start + 1 + len(cmd.examples)] == list(cmd.examples)
