"""A third party's assigner that declares itself static (falconet-testing's ``centre``, added
as a plugin) takes the whole step as falconet's own do: the YOLO family asks the assigner
object, and ``graph=whole-step`` reads the family's answer. On the CPU the backend refuses it
for the device alone; on a GPU it records and replays the step, and trains as eager does.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from falconet.data.targets import Targets
from falconet.training.assembly import Run, assemble, graph_context
from falconet.training.planning import plan_run
from falconet_graphs_cuda.backend import WholeStepBackend
from falconet_testing import static_assigner


@pytest.fixture
def plugins(installed_falconet_plugins):
    installed_falconet_plugins.add_plugin(
        static_assigner, "static-assigner", "falconet-testing", "0"
    )
    return installed_falconet_plugins


def keys_on(tiny_run, device: str) -> dict[str, str]:
    # 24 images, batch 4: 6 batches an epoch; nbs 8: accumulate 2
    keys = {**tiny_run, "batch": "4", "nbs": "8", "val": "false", "optimizer": "sgd"}
    return {**keys, "assigner": "centre", "graph": "whole-step", "device": device}


def test_on_the_cpu_whole_step_refuses_it_for_the_device_alone(tiny_run, plugins, caplog):
    with caplog.at_level(logging.WARNING, logger="falconet.train"):
        run = assemble(plan_run(keys_on(tiny_run, "cpu"), plugins), plugins)
    assert run.graph == "eager"
    assert "graph=whole-step declined: CUDA graphs need a CUDA device" in caplog.text
    context = graph_context(run.family, plugins, run.config, run.parts, run.world)
    assert context.static_loss  # the family asked centre, which declares itself static
    on_a_gpu = dataclasses.replace(context, device=torch.device("cuda", 0))
    assert WholeStepBackend().decline_reason(on_a_gpu) is None  # the device was all
    # the same run with an assigner that declares itself static nowhere: refused for that
    simota = run.config.model_copy(update={"assigner": "simota"})
    context = graph_context(run.family, plugins, simota, run.parts, run.world)
    on_a_gpu = dataclasses.replace(context, device=torch.device("cuda", 0))
    assert "static-shaped loss" in WholeStepBackend().decline_reason(on_a_gpu)


def train(run: Run, data: list, bucket: tuple[int, int]) -> list[float]:
    losses = []
    for i, batch in enumerate(data):
        images = batch["images"].to(run.device).float().div_(255)
        targets = Targets.from_batch(batch).padded(bucket).to(run.device)
        loss, _ = run.step(images, targets, update=(i + 1) % run.accumulate == 0)
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_on_a_gpu_it_runs_whole_step_and_trains_as_eager(tiny_run, plugins):
    keys = {**keys_on(tiny_run, "cuda:0"), "amp_dtype": "fp32", "deterministic": "true"}
    whole = assemble(plan_run(keys, plugins), plugins)
    eager = assemble(plan_run({**keys, "graph": "eager"}, plugins), plugins)
    assert (whole.graph, eager.graph) == ("whole-step", "eager")
    data = [batch for _ in range(2) for batch in eager.train_loader][:12]
    reference = train(eager, data, (32, 64))
    got = train(whole, data, (32, 64))  # one bucket: recorded on its third batch
    stats = whole.step.stats()
    assert stats.recorded >= 1 and stats.failed == 0 and stats.replayed >= 9
    assert min(got) > 0
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
