"""Local side of torch builds and compile caches: swap-torch, envs, cache info/clear/seed.

The work happens in the container (``remote_payload/agent/torchenv`` through agent verbs);
this module picks the build from the builds table, prepares a wheelhouse for air-gapped
builds (streamed in by :mod:`opsctl.remote.wheelhouse`), and turns replies into reports.
Deploy's torch step (build current, cache policy applied) is in :mod:`.deploy`.
"""

from __future__ import annotations

import json
import typing as t

from opsctl.config import paths, torch_builds
from opsctl.errors import ConfigError, TorchEnvError
from opsctl.ops import wheelhouse as wheel_download
from opsctl.remote import wheelhouse as wheels
from remote_payload import wire_shapes as ws

if t.TYPE_CHECKING:
    from opsctl.config.playbook import Playbook
    from opsctl.ops.jobs import Target

Progress = t.Callable[[str], None]
SWAP_TIMEOUT_S = 3600.0


class WheelhouseReport(t.TypedDict):
    """The wheels downloaded on this machine and streamed into the container."""

    files: int
    bytes: int  # sent into the container
    download_s: float
    log_path: str  # pip download's output, on this machine
    sent: int
    present: int  # already in the container's wheelhouse
    seconds: t.NotRequired[float]


class SwapReport(ws.SwapDoc, total=False):
    """``swap-torch``: the agent's ``swap`` reply, the pin, the wheelhouse streamed in (an
    air-gapped build) and the command's own time."""

    pin: str
    wheelhouse: WheelhouseReport
    elapsed_s: float


def builds_table(tgt: Target) -> torch_builds.BuildsTable:
    return torch_builds.load_table(tgt.inventory.torch_builds, tgt.host.torch_builds)


def swap(tgt: Target, variant: str, *, version: str | None = None, index_url: str | None = None,
         wheelhouse: bool | None = None, requirements: t.Sequence[str] = (), dry_run: bool = False,
         reinstall: bool = False, install_only: bool = False,
         progress: Progress | None = None) -> SwapReport:
    """Make ``variant`` the container's current torch build (install if needed).

    ``install_only`` installs and verifies the build without switching to it; the agent
    allows that while a job runs, since the running job's build is not touched.

    Raises:
        ConfigError: unknown variant (lists the known ones).
        TorchEnvError: download, install or verification failed; the old build stays current.
    """
    check_index_url(index_url)
    build = builds_table(tgt).resolve(variant, version=version, index_url=index_url,
                                      wheelhouse=wheelhouse)
    report: dict[str, t.Any] = {"build": build.name, "pin": build.pin}  # a SwapReport once complete
    if dry_run:
        _payload_present(tgt)  # a dry run ships nothing either
    else:
        tgt.agent.ensure_payload()
    envs = tgt.agent.call("envs", timeout=60)
    installed = {b["name"] for b in envs["builds"]}
    wheel_dir = None
    checked_here: list[str] = []
    if build.wheelhouse and (build.name not in installed or reinstall) and dry_run:
        checked_here.append(check_wheelhouse_index(build))  # where its wheels would come from
    if build.wheelhouse and (build.name not in installed or reinstall) and not dry_run:
        dest = paths.home() / "wheelhouse" / build.name
        if progress:
            progress(f"downloading {build.requirement} and its dependencies on this machine")
        wh = wheel_download.prepare_wheelhouse(build, dest, requirements=requirements,
                                               on_line=_pip_progress(progress))
        wheel_dir = torch_builds.remote_wheelhouse_dir(tgt.host.root, build)
        report["wheelhouse"] = {"files": len(wh.files), "bytes": wh.total_bytes,
                                "download_s": wh.seconds, "log_path": str(wh.log_path),
                                **wheels.push_wheels(tgt.agent, wh.files, wheel_dir, progress)}
    elif build.wheelhouse:
        wheel_dir = torch_builds.remote_wheelhouse_dir(tgt.host.root, build)
    args = torch_builds.swap_args(build, wheelhouse_dir=wheel_dir, requirements=requirements,
                                  reinstall=reinstall, dry_run=dry_run, install_only=install_only)
    if progress:
        switch = build.name in installed and not reinstall
        if dry_run:
            progress(f"dry run: would {'switch to' if switch else 'install'} {build.name}"
                     + ("" if switch or build.wheelhouse else
                        f"; checking that {build.index_url} has torch {build.pin}"))
        else:
            progress(f"{'switching to' if switch else 'installing'} {build.name} in the container"
                     + ("" if switch else " (pip + verify: minutes)"))
    report.update(tgt.agent.call(
        "swap", *args, timeout=SWAP_TIMEOUT_S, on_stderr=_line_progress(progress)))
    if checked_here:
        report["checked"] = [*checked_here, *(report.get("checked") or [])]
    return t.cast(SwapReport, report)


#: The index URLs a swap accepts (the agent checks them too: ``INDEX_SCHEMES`` in
#: ``remote_payload/agent/torchenv/swap.py``); ``file:`` names a PEP 503 directory in the container.
INDEX_SCHEMES = ("http", "https", "file")


def check_index_url(index_url: str | None) -> None:
    """Refuse, before connecting, an ``--index-url`` pip could not use as an index.

    Raises:
        ConfigError: another scheme (``ftp:``, ``data:``, a bare path), or no host for http(s).
    """
    if index_url is None:
        return
    from urllib.parse import urlparse

    parts = urlparse(index_url)
    if (parts.scheme.lower() not in INDEX_SCHEMES or any(c.isspace() or ord(c) < 32 for c in index_url)
            or (parts.scheme.lower() != "file" and not parts.netloc)):
        raise ConfigError(f"--index-url {index_url!r}: not an index URL "
                          f"(http://, https:// or file:///dir of a PEP 503 index)")


#: a dry run's look at the index from this machine: never a hang
DRY_RUN_INDEX_TIMEOUT_S = 20.0


def check_wheelhouse_index(build: torch_builds.TorchBuild,
                           timeout_s: float = DRY_RUN_INDEX_TIMEOUT_S) -> str:
    """A wheelhouse build's dry run: the index its wheels would be downloaded from here
    (``download_index_url``, else the build's ``index_url``) answers and has torch
    ``build.pin``. Returns the fact checked. An answer that settles nothing (an HTTP error
    pip may get past with its own credentials, a page over the size bound) is said so.

    A dry run looks up no host name: only a ``file:`` index or one addressed by an IP literal
    is read; an index on a named host is left to the real run, and the fact says so. A dry
    run is what a user runs to see what would happen, on a machine whose resolver may leak
    the lookup or hang on it, and the lookup itself is not what the run would change.

    Raises:
        TorchEnvError: the index cannot be reached or read, or lacks the version.
    """
    from remote_payload import torchindex

    index = build.download_index_url or build.index_url
    check_index_url(index)
    named = _named_host(index)
    if named is not None:
        return (f"not checked here: {index} is on the named host {named}, and a dry run looks "
                "up no host names (the real run downloads from it)")
    view = torchindex.read_index(index, timeout_s=timeout_s)
    hint = ("point download_index_url (builds table) at an index this machine reaches that "
            "has the version, or pick another with --version")
    if view.error is not None:
        raise TorchEnvError(f"dry run: downloading {build.name}'s wheels here would fail: "
                            f"{view.error}; nothing was changed", hint=hint)
    if view.versions is None:
        return f"{index} answered, but its torch page could not be read (pip decides)"
    if build.pin not in view.versions:
        raise TorchEnvError("dry run: downloading {}'s wheels here would fail: {}; nothing was "
                            "changed".format(build.name, torchindex.missing_version_detail(
                                index, build.pin, view.versions)), hint=hint)
    return f"the index this machine downloads from has torch {build.pin} ({index})"


def _named_host(index_url: str) -> str | None:
    """The host name an http(s) index URL would have to look up; None for ``file:`` and for
    an IP literal (``127.0.0.1``, ``[::1]``), which are reached without a lookup."""
    import ipaddress
    from urllib.parse import urlparse

    parts = urlparse(index_url)
    if parts.scheme.lower() == "file":
        return None
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host
    return None


def _payload_present(tgt: Target) -> None:
    """A dry run asks the container's agent, and may not ship it.

    Raises:
        ConfigError: the container has no payload, or an older one.
    """
    from opsctl.remote import payload

    if tgt.agent.remote_digest() != payload.build_manifest().digest:
        raise ConfigError(f"{tgt.label}: dry run: the container has no current opsctl payload, "
                          "and a dry run ships nothing, so it cannot ask there",
                          hint="opsctl swap-torch without --dry-run (or any deploy) ships it")


def _pip_progress(progress: Progress | None) -> t.Callable[[str], None] | None:
    if progress is None:
        return None

    def on_line(line: str) -> None:
        if line.startswith(("Collecting", "Saved", "Downloading", "File was already")):
            progress(line.strip()[:120])

    return on_line


def _line_progress(progress: Progress | None) -> t.Callable[[bytes], None] | None:
    if progress is None:
        return None
    buf = bytearray()

    def on_stderr(chunk: bytes) -> None:
        buf.extend(chunk)
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            text = line.decode("utf-8", "replace").strip()
            if text:
                progress(text[:120])

    return on_stderr


def envs(tgt: Target, history: int) -> ws.EnvsDoc:
    """The container's torch builds and the last ``history`` swaps (payload shipped first)."""
    tgt.agent.ensure_payload()
    return tgt.agent.call("envs", "--history", str(history), timeout=60)


def cache_info(tgt: Target) -> ws.CacheInfoDoc:
    tgt.agent.ensure_payload()
    return tgt.agent.call("cache-info", timeout=120)


def cache_clear(tgt: Target, *, clear_all: bool) -> ws.CacheClearDoc:
    tgt.agent.ensure_payload()
    return tgt.agent.call(
        "cache-clear", *(["--all"] if clear_all else []), timeout=300)


def seed_cache(tgt: Target, book: Playbook, timeout_s: float,
               progress: Progress | None = None) -> ws.CacheSeedDoc:
    """``opsctl cache seed``: the current payload, then :func:`cache_seed`."""
    tgt.agent.ensure_payload()
    if progress:
        progress("compiling every shape bucket cold, then again from the seeded cache…")
    return cache_seed(tgt, book, timeout_s)


def cache_seed(tgt: Target, book: Playbook, timeout_s: float = 1800.0) -> ws.CacheSeedDoc:
    """Warm the current build's cache with ``book``'s exact shapes; proves reuse by hit counters."""
    args = ["--command-json", json.dumps(book.command), "--env-json", json.dumps(book.env),
            "--timeout", f"{timeout_s:g}"]
    if book.workdir:
        args += ["--workdir", book.workdir]
    return tgt.agent.call("cache-seed", *args, timeout=timeout_s * 2 + 60)
