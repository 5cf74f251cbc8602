"""opsctl's YAML files use YAML 1.2's booleans: only ``true``/``false`` (in three spellings)
are booleans, so ``on:``, ``yes`` and ``no`` are the strings they look like."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.config import playbook, yamlfile

TRUE, FALSE = ("true", "True", "TRUE"), ("false", "False", "FALSE")
#: YAML 1.1 booleans that YAML 1.2 reads as strings
WORDS_OF_YAML_1_1 = ("on", "On", "ON", "off", "Off", "OFF", "yes", "Yes", "YES", "no", "No", "NO",
                     "y", "Y", "n", "N")


def _load(tmp_path: Path, text: str) -> object:
    p = tmp_path / "f.yaml"
    p.write_text(text)
    return yamlfile.load(p)[0]


def test_the_documented_restart_policy_loads_with_on_as_its_key(tmp_path):
    p = tmp_path / "book.yaml"
    p.write_text("name: b\ncommand: [python3, train.py]\n"
                 "restart: {max_restarts: 3, on: [failed]}\n")
    book = playbook.load(p)
    assert book.restart is not None
    assert book.restart.to_wire() == {"max_restarts": 3, "on": ["failed"]}


@pytest.mark.parametrize("word", WORDS_OF_YAML_1_1)
def test_yaml_1_1_boolean_words_are_strings_as_keys_and_values(tmp_path, word):
    assert _load(tmp_path, f"{word}: {word}\nlist: [{word}]\n") == {word: word, "list": [word]}


@pytest.mark.parametrize(("word", "value"), [(w, True) for w in TRUE] + [(w, False) for w in FALSE])
def test_true_and_false_are_booleans(tmp_path, word, value):
    assert _load(tmp_path, f"a: {word}\n") == {"a": value}


def test_a_quoted_true_stays_a_string(tmp_path):
    assert _load(tmp_path, 'a: "true"\n') == {"a": "true"}


@settings(max_examples=200, deadline=None)
@given(word=st.text(st.sampled_from("tTrRuUeEfFaAlLsSoOnNyY"), min_size=1, max_size=6))
def test_only_the_six_spellings_of_true_and_false_become_booleans(tmp_path_factory, word):
    got = _load(tmp_path_factory.mktemp("y"), f"k: {word}\n")
    expected = (word in TRUE if word in TRUE + FALSE
                else None if word in ("null", "Null", "NULL") else word)
    assert got == {"k": expected}


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_loads_or_is_a_config_error_never_another_exception(tmp_path_factory, text):
    from opsctl.errors import ConfigError

    try:
        _load(tmp_path_factory.mktemp("y"), text)
    except ConfigError:
        pass


@pytest.mark.parametrize(("key", "loaded"), [("0x10", 16), ("0b11", 3), ("1:30", 90),
                                             ("017", 15), ("1_000", 1000), ("+5", 5)])
def test_an_integer_key_in_any_yaml_spelling_loads_with_its_line(tmp_path, key, loaded):
    p = tmp_path / "f.yaml"
    p.write_text(f"a:\n  {key}: x\n")
    data, lines = yamlfile.load(p)
    assert data == {"a": {loaded: "x"}}
    assert lines[("a", loaded)] == 2


def test_two_spellings_of_one_integer_key_are_a_duplicate(tmp_path):
    from opsctl.errors import ConfigError

    with pytest.raises(ConfigError, match="duplicate key 16"):
        _load(tmp_path, "0x10: a\n16: b\n")


@settings(max_examples=200, deadline=None)
@given(key=st.from_regex(r"\A[-+]?(0b[01_]+|0x[0-9a-fA-F_]+|0[0-7_]+|[1-9][0-9_]*(:[0-5]?[0-9])*"
                         r"|0)\Z"), value=st.text(max_size=10))
def test_any_integer_looking_key_loads_or_is_a_config_error(tmp_path_factory, key, value):
    from opsctl.errors import ConfigError

    try:
        _load(tmp_path_factory.mktemp("y"), f"{key}: {value!r}\n".replace("\\", "\\\\"))
    except ConfigError:
        pass


@pytest.mark.parametrize("text", ["x: 0b_\n", "0x_: a\n", "x: 0x_\n", "x: [1, 0b_]\n"])
def test_a_number_pattern_no_number_reads_is_a_config_error_at_its_line(tmp_path, text):
    from opsctl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"f\.yaml"):
        _load(tmp_path, text)
