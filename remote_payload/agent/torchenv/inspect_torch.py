"""Run BY a build's own python (``python -I inspect_torch.py ...``): facts and verification.

Standalone on purpose (no opsctl imports): it runs in the venv being verified, before
that venv is trusted. Prints one line ``OPSCTL_INSPECT {json}`` last; exit 0 iff every
check passed. Facts are the compile-cache fingerprint inputs.

    python -I inspect_torch.py --facts
    python -I inspect_torch.py --verify --expect-version 2.11.0+cu130 --expect-cuda 13.0 \
        [--require-cuda] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
import typing as t

PREFIX = "OPSCTL_INSPECT "
FAKE_MARKER = "_opsctl_fake_wheel"  # set only by the test suite's fake torch wheels


def facts(torch: t.Any) -> dict[str, t.Any]:
    """Everything a compiled artifact's validity depends on (inductor keys on these too)."""
    try:
        import triton  # type: ignore[import-not-found,unused-ignore]

        triton_version: str | None = str(triton.__version__)
    except Exception:
        triton_version = None
    cuda_available = bool(torch.cuda.is_available())
    gpu_name = None
    if cuda_available:
        try:
            gpu_name = str(torch.cuda.get_device_name(0))
        except Exception as exc:
            gpu_name = f"unknown ({type(exc).__name__})"
    return {
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "gpu": gpu_name,
        "cuda_available": cuda_available,
        "python": platform.python_version(),
        "executable": sys.executable,
        "fake": bool(getattr(torch, FAKE_MARKER, False)),
    }


def _compile_check(torch: t.Any) -> dict[str, t.Any]:
    if getattr(torch, FAKE_MARKER, False):
        return {"name": "compile", "ok": True, "skipped": True,
                "detail": f"fake test wheel (torch.{FAKE_MARKER}): nothing to compile"}
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def f(x: t.Any) -> t.Any:
        return torch.sin(x) * 2 + 1

    t0 = time.monotonic()
    compiled = torch.compile(f)
    x = torch.arange(16, dtype=torch.float32, device=device)
    got = compiled(x)
    ok = bool(torch.allclose(got, f(x)))
    return {"name": "compile", "ok": ok, "skipped": False,
            "detail": f"torch.compile on {device} in {time.monotonic() - t0:.1f}s"
                      + ("" if ok else ": wrong result")}


def verify(torch: t.Any, args: argparse.Namespace) -> list[dict[str, t.Any]]:
    checks: list[dict[str, t.Any]] = []
    version = str(torch.__version__)
    checks.append({"name": "version", "ok": version == args.expect_version,
                   "detail": f"torch.__version__ = {version!r}, expected {args.expect_version!r}"})
    want_cuda = None if args.expect_cuda == "none" else args.expect_cuda
    cuda = torch.version.cuda
    checks.append({"name": "cuda-version", "ok": cuda == want_cuda,
                   "detail": f"torch.version.cuda = {cuda!r}, expected {want_cuda!r}"})
    if args.require_cuda:
        avail = bool(torch.cuda.is_available())
        checks.append({"name": "cuda-available", "ok": avail,
                       "detail": f"torch.cuda.is_available() = {avail} (the container has GPUs)"})
    if not args.no_compile:
        try:
            checks.append(_compile_check(torch))
        except Exception as exc:
            checks.append({"name": "compile", "ok": False, "skipped": False,
                           "detail": f"{type(exc).__name__}: {exc}"[:2000]})
            traceback.print_exc()
    return checks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--facts", action="store_true")
    p.add_argument("--verify", action="store_true")
    p.add_argument("--expect-version", default="")
    p.add_argument("--expect-cuda", default="none")
    p.add_argument("--require-cuda", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args(argv)
    out: dict[str, t.Any] = {"ok": True}
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:
        traceback.print_exc()
        out = {"ok": False, "checks": [{"name": "import", "ok": False,
                                        "detail": f"import torch: {type(exc).__name__}: {exc}"}]}
        print(PREFIX + json.dumps(out), flush=True)
        return 1
    out["facts"] = facts(torch)
    if args.verify:
        out["checks"] = verify(torch, args)
        out["ok"] = all(c["ok"] for c in out["checks"])
    print(PREFIX + json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
