"""Python's cyclic garbage collector around a run: paused while the run is assembled, and kept
off the start-up's objects while it trains.

A full collection walks every object the interpreter tracks, holding the interpreter the whole
time, and Python starts one whenever the objects that survived younger collections since the
last full one reach a quarter of those it already holds. With torch, ``torch._dynamo`` (which
brings sympy) and a run in memory that is several hundred thousand objects: the full
collections fall in the start-up's imports (``torch._dynamo``'s, several times) and, much
later, in training, once enough of the batches' short-lived objects have been promoted; there
one holds the training thread while the GPU drains its queue (docs/performance.md, "The
garbage collector"; what each costs, measured: the lab log).

* :func:`paused`: the collector off while the run is assembled (the imports made ahead, the
  dataset's check, the network, the GPU cache), and in the ``falconet`` command while it loads
  the plugins (torch's import among them): what that makes lives as long as the run. It
  is switched back on after, with what was made meanwhile moved to the oldest generation
  (:func:`gc.freeze` then :func:`gc.unfreeze`, which is what the latter does with frozen
  objects), so that the next young collection does not walk all of it at once.
* :func:`frozen`: while :meth:`~falconet.training.trainer.Trainer.fit` trains, the objects
  alive at its start are moved out of the collector's reach (:func:`gc.freeze`), so its
  collections walk only what training makes; they are put back when ``fit`` ends
  (:func:`gc.unfreeze`), so that a run dropped afterwards (a trainer and its parts refer to
  each other) is collected. Loader workers forked meanwhile share those objects' pages with
  the trainer instead of copying them as a collection touches them (the use
  :func:`gc.freeze` documents).

:func:`gc.unfreeze` puts back every frozen object, not only the ones frozen here: also those
the interpreter froze at its own start (CPython 3.12 does, a few hundred) and those a process
froze before a run. Both functions use it, so such objects are in the collector's reach again
after a run starts. Telling them apart is not possible (a count is all :mod:`gc` gives), and a
guard that froze nothing where anything was frozen already did nothing at all on 3.12.
The collector's switch (:func:`gc.isenabled`) is put back as it was, also when the block
raises.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off inside the block; on again after, where it was on before,
    with the objects alive then in the oldest generation (module docstring)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_on:
            gc.enable()


@contextmanager
def frozen() -> Iterator[None]:
    """Every object alive now out of the collector's reach inside the block, every frozen
    object back in it after (module docstring)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
