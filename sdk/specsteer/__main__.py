"""`python -m specsteer ...`: the `specsteer` command line without the console script on PATH."""

from specsteer.cli import main

main()
