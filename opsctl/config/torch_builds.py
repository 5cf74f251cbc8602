"""The torch builds table and wheelhouse preparation (no torch import).

A build is a variant (``cpu``, ``cu128``, ``cu130``, ...) plus a torch release; the variant
is the wheel's local tag, so the exact pin is ``torch==<version>+<variant>``. Defaults ship
in ``opsctl/bundled/torch-builds.yaml``; any inventory file's ``torch_builds:`` and a host's
``torch_builds:`` override them field by field, so a mirror or an air-gapped host changes
one line, not the table.

    table = load_table(inv.torch_builds, host.torch_builds)
    build = table.resolve(TorchPin.parse("cu130"), version="2.11.0")
    argv = swap_args(build)                      # -> agent verb `swap`
"""

from __future__ import annotations

import dataclasses
import typing as t
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from opsctl.config import paths, yamlfile
from opsctl.errors import ConfigError
from remote_payload import wire

DEFAULTS_PATH = paths.BUNDLED / "torch-builds.yaml"
DEFAULT_INDEX = "https://download.pytorch.org/whl/{variant}"


class BuildSpec(BaseModel):
    """One row of the builds table as written in YAML (every field optional for overrides)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    version: str | None = Field(default=None, description=(
        "torch release without the local tag; the variant is the tag (`2.11.0` → `2.11.0+cu130`)"))
    index_url: str | None = Field(default=None, description=(
        "the build's own package index; null: `https://download.pytorch.org/whl/<variant>`"))
    wheelhouse: bool | None = Field(default=None, description=(
        "true: download the wheels on this machine (`pip download`), stream them into the "
        "container, install with `--no-index` (an air-gapped host)"))
    download_index_url: str | None = Field(default=None, description=(
        "where that download looks; null: this machine's own pip configuration"))

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, v: t.Any) -> t.Any:
        return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v


@dataclasses.dataclass(frozen=True)
class TorchBuild:
    """A resolved build: everything the agent's ``swap`` verb needs."""

    variant: str
    version: str
    index_url: str
    wheelhouse: bool = False
    download_index_url: str | None = None  # None: the operator's pip configuration

    @property
    def name(self) -> str:
        """Directory name in the container: ``torch-2.11.0-cu130``."""
        return wire.torch_build_name(self.version, self.variant)

    @property
    def pin(self) -> str:
        return f"{self.version}+{self.variant}"

    @property
    def requirement(self) -> str:
        return f"torch=={self.pin}"

    @property
    def expected_cuda(self) -> str | None:
        """What ``torch.version.cuda`` must say: ``cu128`` -> ``12.8``, ``cpu`` -> None."""
        return wire.cuda_for_variant(self.variant)


def _check_variant_format(variant: str) -> None:
    if not wire.TORCH_VARIANT_RE.match(variant):
        raise ConfigError(f"torch variant {variant!r} is not 'cpu' or 'cuNNN' (e.g. cu130)")


def check_release(version: str) -> str:
    """A plain torch release (``2.11.0``); the variant supplies the local tag.

    Raises:
        ConfigError: a local tag, an empty or a malformed version.
    """
    if "+" in version:
        base, tag = version.split("+", 1)
        raise ConfigError(f"torch version {version!r} carries a local tag; give the release and "
                          f"the variant separately", hint=f"opsctl swap-torch {tag} --version {base}")
    if not wire.TORCH_RELEASE_RE.match(version):
        raise ConfigError(f"torch version {version!r} is not a release like 2.11.0")
    return version


@dataclasses.dataclass(frozen=True)
class TorchPin:
    """What the operator asked for: a variant, optionally with a version."""

    variant: str
    version: str | None = None

    @classmethod
    def parse(cls, text: str, known: t.Iterable[str] | None = None) -> TorchPin:
        """``cu130`` or ``2.11.0+cu130``.

        Raises:
            ConfigError: malformed, or (when ``known`` is given) a variant not in the table;
                the message lists the known variants.
        """
        text = text.strip()
        version: str | None = None
        variant = text
        if "+" in text:
            version, variant = text.split("+", 1)
            check_release(version)
        known_list = sorted(known) if known is not None else None
        if known_list is not None and variant not in known_list:
            raise ConfigError(
                f"unknown torch variant {variant!r}; known variants: {', '.join(known_list)}",
                hint=f"e.g. opsctl swap-torch {known_list[0] if known_list else 'cu130'}, or add "
                     f"{variant!r} under torch_builds: in the inventory")
        _check_variant_format(variant)
        return cls(variant=variant, version=version)


@dataclasses.dataclass(frozen=True)
class BuildsTable:
    builds: t.Mapping[str, TorchBuild]

    def variants(self) -> list[str]:
        return sorted(self.builds)

    def resolve(self, pin: TorchPin | str, *, version: str | None = None,
                index_url: str | None = None, wheelhouse: bool | None = None) -> TorchBuild:
        """The build for ``pin`` with command-line overrides applied.

        Raises:
            ConfigError: unknown variant (lists the known ones), bad version, conflicting versions.
        """
        if isinstance(pin, str):
            pin = TorchPin.parse(pin, self.variants())
        elif pin.variant not in self.builds:
            TorchPin.parse(pin.variant, self.variants())  # raises with the known list
        base = self.builds[pin.variant]
        if version and pin.version and version != pin.version:
            raise ConfigError(f"two torch versions given: {pin.version} (in the pin) and "
                              f"{version} (--version)")
        chosen = check_release(version or pin.version or base.version)
        return dataclasses.replace(
            base, version=chosen, index_url=index_url or base.index_url,
            wheelhouse=base.wheelhouse if wheelhouse is None else wheelhouse)


def _read_defaults(path: Path) -> dict[str, t.Any]:
    data = yamlfile.load(path)[0] or {}  # bounded, UTF-8, no aliases or duplicate keys
    builds = data.get("torch_builds") if isinstance(data, dict) else None
    if not isinstance(builds, dict):
        raise ConfigError(f"{path}: expected a 'torch_builds:' mapping")
    return builds


def _parse_rows(rows: t.Mapping[str, t.Any], where: str) -> dict[str, BuildSpec]:
    out = {}
    for variant, row in rows.items():
        _check_variant_format(str(variant))
        try:
            out[str(variant)] = BuildSpec.model_validate(row or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"{where}: torch_builds.{variant}.{loc}: {first['msg']}") from None
    return out


def load_table(inventory_builds: t.Mapping[str, t.Any] | None = None,
               host_builds: t.Mapping[str, t.Any] | None = None,
               defaults_path: Path | None = DEFAULTS_PATH) -> BuildsTable:
    """Shipped defaults, then the inventory's ``torch_builds``, then the host's: field by field.

    Raises:
        ConfigError: a bad row, or a variant without a version anywhere.
    """
    layers: list[tuple[str, t.Mapping[str, t.Any]]] = []
    if defaults_path is not None:
        layers.append((str(defaults_path), _read_defaults(defaults_path)))
    layers.append(("inventory torch_builds", inventory_builds or {}))
    layers.append(("host torch_builds", host_builds or {}))
    merged: dict[str, dict[str, t.Any]] = {}
    for where, rows in layers:
        for variant, spec in _parse_rows(rows, where).items():
            merged.setdefault(variant, {}).update(spec.model_dump(exclude_none=True))
    builds = {}
    for variant, row in merged.items():
        if not row.get("version"):
            raise ConfigError(f"torch build {variant!r} has no version in the builds table")
        builds[variant] = TorchBuild(
            variant=variant, version=check_release(str(row["version"])),
            index_url=row.get("index_url") or DEFAULT_INDEX.format(variant=variant),
            wheelhouse=bool(row.get("wheelhouse", False)),
            download_index_url=row.get("download_index_url"))
    return BuildsTable(builds)


def remote_wheelhouse_dir(root: str, build: TorchBuild) -> str:
    """Where streamed wheels go in the container (the agent gets it as ``--wheelhouse``)."""
    return f"{root.rstrip('/')}/wheelhouse/{build.name}"


def swap_args(build: TorchBuild, *, wheelhouse_dir: str | None = None,
              requirements: t.Sequence[str] = (), requirements_index_url: str | None = None,
              reinstall: bool = False, dry_run: bool = False,
              install_only: bool = False) -> list[str]:
    """Arguments of the agent verb ``swap`` for ``build`` (the transport joins them once)."""
    args = ["--variant", build.variant, "--version", build.version]
    if build.wheelhouse:
        if wheelhouse_dir is None:
            raise ConfigError(f"{build.name} installs from a wheelhouse but none was prepared")
        args += ["--wheelhouse", wheelhouse_dir]
    else:
        args += ["--index-url", build.index_url]
    for req in requirements:
        args += ["--requirement", req]
    if requirements_index_url:
        args += ["--requirements-index-url", requirements_index_url]
    if reinstall:
        args.append("--reinstall")
    if dry_run:
        args.append("--dry-run")
    if install_only:
        args.append("--install-only")
    return args
