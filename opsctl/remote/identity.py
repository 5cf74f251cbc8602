"""Check an inventory ``identity_file`` before paramiko reads it.

Why: paramiko opens the path as it is given and blocks for ever on a FIFO, and reports a
missing, unreadable or non-key file as a connection failure ("cannot connect … No such
file or directory", exit 10), which sends the user to the network when the mistake is in
the inventory. Here the file is read as a regular file of at most :data:`LIMIT` bytes
(:func:`.knownhosts.read_regular`) and parsed by paramiko's own loader; a file that fails is a
:class:`~opsctl.errors.ConfigError` (exit 2) naming it. A passphrase-protected key passes:
the connect reports it as an authentication failure, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from opsctl.errors import ConfigError
from opsctl.remote import knownhosts

#: Largest private key file read (an RSA 16384-bit key is about 13 KiB).
LIMIT = 1024 * 1024


def check(path: str, label: str) -> str:
    """``path`` with ``~`` expanded, once it holds a private key paramiko can load.

    Raises:
        ConfigError: it is missing, not a regular file, too large, unreadable or not a key.
    """
    import paramiko

    full = os.path.expanduser(path)
    where = f"{label}: identity_file {full}"
    hint = "set identity_file in the inventory to a private key file (ssh-keygen makes one)"
    try:
        knownhosts.read_regular(Path(full), LIMIT)
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist", hint=hint) from None
    except ValueError as exc:
        raise ConfigError(f"{where} {exc}", hint=hint) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc.strerror}", hint=hint) from None
    try:
        paramiko.PKey.from_path(full)
    except paramiko.PasswordRequiredException:
        pass  # the connect says so (AuthError), as for any key it cannot use
    except TypeError as exc:  # cryptography's words for a PEM key with a passphrase
        if "password" not in str(exc):
            raise ConfigError(f"{where} is not a private key paramiko can read ({exc})",
                              hint=hint) from None
    except Exception as exc:  # paramiko's loaders raise SSHException, ValueError, and more
        raise ConfigError(f"{where} is not a private key paramiko can read "
                          f"({str(exc) or type(exc).__name__})", hint=hint) from None
    return full
