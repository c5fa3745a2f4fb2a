"""The garbage collector around a run (falconet.training.collector): no collection while the
run is assembled, the start-up's objects frozen while it trains and put back after, and the
collector's switch left as the process had it."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref

import pytest

from falconet.plugins import get_plugins
from falconet.training import collector
from falconet.training import trainer as trainer_module
from falconet.training.planning import plan_run
from falconet.training.trainer import Trainer


@pytest.fixture
def collections():
    """The generations of the collections started while the test runs, in order."""
    started: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    try:
        yield started
    finally:
        gc.callbacks.remove(count)
        gc.enable()


def _plan(tiny_run: dict[str, str], plugins, epochs: int = 1):
    return plan_run({**tiny_run, "model": "yolo-n", "epochs": str(epochs), "val": "false"}, plugins)


@pytest.mark.parametrize("was_on", [True, False])
def test_no_collection_runs_while_a_run_is_assembled(tiny_run, collections, monkeypatch, was_on):
    plugins = get_plugins()
    # assembling with the collector on starts collections: the test can see one
    collections.clear()
    trainer_module.assemble(_plan(tiny_run, plugins), plugins)
    assert collections, "assembling a run made too few objects to start a collection"

    seen = {}
    real = trainer_module.assemble

    def observed(plan, plugins):
        seen["on"] = gc.isenabled()
        collections.clear()
        run = real(plan, plugins)
        seen["collections"] = list(collections)
        return run

    monkeypatch.setattr(trainer_module, "assemble", observed)
    (gc.enable if was_on else gc.disable)()
    Trainer(_plan(tiny_run, plugins), plugins)
    assert seen == {"on": False, "collections": []}
    assert gc.isenabled() is was_on  # as the process had it


class _FreezeCount:
    """Records the process's frozen object count at each epoch's end."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_epoch_end(self, run, row) -> None:
        self.counts.append(gc.get_freeze_count())


def test_training_freezes_the_start_up_and_a_dropped_run_is_collected(tiny_run):
    plugins = get_plugins()
    watch = _FreezeCount()
    trainer = Trainer(_plan(tiny_run, plugins, epochs=2), plugins, [watch])
    made = len(gc.get_objects())
    trainer.fit()
    # every epoch trained with at least the start-up's objects frozen
    assert len(watch.counts) == 2 and min(watch.counts) >= made // 2
    assert gc.get_freeze_count() == 0  # put back when fit ended
    # a trainer and its parts refer to each other: only a collection frees them, which a
    # freeze left in place would have prevented
    dropped = weakref.ref(trainer)
    del trainer
    gc.collect()
    assert dropped() is None


FROZEN_AT_START = """
import gc, json, sys
gc.freeze()  # a few hundred objects, as CPython 3.12 freezes at its own start
at_start = gc.get_freeze_count()
from falconet.plugins import get_plugins
from falconet.training.planning import plan_run
from falconet.training.trainer import Trainer

class Watch:
    counts = []
    def on_epoch_end(self, run, row):
        self.counts.append(gc.get_freeze_count())

plugins = get_plugins()
keys = {**json.loads(sys.argv[1]), "model": "yolo-n", "epochs": "1", "val": "false"}
trainer = Trainer(plan_run(keys, plugins), plugins, [Watch()])
made = len(gc.get_objects())
trainer.fit()
print(json.dumps({"at_start": at_start, "made": made, "counts": Watch.counts,
                  "after": gc.get_freeze_count()}))
"""


def test_objects_frozen_at_the_start_do_not_keep_a_run_from_freezing_its_start_up(
    tiny_run, tmp_path
):
    # a guard that froze nothing where anything was frozen already did nothing on 3.12
    script = tmp_path / "frozen_at_start.py"
    script.write_text(FROZEN_AT_START)
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(tiny_run)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0 < seen["at_start"] < seen["made"] // 10
    assert len(seen["counts"]) == 1 and seen["counts"][0] >= seen["made"] // 2
    assert seen["after"] == 0  # gc.unfreeze puts back every frozen object


def test_what_was_made_while_paused_waits_in_the_oldest_generation():
    gc.enable()
    with collector.paused():
        made = [[n] for n in range(1000)]  # more than a young collection's threshold
    # in the oldest generation at once, with no collection run: a young one would not walk it
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(m) in oldest for m in made)
    assert gc.get_freeze_count() == 0


def test_both_put_the_collector_back_when_the_block_raises():
    gc.enable()
    with pytest.raises(RuntimeError), collector.paused():
        raise RuntimeError("inside")
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector.frozen():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("inside")
    assert gc.get_freeze_count() == 0


LOAD_PLUGINS = """
import gc, json, sys

started = []
gc.callbacks.append(lambda phase, info: phase == "start" and started.append(info["generation"]))
from falconet.cli import load_plugins

assert "torch" not in sys.modules
started.clear()  # falconet.cli's own imports (click, pydantic) come before the command's work
plugins = load_plugins()
print(json.dumps({
    "torch": "torch" in sys.modules,
    "commands": sorted(e.name for e in plugins.commands.entries()),
    "collections": started,
    "on": gc.isenabled(),
}))
"""


def test_the_command_loads_its_plugins_and_torch_with_no_collection(tmp_path):
    # a fresh interpreter: torch's import is part of what the command's start pays
    script = tmp_path / "load_plugins.py"
    script.write_text(LOAD_PLUGINS)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["torch"] and "train" in seen["commands"]
    assert seen["collections"] == [] and seen["on"]
