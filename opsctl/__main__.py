"""`python -m opsctl` = the `opsctl` console script."""

from opsctl.cli import main

main()
