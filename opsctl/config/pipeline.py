"""Pipeline playbooks: a list of steps, each a playbook, queued at once with their
dependencies.

A pipeline file is a playbook file with ``steps:`` instead of ``command:``::

    name: dflash-chain
    steps:
      - {playbook: dflash-regenerate, args: [--limit, "1000"]}
      - {playbook: dflash-8gpu, after: previous}
      - {name: export, playbook: dflash-export, after: dflash-8gpu}

``after`` is ``previous`` or the name of an *earlier* step (a step's name defaults to its
playbook's), so a pipeline can have no cycle; ``args`` are appended to the step playbook's
command, ``gpus`` overrides its ``gpus``. ``deploy`` of a pipeline queues every step in the
container at once (``opsctl queue`` shows them); the container runs them with no client.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opsctl.config import playbook as playbook_mod
from opsctl.config.playbook import Playbook
from opsctl.errors import ConfigError
from remote_payload import wire

STEP_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
PREVIOUS = "previous"


class Step(BaseModel):
    """One step: a playbook (name or path), extra arguments, and what it waits for."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    playbook: str = Field(min_length=1, max_length=4096, description="the step's playbook: a name or a path")
    name: str | None = Field(default=None, pattern=STEP_NAME, description=(
        "the step's name, for `after`; null: its playbook's name"))
    args: list[t.Annotated[str, Field(max_length=4096)]] = Field(default_factory=list,
                                                                max_length=256, description=(
        "appended to the step playbook's command"))
    after: str | None = Field(default=None, max_length=128, description=(
        "`previous` or the name of an earlier step: this step waits until that one SUCCEEDED "
        "(it ends CANCELLED if that one failed); null: nothing"))
    gpus: int | list[int] | None = Field(default=None, description="overrides the step playbook's `gpus`")

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_request(cls, v: t.Any) -> t.Any:
        return wire.validate_gpu_request(v)

    @field_validator("args")
    @classmethod
    def _no_nul(cls, v: list[str]) -> list[str]:
        if any("\0" in a for a in v):
            raise ValueError("NUL bytes cannot be passed to a process")
        return v

    @property
    def step_name(self) -> str:
        if self.name is not None:
            return self.name
        stem = self.playbook.rsplit("/", 1)[-1].removesuffix(".yaml")
        return stem[:64] or "step"


class Pipeline(BaseModel):
    """``steps:``, 1 to ``wire.MAX_PIPELINE_STEPS`` of them, each after ``previous``, an
    earlier step, or nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    name: str = Field(pattern=STEP_NAME, description="the pipeline's name (`--playbook NAME`)")
    description: str | None = Field(default=None, description="one line for `opsctl playbooks`")
    steps: list[Step] = Field(min_length=1, max_length=wire.MAX_PIPELINE_STEPS, description=(
        "the steps, queued in the container at once, in this order"))

    @model_validator(mode="after")
    def _dependencies_point_back(self) -> Pipeline:
        seen: list[str] = []
        for i, step in enumerate(self.steps):
            name = step.step_name
            if name in seen:
                raise ValueError(f"steps[{i}]: two steps are named {name!r}; give one a `name:`")
            if step.after == PREVIOUS and i == 0:
                raise ValueError("steps[0]: after: previous, but it is the first step")
            if step.after not in (None, PREVIOUS) and step.after not in seen:
                later = any(s.step_name == step.after for s in self.steps[i:])
                raise ValueError(f"steps[{i}]: after: {step.after!r} "
                                 + ("names itself or a later step (a step waits for an earlier "
                                    "one; no cycles)" if later else
                                    f"is no earlier step (earlier: {', '.join(seen) or 'none'})"))
            seen.append(name)
        return self

    def dependencies(self) -> list[int | None]:
        """For each step, the index of the step it waits for (None: nothing)."""
        names = [s.step_name for s in self.steps]
        return [None if s.after is None else (i - 1 if s.after == PREVIOUS else names.index(s.after))
                for i, s in enumerate(self.steps)]


@dataclass(frozen=True)
class ResolvedStep:
    name: str
    book: Playbook  # the step's playbook with its args appended and its gpus applied
    after: int | None  # index of the step it waits for


def resolve(pipe: Pipeline) -> list[ResolvedStep]:
    """Each step's playbook loaded, with the step's ``args`` and ``gpus`` applied.

    Raises:
        ConfigError: a step's playbook is missing, invalid, or itself a pipeline.
    """
    out = []
    for step, after in zip(pipe.steps, pipe.dependencies(), strict=True):
        loaded = load_any(step.playbook)
        if isinstance(loaded, Pipeline):
            raise ConfigError(f"pipeline {pipe.name}: step {step.step_name} is the pipeline "
                              f"{loaded.name}; a step is one playbook")
        update: dict[str, t.Any] = {"command": [*loaded.command, *step.args]}
        if step.gpus is not None:
            update["gpus"] = step.gpus
        book = Playbook.model_validate({**loaded.model_dump(), **update})
        out.append(ResolvedStep(step.step_name, book, after))
    return out


def load_any(path: str) -> Playbook | Pipeline:
    """A playbook or a pipeline (a file with ``steps:``), by path or name.

    Raises:
        ConfigError: missing file, bad YAML, an invalid field (file:line field: problem).
    """
    from opsctl.config import yamlfile

    p = playbook_mod.locate(path).path
    data, lines = yamlfile.load(p)
    if isinstance(data, dict) and "steps" in data:
        return yamlfile.validate(Pipeline, data, p, lines)
    return playbook_mod.load(p)
