"""What a PEP 503 index says about torch: which versions it has, or why it could not be read.

Shared by the agent (a swap's preflight and dry run, from the container) and the CLI (a
wheelhouse build's dry run, from this machine, where its wheels would be downloaded), so
both read an index the same way. Stdlib only, Python >= 3.10. pip itself says only "from
versions: none" when it cannot connect with retries off, hence a reader of its own; bounded
in time (``timeout_s``) and size (``limit``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing as t
import urllib.error
import urllib.parse
import urllib.request

from remote_payload import wire

_HREF_RE = re.compile(r"torch-([^-/\"'#]+)-[^/\"'#]*\.whl")


@dataclasses.dataclass(frozen=True)
class IndexView:
    """What the build's index says about torch, as far as it could be read."""

    error: str | None  # "cannot reach URL: [Errno 111] Connection refused"; None: reachable
    versions: frozenset[str] | None  # None: inconclusive (HTTP error, page too big, auth)


#: The index URL schemes a swap accepts (pip's own; ``file:`` names a PEP 503 directory).
INDEX_SCHEMES = ("http", "https", "file")


def _read_file_index(index_url: str) -> IndexView:
    """A ``file:`` index: ``<dir>/torch/`` with an ``index.html`` or the wheels themselves."""
    path = urllib.request.url2pathname(urllib.parse.urlparse(index_url).path)
    project = os.path.join(path, "torch")
    if not os.path.isdir(path):
        return IndexView(f"cannot reach {index_url}: {path} is not a directory", None)
    if not os.path.isdir(project):
        return IndexView(f"cannot reach {index_url}: {path} is not a PEP 503 index "
                         "(no torch/ directory in it)", None)
    page = os.path.join(project, "index.html")
    try:
        if os.path.isfile(page):
            with open(page, encoding="utf-8", errors="replace") as f:
                text = f.read(16 << 20)
            return IndexView(None, frozenset(urllib.parse.unquote(m.group(1))
                                             for m in _HREF_RE.finditer(text)))
        names = os.listdir(project)
    except OSError as exc:
        return IndexView(f"cannot read {index_url}: {exc.strerror}", None)
    return IndexView(None, frozenset(m.group(1) for n in names
                                     if (m := wire.TORCH_WHEEL_RE.match(n))))


def read_index(index_url: str, timeout_s: float = 15.0, limit: int = 16 << 20) -> IndexView:
    """Read ``<index>/torch/`` (PEP 503). pip says only "from versions: none" when it
    cannot connect with retries off, so the agent asks the index itself."""
    scheme = urllib.parse.urlparse(index_url).scheme.lower()
    if scheme not in INDEX_SCHEMES:
        return IndexView(f"{index_url}: not an index URL (use {', '.join(INDEX_SCHEMES)})", None)
    if scheme == "file":
        return _read_file_index(index_url)
    url = index_url.rstrip("/") + "/torch/"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            raw = resp.read(limit + 1)
    except urllib.error.HTTPError:
        return IndexView(None, None)  # auth or layout pip may handle better: let pip decide
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return IndexView(f"cannot reach {index_url}: {getattr(exc, 'reason', exc)}", None)
    if len(raw) > limit:
        return IndexView(None, None)
    page = raw.decode("utf-8", "replace")
    return IndexView(None, frozenset(urllib.parse.unquote(m.group(1))
                                     for m in _HREF_RE.finditer(page)))


def missing_version_detail(index_url: str, pinned: str, versions: t.Iterable[str]) -> str:
    tag = pinned.partition("+")[2]
    same = sorted(v for v in versions if v.endswith(f"+{tag}")) or sorted(versions)
    shown = ", ".join(same[-10:]) or "no torch wheels"
    return f"torch {pinned} is not on {index_url} (it has: {shown})"


