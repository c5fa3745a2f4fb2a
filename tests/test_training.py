"""The trainer in-process: configuration errors, NaN handling, gradient accumulation, and a
run with the network cut off."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from falconet import Detector
from falconet.contract import NO_CAPTURES
from falconet.data.targets import Targets
from falconet.training.callbacks import EVENTS, CallbackList
from falconet.training.checkpoint import CheckpointError, load_checkpoint
from falconet.training.config import ConfigError
from falconet.training.planning import (
    build_callbacks,
    callback_names,
    default_model,
    plan_run,
)
from falconet.training.run_state import RunState
from falconet.training.trainer import Trainer, TrainingDiverged, write_release_batch


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"imgsz": 100}, "imgsz=100: must be a multiple of 32"),
        (
            {"cache": "ssd"},
            "cache='ssd': expected 'auto', 'none', 'ram', 'disk', 'gpu', 'encoded' or 'stream'",
        ),
        ({"epochs": "many"}, "epochs='many'"),
        ({"lr0": -1}, "lr0=-1"),
        ({"amp_dtype": "fp16", "device": "cpu"}, "amp_dtype=fp16 needs a CUDA device"),
        ({"amp_dtype": "fp8", "device": "cpu"}, "amp_dtype=fp8 needs a CUDA GPU"),
        ({"assigner": "tall"}, "Did you mean assigner=tal?"),
        ({"eval_backend": "cocoapi"}, "eval_backend=cocoapi"),
        ({"optimiser": "sgd"}, "did you mean optimizer=?"),
    ],
)
def test_bad_values_name_the_key(tiny_run, keys, expected):
    with pytest.raises(Exception, match=None) as info:
        Detector("yolo-n").train(**{**tiny_run, **keys})
    assert expected in str(info.value)


def test_resolution_order(tiny_shapes, installed_falconet_plugins):
    """Defaults < family recipe < the data's train_defaults < the user's keys."""
    data = tiny_shapes.parent / "with-defaults.yaml"
    data.write_text(
        tiny_shapes.read_text().replace("path: .", f"path: {tiny_shapes.parent}")
        + "train_defaults:\n  imgsz: 96\n  lr0: 0.005\n"
    )
    plan = plan_run({"data": str(data), "lr0": 0.02}, installed_falconet_plugins)
    assert plan.config.imgsz == 96  # the data's hint over the recipe's 640
    assert plan.config.lr0 == 0.02  # the user's key over the hint
    assert plan.config.momentum == 0.937  # the recipe
    bad = tiny_shapes.parent / "bad-defaults.yaml"
    bad.write_text(data.read_text() + "  epocs: 3\n")
    with pytest.raises(ConfigError, match="epocs"):
        plan_run({"data": str(bad)}, installed_falconet_plugins)


def test_the_config_records_the_model_trained_and_its_familys_assigner(
    tiny_shapes, installed_falconet_plugins
):
    plan = plan_run({"data": str(tiny_shapes)}, installed_falconet_plugins, base_model="detr-n")
    assert (plan.model_name, plan.config.model, plan.config.assigner) == (
        "detr-n",
        "detr-n",
        "hungarian",
    )


def test_with_no_model_the_family_of_highest_priority_gives_it(
    tiny_shapes, installed_falconet_plugins, falconet_plugins
):
    plugins = installed_falconet_plugins
    assert default_model(plugins) == "yolo-n"  # yolo (10) over detr (0)
    assert plan_run({"data": str(tiny_shapes)}, plugins).config.model == "yolo-n"
    family = _add_family(plugins, "first", lambda loss: loss)
    type(plugins.families.get(family)).priority = 20  # a third party's family may win
    assert default_model(plugins) == "first-n"
    assert Detector(plugins=plugins).model_name == "first-n"
    with pytest.raises(ConfigError, match="no model family is installed"):
        default_model(falconet_plugins)  # the core alone


def test_a_recipe_without_an_assigner_is_an_error_that_lists_them(
    tiny_shapes, installed_falconet_plugins
):
    model = _add_family(installed_falconet_plugins, "plain", lambda loss: loss)
    family = type(installed_falconet_plugins.families.get(model))
    family.default_recipe = lambda self, model: {"optimizer": "sgd", "lr0": 0.01, "imgsz": 64}
    with pytest.raises(ConfigError, match=r"names no label assigner; set assigner= one of .*tal"):
        plan_run({"data": str(tiny_shapes)}, installed_falconet_plugins, base_model=model)


class NanAfter:
    """A yolo loss that turns NaN from its ``start``-th call on."""

    def __init__(self, loss, start: int) -> None:
        self.loss, self.start, self.calls = loss, start, 0

    def __call__(self, outputs, targets):
        self.calls += 1
        total, parts = self.loss(outputs, targets)
        return (total * float("nan") if self.calls >= self.start else total), parts


def _add_family(plugins, name: str, build_loss) -> str:
    """Register a family ``name`` whose model is yolo-n and whose loss is
    ``build_loss(yolo_loss)``; returns its model name."""
    yolo = plugins.families.get("yolo")

    class Wrapped:
        summary, models, priority = "yolo-n with a test loss", (f"{name}-n",), -1
        default_recipe, capture_region, postprocess = (
            yolo.default_recipe,
            yolo.capture_region,
            yolo.postprocess,
        )

        def build_model(self, model, num_classes):
            return yolo.build_model("yolo-n", num_classes)

        def build_loss(self, model, assigner):
            return build_loss(yolo.build_loss(model, assigner))

        def static_loss(self, assigner, device):
            return False  # a test loss: no graph backend records it

    Wrapped.name = name
    plugins.add_plugin(
        SimpleNamespace(register_families=lambda register: register(Wrapped())),
        f"{name}-plugin",
        "test",
        "0",
    )
    return f"{name}-n"


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(
    tiny_run, installed_falconet_plugins, tmp_path
):
    # 3 batches per epoch: epoch 1 is clean, epoch 2 turns NaN at its first batch. Mid-epoch
    # reads are one log interval late (LaggedReads), so the run sees 2 NaN steps at the read
    # after batch 3, the epoch's last: it stops there, before saving the epoch
    model = _add_family(installed_falconet_plugins, "nan", lambda loss: NanAfter(loss, start=4))
    detector = Detector(model, plugins=installed_falconet_plugins)
    with pytest.raises(TrainingDiverged, match="NaN or infinite for 3 consecutive steps"):
        detector.train(**tiny_run, epochs=3, nan_patience=2, log_interval=1)
    last = load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt")
    assert last["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in last["model"].values() if t.is_floating_point())


def test_weights_that_turn_non_finite_stop_the_run_before_their_epoch_is_saved(
    tiny_run, installed_falconet_plugins, tmp_path
):
    # the weights' check is queued at an epoch's last batch and read with its last log read;
    # a NaN written into a weight in epoch 2 (the loss turns NaN with it, and nan_patience is
    # too high to stop the run first) ends the run at epoch 2's end, epoch 1's files kept
    plugins = installed_falconet_plugins

    class PoisonAWeight:
        def on_step_end(self, state):
            if state.progress.epoch == 1 and state.batch_in_epoch == 1:
                weight = next(trainer.run.model.parameters())
                with torch.no_grad():
                    weight[(0,) * weight.dim()] = float("nan")

    plan = plan_run({**tiny_run, "epochs": 3, "nan_patience": 100}, plugins)
    trainer = Trainer(plan, plugins, [PoisonAWeight()])
    with pytest.raises(TrainingDiverged, match="the weights became NaN or infinite in epoch 2"):
        trainer.fit()
    last = load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt")
    assert last["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in last["model"].values() if t.is_floating_point())


def _trainer(tiny_run, plugins, **keys) -> Trainer:
    base = {**tiny_run, "warmup_epochs": 0, "ema": False, "val": False, "seed": 1, "clip_grad": 0}
    return Trainer(plan_run({**base, **keys}, plugins), plugins)


def _per_image_mean_loss(_yolo_loss):
    """A loss that is a plain mean over images (YOLO's is normalised by its soft-target sum,
    floored at 1, which at random initialisation makes a batch and its half differ by design)."""

    def loss(outputs, targets):
        box, cls = outputs[0].float(), outputs[1].float()
        total = cls.sigmoid().mean() + 1e-3 * box.pow(2).mean()
        return total, {"cls": total.detach()}

    return loss


def test_gradient_accumulation_equals_the_larger_batch(tiny_run, installed_falconet_plugins):
    """Two batches of [x1, x2] accumulated = one batch [x1, x2, x1, x2] (BatchNorm sees the same
    statistics in both), up to float rounding."""
    plugins = installed_falconet_plugins
    model = _add_family(plugins, "mean", _per_image_mean_loss)
    # on the CPU, where the batches below are (and the eager step compares like with like)
    big = _trainer(tiny_run, plugins, model=model, batch=4, nbs=4, name="big", device="cpu")
    small = _trainer(tiny_run, plugins, model=model, batch=2, nbs=4, name="small", device="cpu")
    big_model, small_model = big.run.model, small.run.model
    before = [p.detach().clone() for p in big_model.parameters()]
    assert (big.run.accumulate, small.run.accumulate) == (1, 2)
    for a, b in zip(big_model.parameters(), small_model.parameters(), strict=True):
        assert torch.equal(a, b)
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    boxes, labels = torch.zeros(2, 8, 4), torch.zeros(2, 8, dtype=torch.int64)
    counts = torch.zeros(2, dtype=torch.int64)
    targets = Targets.from_padded(boxes, labels, counts)
    doubled = Targets.from_padded(torch.cat([boxes] * 2), torch.cat([labels] * 2), counts.repeat(2))
    big.run.step(torch.cat([images, images]), doubled, update=True)
    small.run.step(images, targets, update=False)
    assert small.progress.updates == 0  # no update: the gradients wait for the next batch
    grads = [p.grad.clone() for p in small_model.parameters()]
    small.run.step(images, targets, update=True)
    assert (big.progress.updates, small.progress.updates) == (1, 1)
    # compare the updates: a slip in the accumulation (a missing 1/accumulate, a zero_grad
    # between batches) is off by 50-100%; float rounding, amplified by BatchNorm's backward on
    # a few near-cancelling weights, stays far below 0.1% of the update
    diff = total = 0.0
    for (name, a), b, start in zip(
        big_model.named_parameters(), small_model.parameters(), before, strict=True
    ):
        step_a, step_b = (a.detach() - start).double(), (b.detach() - start).double()
        assert step_a.norm() > 0, f"{name} did not move"
        diff += float((step_a - step_b).norm() ** 2)
        total += float(step_a.norm() ** 2)
        assert float((step_a - step_b).norm() / step_a.norm()) < 1e-2, name
    assert (diff / total) ** 0.5 < 1e-3
    assert any(g.abs().sum() > 0 for g in grads)  # the first microbatch did contribute


AUDIT = """
import sys
import socket
def refuse(event, args):
    # local AF_UNIX sockets (multiprocessing passes worker fds through them) are not network
    inet = event == "socket.connect" and args[0].family in (socket.AF_INET, socket.AF_INET6)
    if inet or event in ("socket.getaddrinfo", "socket.gethostbyname", "urllib.Request"):
        raise RuntimeError(f"network attempt: {event} {args}")
sys.addaudithook(refuse)
from falconet.cli import main
main(sys.argv[1:])
"""


def test_main_job_makes_no_network_attempt(tmp_path):
    """The README's main job (here with fewer epochs and images) under an audit hook that turns
    any connection or name lookup into an error, and under ``unshare -n`` where allowed."""
    keys = [
        "data=shapes",
        "epochs=1",
        "imgsz=64",
        "fraction=0.1",
        "workers=1",
        f"project={tmp_path / 'runs'}",
    ]
    env = {
        "FALCONET_CACHE_DIR": str(tmp_path / "cache"),
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    if "PYTHONPATH" in os.environ:  # where the packages were installed apart (the GPU machine)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    command = [sys.executable, "-c", AUDIT, "train", *keys]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "network attempt" not in done.stderr
    assert (tmp_path / "runs" / "exp" / "results.png").is_file()
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rn", "true"]).returncode != 0:
        pytest.skip("unshare -rn is not permitted here; the audit-hook run above passed")
    isolated = subprocess.run(
        [unshare, "-rn", *command[:3], "train", *keys[:-1], f"project={tmp_path / 'isolated'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert isolated.returncode == 0, isolated.stderr


def test_checkpoint_loads_into_a_detector_and_predicts(tiny_run, tmp_path):
    summary = Detector("yolo-n").train(**tiny_run, epochs=1)
    best = Path(summary["run_dir"]) / "weights" / "best.pt"
    detector = Detector(best)
    images = Path(tiny_run["data"]).parent / "images" / "val"
    results = detector.predict(images, conf=0.0001, device="cpu")
    assert len(results) == 8 and all("boxes" in r for r in results)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    with_bad = detector.predict([broken, next(images.iterdir())], device="cpu")
    assert "error" in with_bad[0] and "boxes" in with_bad[1]


def test_plugin_graph_backend_and_callbacks_are_used(tiny_run, installed_falconet_plugins):
    pytest.importorskip(
        "falconet_example_plugin",
        reason="its graph backend: tests/fixtures/example-plugin, installed by the dev group",
    )
    plugins = installed_falconet_plugins
    events: list[str] = []

    states: list[RunState] = []

    class Recorder:
        name, summary = "recorder", "records the events it sees"

        @staticmethod
        def wanted(config):
            return False  # only when callbacks= names it

        def __init__(self, **options):
            for event in EVENTS:
                setattr(
                    self, event, lambda run, *args, e=event: (events.append(e), states.append(run))
                )

    plugins.add_plugin(
        SimpleNamespace(register_callbacks=lambda register: register(Recorder)),
        "recorder-plugin",
        "test",
        "0",
    )
    Detector("yolo-n", plugins=plugins).train(
        **tiny_run, epochs=2, graph="example-counting", callbacks="recorder", device="cpu"
    )
    assert plugins.graph_backends.get("example-counting").calls == 6  # 2 epochs x 3 batches
    epoch = ["on_epoch_start"] + ["on_step_end"] * 3 + ["on_val_end", "on_epoch_end"]
    assert events == ["on_train_start", *epoch, *epoch, "on_train_end"]
    # every event receives the run's typed view, one object kept current, never the trainer
    (state,) = {id(s): s for s in states}.values()
    assert isinstance(state, RunState)
    assert (state.model, state.graph, state.precision, str(state.device)) == (
        "yolo-n",
        "example-counting",
        "fp32",
        "cpu",
    )
    assert (state.accumulate, state.batches_per_epoch, state.train_images) == (2, 3, 24)
    # updates at every 2nd batch and at an epoch's last: batches 2 and 3 of each epoch
    assert (state.epoch, state.batch_in_epoch, state.progress.updates) == (2, 3, 4)
    assert state.config.callbacks == ["recorder"] and state.last_eval is not None
    assert (state.run_dir / "results.csv").is_file() and "img/s" in state.logged
    assert state.step_stats() == NO_CAPTURES  # the eager step records nothing


def test_the_core_loggers_are_registered_callbacks_a_run_adds_when_wanted(
    tiny_run, falconet_plugins, add_falconet_plugin
):
    from falconet.training.callbacks import (
        ConsoleProgress,
        CSVLogger,
        PlotWriter,
        tensorboard_available,
    )
    from falconet.training.config import build_config, config_model

    class Named:
        name, summary = "named", "added by name only"

        @staticmethod
        def wanted(config):
            return False

        def __init__(self, **options):
            pass

    add_falconet_plugin(SimpleNamespace(register_callbacks=lambda register: register(Named)))
    model = config_model(falconet_plugins)
    tensorboard = ["tensorboard"] if tensorboard_available() else []
    plots = build_config(model, {"plots": True})
    assert callback_names(plots, falconet_plugins) == ["csv", "plots", "progress", *tensorboard]
    quiet = build_config(model, {"plots": False, "callbacks": "named"})
    assert callback_names(quiet, falconet_plugins) == ["csv", "progress", *tensorboard, "named"]
    built = build_callbacks(quiet, falconet_plugins)
    assert [type(c) for c in built[:2]] == [CSVLogger, ConsoleProgress]
    assert isinstance(built[-1], Named) and not any(isinstance(c, PlotWriter) for c in built)


def test_a_callback_can_end_the_run_after_the_current_batch(tiny_run, installed_falconet_plugins):
    """``request_stop`` inside an epoch: that epoch is neither validated nor saved, so the last
    checkpoint is the previous epoch's, and the reason is the summary's ``stop_reason``."""
    seen = []

    class StopsInEpochTwo:
        def on_step_end(self, run):
            seen.append((run.epoch, run.batch_in_epoch))
            if (run.epoch, run.batch_in_epoch) == (1, 2):
                run.request_stop("enough for this test")

        def on_train_end(self, run):
            seen.append("end")

    trainer = _trainer(tiny_run, installed_falconet_plugins, epochs=3)
    trainer.callbacks = CallbackList([StopsInEpochTwo()])
    summary = trainer.fit()
    assert seen == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), "end"]
    assert summary["stop_reason"] == "enough for this test" and summary["epochs"] == 1
    assert load_checkpoint(trainer.weights_dir / "last.pt")["epoch"] == 1


def test_the_checkpoint_write_is_released_mid_epoch_and_no_later_than_a_cap():
    assert [write_release_batch(n) for n in (1, 2, 3, 8, 32, 64, 65, 7_393)] == [
        1, 1, 2, 4, 16, 32, 32, 32
    ]  # fmt: skip


def test_an_epochs_checkpoint_is_written_from_the_middle_of_the_next_epoch(
    tiny_run, installed_falconet_plugins
):
    """The previous epoch's files serialise only once the next epoch is under way
    (CheckpointWriter.hold, write_release_batch): not while the GPU's queue is empty at the
    epoch's start. Epoch 1 has nothing to hold; the last epoch's files are written before fit
    returns."""
    held = []
    trainer = _trainer(tiny_run, installed_falconet_plugins, epochs=2)

    class Watches:
        def on_step_end(self, run):
            held.append((run.epoch, run.batch_in_epoch, trainer.checkpoints.held))

    trainer.callbacks = CallbackList([Watches()])
    trainer.fit()
    epoch_1 = [(0, 1, False), (0, 2, False), (0, 3, False)]
    epoch_2 = [(1, 1, True), (1, 2, False), (1, 3, False)]  # released at the second of three
    assert held == epoch_1 + epoch_2
    assert load_checkpoint(trainer.weights_dir / "last.pt")["epoch"] == 2


def test_the_next_epochs_first_batch_is_fetched_before_the_last_log_read_and_changes_nothing(
    tiny_run, installed_falconet_plugins
):
    """An epoch's last log read waits for the GPU, which then idles until the next step is
    launched: the next epoch's first batch is fetched before that read (Trainer._fetch), never
    past the run's last epoch, and the run trains what a run fetching every batch in line
    trains (a profiler's timed phases fetch in line): the same batches, the same weights."""
    plugins = installed_falconet_plugins
    ahead = _trainer(tiny_run, plugins, epochs=3, name="ahead")
    initial = {k: v.clone() for k, v in ahead.run.model.state_dict().items()}
    events: list[str] = []
    fetch, read = ahead._fetch, ahead._log_reads.read

    def logged_fetch(batches, epoch, index):
        events.append("fetch")
        return fetch(batches, epoch, index)

    def logged_read(values, *, now):
        events.append("read" if now else "lagged read")
        return read(values, now=now)

    ahead._fetch, ahead._log_reads.read = logged_fetch, logged_read
    ahead.fit()
    batches = ahead.state.batches_per_epoch
    assert batches == 3
    fetches = [e for e in events if e != "lagged read"]
    assert fetches == (
        ["fetch"] * 4 + ["read"] + ["fetch"] * 3 + ["read"] + ["fetch"] * 2 + ["read"]
    )
    in_line = _trainer(tiny_run, plugins, epochs=3, name="in-line")
    in_line.run.phases.use(lambda name: contextlib.nullcontext())
    in_line.fit()
    trained, expected = ahead.run.model.state_dict(), in_line.run.model.state_dict()
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)  # it trained
    assert all(torch.equal(trained[k], expected[k]) for k in expected)


def test_a_loader_failing_at_the_next_epochs_first_batch_keeps_this_epochs_checkpoint(
    tiny_run, installed_falconet_plugins
):
    """The next epoch's first batch is fetched before this epoch is saved: a loader that fails
    there (a worker killed) raises at the next epoch's start, after this epoch's files."""
    trainer = _trainer(tiny_run, installed_falconet_plugins, epochs=2)
    fetch, fetched = trainer._fetch, []

    def failing_fetch(batches, epoch, index):
        fetched.append((epoch, index))
        if len(fetched) == 4:  # 3 batches an epoch: the second epoch's first
            raise RuntimeError("a loader worker died")
        return fetch(batches, epoch, index)

    trainer._fetch = failing_fetch
    with pytest.raises(RuntimeError, match="worker died"):
        trainer.fit()
    assert load_checkpoint(trainer.weights_dir / "last.pt")["epoch"] == 1


def test_fine_tuning_a_checkpoint_on_other_classes_keeps_all_but_the_class_head(
    tiny_run, tmp_path, caplog
):
    import logging

    summary = Detector("yolo-n").train(**tiny_run, epochs=1)
    best = Path(summary["run_dir"]) / "weights" / "best.pt"
    two_classes = Path(tiny_run["data"]).with_name("two-classes.yaml")
    two_classes.write_text(
        "path: .\ntrain: images/train\nval: images/val\nnames: [circle, square]\n"
    )
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        tuned = Detector(best).train(**{**tiny_run, "data": str(two_classes)}, epochs=1)
    line = next(r.message for r in caplog.records if r.message.startswith("weights: "))
    loaded, total = (int(n) for n in line.split()[1:4:2])
    assert 0 < total - loaded <= 6 and "head.cls" in line  # only the class layers differ
    state = load_checkpoint(Path(tuned["run_dir"]) / "weights" / "best.pt")
    assert state["spec"]["names"] == ["circle", "square"]
    start = load_checkpoint(best)["weights"]
    stem = "stem.0.conv.weight"
    assert state["weights"][stem].shape == start[stem].shape


def test_a_run_logs_where_its_start_up_went(tiny_run, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="falconet.train"):
        Detector("yolo-n").train(**tiny_run, epochs=1)
    lines = [r.message for r in caplog.records if r.message.startswith("start-up ")]
    assert len(lines) == 1, lines
    parts = [p.rsplit(" ", 2)[0] for p in lines[0].split(": ", 1)[1].split(" (")[0].split(", ")]
    assert parts[:2] == ["device", "data"] and parts[-2:] == ["loaders", "step"], parts


def test_every_phase_of_a_step_runs_inside_the_phase_seam(tiny_run, installed_falconet_plugins):
    """A profiler's view of the loop: phases in order, never nested, optimizer and EMA only on
    the steps that update the weights (here every 2nd batch and the epoch's last)."""
    from contextlib import contextmanager

    from falconet.training.phases import PHASES

    seen: list[str] = []
    depth = [0]

    @contextmanager
    def recorder(name):
        assert depth[0] == 0, f"{name} entered inside another phase"
        depth[0] += 1
        seen.append(name)
        yield
        depth[0] -= 1

    class Install:
        name = "install"

        def on_train_start(self, run):
            assert not run.phases.timed  # the do-nothing default until someone installs one
            run.phases.use(recorder)

    # on the CPU: the eager step's phases (a GPU run's graph=auto replays whole steps)
    keys = {**tiny_run, "epochs": 1, "nbs": 16, "val": False, "device": "cpu"}
    plan = plan_run(keys, installed_falconet_plugins)
    trainer = Trainer(plan, installed_falconet_plugins, [Install()])
    assert trainer.state.phases is trainer.run.parts.phases  # the step's phases, shared
    trainer.fit()
    batch = ["data", "to-device", "forward", "loss", "backward"]
    update = ["optimizer", "ema"]
    assert seen == batch + batch + update + batch + update  # 3 batches, accumulate 2
    assert set(seen) == set(PHASES) - {"step"}  # "step": a backend replaying the whole step


def test_a_checkpoint_that_cannot_be_written_stops_the_run_with_a_clear_error(
    tiny_run, installed_falconet_plugins, tmp_path
):
    """The files are written in the background; a write that fails (here the weights folder
    is a file) must still end the run with the reason, not pass unnoticed."""
    trainer = _trainer(tiny_run, installed_falconet_plugins, epochs=2)
    shutil.rmtree(trainer.weights_dir, ignore_errors=True)
    trainer.weights_dir.write_text("in the way")
    with pytest.raises(CheckpointError, match="writing a checkpoint failed"):
        trainer.fit()


def test_the_last_checkpoint_is_on_disk_before_on_train_end(
    tiny_run, installed_falconet_plugins, monkeypatch
):
    """A slow disk (every write held back 0.3 s): a callback that reads last.pt when training
    ends must find the last epoch's file, not the one before it or none."""
    from falconet.training import checkpoint

    real_save = checkpoint.save_atomic

    def slow_save(state, path):
        time.sleep(0.3)
        return real_save(state, path)

    monkeypatch.setattr(checkpoint, "save_atomic", slow_save)
    seen = []

    class ReadsLast:
        def on_train_end(self, run):
            seen.append(load_checkpoint(run.run_dir / "weights" / "last.pt")["epoch"])

    trainer = _trainer(tiny_run, installed_falconet_plugins, epochs=2)
    trainer.callbacks = CallbackList([ReadsLast()])
    trainer.fit()
    assert seen == [2]


def test_the_loaders_workers_are_stopped_when_fit_returns(tiny_run, installed_falconet_plugins):
    """Workers left running stop at the interpreter's exit, which PyTorch can make wait 5 s per
    worker (``falconet.data.loader.stop_workers``): fit ends them itself, train and val."""
    # on the CPU: on a GPU, cache=auto trains from the GPU cache, whose loader has no workers
    trainer = _trainer(
        tiny_run, installed_falconet_plugins, epochs=1, workers=2, val=True, device="cpu"
    )
    started = []

    class SeesWorkers:
        def on_epoch_end(self, run, row):
            for loader in (trainer.run.train_loader, trainer.run.val_loader):
                started.extend(loader._iterator._workers)

    trainer.callbacks = CallbackList([SeesWorkers()])
    trainer.fit()
    assert len(started) == 4 and not any(w.is_alive() for w in started)


def test_the_val_batches_are_started_with_a_validating_epoch_and_score_the_same(
    tiny_run, installed_falconet_plugins
):
    """An epoch that ends with a validation starts the val loader's workers at its start (so
    its batches are ready when training ends); the metrics are those of a validation that
    starts its loader only then (the same weights, after fit)."""
    trainer = _trainer(
        tiny_run, installed_falconet_plugins, epochs=3, workers=2, val=True, val_interval=2
    )
    started, results = [], []

    class Sees:
        def on_epoch_start(self, run):
            started.append(trainer._val_batches is not None)

        def on_val_end(self, run, result):
            assert run.last_eval is result
            results.append(result.stats)

    trainer.callbacks = CallbackList([Sees()])
    trainer.fit()
    assert started == [False, True, True]  # epoch 2 (every 2nd) and epoch 3 (the last)
    assert len(results) == 2
    assert trainer.validate().stats == results[-1]  # loader started afresh, after fit


def test_a_validation_from_a_started_iterator_predicts_what_the_loader_gives(
    tiny_run, installed_falconet_plugins
):
    """The consuming side of the early start: an iterator whose workers started earlier gives
    the same detections, image for image, as the loader iterated afresh (random weights, so
    every image has detections above conf=0.001; the metrics of the test above are zero)."""
    from falconet.training import validation

    trainer = _trainer(tiny_run, installed_falconet_plugins, workers=2, val=True)
    run = trainer.run
    model = run.model.eval()

    def predict(batches):
        categories = validation.category_ids(run.dataset)
        return validation.predict_split(model, run.family, batches, run.device, categories).state()

    started = iter(run.val_loader)
    time.sleep(0.5)  # the workers prepare the batches meanwhile
    early, fresh = predict(started), predict(run.val_loader)
    assert len(fresh["images"]) == 8 and fresh["counts"].min() > 0
    assert early.keys() == fresh.keys()
    assert all(np.array_equal(early[k], fresh[k]) for k in fresh)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the checkpoint's copies from a GPU")
@pytest.mark.parametrize("graph", ["eager", "whole-step"])
def test_gpu_checkpoints_hold_the_state_the_run_ended_with(tiny_run, graph):
    """On a GPU the checkpoint's tensors are copied at the epoch's last batch, into pinned
    buffers reused every epoch, and written while the next epoch trains: the files of the
    last epoch must hold exactly the weights, EMA and momentum the run ended with."""
    from falconet.plugins import get_plugins

    plugins = get_plugins()
    keys = {**tiny_run, "device": "cuda:0", "epochs": "3", "val": "false", "graph": graph}
    keys.update(batch="4", nbs="8", optimizer="sgd", amp_dtype="fp16")
    trainer = Trainer(plan_run(keys, plugins), plugins)
    trainer.fit()
    run = trainer.run
    last = load_checkpoint(trainer.weights_dir / "last.pt")
    best = load_checkpoint(trainer.weights_dir / "best.pt")  # no validation: every epoch
    assert last["epoch"] == best["epoch"] == 3
    for saved, live in (
        (last["model"], run.model.state_dict()),
        (last["ema"]["state"], run.ema.module.state_dict()),
        (last["weights"], run.ema.module.state_dict()),
        (best["weights"], run.ema.module.state_dict()),
    ):
        assert saved.keys() == live.keys()
        assert all(torch.equal(saved[k], v.cpu()) for k, v in live.items())
    momentum = [s["momentum_buffer"] for s in run.optimizer.state_dict()["state"].values()]
    saved = [s["momentum_buffer"] for s in last["optimizer"]["state"].values()]
    assert len(saved) == len(momentum) > 0
    assert all(torch.equal(a, b.cpu()) for a, b in zip(saved, momentum, strict=True))
    assert last["ema"]["updates"] == run.ema.updates > 0
