"""multi_scale= end to end on the tiny shapes set (64 px: sizes 32, 64 and 96): every batch
trains at its drawn size for both families, a graph backend's keying sees one shape per size,
a resumed run draws what the uninterrupted run drew, and the CLI and the Python API take the
key. CUDA graphs need a GPU, so the keying runs with the CPU stand-ins of the recorders
(:class:`~falconet_graphs_cuda.recording.BufferRecorder`, ``EagerStepRecorder``), which key
and count as the CUDA ones do."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from falconet import Detector
from falconet.contract import GraphContext
from falconet.graph_backends.eager_step import EagerStep
from falconet.training.checkpoint import load_checkpoint
from falconet.training.multi_scale import size_draw
from falconet.training.planning import plan_run
from falconet.training.trainer import Trainer

SIZES = (32, 64, 96)  # 0.5-1.5 of 64 px


class Shapes:
    """The run's step, noting each batch's image shape and its largest box coordinate."""

    def __init__(self, step) -> None:
        self.step, self.seen, self.largest = step, [], []

    def __call__(self, images, targets, *, update):
        self.seen.append(tuple(images.shape[-2:]))
        self.largest.append(float(targets.boxes.max()))
        return self.step(images, targets, update=update)

    def stats(self):
        return self.step.stats()


def drawn(trainer: Trainer, epochs: range) -> list[int]:
    draw = size_draw(trainer.cfg.multi_scale, trainer.cfg.imgsz, trainer.cfg.seed)
    per_epoch = trainer.state.batches_per_epoch
    return [draw(epoch, i) for epoch in epochs for i in range(per_epoch)]


@pytest.mark.parametrize("model", ["yolo-n", "detr-n"])
def test_every_batch_trains_at_its_drawn_size_and_validation_at_imgsz(
    model, tiny_run, installed_falconet_plugins
):
    plugins = installed_falconet_plugins
    keys = {**tiny_run, "model": model, "batch": "4", "epochs": 1, "multi_scale": "0.5-1.5"}
    keys["val"] = str(model == "yolo-n")  # validation at imgsz; detr-n's is the slow one
    trainer = Trainer(plan_run(keys, plugins), plugins)
    shapes = trainer.run.step = Shapes(trainer.run.step)
    summary = trainer.fit()
    expected = drawn(trainer, range(1))
    assert [side for side, _ in shapes.seen] == expected
    assert all(h == w for h, w in shapes.seen) and set(expected) <= set(SIZES)
    assert len(set(expected)) > 1  # the draw is not one size
    sizes = [size for size, _ in shapes.seen]
    assert all(top <= size for top, size in zip(shapes.largest, sizes, strict=True))
    assert summary["epochs"] == 1
    if trainer.run.val_loader is not None:
        assert summary["metrics"] and trainer.run.val_loader.dataset.imgsz == 64


def test_the_network_graph_records_one_shape_per_size(tiny_run, installed_falconet_plugins):
    """graph=cuda-graph's keying: a recording per size seen three times, never one per batch."""
    from falconet_graphs_cuda.graphed import GraphedNetwork
    from falconet_graphs_cuda.recording import BufferRecorder

    plugins = installed_falconet_plugins
    # 12 batches over 3 sizes: at least one size comes 4 times
    keys = {**tiny_run, "batch": "4", "epochs": 2, "val": "false", "multi_scale": "0.5-1.5"}
    trainer = Trainer(plan_run(keys, plugins), plugins)
    run = trainer.run
    network = GraphedNetwork(run.model, BufferRecorder(), capture_after=3)
    trainer.run.step = EagerStep(run.parts, network, network.stats)
    trainer.fit()
    counts = Counter(drawn(trainer, range(2)))
    recorded = {key[0][-1] for key in network.recordings}
    assert recorded and recorded == {size for size, n in counts.items() if n >= 3}
    assert network.counts["recorded"] == len(recorded) <= len(SIZES)
    assert network.counts["replayed"] == sum(n - 2 for s, n in counts.items() if s in recorded)


def test_the_whole_step_records_per_size_and_bucket(tiny_run, installed_falconet_plugins):
    from falconet_graphs_cuda.keys import GraphsCudaKeys
    from falconet_graphs_cuda.recording import EagerStepRecorder
    from falconet_graphs_cuda.whole_step import WholeStep

    plugins = installed_falconet_plugins
    keys = {**tiny_run, "batch": "4", "nbs": "8", "epochs": 2, "val": "false"}
    keys |= {"optimizer": "sgd", "multi_scale": "0.5-1.5"}
    trainer = Trainer(plan_run(keys, plugins), plugins)
    run = trainer.run
    options = GraphContext(run.device, run.precision, config=run.config).keys(GraphsCudaKeys)
    step = trainer.run.step = WholeStep(run.parts, options, EagerStepRecorder(), capture_after=3)
    trainer.fit()
    image_sizes = {key[0][-1] for key in step.micros}
    assert image_sizes and image_sizes <= set(drawn(trainer, range(2)))
    assert step.counts["recorded"] >= len(image_sizes) and step.counts["replayed"] > 0


def test_a_resumed_run_draws_and_trains_as_the_uninterrupted_one(
    tiny_run, installed_falconet_plugins, tmp_path
):
    plugins = installed_falconet_plugins
    keys = {**tiny_run, "batch": "4", "fraction": 0.5, "epochs": 2, "val": "false"}
    keys["multi_scale"] = "0.5-1.5"
    whole = Trainer(plan_run({**keys, "name": "whole"}, plugins), plugins)
    whole_shapes = whole.run.step = Shapes(whole.run.step)
    whole.fit()

    class StopAfterTheFirstEpoch:
        def on_epoch_end(self, state, row):
            state.request_stop("stopped for the test")

    cut = Trainer(plan_run({**keys, "name": "cut"}, plugins), plugins, [StopAfterTheFirstEpoch()])
    cut.fit()
    last = Path(cut.run_dir) / "weights" / "last.pt"
    resumed = Trainer(plan_run({"resume": str(last)}, plugins), plugins)
    resumed_shapes = resumed.run.step = Shapes(resumed.run.step)
    resumed.fit()
    per_epoch = whole.state.batches_per_epoch
    assert resumed_shapes.seen == whole_shapes.seen[per_epoch:]
    a = load_checkpoint(Path(whole.run_dir) / "weights" / "last.pt")["model"]
    b = load_checkpoint(last)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_python_api_takes_the_key_and_logs_the_sizes(tiny_run, caplog):
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        summary = Detector("yolo-n").train(
            **tiny_run, epochs=1, val=False, fraction=0.34, multi_scale=True
        )
    args = yaml.safe_load((Path(summary["run_dir"]) / "args.yaml").read_text())
    assert args["multi_scale"] == "0.5-1.5"
    assert "each batch trains at one of 32, 64, 96 px" in caplog.text


def test_the_cli_refuses_a_size_off_the_stride_before_training(falconet_cli, tiny_run):
    pairs = [f"{k}={v}" for k, v in tiny_run.items()]
    done = falconet_cli("train", *pairs, "multi_scale=32,80")
    assert done.returncode == 2
    assert "multi_scale='32,80': 80 is not a multiple of 32" in done.stderr + done.stdout
