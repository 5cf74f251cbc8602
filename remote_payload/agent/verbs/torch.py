"""Agent verbs for torch builds and compile caches; the work is in ``torchenv``.

    envs        [--history N]
    swap        --variant V --version X (--index-url URL | --wheelhouse DIR)
                [--requirement R ...] [--requirements-index-url URL] [--reinstall] [--dry-run]
                [--install-only]
                [--pip-retries N] [--pip-timeout S] [--install-timeout S]
    cache-info
    cache-clear [--all | --fingerprint FP]
    cache-seed  --command-json '["python3","-m","remote_payload.trainer",...]'
                [--workdir DIR] [--env-json '{}'] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import typing as t

from remote_payload.agent.common import AgentFailure
from remote_payload.agent.torchenv import caches, seed
from remote_payload.agent.torchenv.builds import envs_report
from remote_payload.agent.torchenv.layout import Layout
from remote_payload.agent.torchenv.swap import SwapRequest, swap
from remote_payload.wire import ErrorType


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    if verb == "envs":
        parser.add_argument("--history", type=int, default=20, help="last N swaps to include")
    elif verb == "swap":
        parser.add_argument("--variant", required=True, help="cpu | cu128 | cu130 | ...")
        parser.add_argument("--version", required=True, help="torch release, e.g. 2.11.0")
        parser.add_argument("--index-url", default=None)
        parser.add_argument("--wheelhouse", default=None, help="install --no-index from this dir")
        parser.add_argument("--requirement", action="append", default=[], dest="requirements")
        parser.add_argument("--requirements-index-url", default=None)
        parser.add_argument("--reinstall", action="store_true")
        parser.add_argument("--dry-run", action="store_true")
        parser.add_argument("--install-only", action="store_true",
                            help="install + verify, do not switch (allowed while a job runs)")
        parser.add_argument("--pip-retries", type=int, default=3)
        parser.add_argument("--pip-timeout", type=float, default=60.0)
        parser.add_argument("--install-timeout", type=float, default=3600.0)
    elif verb == "cache-clear":
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--all", action="store_true", dest="clear_all")
        group.add_argument("--fingerprint", default=None)
    elif verb == "cache-seed":
        parser.add_argument("--command-json", required=True, help="the job's command, JSON list")
        parser.add_argument("--workdir", default=None)
        parser.add_argument("--env-json", default="{}")
        parser.add_argument("--timeout", type=float, default=1800.0)


def _json_arg(name: str, raw: str, kind: type) -> t.Any:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise AgentFailure(ErrorType.UsageError, f"{name} is not JSON: {exc}") from None
    if not isinstance(value, kind):
        raise AgentFailure(ErrorType.UsageError, f"{name} must be a JSON {kind.__name__}")
    return value


def run(verb: str, args: argparse.Namespace) -> t.Any:
    layout = Layout(args.root)
    if verb == "envs":
        return envs_report(layout, args.history)
    if verb == "swap":
        return swap(layout, SwapRequest(
            version=args.version, variant=args.variant, index_url=args.index_url,
            wheelhouse=args.wheelhouse, requirements=tuple(args.requirements),
            requirements_index_url=args.requirements_index_url, reinstall=args.reinstall,
            dry_run=args.dry_run, install_only=args.install_only,
            pip_retries=args.pip_retries, pip_timeout_s=args.pip_timeout,
            install_timeout_s=args.install_timeout))
    if verb == "cache-info":
        return caches.cache_info(layout)
    if verb == "cache-clear":
        return caches.cache_clear(layout, clear_all=args.clear_all, fingerprint=args.fingerprint)
    if verb == "cache-seed":
        command = _json_arg("--command-json", args.command_json, list)
        env = _json_arg("--env-json", args.env_json, dict)
        return seed.seed(layout, [str(a) for a in command], workdir=args.workdir,
                         env_extra={str(k): str(v) for k, v in env.items()},
                         timeout_s=args.timeout)
    raise AgentFailure(ErrorType.UsageError, f"verb {verb!r} is not a torch verb")
