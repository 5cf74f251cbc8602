"""The container agent: ``python3 -m remote_payload.agent [--root R] VERB ... --json``.

Stdlib plus libtmux (shipped as a wheel in ``remote_payload/wheels``) only; it
answers exactly one JSON document (see :mod:`remote_payload.wire`).
"""
