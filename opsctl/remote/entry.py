"""How a command enters the target: the one piece that differs between kinds of host.

A target is where the agent, the payload, the jobs and the files live. On a Proxmox node it is
an LXC container, entered with ``pct exec <ct> --keep-env 0 --``; on a plain SSH server (a
bare-metal GPU machine, a cloud VM) it is the host itself, entered with nothing at all. Each
:class:`Entry` is an argv prefix and the facts that go with it: whether the target has a
container id, and which host-side checks (``pct`` answers, the container runs, its config
passes the GPU devices) apply. Everything else is shared: the argv is still joined once by
:func:`opsctl.remote.command.host_command`, under the same host-key policy, the same
coreutils ``timeout`` on the host, and the same sudo rule (only ``pct`` ever runs under
``sudo``; a direct host runs nothing as root that its SSH user could not).

Another kind (``docker exec`` into a named container) is one more entry: its prefix
(``docker exec -i --env LC_ALL=C.UTF-8 NAME``), the container's name in the inventory,
its own failure words (``No such container``, ``is not running``) classified like pct's,
a sudoers line for ``docker exec`` (which is root-equivalent, as ``pct push`` is), and
its doctor rows (``docker version``, ``docker inspect`` for ``--gpus``/device requests)
instead of pct's.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from opsctl.config.inventory import DIRECT_CTID
from opsctl.errors import ConfigError
from opsctl.remote.command import guard_argv, pct_argv

if t.TYPE_CHECKING:
    from opsctl.config.inventory import HostSpec

#: doctor's host-side rows that only a Proxmox container has
PROXMOX_ROWS = ("pct", "container-running", "ct-config-devices")


@dataclass(frozen=True)
class Entry:
    """One way into a target."""

    name: str  # the inventory's ``enter`` value
    #: the target is a container named by ``--ct`` (False: the host itself is the target)
    has_container: bool
    #: doctor's host-side rows this kind has no such thing for ("not applicable")
    not_applicable: tuple[str, ...]
    #: why those rows do not apply, as doctor prints it
    why_not: str = ""

    def argv(self, ctid: int, argv: t.Sequence[str], *, timeout: float | None = None,
             keep_env: bool = False, guard: bool = False) -> list[str]:
        """``argv`` as the host runs it to reach the target (without the host-side
        ``env``/``timeout``/``sudo`` words, which :func:`.command.host_command` adds).

        ``pct``: ``pct exec CT --keep-env 0|1 -- [timeout …] argv`` (a deadline in the
        container too: pct is a process boundary). ``direct``: ``argv`` itself (the host's
        ``timeout`` already holds the whole group), or under the exec guard; it runs in the
        SSH session's environment, as the user's own commands there do (``keep_env`` is
        pct's choice between the container's clean one and the session's).
        """
        if self.has_container:
            return pct_argv(ctid, argv, timeout=timeout, keep_env=keep_env, guard=guard)
        inner = [str(a) for a in argv]
        return guard_argv(inner, timeout) if guard else inner


ENTRIES: dict[str, Entry] = {
    "pct": Entry("pct", has_container=True, not_applicable=()),
    "direct": Entry("direct", has_container=False, not_applicable=PROXMOX_ROWS,
                    why_not="not applicable: a direct host (enter: direct) has no pct and no "
                            "container; commands run on the host itself"),
}


def of(host: HostSpec) -> Entry:
    """The entry of ``host`` (its inventory ``enter``)."""
    return ENTRIES[host.enter]


def check_ct(host: HostSpec, ctid: int | None, *, what: str = "--ct") -> int:
    """The container id a command addresses on ``host``: ``ctid`` on a pct host, the pseudo
    id :data:`DIRECT_CTID` on a direct one, which takes none.

    Raises:
        ConfigError: a container id given for a direct host (nothing was sent).
    """
    if of(host).has_container:
        if ctid is None:
            raise ConfigError(f"{host.label}: no container: pass {what}")
        return ctid
    if ctid is not None and ctid != DIRECT_CTID:
        raise ConfigError(f"{host.label} is a direct host (enter: direct): its commands run on "
                          f"the host itself, so it takes no {what} (given {ctid}); nothing was "
                          "sent", hint=f"drop {what}: e.g. opsctl status --host {host.label}")
    return DIRECT_CTID
