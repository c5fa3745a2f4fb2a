"""``profile=true`` through the trainer: the core's seam (keys, request_stop, the missing-plugin
error) and falconet-profiler inside real CPU runs (hooks removed, same weights, DDP ranks)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from falconet import Detector
from falconet.contract import CaptureStats
from falconet.graph_backends.eager_step import EagerStep
from falconet.plugins import Plugins
from falconet.training.checkpoint import load_checkpoint
from falconet.training.config import ConfigError
from falconet.training.planning import callback_names, plan_run
from falconet.training.trainer import Trainer
from falconet_profiler.callback import Profiler
from falconet_profiler.report import format_report
from falconet_profiler.window import PhaseClock


@pytest.fixture
def keys(tiny_run):
    return {**tiny_run, "val": "false", "nbs": "16"}  # 3 batches an epoch, accumulate 2


class StopAt:
    """Calls ``run.request_stop`` after the ``batch``-th batch of the run."""

    def __init__(self, batch: int) -> None:
        self.batch, self.seen = batch, 0

    def on_step_end(self, run):
        self.seen += 1
        if self.seen == self.batch:
            run.request_stop(f"stopped by the test after batch {self.batch}")


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
    """``profile`` is the profiler's own key: without the plugin it is unknown, and the error
    names the distribution that declares it (install_hints' ``train_keys``)."""
    import falconet_detect

    add_falconet_plugin(falconet_detect, name="detect", distribution="falconet-detect")
    with pytest.raises(ConfigError) as info:  # the built-ins and detect, no profiler
        plan_run({**keys, "profile": "true"}, falconet_plugins)
    assert str(info.value) == (
        "unknown key 'profile': it is a key of falconet-profiler, which is not installed; "
        "pip install falconet-profiler"
    )


def test_profile_with_the_plugin_disabled_says_so(keys):
    disabled = Plugins(env={"FALCONET_DISABLE_PLUGINS": "falconet-profiler"}).load()
    with pytest.raises(ConfigError, match="falconet-profiler is installed but disabled"):
        plan_run({**keys, "profile": "true"}, disabled)


def test_the_profiler_is_added_only_when_asked(keys, installed_falconet_plugins):
    """Its ``wanted(config)`` reads its own ``profile`` key; by name it is added once."""
    plugins = installed_falconet_plugins
    loggers = callback_names(plan_run(keys, plugins).config, plugins)
    assert "profiler" not in loggers and {"csv", "progress"} <= set(loggers)
    on = plan_run({**keys, "profile": "true", "callbacks": "example-steps"}, plugins).config
    assert on.profile is True
    assert callback_names(on, plugins) == [*sorted([*loggers, "profiler"]), "example-steps"]
    both = plan_run({**keys, "profile": "true", "callbacks": "profiler"}, plugins).config
    assert callback_names(both, plugins).count("profiler") == 1
    by_name = plan_run({**keys, "callbacks": "profiler"}, plugins).config
    assert callback_names(by_name, plugins) == [*loggers, "profiler"]


class PhasesSeen:
    """Records which timer ``run.phases`` holds after each batch (after the profiler's own
    ``on_step_end``, which runs first)."""

    def __init__(self):
        self.kinds: list[str] = []

    def on_step_end(self, run):
        timer = run.phases.timer
        self.kinds.append(
            "clock"
            if isinstance(timer, PhaseClock)
            else "none"
            if not run.phases.timed
            else repr(timer)
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


class ScriptedStep:
    """The eager step, reporting the capture statistics ``script(batch, stats)`` gives after
    each batch, as a graph backend's step reports its own."""

    def __init__(self, parts, script) -> None:
        self.eager, self.script, self.calls = EagerStep(parts), script, 0
        self._stats = script(None, CaptureStats())  # before the first batch

    def __call__(self, images, targets, *, update):
        out = self.eager(images, targets, update=update)
        self._stats = self.script(self.calls, self._stats)
        self.calls += 1
        return out

    def stats(self) -> CaptureStats:
        return self._stats


@dataclass
class ScriptedBackend:
    """A graph backend (``graph=scripted`` only: no priority) whose step is a
    :class:`ScriptedStep`."""

    script: object
    name: str = "scripted"
    summary: str = "the eager step with scripted capture statistics"
    priority: int | None = None
    replays: bool = False  # eager underneath: the captures are scripted, not recorded

    def decline_reason(self, context):
        return None

    def build_step(self, parts, context):
        return ScriptedStep(parts, self.script)


def _scripted_trainer(plugins, keys, script, callbacks) -> Trainer:
    backend = ScriptedBackend(script)
    record = plugins.add_plugin(
        SimpleNamespace(register_graph_backends=lambda register: register(backend)),
        "scripted-plugin",
        "test",
    )
    assert record.status == "ok", record.failure
    plan = plan_run({**keys, "graph": "scripted"}, plugins)
    trainer = Trainer(plan, plugins, callbacks)
    assert trainer.state.graph == "scripted" and isinstance(trainer.run.step, ScriptedStep)
    return trainer


def records_at(batches: set[int]):
    """A capture at the given batches, as ``whole-step`` records when a new target bucket
    repeats; every batch runs eagerly."""

    def script(batch, stats):
        return CaptureStats(recorded=stats.recorded + (batch in batches))

    return script


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
    trainer = _scripted_trainer(
        installed_falconet_plugins,
        {**keys, "epochs": 4, "profile": "true", "profile_warmup": 2, "profile_steps": 4},
        records_at(captures),
        [Profiler(), seen := PhasesSeen()],
    )
    summary = trainer.fit()
    # seen.kinds[i] is what batch i + 1 runs with (the profiler prepares it first); a half
    # dropped for a capture was timed too, so only the last block of clocks is the window
    assert seen.kinds[clock_from - 1 :] == ["clock"] * 4 + ["none"] * (9 - clock_from)
    assert seen.kinds[clock_from - 2] == "none"
    doc = json.loads((Path(summary["run_dir"]) / "profile.json").read_text())
    assert doc["window"]["warmup"] == clock_from
    assert doc["window"]["unsynced"] == doc["window"]["synced"] == 2
    assert doc["window"]["graph_captures"] == in_window


def pending_until(records_at: int, eager_at: set[int] = frozenset()):
    """Statistics of whole-step in fp16: pending (every batch eager) until it records at
    batch ``records_at``, then replaying, except the batches in ``eager_at``."""

    def script(batch, stats):
        if batch is None:
            return CaptureStats(pending=True)
        recorded = stats.recorded + (batch == records_at)
        eager = recorded == 0 or batch in eager_at
        return CaptureStats(
            recorded=recorded,
            eager=stats.eager + eager,
            replayed=stats.replayed + (not eager),
            pending=recorded == 0,
        )

    return script


@pytest.mark.parametrize(
    ("records_at", "eager_at", "clock_from", "eager_in_window"),
    [
        # pending until batch 7 (fp16: the scaler skipped the first updates), a capture there:
        # 2 clean batches (8, 9) first, so the window is batches 10-13
        (7, set(), 10, 0),
        (7, {11, 12}, 10, 2),  # replays, but two batches of the window ran eager: counted
    ],
)
def test_the_window_waits_for_a_pending_step(
    keys, installed_falconet_plugins, records_at, eager_at, clock_from, eager_in_window
):
    trainer = _scripted_trainer(
        installed_falconet_plugins,
        {**keys, "epochs": 6, "profile": "true", "profile_warmup": 2, "profile_steps": 4},
        pending_until(records_at, eager_at),
        [Profiler(), seen := PhasesSeen()],
    )
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

    def _drain(self, run) -> None:
        self.drained.append(self.seen)
        super()._drain(run)


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
