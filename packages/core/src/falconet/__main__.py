"""``python -m falconet``: the same as the ``falconet`` command."""

from falconet.cli import main

main()
