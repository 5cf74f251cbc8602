"""The configuration reference (docs/playbooks.md) is made from the models that validate the
files: every key of every model is in its table, with the description written on the model."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from opsctl.config import inventory, pipeline, playbook, torch_builds
from tests.paths import REPO
from tests.unit.test_docs import _hooks

PAGE = REPO / "docs" / "playbooks.md"

#: Each generated block and the models whose tables it holds.
BLOCKS: dict[str, tuple[type[BaseModel], ...]] = {
    "playbook-fields": (playbook.Playbook, playbook.HealthyWhen, playbook.RestartPolicy,
                        playbook.TorchSpec, playbook.FileSpec),
    "pipeline-fields": (pipeline.Pipeline, pipeline.Step),
    "inventory-fields": (inventory.InventoryFile, inventory.HostSpec, inventory.ContainerSpec),
    "torch-build-fields": (torch_builds.BuildSpec,),
}

MODELS = [model for models in BLOCKS.values() for model in models]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_key_of_a_configuration_model_says_what_it_is(model):
    assert [name for name, f in model.model_fields.items() if not (f.description or "").strip()] == []


@pytest.mark.parametrize("block", BLOCKS)
def test_the_reference_page_holds_each_generated_block_once(block):
    assert PAGE.read_text(encoding="utf-8").count(f"<!-- generated: {block} -->") == 1


@pytest.mark.parametrize("block", BLOCKS)
def test_a_blocks_tables_list_exactly_the_keys_of_its_models_in_order(block):
    text = _hooks().GENERATORS[block]()
    tables = re.split(r"^### .*$", text, flags=re.M)[1:]
    assert len(tables) == len(BLOCKS[block])
    for model, table in zip(BLOCKS[block], tables, strict=True):
        keys = re.findall(r"^\| `([a-z_]+)` \|", table, re.M)
        assert keys == list(model.model_fields)
        for name, f in model.model_fields.items():
            assert " ".join(f.description.split()).replace("|", "\\|") in table, name


def test_torch_builds_and_socket_ifname_are_in_the_reference():
    rendered = _hooks().render(PAGE.read_text(encoding="utf-8"))
    for key in ("torch_builds", "socket_ifname", "download_index_url", "wheelhouse"):
        assert f"| `{key}` |" in rendered, key


def test_a_model_field_without_a_description_fails_the_docs_build():
    class Bare(BaseModel):
        undocumented: int = 0

    with pytest.raises(ValueError, match=r"Bare\.undocumented has no Field\(description"):
        _hooks().model_tables([("bare", Bare)])


def test_the_page_shows_the_line_that_makes_an_editor_use_the_schema():
    text = PAGE.read_text(encoding="utf-8")
    assert "# yaml-language-server: $schema=" in text
    assert "opsctl schema playbook > playbook.schema.json" in text
    assert "opsctl schema inventory > inventory.schema.json" in text
