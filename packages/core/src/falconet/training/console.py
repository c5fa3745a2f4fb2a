"""What a run shows when it is started from Python: the CLI's progress, unless asked not to.

The trainer speaks through the ``falconet`` loggers (the resolved keys, one line per epoch,
the final table's inputs). The CLI sets logging up itself; a Python program that set up no
logging of its own would see none of it, so ``Detector.train`` shows it the CLI's way for the
call's duration. A program that configured logging keeps its own handlers and levels.
``verbose=False`` trains quietly: no lines below warnings, and no progress bar.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

LOGGER = "falconet"


@contextlib.contextmanager
def run_output(verbose: bool) -> Iterator[None]:
    """Show the ``falconet`` loggers' info lines on stderr for the block (``verbose``, where
    nobody set logging up), or only their warnings (not ``verbose``)."""
    logger = logging.getLogger(LOGGER)
    level = logger.level
    handler = None
    if not verbose:
        logger.setLevel(logging.WARNING)
    elif not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)
        if handler is not None:
            logger.removeHandler(handler)


def without_progress(callbacks: list) -> list:
    """``callbacks`` less the console's progress bar (a quiet run's)."""
    return [c for c in callbacks if getattr(c, "name", None) != "progress"]
