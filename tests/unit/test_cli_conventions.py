"""Conventions every command follows, checked without a host: the ``--json`` envelope, shell
completion, positional JOB, the aliases; and the output time index behind ``logs --since``."""

from __future__ import annotations

import io
import json
import os
import time

import pytest
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli, jsonout
from opsctl.ops import interactive
from remote_payload.agent import outindex


def _printed(doc, capsys) -> dict:
    jsonout.print_json(doc)
    return json.loads(capsys.readouterr().out)


class TestJsonEnvelope:
    def test_a_success_document_gets_ok_true_first(self, capsys):
        out = _printed({"job_id": "a", "state": "RUNNING"}, capsys)
        assert list(out) == ["ok", "job_id", "state"] and out["ok"] is True

    def test_an_error_document_keeps_ok_false(self, capsys):
        assert _printed({"error": {"type": "X"}, "ok": False}, capsys) == {
            "ok": False, "error": {"type": "X"}}

    def test_a_list_is_refused_as_a_bug(self):
        with pytest.raises(TypeError):
            jsonout.print_json([1, 2])  # type: ignore[arg-type]

    def test_hosts_json_is_an_object_with_ok(self):
        doc = json.loads(CliRunner().invoke(cli, ["hosts", "--json"]).stdout)
        assert doc == {"ok": True, "hosts": []}  # the test's inventory is empty


class TestCompletion:
    @pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F"),
                                               ("zsh", "#compdef opsctl")])
    def test_completion_prints_clicks_script(self, shell, marker):
        res = CliRunner().invoke(cli, ["completion", shell], prog_name="opsctl")
        assert res.exit_code == 0 and marker in res.output and "_OPSCTL_COMPLETE" in res.output

    def complete(self, words: str) -> list[str]:
        env = {"_OPSCTL_COMPLETE": "bash_complete", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
        out = CliRunner().invoke(cli, [], prog_name="opsctl", env=env).output
        return [line for line in out.splitlines() if line]

    def test_hosts_complete_from_the_inventory(self, isolated_env):
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        (inv / "h.yaml").write_text("hosts:\n  pve1: {address: 10.1.2.6}\n  pve2: {address: 10.1.2.7}\n")
        assert self.complete("opsctl status --host pve") == ["plain,pve1", "plain,pve2"]

    def test_playbooks_complete_by_name(self, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)
        (tmp_path / "playbooks").mkdir()
        (tmp_path / "playbooks" / "mine.yaml").write_text("name: mine\ncommand: [true]\n")
        assert "plain,mine" in self.complete("opsctl deploy --playbook mi")

    def test_job_ids_complete_to_nothing_quickly_when_there_is_no_target(self):
        start = time.monotonic()
        assert self.complete("opsctl logs ") == []
        assert time.monotonic() - start < 5


class TestOptions:
    def test_job_as_argument_and_as_option_must_agree(self):
        res = CliRunner().invoke(cli, ["logs", "a1", "--job", "b2"])
        assert res.exit_code == errors.USAGE and "two job ids" in res.output

    def test_deploy_detach_is_an_alias_of_no_wait(self):
        help_text = CliRunner().invoke(cli, ["deploy", "--help"]).output
        assert "-d, --no-wait, --detach" in help_text and "-y, --yes" in help_text

    @pytest.mark.parametrize("text, ports", [("6006", (6006, 6006)), ("16006:6006", (16006, 6006))])
    def test_forward_ports(self, text, ports):
        assert interactive.parse_ports(text) == ports

    @pytest.mark.parametrize("text", ["0", "70000", "a:b", "1:2:3", ""])
    def test_forward_refuses_bad_ports_before_connecting(self, text):
        res = CliRunner().invoke(cli, ["forward", text, "--host", "10.1.2.6", "--ct", "200"])
        assert res.exit_code == errors.USAGE


class TestOutputIndex:
    def write(self, path, data: bytes) -> str:
        p = os.path.join(path, "output.log")
        with open(p, "wb") as f:
            f.write(data)
        return p

    @pytest.mark.parametrize("data, n, want", [
        (b"a\nb\nc\n", 2, b"b\nc\n"), (b"a\nb\nc", 2, b"b\nc"), (b"a\nb\n", 5, b"a\nb\n"),
        (b"", 3, b""), (b"a\nb\n", 0, b""), (b"\n\n\n", 1, b"\n")])
    def test_the_last_n_lines_start_where_they_should(self, tmp_path, data, n, want):
        p = self.write(tmp_path, data)
        assert data[outindex.offset_of_last_lines(p, n, len(data)):] == want

    def test_the_last_lines_of_a_log_larger_than_a_block(self, tmp_path):
        data = b"".join(b"line %06d\n" % i for i in range(20000))  # 240 KB
        p = self.write(tmp_path, data)
        assert data[outindex.offset_of_last_lines(p, 3, len(data)):] == (
            b"line 019997\nline 019998\nline 019999\n")

    def test_since_finds_the_first_chunk_written_at_or_after_the_time(self, tmp_path):
        (tmp_path / outindex.INDEX).write_text("100.0 0\n101.5 40\n103.0 90\n10")  # torn last line
        assert outindex.offset_since(str(tmp_path), 101.0, 120) == 40
        assert outindex.offset_since(str(tmp_path), 50.0, 120) == 0
        assert outindex.offset_since(str(tmp_path), 104.0, 120) == 120  # nothing since
        assert outindex.offset_since(str(tmp_path / "nowhere"), 1.0, 5) is None

    def test_the_writer_notes_at_most_one_offset_a_second(self, tmp_path):
        w = outindex.Writer(str(tmp_path))
        fd = os.open(tmp_path / "output.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        for i, now in enumerate((10.0, 10.4, 11.2, 11.3)):
            w.note(now, fd)
            os.write(fd, b"x" * (i + 1))
        os.close(fd)
        assert (tmp_path / outindex.INDEX).read_text() == "10.000 0\n11.200 3\n"


def test_stdin_is_never_read_for_a_question_without_a_terminal(monkeypatch):
    from opsctl.cli import app

    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    app.confirm("really?", yes=False)  # returns: no terminal, no question
    assert app.interactive() is False
