"""Test helper: tiny fake ``torch`` wheels and a PEP 503 "simple" index on 127.0.0.1.

The wheels are built by hand (files + METADATA/WHEEL/RECORD, zipped): no setuptools,
no network. Each fake torch sets ``torch._opsctl_fake_wheel = True`` so verification
skips its compile check explicitly (there is nothing to compile), and nothing else.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import html
import http.server
import os
import socket
import threading
import typing as t
import zipfile


@dataclasses.dataclass(frozen=True)
class FakeTorch:
    """One fake wheel: ``version`` (with local tag) and what ``torch.version.cuda`` says."""

    version: str  # "2.11.0+cu128"
    cuda: str | None  # "12.8"; deliberately wrong for a wheel that must fail verification
    import_error: str | None = None  # raise this on import instead


DEFAULT_FAKES = (
    FakeTorch("2.11.0+cu128", "12.8"),
    FakeTorch("2.11.0+cu130", "13.0"),
    FakeTorch("2.11.0+cu126", "12.4"),  # installs fine, fails the cuda-version check
)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(dest: str, name: str, version: str, files: t.Mapping[str, str],
                requires: t.Sequence[str] = ()) -> str:
    """Write ``<name>-<version>-py3-none-any.whl`` with ``files`` (path -> text) into ``dest``."""
    dist_info = f"{name}-{version}.dist-info"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    contents = dict(files)
    contents[f"{dist_info}/METADATA"] = meta
    contents[f"{dist_info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: opsctl-tests\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = [f"{p},{_record_hash(c.encode())},{len(c.encode())}" for p, c in contents.items()]
    record.append(f"{dist_info}/RECORD,,")
    contents[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    path = os.path.join(dest, f"{name}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p, c in contents.items():
            zf.writestr(p, c)
    return path


def fake_torch_files(fake: FakeTorch) -> dict[str, str]:
    init = (f"raise ImportError({fake.import_error!r})\n" if fake.import_error else "") + (
        f'__version__ = "{fake.version}"\n'
        "_opsctl_fake_wheel = True  # tells verification there is nothing to compile\n"
        "from . import cuda, version\n")
    return {
        "torch/__init__.py": init,
        "torch/version.py": f"__version__ = {fake.version!r}\ncuda = {fake.cuda!r}\n",
        "torch/cuda.py": ("def is_available():\n    return False\n\n"
                          "def get_device_name(index=0):\n"
                          "    raise RuntimeError('no GPU in a fake wheel')\n"),
    }


def build_fake_torches(dest: str, fakes: t.Sequence[FakeTorch] = DEFAULT_FAKES) -> list[str]:
    os.makedirs(dest, exist_ok=True)
    return [build_wheel(dest, "torch", f.version, fake_torch_files(f)) for f in fakes]


def write_simple_index(root: str, wheels: t.Sequence[str]) -> None:
    """PEP 503 layout under ``root``: ``simple/<project>/index.html`` + ``files/``."""
    files_dir = os.path.join(root, "files")
    os.makedirs(files_dir, exist_ok=True)
    projects: dict[str, list[str]] = {}
    for wheel in wheels:
        name = os.path.basename(wheel)
        target = os.path.join(files_dir, name)
        if os.path.abspath(wheel) != os.path.abspath(target):
            with open(wheel, "rb") as src, open(target, "wb") as dst:
                dst.write(src.read())
        project = name.split("-")[0].lower().replace("_", "-")
        projects.setdefault(project, []).append(name)
    simple = os.path.join(root, "simple")
    os.makedirs(simple, exist_ok=True)
    links = "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(projects))
    with open(os.path.join(simple, "index.html"), "w") as f:
        f.write(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    for project, names in projects.items():
        os.makedirs(os.path.join(simple, project), exist_ok=True)
        anchors = []
        for name in sorted(names):
            with open(os.path.join(files_dir, name), "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            href = html.escape(f"../../files/{name.replace('+', '%2B')}#sha256={sha}")
            anchors.append(f'<a href="{href}">{html.escape(name)}</a><br/>\n')
        with open(os.path.join(simple, project, "index.html"), "w") as f:
            f.write("<!DOCTYPE html><html><body>\n" + "".join(anchors) + "</body></html>\n")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: t.Any) -> None:
        pass


@contextlib.contextmanager
def serve_index(root: str) -> t.Iterator[str]:
    """Serve ``root`` on 127.0.0.1:<random>; yields the ``.../simple`` index URL."""
    handler = functools.partial(_QuietHandler, directory=root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    """An index URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"
