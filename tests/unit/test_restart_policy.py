"""The pure parts of a job's babysitting: the restart decision, the playbook keys that feed it,
secret redaction in a stream cut anywhere, and ``--env-file`` parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.config import envfile
from opsctl.config.playbook import Playbook
from opsctl.errors import ConfigError
from opsctl.ops.deploy import collect_secrets
from remote_payload import wire
from remote_payload.agent import jobsecrets, restart
from remote_payload.agent.restart import should_restart

POLICY = {"max_restarts": 3, "on": ["failed"]}


class TestShouldRestart:
    def test_a_failed_attempt_restarts_while_restarts_are_left(self):
        d = should_restart([], 1, None, POLICY, attempts=1, cancelled=False)
        assert d == restart.Decision(True, "exit 1", "restart 1 of 3 after exit 1")
        assert d.decision == "restart"

    def test_the_limit_counts_restarts_not_attempts(self):
        assert should_restart([], 1, None, POLICY, attempts=3, cancelled=False).restart is True
        last = should_restart([], 1, None, POLICY, attempts=4, cancelled=False)
        assert (last.restart, last.decision) == (False, "give up")
        assert "restart limit reached" in last.why

    def test_success_and_no_policy_decide_nothing(self):
        assert should_restart([], 0, None, POLICY, attempts=1, cancelled=False) is None
        assert should_restart(["cuda_oom"], 1, None, None, attempts=1, cancelled=False) is None

    def test_a_usage_error_never_restarts_even_when_named(self):
        d = should_restart(["python_exception"], 2, None,
                           {"max_restarts": 5, "on": ["failed", "python_exception"]}, 1, False)
        assert d.restart is False
        assert "usage error" in d.why

    def test_a_cancelled_job_never_restarts(self):
        d = should_restart([], None, "SIGINT", POLICY, attempts=1, cancelled=True)
        assert d.restart is False
        assert "cancelled" in d.why

    def test_a_diagnosis_id_in_on_restarts_and_is_the_reason(self):
        policy = {"max_restarts": 2, "on": ["nccl_timeout"]}
        d = should_restart(["python_exception", "nccl_timeout"], 1, None, policy, 1, False)
        assert (d.restart, d.reason) == (True, "nccl_timeout")

    def test_a_failure_not_named_in_on_gives_up_saying_what_it_was(self):
        policy = {"max_restarts": 2, "on": ["nccl_timeout", 3]}
        d = should_restart(["cuda_oom"], 1, None, policy, 1, False)
        assert d.restart is False
        assert d.reason == "exit 1"
        assert "cuda_oom" in d.why

    def test_an_exit_code_matches_and_a_signal_matches_128_plus_its_number(self):
        policy = {"max_restarts": 2, "on": [3, 137]}
        assert should_restart([], 3, None, policy, 1, False).restart is True
        killed = should_restart([], None, "SIGKILL", policy, 1, False)
        assert (killed.restart, killed.reason) == (True, "SIGKILL")
        assert should_restart([], 4, None, policy, 1, False).restart is False

    def test_a_hang_restarts_only_when_named(self):
        assert should_restart(["hang"], None, None, POLICY, 1, False).restart is False
        named = should_restart(["hang"], None, None, {"max_restarts": 1, "on": ["hang"]}, 1, False)
        assert (named.restart, named.reason) == (True, "hang")

    def test_backoff_doubles_up_to_its_ceiling(self):
        assert [restart.backoff_s(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
        assert restart.backoff_s(50) == restart.BACKOFF_MAX_S


class TestRestartKey:
    def test_only_max_restarts_gives_the_documented_default(self):
        assert wire.validate_restart({"max_restarts": 2}) == {"max_restarts": 2, "on": ["failed"]}

    @pytest.mark.parametrize("raw, words", [
        ({"max_restarts": -1}, "max_restarts"),
        ({"max_restarts": 1, "on": [2]}, "usage error"),
        ({"max_restarts": 1, "on": []}, "non-empty"),
        ({"max_restarts": 1, "on": [True]}, "neither"),
        ({"max_restarts": 1, "when": []}, "unknown keys"),
        ({"max_restarts": 1, "on": ["nccl_timout"]}, "unknown id 'nccl_timout'"),
    ])
    def test_the_agent_refuses_a_bad_policy(self, raw, words):
        with pytest.raises(ValueError, match=words):
            wire.validate_restart(raw)

    def test_the_ids_restart_on_accepts_are_exactly_the_diagnosis_causes(self):
        from remote_payload.agent import diagnosis

        assert tuple(sig.cause for sig in diagnosis.SIGNATURES) == wire.DIAGNOSIS_IDS

    def test_the_playbook_model_applies_the_same_rule(self):
        book = {"name": "b", "command": ["true"]}
        ok = Playbook.model_validate({**book, "restart": {"max_restarts": 3}})
        assert ok.job_spec("b-1", root="/r")["restart"] == {"max_restarts": 3, "on": ["failed"]}
        with pytest.raises(ValueError, match="usage error"):
            Playbook.model_validate({**book, "restart": {"max_restarts": 1, "on": [2]}})

    def test_playbook_keys_reach_the_spec_and_inventory_webhooks_follow_the_playbooks(self):
        book = Playbook.model_validate({"name": "b", "command": ["true"], "max_duration_s": 5,
                                        "notify": ["http://127.0.0.1:9/a"], "secrets": ["TOKEN"]})
        spec = book.job_spec("b-1", root="/r", notify=["http://127.0.0.1:9/a", "https://h/b"],
                             target={"host": "pve1", "ct": 200})
        assert spec["max_duration_s"] == 5
        assert spec["notify"] == ["http://127.0.0.1:9/a", "https://h/b"]
        assert spec["secrets"] == ["TOKEN"]
        assert spec["target"] == {"host": "pve1", "ct": 200}

    @pytest.mark.parametrize("extra, words", [
        ({"notify": ["ftp://x/y"]}, "not an http"),
        ({"secrets": ["1BAD"]}, "secret names"),
        ({"secrets": ["T", "T"]}, "twice"),
        ({"secrets": ["T"], "env": {"T": "x"}}, "both env and secrets"),
        ({"max_duration_s": 0}, "greater than 0"),
    ])
    def test_bad_babysitting_keys_are_usage_errors(self, extra, words):
        with pytest.raises(ValueError, match=words):
            Playbook.model_validate({"name": "b", "command": ["true"], **extra})


class TestRedactor:
    def test_a_secret_split_across_reads_is_still_masked(self):
        r = jobsecrets.Redactor(["hunter2-xyz"])
        out = b"".join(r.feed(c) for c in (b"token=hun", b"ter2", b"-xyz done\n")) + r.flush()
        assert out == b"token=*** done\n"

    def test_text_that_only_starts_like_a_secret_comes_out_unchanged(self):
        r = jobsecrets.Redactor(["hunter2-xyz"])
        held = r.feed(b"a hunt")
        assert held == b"a "
        assert r.feed(b"ing trip\n") == b"hunting trip\n"
        assert r.flush() == b""

    def test_the_longer_of_two_overlapping_secrets_is_masked_whole(self):
        r = jobsecrets.Redactor(["abcd", "abcdefgh"])
        assert r.feed(b"[abcdefgh] [abcd]\n") == b"[***] [***]\n"


class TestSecretValues:
    BOOK = Playbook.model_validate({"name": "b", "command": ["true"], "secrets": ["TOKEN", "KEY"]})

    def test_an_env_file_wins_and_the_environment_fills_in(self, tmp_path: Path):
        f = tmp_path / "s.env"
        f.write_text("# tokens\nexport TOKEN='from file'\n\n")
        values = collect_secrets(self.BOOK, str(f), environ={"TOKEN": "env", "KEY": "key-env"})
        assert values == {"TOKEN": "from file", "KEY": "key-env"}

    def test_a_missing_secret_is_a_usage_error_naming_the_variable_not_a_value(self):
        with pytest.raises(ConfigError) as exc:
            collect_secrets(self.BOOK, None, environ={"TOKEN": "s3cret-value"})
        assert exc.value.exit_code == 2
        assert "KEY" in exc.value.message
        assert "s3cret-value" not in exc.value.message

    def test_a_malformed_env_file_line_names_file_and_line_but_not_the_value(self, tmp_path: Path):
        f = tmp_path / "bad.env"
        f.write_text("TOKEN=ok\nthis is s3cret\n")
        with pytest.raises(ConfigError, match=r"bad.env:2") as exc:
            envfile.load(f)
        assert "s3cret" not in exc.value.message
