"""``profile=true`` through the trainer: the core's seam (keys, request_stop, the missing-plugin
error) and falconet-profiler inside real CPU runs (hooks removed, same weights, DDP ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from falconet import Detector
from falconet.plugins import Plugins
from falconet.registry import UnknownNameError
from falconet.training.checkpoint import load_checkpoint
from falconet.training.phases import NO_PHASES
from falconet.training.setup import callback_names, plan_run
from falconet.training.trainer import Trainer
from falconet_profiler.callback import Profiler
from falconet_profiler.report import format_report
from falconet_profiler.window import PhaseClock


@pytest.fixture
def keys(tiny_run):
    return {**tiny_run, "val": "false", "nbs": "16"}  # 3 batches an epoch, accumulate 2


class StopAt:
    """Calls ``trainer.request_stop`` after the ``batch``-th batch of the run."""

    def __init__(self, batch: int) -> None:
        self.batch, self.seen = batch, 0

    def on_step_end(self, trainer):
        self.seen += 1
        if self.seen == self.batch:
            trainer.request_stop(f"stopped by the test after batch {self.batch}")


def test_request_stop_inside_an_epoch_saves_nothing_of_it(keys, installed_falconet_plugins):
    plan = plan_run({**keys, "epochs": 3}, installed_falconet_plugins)
    summary = Trainer(plan, installed_falconet_plugins, [StopAt(5)]).fit()
    run = Path(summary["run_dir"])
    assert summary["stop_reason"] == "stopped by the test after batch 5"
    assert summary["epochs"] == 1  # epoch 2 stopped at its 2nd batch: not claimed
    assert load_checkpoint(run / "weights" / "last.pt")["epoch"] == 1


def test_request_stop_at_an_epochs_end_keeps_that_epoch(keys, installed_falconet_plugins):
    plan = plan_run({**keys, "epochs": 3}, installed_falconet_plugins)
    summary = Trainer(plan, installed_falconet_plugins, [StopAt(6)]).fit()
    assert summary["epochs"] == 2
    assert load_checkpoint(Path(summary["run_dir"]) / "weights" / "last.pt")["epoch"] == 2


def test_profile_needs_the_plugin(keys, falconet_plugins, add_falconet_plugin):
    import falconet_detect

    add_falconet_plugin(falconet_detect, name="detect", distribution="falconet-detect")
    with pytest.raises(UnknownNameError) as info:  # the built-ins and detect, no profiler
        plan_run({**keys, "profile": "true"}, falconet_plugins)
    assert "profile=true needs: pip install falconet-profiler" in str(info.value)
    disabled = Plugins(env={"FALCONET_DISABLE_PLUGINS": "falconet-profiler"}).load()
    with pytest.raises(UnknownNameError, match="falconet-profiler is installed but disabled"):
        plan_run({**keys, "profile": "true"}, disabled)


def test_the_profiler_is_added_only_when_asked(keys, installed_falconet_plugins):
    plugins = installed_falconet_plugins
    assert callback_names(plan_run(keys, plugins).config) == []
    on = plan_run({**keys, "profile": "true", "callbacks": "example-steps"}, plugins).config
    assert callback_names(on) == ["example-steps", "profiler"]
    both = plan_run({**keys, "profile": "true", "callbacks": "profiler"}, plugins).config
    assert callback_names(both) == ["profiler"]


class PhasesSeen:
    """Records what ``trainer.phases`` is after each batch (after the profiler's own
    ``on_step_end``, which runs first)."""

    def __init__(self):
        self.kinds: list[str] = []

    def on_step_end(self, trainer):
        phases = trainer.phases
        self.kinds.append(
            "clock"
            if isinstance(phases, PhaseClock)
            else "none"
            if phases is NO_PHASES
            else repr(phases)
        )


def test_the_window_hooks_in_and_out_and_training_goes_on(keys, installed_falconet_plugins):
    plan = plan_run(
        {**keys, "epochs": 3, "profile": "true", "profile_warmup": 1, "profile_steps": 4},
        installed_falconet_plugins,
    )
    seen = PhasesSeen()
    summary = Trainer(plan, installed_falconet_plugins, [Profiler(), seen]).fit()
    # batch 1 (0-based) is the first optimizer step and batch 2 the one discarded after it:
    # the clock is installed after batch 1 for batches 2-5, then the default is back
    assert seen.kinds == ["none"] + ["clock"] * 4 + ["none"] * 4
    assert summary["epochs"] == 3 and summary["stop_reason"] == ""
    assert (Path(summary["run_dir"]) / "profile.json").exists()


def test_profile_leaves_the_run_identical(keys):
    plain = Detector("yolo-n").train(**keys, epochs=2, name="plain")
    profiled = Detector("yolo-n").train(
        **keys, epochs=2, name="profiled", profile=True, profile_warmup=1, profile_steps=4
    )
    assert (Path(profiled["run_dir"]) / "profile.json").exists()
    a = load_checkpoint(Path(plain["run_dir"]) / "weights" / "last.pt")
    b = load_checkpoint(Path(profiled["run_dir"]) / "weights" / "last.pt")
    for name in ("model", "weights"):
        assert a[name].keys() == b[name].keys()
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key]), key


def test_other_ranks_measure_nothing_but_stop_with_rank_0(keys, installed_falconet_plugins):
    plan = plan_run(
        {
            **keys,
            "epochs": 3,
            "profile": "true",
            "profile_warmup": 0,
            "profile_steps": 3,
            "profile_then_stop": "true",
        },
        installed_falconet_plugins,
    )
    seen = PhasesSeen()
    summary = Trainer(plan, installed_falconet_plugins, [Profiler(rank=1), seen]).fit()
    assert seen.kinds == ["none"] * 4  # never hooked in, stopped after the window's 4 batches
    assert "stopped after profiling" in summary["stop_reason"]
    assert not (Path(summary["run_dir"]) / "profile.json").exists()


def test_train_cli_with_profile_then_stop(falconet_cli, keys):
    pairs = [f"{k}={v}" for k, v in keys.items()]
    done = falconet_cli(
        "train",
        *pairs,
        "epochs=5",
        "profile=true",
        "profile_warmup=0",
        "profile_steps=3",
        "profile_then_stop=true",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "profile: " in done.stderr and "phases (synchronised, ms per batch)" in done.stderr
    assert "stopped after profiling (profile_then_stop=true): 4 batches" in done.stdout
    run = Path(done.stdout.splitlines()[0].removeprefix("run folder: "))
    assert (run / "timeline.html").exists()
    assert load_checkpoint(run / "weights" / "last.pt")["epoch"] == 1  # epoch 2 not claimed


def test_a_run_shorter_than_the_window_reports_what_it_measured(keys, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="falconet.profile"):
        summary = Detector("yolo-n").train(
            **keys, epochs=1, profile=True, profile_warmup=0, profile_steps=10
        )
    # accumulate 2: the first optimizer step (batch 1) is discarded, then 10 measured
    assert "the run ended after 3 of the window's 11 batches (1 discarded" in caplog.text
    doc = (Path(summary["run_dir"]) / "profile.json").read_text()
    assert '"complete": false' in doc


class RecordsAt:
    """A step runner standing in for a graph backend's: it runs every batch eagerly
    (returns ``None``) but reports a capture at the given batches, as ``whole-step`` does
    when a new target bucket repeats."""

    def __init__(self, batches: set[int]) -> None:
        self.batches, self.calls = batches, 0
        self.counts = {"recorded": 0, "failed": 0}

    def __call__(self, images, targets, *, optimizer_step):
        if self.calls in self.batches:
            self.counts["recorded"] += 1
        self.calls += 1
        return None


@pytest.mark.parametrize(
    ("captures", "clock_from", "in_window"),
    [
        # accumulate 2: the first optimizer step is batch 1, then 2 discarded: batches 3-6
        (set(), 3, 0),
        ({0}, 3, 0),  # a capture in batch 0: 2 clean batches after it are there anyway
        ({1}, 4, 0),  # in batch 1: 2 clean batches (2, 3) first, so 4-7
        ({3}, 6, 0),  # in the unsynchronised half (batches 3-4): dropped, 6-9 instead
        ({0, 3}, 6, 0),
        ({5}, 3, 1),  # in the synchronised half (5-6): measured, and counted
    ],
)
def test_the_window_waits_out_graph_captures(
    keys, installed_falconet_plugins, captures, clock_from, in_window
):
    plan = plan_run(
        {**keys, "epochs": 4, "profile": "true", "profile_warmup": 2, "profile_steps": 4},
        installed_falconet_plugins,
    )
    trainer = Trainer(plan, installed_falconet_plugins, [Profiler(), seen := PhasesSeen()])
    trainer.step_runner = RecordsAt(captures)
    summary = trainer.fit()
    # seen.kinds[i] is what batch i + 1 runs with (the profiler prepares it first); a half
    # dropped for a capture was timed too, so only the last block of clocks is the window
    assert seen.kinds[clock_from - 1 :] == ["clock"] * 4 + ["none"] * (9 - clock_from)
    assert seen.kinds[clock_from - 2] == "none"
    doc = json.loads((Path(summary["run_dir"]) / "profile.json").read_text())
    assert doc["window"]["warmup"] == clock_from
    assert doc["window"]["unsynced"] == doc["window"]["synced"] == 2
    assert doc["window"]["graph_captures"] == in_window


class PendingUntil:
    """A step runner standing in for whole-step in fp16: pending (every batch eager) until it
    records at batch ``records_at``, then replaying, except the batches in ``eager_at``."""

    def __init__(self, records_at: int, eager_at: set[int] = frozenset()) -> None:
        self.records_at, self.eager_at, self.calls = records_at, eager_at, 0
        self.counts = {"recorded": 0, "failed": 0, "eager": 0, "replayed": 0}

    @property
    def pending(self) -> bool:
        return self.counts["recorded"] == 0

    def __call__(self, images, targets, *, optimizer_step):
        batch, self.calls = self.calls, self.calls + 1
        if batch == self.records_at:
            self.counts["recorded"] += 1
        if self.pending or batch in self.eager_at:
            self.counts["eager"] += 1
        else:
            self.counts["replayed"] += 1
        return None  # the trainer's eager step runs either way; only the counts matter here


@pytest.mark.parametrize(
    ("records_at", "eager_at", "clock_from", "eager_in_window"),
    [
        # pending until batch 7 (fp16: the scaler skipped the first updates), a capture there:
        # 2 clean batches (8, 9) first, so the window is batches 10-13
        (7, set(), 10, 0),
        (7, {11, 12}, 10, 2),  # replays, but two batches of the window ran eager: counted
    ],
)
def test_the_window_waits_for_a_pending_step_runner(
    keys, installed_falconet_plugins, records_at, eager_at, clock_from, eager_in_window
):
    plan = plan_run(
        {**keys, "epochs": 6, "profile": "true", "profile_warmup": 2, "profile_steps": 4},
        installed_falconet_plugins,
    )
    trainer = Trainer(plan, installed_falconet_plugins, [Profiler(), seen := PhasesSeen()])
    trainer.step_runner = PendingUntil(records_at, eager_at)
    summary = trainer.fit()
    assert seen.kinds[clock_from - 1 : clock_from + 3] == ["clock"] * 4
    assert "clock" not in seen.kinds[: clock_from - 1]
    doc = json.loads((Path(summary["run_dir"]) / "profile.json").read_text())
    assert doc["window"]["warmup"] == clock_from
    assert doc["window"]["eager_batches"] == eager_in_window
    assert ("ran eagerly under graph=" in format_report(doc)) == bool(eager_in_window)


class DrainSeen(Profiler):
    """The profiler, noting the batch after which it waits for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.drained: list[int] = []

    def _drain(self, trainer) -> None:
        self.drained.append(self.seen)
        super()._drain(trainer)


def test_the_unsynchronised_half_ends_when_the_device_is_done(keys, installed_falconet_plugins):
    """Batches 3-4 are the unsynchronised half (the first optimizer step at batch 1, 2
    discarded, 4 measured): its last batch waits for the device, once, so the half's time
    covers what the host queued."""
    plan = plan_run(
        {**keys, "epochs": 3, "profile": "true", "profile_warmup": 2, "profile_steps": 4},
        installed_falconet_plugins,
    )
    profiler = DrainSeen()
    Trainer(plan, installed_falconet_plugins, [profiler]).fit()
    assert profiler.drained == [4]
