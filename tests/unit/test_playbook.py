"""Playbooks: validated with pydantic; every problem names the file, line and field."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from opsctl import errors
from opsctl.config import playbook
from opsctl.errors import ConfigError
from tests.paths import REPO


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_a_minimal_playbook_gets_safe_defaults(tmp_path):
    book = playbook.load(write(tmp_path, """
        name: hello
        command: [python3, -c, "print(1)"]
    """))
    assert book.healthy_when.to_wire() == {"started": True}
    assert book.cache == "keep"
    assert book.timeout_s == 600


def test_a_bad_field_is_reported_with_its_path_and_line(tmp_path):
    p = write(tmp_path, """
        name: hello
        command: [python3]
        healthy_when:
          event: step
          regex: "x"
        timeout_s: -5
    """)
    with pytest.raises(ConfigError) as exc:
        playbook.load(p)
    msg = exc.value.message
    assert f"{p}:4: healthy_when: " in msg and "exactly one" in msg
    assert f"{p}:7: timeout_s:" in msg


def test_an_unknown_key_is_refused_not_ignored(tmp_path):
    p = write(tmp_path, """
        name: hello
        comand: [python3]
    """)
    with pytest.raises(ConfigError) as exc:
        playbook.load(p)
    assert f"{p}:3: comand: Extra inputs are not permitted" in exc.value.message


def test_yaml_syntax_errors_name_the_line(tmp_path):
    p = write(tmp_path, "name: hello\ncommand: [python3\n")
    with pytest.raises(ConfigError) as exc:
        playbook.load(p)
    assert str(p) + ":" in exc.value.message and "YAML syntax error" in exc.value.message


def test_env_values_must_be_strings_and_numbers_are_converted(tmp_path):
    book = playbook.load(write(tmp_path, """
        name: hello
        command: [sh]
        env: {OMP_NUM_THREADS: 2}
    """))
    assert book.env == {"OMP_NUM_THREADS": "2"}
    with pytest.raises(ConfigError, match="env"):
        playbook.load(write(tmp_path, "name: x\ncommand: [sh]\nenv: {A: [1]}\n"))


def test_an_invalid_regex_is_caught_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="invalid regex"):
        playbook.load(write(tmp_path, "name: x\ncommand: [sh]\nhealthy_when: {regex: '('}\n"))


def test_the_job_spec_carries_the_contract_fields(tmp_path):
    book = playbook.load(write(tmp_path, "name: x\ncommand: [python3, t.py]\nenv: {A: b}\n"))
    spec = book.job_spec("x-1", root="/opt/opsctl", python="/opt/opsctl/envs/current/bin/python")
    assert spec["workdir"] == "/opt/opsctl/payload"
    assert spec["env"] == {"A": "b"}
    assert spec["python"] == "/opt/opsctl/envs/current/bin/python"
    assert spec["command"] == ["python3", "t.py"]


def test_shipped_playbooks_are_valid_and_named_after_their_file():
    root = REPO / "opsctl" / "bundled" / "playbooks"
    books = sorted(root.glob("*.yaml"))
    assert {p.stem for p in books} >= {"dflash-8gpu", "dflash-cpu-smoke", "dflash-cpu-e2e"}
    from opsctl.config.pipeline import load_any

    for p in books:  # a playbook, or a pipeline of them (dflash-chain)
        assert load_any(str(p)).name == p.stem, p


@pytest.mark.parametrize("regex", [r"(a+)+$", r"(\w*\s?)*done", r"^(x+x+)+y", r"(.*a){20}"])
def test_a_playbook_regex_that_can_backtrack_catastrophically_is_refused_at_load(tmp_path, regex):
    book = tmp_path / "b.yaml"
    book.write_text(f"name: x\ncommand: [sh]\nhealthy_when: {{regex: '{regex}'}}\n")
    with pytest.raises(errors.ConfigError, match="backtrack"):
        playbook.load(book)


@pytest.mark.parametrize("regex", [r"step \d+", r"(\d+\.){3}\d+", r"loss=([0-9.]+)", r"(ab|cd)+x"])
def test_ordinary_healthy_when_regexes_are_accepted(tmp_path, regex):
    book = tmp_path / "b.yaml"
    book.write_text(f"name: x\ncommand: [sh]\nhealthy_when: {{regex: '{regex}'}}\n")
    assert playbook.load(book).healthy_when.regex == regex


@pytest.mark.parametrize(("name", "value", "credential"), [
    ("MLFLOW_TRACKING_PASSWORD", "x" * 20, True),
    ("MLFLOW_TRACKING_TOKEN", "x" * 20, True),
    ("HF_TOKEN", "x" * 20, True),
    ("WANDB_API_KEY", "x" * 20, True),
    ("AWS_SECRET_ACCESS_KEY", "x" * 20, True),
    ("MLFLOW_TRACKING_URI", "https://me:pw123456789@mlflow.example/", True),
    ("MLFLOW_TRACKING_URI", "https://mlflow.example/", False),
    ("MLFLOW_TRACKING_USERNAME", "trainer", False),
    ("TOKENIZERS_PARALLELISM", "false", False),
    ("CUDA_VISIBLE_DEVICES", "0", False),
    ("CACHE_KEY", "abc", False),
])
def test_an_env_entry_holding_a_credential_is_told_by_its_name_or_a_password_in_a_url(
        name: str, value: str, credential: bool) -> None:
    from opsctl.config.playbook import is_credential

    assert is_credential(name, value) is credential


def test_credential_env_entries_go_in_the_spec_by_name_only_and_their_values_as_secrets() -> None:
    from opsctl.ops.deploy import collect_secrets

    token = "tok-" + "9" * 20
    book = playbook.Playbook(name="p", command=["true"], secrets=["OTHER_SECRET"],
                    env={"MLFLOW_TRACKING_TOKEN": token, "LR": "3e-4"})
    spec = book.job_spec("p-1", root="/opt/opsctl")
    assert spec["env"] == {"LR": "3e-4"} and token not in json.dumps(spec)
    assert spec["secrets"] == ["OTHER_SECRET", "MLFLOW_TRACKING_TOKEN"]
    values = collect_secrets(book, environ={"OTHER_SECRET": "o" * 20})
    assert values == {"OTHER_SECRET": "o" * 20, "MLFLOW_TRACKING_TOKEN": token}
    short = playbook.Playbook(name="p", command=["true"], env={"HF_TOKEN": "abc"})
    with pytest.raises(errors.ConfigError) as exc:
        collect_secrets(short, environ={})
    assert "HF_TOKEN" in exc.value.message and "abc" not in exc.value.message


@pytest.mark.parametrize("gpus", ["true", "[0, true]", "'2'"])
def test_a_boolean_or_a_string_is_no_gpu_count(tmp_path, gpus):
    p = write(tmp_path, f"""
        name: hello
        command: [python3]
        gpus: {gpus}
    """)
    with pytest.raises(ConfigError) as exc:
        playbook.load(p)
    assert "gpus" in exc.value.message


def test_a_gpu_count_or_indices_load(tmp_path):
    for gpus, want in (("2", 2), ("[0, 3]", [0, 3]), ("null", None)):
        p = write(tmp_path, f"name: hello\ncommand: [python3]\ngpus: {gpus}\n")
        assert playbook.load(p).gpus == want
