"""Pure parsers of what a GPU machine shows (driver version, device nodes, ``pct config``
device entries, kernel-log Xid/OOM lines, what NCCL needs of ``/dev/shm``), shared by the container agent and
the host side of ``opsctl doctor``.

Stdlib only, no I/O: every function takes text and returns a value or ``"unknown"`` (or an
empty result), never an exception, whatever the text (tests/unit/test_gpufacts.py checks that
with hypothesis). The formats are the ones recorded on a real H200 machine
(tests/fixtures/h200-gpu-facts/) and NVIDIA's Xid catalog.
"""
