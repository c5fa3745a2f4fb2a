"""detr-n under graph=whole-step's logic on the CPU: with its matching on the device the DETR
loss can be recorded with the rest of the step, so the loss must not change when the whole
step pads the targets to a recorded bucket, and the whole step must train as the eager one.

The recorder runs the recorded functions eagerly on the same static buffers (what a replay
reads and writes), as in test_whole_step.py; tools/check_graphs.py and the GPU tests of the
hungarian assigner check the recording itself on the GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from falconet.contract import GraphContext
from falconet.data.targets import Targets
from falconet.training.assembly import Run, assemble
from falconet.training.planning import plan_run
from falconet_graphs_cuda.keys import GraphsCudaKeys
from falconet_graphs_cuda.recording import EagerStepRecorder
from falconet_graphs_cuda.whole_step import WholeStep


@pytest.fixture
def keys(tiny_run):
    # the family's recipe (AdamW, clipping at 0.1, EMA); 4 images a batch; on the CPU on every
    # machine (on a GPU machine device=auto would take cache=gpu's loader and its own draws)
    return {
        **tiny_run,
        "model": "detr-n",
        "batch": "4",
        "nbs": "8",
        "val": "false",
        "device": "cpu",
    }


def run_for(keys, plugins, recorder=None) -> Run:
    run = assemble(plan_run(keys, plugins), plugins)
    if recorder is not None:
        cuda_keys = GraphContext(run.device, run.precision, config=run.config).keys(GraphsCudaKeys)
        run.step = WholeStep(run.parts, cuda_keys, recorder)
    return run


def batches(run: Run, n: int) -> list[dict[str, torch.Tensor]]:
    out: list[dict[str, torch.Tensor]] = []
    while len(out) < n:
        out.extend(run.train_loader)
    return out[:n]


def train(run: Run, data) -> list[float]:
    losses = []
    for i, batch in enumerate(data):
        update = (i + 1) % run.accumulate == 0
        images, targets = batch["images"].float().div_(255), Targets.from_batch(batch)
        loss, _ = run.step(images, targets, update=update)
        losses.append(float(loss.detach()))
    return losses


def test_padding_the_targets_does_not_change_the_detr_loss(keys, installed_falconet_plugins):
    """The whole step replays a batch in a recorded bucket larger than its own: the padded
    slots get denoising queries and cost rows, and neither may move the loss."""
    run = run_for(keys, installed_falconet_plugins)
    batch = batches(run, 1)[0]
    targets = Targets.from_batch(batch)
    run.model.train()
    with torch.no_grad():
        outputs = run.model(batch["images"].float().div_(255))
        torch.manual_seed(0)  # the same denoising draws for the real slots (slot_draws)
        small, small_parts = run.parts.loss(outputs, targets)
        torch.manual_seed(0)
        larger, larger_parts = run.parts.loss(outputs, targets.padded((32, 64)))
    torch.testing.assert_close(small, larger)
    for name, value in small_parts.items():
        torch.testing.assert_close(value, larger_parts[name])


def test_the_detr_whole_step_trains_like_the_eager_step(keys, installed_falconet_plugins):
    """With SGD, whose static update is torch's exactly (test_whole_step.py shows AdamW's
    within rounding of torch's; DETR's matching turns such rounding into another matching
    within a few steps, so the family is compared where it is exact), over replays in the
    batch's own bucket and in a larger one: losses, weights, EMA and momentum bit for bit. The
    denoising pass runs the decoder inside the loss; the static step runs the loss with the
    leaves in place of the parameters, so those gradients reach the update as eager's do."""
    plugins = installed_falconet_plugins
    keys = {**keys, "optimizer": "sgd", "momentum": "0.9", "lr0": "0.001"}
    eager = run_for(keys, plugins)
    whole = run_for(keys, plugins, EagerStepRecorder())
    data = batches(eager, 10)
    buckets = [Targets.from_batch(b).bucket for b in data]
    assert len(set(buckets)) > 1  # some batches replay padded to a larger bucket
    torch.manual_seed(0)  # the denoising draws
    reference = train(eager, data)
    torch.manual_seed(0)
    got = train(whole, data)
    stats = whole.step.stats()
    assert stats.recorded >= 1 and stats.replayed >= 6 and stats.failed == 0
    assert whole.progress.updates == eager.progress.updates == 5
    assert got == reference
    weights = [*eager.model.state_dict().values(), *eager.ema.module.state_dict().values()]
    replayed = [*whole.model.state_dict().values(), *whole.ema.module.state_dict().values()]
    assert all(torch.equal(a, b) for a, b in zip(weights, replayed, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(momenta(eager), momenta(whole), strict=True))


def momenta(run: Run) -> list[torch.Tensor]:
    state = run.optimizer.state
    return [state[p]["momentum_buffer"] for p in run.model.parameters()]
