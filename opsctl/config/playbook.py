"""Job specs from ``playbooks/*.yaml``, validated with pydantic.

A name (``dflash-8gpu``) is looked up in ``./playbooks``, ``$OPSCTL_HOME/playbooks`` (by default
``~/.opsctl/playbooks``), then the playbooks bundled with opsctl; the first match wins
(:func:`opsctl.config.paths.playbook_dirs`). ``opsctl playbooks`` lists every one with its origin.

A playbook says what to run in the container and when it counts as healthy;
``torch:`` and ``cache:`` say which torch build and compile-cache policy the
job needs (applied by ``deploy`` before launch).
"""

from __future__ import annotations

import itertools
import re
import secrets
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from opsctl.config import paths, yamlfile
from opsctl.errors import ConfigError
from remote_payload import wire

#: What a POSIX shell and ``os.execve`` accept as an environment variable name.
ENV_NAME_RE = re.compile(wire.ENV_NAME_PATTERN)
#: words of an environment name (split at ``_``) that say it holds a credential
#: (``MLFLOW_TRACKING_PASSWORD``, ``HF_TOKEN``); ``TOKENIZERS_PARALLELISM`` has none of them
CREDENTIAL_WORDS = frozenset({"PASSWORD", "PASSWD", "SECRET", "TOKEN", "APIKEY", "CREDENTIAL",
                              "CREDENTIALS"})
#: pairs of adjacent words that do (``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``)
CREDENTIAL_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"),
                              ("SECRET", "KEY"), ("AUTH", "KEY")})
#: a URL with a password in it (``https://user:pass@mlflow.example``)
URL_WITH_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]+@")


def is_credential(name: str, value: str) -> bool:
    """Whether a playbook ``env`` entry holds a credential: by its name's words, or a URL
    with a password in its value. Such an entry travels as a secret (:meth:`Playbook.job_spec`):
    on the launch's stdin, stored 0600, removed when the job ends, masked in its output;
    never in ``spec.json``, a command line or a log."""
    words = name.upper().split("_")
    return (any(w in CREDENTIAL_WORDS for w in words)
            or any(pair in CREDENTIAL_PAIRS for pair in itertools.pairwise(words))
            or URL_WITH_PASSWORD.search(value) is not None)


#: The launch spec travels as JSON on the agent's command line, which is capped at
#: ``MAX_COMMAND_BYTES`` (100 KiB, opsctl/remote/command.py); leave room for JSON escaping and the rest.
MAX_SPEC_TEXT_BYTES = 48 * 1024

MAX_REGEX_LEN = 1000


def backtracking_risk(pattern: str) -> str | None:
    """Why ``pattern`` can backtrack catastrophically, or None.

    Obvious cases only: an unbounded repeat nested in another (``(a+)+``, ``(\\w*\\s?)*``)
    is exponential on a near-miss line. The wrapper also bounds every match in time,
    so this is the early, clear error, not the only guard.
    """
    if len(pattern) > MAX_REGEX_LEN:
        return f"longer than {MAX_REGEX_LEN} characters"
    import importlib

    try:
        parser: t.Any = importlib.import_module("re._parser")  # 3.11+
    except ModuleNotFoundError:  # pragma: no cover - older pythons
        parser = importlib.import_module("sre_parse")
    consts = parser  # MAXREPEAT and the opcodes are re-exported there
    repeats = {consts.MAX_REPEAT, consts.MIN_REPEAT}

    def unbounded_inside(items: t.Any, in_repeat: bool) -> bool:
        for op, av in items:
            if op in repeats:
                _lo, hi, sub = av
                unbounded = hi == consts.MAXREPEAT
                if unbounded and in_repeat:
                    return True
                # (x+){3} is cubic at worst and common (addresses); (.*a){20} is not
                subs = [(sub, in_repeat or unbounded or hi > 10)]
            elif op == consts.SUBPATTERN:
                subs = [(av[-1], in_repeat)]
            elif op == consts.BRANCH:
                subs = [(b, in_repeat) for b in av[1]]
            else:
                continue
            if any(unbounded_inside(x, r) for x, r in subs):
                return True
        return False

    try:
        tree = parser.parse(pattern)
    except Exception:  # re.compile already accepted it; never fail the check itself
        return None
    if unbounded_inside(tree, False):
        return ("a repeated group contains another unbounded repeat, which can backtrack "
                "exponentially (e.g. (a+)+); write it without the nesting, e.g. a+")
    return None


# Every playbook number has a finite range (README, "Input limits"; ``.inf`` and ``.nan`` are
# refused: `timeout_s: .inf` once made deploy wait forever).
MAX_WAIT_S = 7 * 86400.0  # timeout_s, hang_after_s, phase_budgets_s: a week
MAX_DURATION_S = 366 * 86400.0  # max_duration_s: a year
MAX_TOK_S = 1e9  # expect_tok_s
MAX_GPU_INDEX = 1023  # gpus: nvidia-smi indices


class HealthyWhen(BaseModel):
    """Exactly one criterion: first event of a kind, a regex on output, or started."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    event: str | None = Field(default=None, description=(
        "healthy at the first trainer event of this kind (`step`: the first training step)"))
    regex: str | None = Field(default=None, description=(
        "healthy at the first output line this regular expression matches (patterns that "
        "backtrack catastrophically are refused)"))
    started: bool | None = Field(default=None, description="healthy as soon as the process runs")

    @model_validator(mode="after")
    def _exactly_one(self) -> HealthyWhen:
        given = [k for k in ("event", "regex", "started") if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("give exactly one of event, regex, started")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"invalid regex: {exc}") from None
            risky = backtracking_risk(self.regex)
            if risky:
                raise ValueError(f"regex {self.regex!r} rejected: {risky}")
        return self

    def to_wire(self) -> dict[str, t.Any]:
        return self.model_dump(exclude_none=True)


def _default_on() -> list[int | str]:
    return [*wire.RESTART_DEFAULT_ON]


class RestartPolicy(BaseModel):
    """``restart: {max_restarts: N, on: [...]}``: the wrapper in the container runs a failed
    attempt again (``remote_payload/agent/restart.py`` has the rule; docs/playbooks.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    max_restarts: int = Field(ge=0, le=wire.MAX_RESTARTS_LIMIT, description=(
        "how many times a failed attempt is run again in the same job"))
    on: list[int | str] = Field(default_factory=lambda: _default_on(), description=(
        "what restarts: `failed` (any exit but 0, or a signal), `hang`, diagnosis ids "
        "(`nccl_timeout`, `cuda_oom`, …) and exit codes (`137`; a signal *n* also matches "
        "128 + *n*); exit 2 is never restarted"))

    @model_validator(mode="after")
    def _the_agents_rule(self) -> RestartPolicy:
        wire.validate_restart(self.to_wire())  # one rule, on both sides: raises ValueError
        return self

    def to_wire(self) -> dict[str, t.Any]:
        return {"max_restarts": self.max_restarts, "on": list(self.on)}


class TorchSpec(BaseModel):
    """``torch: {variant, version}``: the build the job needs (``swap-torch`` before launch)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    variant: str = Field(description="the build's variant, the wheel's local tag: `cpu`, `cu128`, `cu130`, …")
    version: str | None = Field(default=None, description=(
        "torch release without the tag (`2.11.0`); null: the builds table's version of the variant"))


class FileSpec(BaseModel):
    """One entry of a playbook's ``files:``: a local path and where it goes in the container."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    src: str = Field(min_length=1, description=(
        "a file or directory on this machine (relative: to the current directory; `~` expands)"))
    dest: str | None = Field(default=None, description=(
        "where it goes in the container: absolute, or under `<root>/data`; null: "
        "`<root>/data/<name of src>`"))


class Playbook(BaseModel):
    """A job: what runs in the container, when it counts as healthy, what it needs there.

    Restarts, the time limit, webhooks and secrets are applied in the container by the job's
    wrapper, with no client connected."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description=(
        "the playbook's name (`--playbook NAME`), 1-64 letters, digits, `_.-`"))
    description: str | None = Field(default=None, description="one line for `opsctl playbooks`")
    command: list[str] = Field(min_length=1, description=(
        "the job's argv, no shell; `python3` first runs with the container's current torch build"))
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of the job")
    workdir: str | None = Field(default=None, description=(
        "the job's working directory in the container; null: the payload directory"))
    healthy_when: HealthyWhen = Field(default_factory=lambda: HealthyWhen(started=True), description=(
        "what makes the job healthy, exactly one of `event`, `regex`, `started`"))
    timeout_s: float = Field(default=600, gt=0, le=MAX_WAIT_S, allow_inf_nan=False, description=(
        "how long `deploy` waits for healthy (exit 41 past it); the job itself keeps running"))
    expect_tok_s: float | None = Field(default=None, gt=0, le=MAX_TOK_S, allow_inf_nan=False,
                                       description="the diagnosis warns below half of this rate")
    hang_after_s: float | None = Field(default=None, gt=0, le=MAX_WAIT_S, allow_inf_nan=False, description=(
        "silence (no output, no event) that names the job hung and takes its stacks, unless the "
        "job announced a longer budget for its phase (the trainer's cold compile)"))
    phase_budgets_s: dict[str, float] = Field(default_factory=dict, description=(
        "`{phase: seconds}`, e.g. `{compiling: 600}`: a phase's hang budget, over both the above"))
    # strict: YAML's `true` is no count (lax pydantic would read it as 1)
    gpus: t.Annotated[int, Strict()] | list[t.Annotated[int, Strict()]] | None = Field(
        default=None, description=(
        "GPU slots the job reserves: a count (the lowest free slots) or indices (`[0, 1]`); the "
        "job gets `CUDA_VISIBLE_DEVICES` of them and runs beside others (guide/queue.md); a GPU "
        "held outside opsctl's jobs is refused unless `deploy --force`. null: the whole container"))
    torch: TorchSpec | None = Field(default=None, description=(
        "the torch build the job needs, switched to before launch"))
    cache: t.Literal["keep", "clear", "seed"] = Field(default="keep", description=(
        "the build's compile cache before launch: keep it, clear it, or seed it from the mega-cache"))
    requirements: list[str] = Field(default_factory=list, description=(
        "pip requirements installed into the build's venv (`transformers==5.24.0`)"))
    restart: RestartPolicy | None = Field(default=None, description=(
        "run a failed (or hung) attempt again in the same job"))
    max_duration_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S, allow_inf_nan=False,
                                         description=(
        "wall-clock limit of the whole job, all attempts: then stopped like `opsctl stop`, "
        "CANCELLED with `end_reason: \"time limit\"`"))
    notify: list[str] = Field(default_factory=list, description=(
        "webhook URLs the container POSTs every change of the job to (after the inventory's)"))
    secrets: list[str] = Field(default_factory=list, description=(
        "environment names whose values come from `deploy --env-file F` or the local "
        "environment; sent on stdin, masked in every output"))

    @field_validator("notify")
    @classmethod
    def _notify_urls(cls, v: list[str]) -> list[str]:
        return wire.check_notify_urls(v)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_request(cls, v: t.Any) -> t.Any:
        return wire.validate_gpu_request(v)  # one rule with --gpus and the agent

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not ENV_NAME_RE.fullmatch(n)]
        if bad:
            raise ValueError(f"secret names must match {ENV_NAME_RE.pattern}: "
                             + ", ".join(repr(n) for n in bad))
        if len(set(v)) != len(v):
            raise ValueError("a secret is named twice")
        return v
    files: list[FileSpec] = Field(default_factory=list, description=(
        "pushed by `deploy` before launch (rsync: only what changed)"))
    outputs: list[t.Annotated[str, Field(min_length=1)]] = Field(default_factory=list, description=(
        "container paths (absolute, or under `<root>/data`) that `opsctl pull` without SRC "
        "fetches, each to `./<its name>`"))

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_are_strings(cls, v: t.Any) -> t.Any:
        if isinstance(v, dict):
            bad = [k for k, x in v.items() if not isinstance(x, (str, int, float)) or isinstance(x, bool)]
            if bad:
                raise ValueError(f"env values must be strings (quote them): {', '.join(map(str, bad))}")
            return {str(k): str(x) for k, x in v.items()}
        return v

    @field_validator("phase_budgets_s")
    @classmethod
    def _budgets_are_positive(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, x in v.items() if not 0 < x <= MAX_WAIT_S]
        if bad:
            raise ValueError(f"phase budgets must be seconds > 0 and <= {MAX_WAIT_S:g}: "
                             f"{', '.join(bad)}")
        return v

    @model_validator(mode="after")
    def _runnable_in_the_container(self) -> Playbook:
        # What the remote wrapper would otherwise crash on (job LOST): checked here, exit 2.
        if not self.command[0]:
            raise ValueError("command[0] is empty: name the program to run")
        bad_env = [k for k in self.env if not ENV_NAME_RE.fullmatch(k)]
        if bad_env:
            raise ValueError(f"env names must match {ENV_NAME_RE.pattern}: "
                             + ", ".join(repr(k) for k in bad_env))
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(f"named in both env and secrets: {', '.join(both)} (a secret's value "
                             "never goes in the playbook)")
        texts = [("name", self.name), ("workdir", self.workdir or ""),
                 *((f"command[{i}]", a) for i, a in enumerate(self.command)),
                 *((f"env.{k}", v) for k, v in self.env.items())]
        with_nul = [where for where, text in texts if "\0" in text]
        if with_nul:
            raise ValueError(f"NUL bytes cannot be passed to a process: {', '.join(with_nul)}")
        size = sum(len(text.encode("utf-8", "surrogateescape")) for _, text in texts)
        if size > MAX_SPEC_TEXT_BYTES:
            raise ValueError(f"command, env and workdir hold {size} bytes; at most "
                             f"{MAX_SPEC_TEXT_BYTES} fit on the launch command line (put large "
                             "input in a file in the payload instead)")
        return self

    def new_job_id(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return f"{self.name}-{stamp}-{secrets.token_hex(wire.JOB_ID_RANDOM_BYTES)}"

    def job_spec(self, job_id: str, *, root: str, replace: bool = False,
                 python: str | None = None, notify: t.Sequence[str] = (),
                 target: dict[str, t.Any] | None = None) -> dict[str, t.Any]:
        """The agent's launch spec (docs/contracts.md); ``python`` None: the current torch build's.

        ``notify``: the inventory's webhooks, added after the playbook's own; ``target``:
        ``{"host", "ct"}`` for the notifications. Secrets travel by name only (their values
        go on the launch's stdin), and so do the ``env`` entries that hold a credential
        (:meth:`credential_env`).
        """
        routed = self.credential_env()
        env = {k: v for k, v in self.env.items() if k not in routed}
        return {
            "job_id": job_id,
            "name": self.name,
            "command": list(self.command),
            "env": env,
            "workdir": self.workdir or f"{root}/payload",
            "healthy_when": self.healthy_when.to_wire(),
            "timeout_s": self.timeout_s,
            "replace": replace,
            "expect_tok_s": self.expect_tok_s,
            "hang_after_s": self.hang_after_s,
            "phase_budgets_s": dict(self.phase_budgets_s),
            "gpus": list(self.gpus) if isinstance(self.gpus, list) else self.gpus,
            "python": python,
            "restart": self.restart.to_wire() if self.restart is not None else None,
            "max_duration_s": self.max_duration_s,
            "notify": list(dict.fromkeys([*self.notify, *notify])),
            "secrets": [*self.secrets, *routed],
            "target": target,
        }

    def credential_env(self) -> dict[str, str]:
        """The ``env`` entries that hold a credential (:func:`is_credential`): sent as
        secrets, by name in the spec and by value on stdin."""
        return {k: v for k, v in self.env.items() if is_credential(k, v)}

    def secret_names(self) -> list[str]:
        """Every name whose value goes on the launch's stdin: ``secrets`` and the credential
        ``env`` entries."""
        return [*self.secrets, *self.credential_env()]


@dataclass(frozen=True)
class Found:
    """A playbook file found by name, and where it came from."""

    name: str
    path: Path
    origin: str  # "cwd" | "home" | "bundled" (paths.SearchDir.origin), or "path" when given one
    active: bool = True  # False: an earlier directory has a playbook of the same name

    def to_dict(self) -> dict[str, t.Any]:
        return {"name": self.name, "origin": self.origin, "path": str(self.path),
                "active": self.active}


def available() -> list[Found]:
    """Every ``*.yaml`` playbook in lookup order; a shadowed one has ``active=False``."""
    seen: set[str] = set()
    out = []
    for d in paths.playbook_dirs():
        for f in sorted(d.path.glob("*.yaml")) if d.path.is_dir() else ():
            out.append(Found(f.stem, f, d.origin, active=f.stem not in seen))
            seen.add(f.stem)
    return out


def available_names() -> list[str]:
    return sorted({f.name for f in available()})


def locate(path: str | Path) -> Found:
    """A path that exists, else a name looked up in the playbook directories.

    Raises:
        ConfigError: neither (the message lists the directories searched and the names found).
    """
    p = Path(path)
    if p.exists():
        return Found(p.stem, p, "path")
    if not p.suffix and len(p.parts) == 1:
        for d in paths.playbook_dirs():
            candidate = d.path / f"{p.name}.yaml"
            if candidate.is_file():
                return Found(p.name, candidate, d.origin)
    searched = ", ".join(f"{d.path} ({d.origin})" for d in paths.playbook_dirs())
    names = ", ".join(available_names()) or "(none)"
    raise ConfigError(f"playbook {str(path)!r} not found (searched {searched})",
                      hint=f"available: {names}; `opsctl playbooks` lists them with their origin")


def load(path: str | Path) -> Playbook:
    """Load a playbook by path, or by name (see :func:`locate`).

    Raises:
        ConfigError: missing file, bad YAML or an invalid field (file:line field: problem).
    """
    p = locate(path).path
    data, lines = yamlfile.load(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}:1: a playbook is a mapping with at least name and command")
    return yamlfile.validate(Playbook, data, p, lines)
