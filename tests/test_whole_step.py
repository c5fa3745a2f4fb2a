"""graph=whole-step's logic on the CPU: the static step (device-tensor learning rate, momentum
and EMA weight; gradients into static buffers) trains like the eager step; the whole step's
buckets, eager fallbacks and accumulation windows.

CUDA graphs need a GPU, so the recorder here runs the recorded functions eagerly on the same
static buffers (what a replay reads and writes); tools/check_graphs.py checks the recording on
the GPU machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import re
import shutil
import time

import pytest
import torch

from falconet.contract import GraphContext, Progress, StepParts
from falconet.data.targets import Targets, fits
from falconet.graph_backends.eager_step import EagerStep
from falconet.loss_scaler import LossScaler
from falconet.training.assembly import Run, assemble
from falconet.training.phases import Phases
from falconet.training.planning import plan_run
from falconet_graphs_cuda.backend import WholeStepBackend
from falconet_graphs_cuda.keys import GraphsCudaKeys
from falconet_graphs_cuda.recording import EagerStepRecorder
from falconet_graphs_cuda.whole_step import WholeStep


@pytest.fixture
def keys(tiny_run):
    # 24 images, batch 4: 6 batches an epoch; nbs 8: accumulate 2; on the CPU, also on a GPU
    # machine (the GPU test below asks for its device)
    keys = {**tiny_run, "batch": "4", "nbs": "8", "val": "false", "optimizer": "sgd"}
    return {**keys, "device": "cpu"}


def cuda_keys(run: Run) -> GraphsCudaKeys:
    """The run's values of the plugin's keys, as the backend reads them."""
    return GraphContext(run.device, run.precision, config=run.config).keys(GraphsCudaKeys)


def run_for(keys, plugins, recorder=None) -> Run:
    """The run's parts with the eager step, or with the whole step on ``recorder``."""
    run = assemble(plan_run(keys, plugins), plugins)
    if recorder is not None:
        run.step = WholeStep(run.parts, cuda_keys(run), recorder)
    return run


def batches(run, n: int) -> list[dict[str, torch.Tensor]]:
    out = []
    while len(out) < n:
        for batch in run.train_loader:
            out.append(batch)
            if len(out) == n:
                break
    return out


def train(run, data, targets_of=lambda t: t, after_update=lambda: None):
    losses = []
    for i, batch in enumerate(data):
        images = batch["images"].float().div_(255)
        targets = targets_of(Targets.from_batch(batch))
        update = (i + 1) % run.accumulate == 0
        loss, _ = run.step(images, targets, update=update)
        losses.append(float(loss.detach()))
        if update:
            after_update()
    return losses


def state(run) -> list[torch.Tensor]:
    tensors = list(run.model.state_dict().values())
    tensors += list(run.ema.module.state_dict().values())
    for name in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
        tensors += [s[name] for s in run.optimizer.state.values() if name in s]
    return tensors


def padded(bucket):
    return lambda targets: targets.padded(bucket)


@pytest.mark.parametrize(
    ("optimizer", "amp"), [("sgd", "fp32"), ("sgd", "bf16"), ("adamw", "fp32")]
)
def test_the_static_step_trains_like_the_eager_step(
    keys, installed_falconet_plugins, optimizer, amp
):
    """bf16 (autocast on the CPU): the static step casts the convolutions' weights to bf16
    itself, as autocast would, and trains bit for bit as eager all the same."""
    plugins = installed_falconet_plugins
    keys = {**keys, "optimizer": optimizer, "amp_dtype": amp}
    eager = run_for(keys, plugins)
    recorder = EagerStepRecorder()
    whole = run_for(keys, plugins, recorder)
    data = batches(eager, 12)
    reference = train(eager, data)
    got = train(whole, data)
    step = whole.step
    # eager until the optimizer's first step has made its momentum buffers and a (shape,
    # bucket) key has been seen 3 times; replayed from then on (the set has two buckets)
    stats = step.stats()
    assert stats.recorded >= 1 and stats.replayed >= 4 and stats.failed == 0
    assert stats.eager + stats.replayed == 12
    assert sum(m.replays for m in recorder.micros) == stats.replayed
    assert whole.progress.updates == eager.progress.updates == 6
    assert whole.ema.updates == eager.ema.updates
    casts = {w.dtype for w in step.step.cast_weights}
    assert casts == ({torch.bfloat16} if amp == "bf16" else set())  # every conv's weights
    if optimizer == "sgd":  # the static SGD update is torch's bit for bit (static_step)
        assert got == reference
        assert all(torch.equal(a, b) for a, b in zip(state(eager), state(whole), strict=True))
        return
    # AdamW's first replayed update differs from torch's by rounding (about 1e-8, see
    # static_step's docstring); training carries that along: close, not equal
    torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-5)
    for a, b in zip(state(eager), state(whole), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(
    ("optimizer", "nesterov"), [("sgd", True), ("sgd", False), ("adamw", False)]
)
@pytest.mark.parametrize("clip", [0.0, 0.05])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_static_update_is_torch_optim_clip_and_ema(optimizer, nesterov, clip, dtype):
    """The static update (learning rate, momentum or betas, bias corrections as tensors)
    against clip_grad_norm_ + torch.optim.SGD or AdamW + ModelEMA, for three groups with their
    own learning rates, momenta and weight decay: SGD's bit for bit; AdamW's to rounding
    (its step size is a tensor factor where torch fuses a Python number in)."""
    from types import SimpleNamespace

    from falconet.training.optimization import ModelEMA, parameter_groups
    from falconet_graphs_cuda.static_step import StaticStep

    def setup():
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Conv2d(4, 2, 1)
        ).to(dtype)
        groups = parameter_groups(net, 5e-4 if optimizer == "sgd" else 0.05, False)
        if optimizer == "sgd":
            optim = torch.optim.SGD(groups, lr=0.01, momentum=0.9, nesterov=nesterov)
        else:
            optim = torch.optim.AdamW(groups, lr=0.01, betas=(0.9, 0.999))
        return StepParts(
            model=net,
            loss=None,  # the update alone is under test
            optimizer=optim,
            precision=SimpleNamespace(autocast=lambda device: contextlib.nullcontext()),
            scaler=None,
            ema=ModelEMA(net, 0.9999, 2000),
            clip_grad=clip,
            loss_gain=4.0,
            schedule=None,
            progress=Progress(),
            phases=Phases(),
            device=torch.device("cpu"),
        )

    def set_grads(trainer, seed):
        g = torch.Generator().manual_seed(seed)
        for p in trainer.model.parameters():
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)

    def schedule(trainer, k):
        for i, group in enumerate(trainer.optimizer.param_groups):
            group["lr"] = 0.01 * (i + 1) / (k + 1)
            if optimizer == "sgd":
                group["momentum"] = 0.8 + 0.01 * k
            else:
                group["betas"] = (0.8 + 0.01 * k, group["betas"][1])

    eager, static = setup(), setup()
    step = StaticStep(static, GraphsCudaKeys())
    for k in range(4):
        schedule(eager, k)
        set_grads(eager, k)
        if clip:
            torch.nn.utils.clip_grad_norm_(eager.model.parameters(), clip, foreach=True)
        eager.optimizer.step()
        eager.ema.update(eager.model)
        schedule(static, k)
        set_grads(static, k)
        if k == 0:  # the first step is torch's own: it makes the momentum buffers
            if clip:
                torch.nn.utils.clip_grad_norm_(static.model.parameters(), clip, foreach=True)
            static.optimizer.step()
            static.ema.update(static.model)
            continue
        assert step.ready()
        step.bind()
        for p, grad in zip(step.params, [p.grad.clone() for p in step.params], strict=True):
            p.grad.copy_(grad)
        step.fill_scalars(update=True)
        step.update()
        step.after_update()
        assert all(float(g.abs().sum()) == 0 for g in step.grads)  # zeroed for the next window
    emas = (eager.ema.module.state_dict().values(), static.ema.module.state_dict().values())
    params = list(zip(eager.model.parameters(), static.model.parameters(), strict=True))
    state_a, state_b = eager.optimizer.state, static.optimizer.state
    keys = ("momentum_buffer",) if optimizer == "sgd" else ("exp_avg", "exp_avg_sq", "step")
    pairs = [
        *params,
        *zip(*emas, strict=True),
        *((state_a[a][k], state_b[b][k]) for a, b in params for k in keys),
    ]
    for a, b in pairs:
        if optimizer == "sgd":
            assert torch.equal(a, b)
        elif dtype == torch.float64:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert eager.ema.updates == static.ema.updates == 4


def test_a_batch_with_fewer_boxes_replays_in_a_larger_bucket(keys, installed_falconet_plugins):
    plugins = installed_falconet_plugins
    whole = run_for(keys, plugins, EagerStepRecorder())
    data = batches(whole, 10)
    # (slots per image, boxes per batch): at most (16, 32) in these batches of 4, and varied
    buckets = {Targets.from_batch(b).bucket for b in data}
    assert len(buckets) > 1 and all(fits(b, (16, 32)) for b in buckets)
    train(whole, data[:6], padded((32, 64)))  # records the larger bucket (and the one above)
    step = whole.step
    assert [r.bucket for r in next(iter(step.micros.values()))] == [(32, 64), (64, 128)]
    replayed = step.stats().replayed
    train(whole, data[6:])  # each bucket fits in (32, 64): replayed, not recorded
    assert step.stats().replayed == replayed + 4 and step.stats().recorded == 2
    assert step.micros[next(iter(step.micros))][1].replays == 0  # the smallest bucket replays


def test_a_new_box_count_records_at_the_largest_slot_count_so_far(keys, installed_falconet_plugins):
    """Per box, the slots per image cost next to nothing, so a recording for a new batch box
    count ``N`` takes the largest ``M`` recorded before: fewer recordings in a run. A bucket
    recorded as its eager batches ran it is ``trained`` (no warm-up pass needed); a widened
    one is not, nor the bucket recorded ahead with the first."""
    recorder = EagerStepRecorder()
    whole = run_for(keys, installed_falconet_plugins, recorder)
    data = batches(whole, 12)
    few_slots = [b for b in data if Targets.from_batch(b).bucket[0] == 8][:3]
    assert len(few_slots) == 3
    train(whole, data[:6], padded((32, 32)))  # recorded at (32, 32), and (64, 64) ahead
    train(whole, few_slots, padded((8, 128)))  # a new N: recorded at (64, 128)
    step = whole.step
    buckets = [r.bucket for r in next(iter(step.micros.values()))]
    assert buckets == [(32, 32), (64, 64), (64, 128)]
    assert recorder.trained == [True, False, False]
    recorded, replayed = step.stats().recorded, step.stats().replayed
    train(whole, data[:2], padded((32, 128)))  # fits: no fourth recording
    assert step.stats().recorded == recorded == 3
    assert step.stats().replayed == replayed + 2


def test_the_first_recording_records_the_bucket_above_it_and_its_batches_replay_at_once(
    keys, installed_falconet_plugins, caplog
):
    """With the run's first recording the bucket above it is recorded too (``ahead_bucket``):
    a later batch of that bucket replays at once, with no eager batch and no recording in the
    middle of its epoch, and trains as the eager step does."""
    plugins = installed_falconet_plugins
    eager = run_for(keys, plugins)
    whole = run_for(keys, plugins, EagerStepRecorder())
    data = batches(eager, 12)
    plan = [(data[:6], (32, 32)), (data[6:], (64, 64))]
    initial = [t.clone() for t in state(whole)]
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        reference = [x for part, b in plan for x in train(eager, part, padded(b))]
        got = [x for part, b in plan for x in train(whole, part, padded(b))]
    stats = whole.step.stats()
    assert stats.recorded == 2 and stats.eager == 2  # the first bucket's first two batches
    assert stats.replayed == 10  # the third (32, 32) batch on: every (64, 64) batch too
    assert "with target bucket (64, 64) ahead" in caplog.text
    assert got == reference
    assert all(torch.equal(a, b) for a, b in zip(state(eager), state(whole), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(state(eager), initial, strict=True))


def test_a_failed_recording_ahead_is_logged_and_the_run_keeps_its_recordings(
    keys, installed_falconet_plugins, caplog
):
    """The bucket recorded ahead is a convenience: its capture failing leaves the first
    recording replaying, and a batch that needs that bucket records it by the usual rule."""

    class FailsAhead(EagerStepRecorder):
        failed_once = False

        def micro(self, step, images, targets, bucket, *, trained=False):
            if bucket == (64, 64) and not self.failed_once:
                self.failed_once = True
                raise RuntimeError("CUDA error: out of memory")
            return super().micro(step, images, targets, bucket, trained=trained)

    plugins = installed_falconet_plugins
    eager = run_for(keys, plugins)
    whole = run_for(keys, plugins, FailsAhead())
    data = batches(eager, 12)
    plan = [(data[:6], (32, 32)), (data[6:], (64, 64))]
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        reference = [x for part, b in plan for x in train(eager, part, padded(b))]
        got = [x for part, b in plan for x in train(whole, part, padded(b))]
    stats = whole.step.stats()
    assert stats.failed == 0 and not whole.step.failed  # not given up
    assert "did not capture the step ahead for target bucket (64, 64)" in caplog.text
    # (64, 64) recorded on its third batch, by the usual rule, after two eager ones
    assert [r.bucket for r in next(iter(whole.step.micros.values()))] == [(32, 32), (64, 64)]
    assert stats.eager == 4 and stats.recorded == 2
    assert got == reference


def test_padding_does_not_change_the_loss(keys, installed_falconet_plugins):
    run = run_for(keys, installed_falconet_plugins)
    batch = batches(run, 1)[0]
    images = batch["images"].float().div_(255)
    targets = Targets.from_batch(batch)
    run.model.train()
    with torch.no_grad():
        outputs = run.model(images)
        small, _ = run.parts.loss(outputs, targets)
        larger, _ = run.parts.loss(outputs, targets.padded((32, 64)))
    torch.testing.assert_close(small, larger)


def test_a_failed_recording_continues_eagerly(keys, installed_falconet_plugins, caplog):
    plugins = installed_falconet_plugins
    eager = run_for(keys, plugins)
    whole = run_for(keys, plugins, EagerStepRecorder(fail=True))
    data = batches(eager, 8)
    with caplog.at_level(logging.ERROR, "falconet.train"):
        reference, got = train(eager, data), train(whole, data)
    assert got == reference  # every batch ran the whole step's own eager step
    assert whole.step.stats().failed == 1
    assert not whole.step.stats().pending  # nothing more to wait for
    assert caplog.text.count("could not capture the step") == 1


def test_the_whole_step_runs_as_one_phase(keys, installed_falconet_plugins):
    whole = run_for(keys, installed_falconet_plugins, EagerStepRecorder())
    names: list[str] = []

    def timer(name):
        names.append(name)
        return torch.autograd.profiler.record_function(name)

    whole.phases.use(timer)
    train(whole, batches(whole, 8), padded((32, 64)))  # one bucket
    stats = whole.step.stats()
    assert stats.replayed >= 2
    # a replayed batch is one "step" phase; a batch left to the eager step runs its phases
    assert names.count("step") == stats.replayed and names.count("forward") == stats.eager
    assert stats.replayed + stats.eager == 8


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "sgd without momentum": lambda params: torch.optim.SGD(params, lr=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


@pytest.mark.parametrize(
    ("optimizer", "scaled", "static", "reason"),
    [
        ("sgd", False, True, None),
        ("sgd", True, True, None),
        ("adamw", True, True, "step count"),
        ("adamw", False, True, None),
        ("adam", False, True, "only SGD and AdamW"),
        (None, False, True, "no optimizer: only SGD and AdamW"),
        ("sgd without momentum", False, True, "momentum"),
        ("sgd", False, False, "static-shaped loss"),
    ],
)
def test_whole_step_declines_what_it_cannot_capture(optimizer, scaled, static, reason):
    """It decides by the objects it is handed: the built optimizer, the loss scaler (fp16's),
    the family's answer for the run's assigner; never by a key's name or value."""
    from falconet.precision import BF16, FP16

    net = torch.nn.Linear(1, 1)
    context = GraphContext(
        torch.device("cuda", 0),
        FP16 if scaled else BF16,
        capture_region=net,
        static_loss=static,
        optimizer=None if optimizer is None else OPTIMIZERS[optimizer](net.parameters()),
        scaler=LossScaler("cpu") if scaled else None,
    )
    got = WholeStepBackend().decline_reason(context)
    assert got is None if reason is None else reason in got


def test_the_static_step_refuses_what_the_backend_declines(keys, installed_falconet_plugins):
    """One rule for both (:func:`falconet_graphs_cuda.static_update.unsupported`)."""
    from falconet_graphs_cuda.static_step import StaticStep

    run = run_for(keys, installed_falconet_plugins)
    parts = dataclasses.replace(run.parts, optimizer=OPTIMIZERS["adam"](run.model.parameters()))
    with pytest.raises(TypeError, match="only SGD and AdamW steps are captured"):
        StaticStep(parts, cuda_keys(run))


def test_whole_step_takes_auto_in_a_distributed_run(installed_falconet_plugins):
    """It records the gradients' all-reduce in the step (tests/test_distributed_whole_step.py),
    so a distributed run no longer makes it decline."""
    from falconet.precision import BF16
    from falconet.training.backends import choose_graph

    net = torch.nn.Linear(1, 1)
    sgd = OPTIMIZERS["sgd"](net.parameters())
    context = GraphContext(torch.device("cuda", 0), BF16, 2, net, True, sgd)
    assert WholeStepBackend().decline_reason(context) is None
    assert choose_graph("auto", context, net, installed_falconet_plugins)[0] == "whole-step"


def test_the_yolo_family_asks_its_assigner_whether_its_loss_is_static(installed_falconet_plugins):
    """What each assigner declares for the device: ``tal`` everywhere; ``hungarian`` on a GPU
    where it solves there (on a CPU machine, nowhere); ``simota`` nowhere yet."""
    from falconet_detect.assigners.gpu_solver import gpu_solver

    plugins = installed_falconet_plugins
    family, assigner = plugins.families.get("yolo"), plugins.assigners.get
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert family.static_loss(assigner("tal"), cpu) and family.static_loss(assigner("tal"), cuda)
    assert not family.static_loss(assigner("simota"), cuda)
    assert not family.static_loss(assigner("hungarian"), cpu)
    assert family.static_loss(assigner("hungarian"), cuda) == (gpu_solver() is not None)


@pytest.mark.skipif(
    not any(map(shutil.which, ("c++", "g++", "clang++"))),
    reason="Inductor needs a C++ compiler on the CPU and none is on PATH",
)
@pytest.mark.parametrize(
    ("fuse", "network", "loss"),
    [("inductor", 1, 0), ("inductor-loss", 0, 1), ("inductor-all", 1, 1)],
)
def test_fuse_compiles_the_network_or_the_loss_inside_the_step(
    keys, installed_falconet_plugins, fuse, network, loss, caplog
):
    """``fuse=inductor`` compiles the static step's forward, ``inductor-loss`` the loss with
    its assigner, ``inductor-all`` both: Inductor's kernels, not the eager ones, and training
    follows the eager step to rounding."""
    plugins = installed_falconet_plugins
    eager = run_for(keys, plugins)
    with caplog.at_level(logging.WARNING, logger="falconet.train"):
        fused = run_for({**keys, "fuse": fuse}, plugins, EagerStepRecorder())
    data = batches(eager, 8)
    one_bucket = padded((32, 64))  # replays from the 3rd batch
    reference = train(eager, data, one_bucket)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    got = train(fused, data, one_bucket)
    assert f"fuse={fuse}: the captured step runs Inductor's kernels" in caplog.text  # said
    assert f"this run is {fused.precision.name}: check your accuracy" in caplog.text
    assert fused.step.stats().replayed >= 2
    # Dynamo compiled what was asked: the network once, the loss once per target bucket run
    # (this recorder runs nothing when it records: the bucket recorded ahead is never run here)
    recordings = [r for recorded in fused.step.micros.values() for r in recorded]
    buckets = sum(1 for r in recordings if r.replays)
    assert len(recordings) == 2 and buckets == 1
    assert counters["stats"]["unique_graphs"] == network + loss * buckets
    assert not counters["graph_break"]  # in one piece: no eager op between Inductor kernels
    torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-5)
    # and so do the weights, BatchNorm's running statistics, the EMA and the momentum, each to
    # a thousandth of its own scale
    for got_tensor, reference_tensor in zip(state(fused), state(eager), strict=True):
        scale = reference_tensor.double().abs().max().item()
        gap = (got_tensor.double() - reference_tensor.double()).abs().max().item()
        assert gap <= 1e-3 * scale + 1e-7


def scaled_run(keys, plugins, recorder=None, **scaler) -> Run:
    """A run with fp16's loss scaler (float32 on the CPU: ``scaler`` sets a scale high enough
    to overflow), and the whole step when ``recorder`` is given."""
    run = run_for(keys, plugins)
    run.parts = dataclasses.replace(run.parts, scaler=LossScaler("cpu", **scaler))
    run.scaler = run.parts.scaler
    run.step = EagerStep(run.parts)
    if recorder is not None:
        run.step = WholeStep(run.parts, cuda_keys(run), recorder)
    return run


def run_scaled(run, data, targets_of=lambda t: t):
    """Losses of every batch and the scale after every update."""
    scales: list[float] = []
    losses = train(run, data, targets_of, lambda: scales.append(run.scaler.get_scale()))
    return losses, scales


def test_the_static_step_with_a_gradient_scaler_matches_the_eager_scaler(
    keys, installed_falconet_plugins
):
    """fp16's gradient scaler on the device (float32 on the CPU here): the loss scaled, the
    gradients unscaled, an overflowed update undone and the scale backed off, the scale grown
    after clean steps, as ``GradScaler`` does on the host. The scale starts high and grows
    fast, so that replayed updates both overflow and go through."""
    plugins = installed_falconet_plugins
    scaler = {
        "init_scale": 2.0**110,
        "growth_factor": 2.0**8,
        "backoff_factor": 2.0**-8,
        "growth_interval": 1,
    }
    eager = scaled_run(keys, plugins, **scaler)
    whole = scaled_run(keys, plugins, EagerStepRecorder(), **scaler)
    data = batches(eager, 16)
    reference, reference_scales = run_scaled(eager, data)
    got, scales = run_scaled(whole, data)
    stats = whole.step.stats()
    assert stats.recorded >= 1 and stats.replayed >= 6 and stats.failed == 0
    assert scales == reference_scales
    replayed_updates = scales[-stats.replayed // whole.accumulate :]
    steps = list(itertools.pairwise(replayed_updates))
    assert any(b < a for a, b in steps) and any(b > a for a, b in steps)  # skipped and taken
    assert got == reference
    assert all(torch.equal(a, b) for a, b in zip(state(eager), state(whole), strict=True))


def test_fp16_records_before_the_scalers_first_taken_update(keys, installed_falconet_plugins):
    """The scaler's first updates overflow and are skipped, so torch's SGD has made no momentum
    buffer yet; whole-step makes them as zeros and records on the third batch all the same,
    and trains bit for bit as eager does (whose first taken step copies the gradient)."""
    plugins = installed_falconet_plugins
    scaler = {"init_scale": 2.0**127, "backoff_factor": 0.5, "growth_interval": 1000}
    eager = scaled_run(keys, plugins, **scaler)
    whole = scaled_run(keys, plugins, EagerStepRecorder(), **scaler)
    data = batches(eager, 12)
    one_bucket = padded((32, 64))
    reference, reference_scales = run_scaled(eager, data, one_bucket)
    skipped = sum(b < a for a, b in itertools.pairwise([2.0**127, *reference_scales]))
    assert skipped >= 2 and reference_scales[-1] == reference_scales[-2]  # skipped, then taken
    got, scales = run_scaled(whole, data, one_bucket)
    stats = whole.step.stats()
    # (32, 64), and the bucket above it recorded ahead
    assert (stats.replayed, stats.eager, stats.recorded, stats.failed) == (10, 2, 2, 0)
    assert scales == reference_scales and got == reference
    assert all(torch.equal(a, b) for a, b in zip(state(eager), state(whole), strict=True))


def test_make_state_keeps_a_restored_momentum_buffer(keys, installed_falconet_plugins):
    """Zero buffers only where the optimizer has none: a buffer a resume restored is kept, and
    the state is filled in torch's order (the order ``optimizer.state`` iterates in)."""
    from falconet_graphs_cuda.static_step import StaticStep

    run = run_for(keys, installed_falconet_plugins)
    step = StaticStep(run.parts, cuda_keys(run))
    optimizer = run.optimizer
    first = optimizer.param_groups[0]["params"][0]
    restored = torch.full_like(first, 0.25)
    optimizer.state[first]["momentum_buffer"] = restored
    assert not step.ready()
    step.make_state()
    assert step.ready()
    assert optimizer.state[first]["momentum_buffer"] is restored
    ordered = [p for group in optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in optimizer.state] == [id(p) for p in ordered if p.requires_grad]
    for param in step.params:
        if param is not first:
            buffer = optimizer.state[param]["momentum_buffer"]
            assert buffer.shape == param.shape and float(buffer.abs().sum()) == 0


def test_make_state_gives_adamw_the_state_torch_makes(keys, installed_falconet_plugins):
    """AdamW's state made before its first step (host step count 0, zero moments) is the one
    torch makes on that step: two optimizers, one given the state first, take three steps on
    the same gradients and end bit for bit equal, step counts and their dtype included."""
    from falconet_graphs_cuda.static_step import StaticStep

    keys = {**keys, "optimizer": "adamw"}
    trainers = [run_for(keys, installed_falconet_plugins) for _ in range(2)]
    trainers[1].model.load_state_dict(trainers[0].model.state_dict())
    step = StaticStep(trainers[1].parts, cuda_keys(trainers[1]))
    assert not step.ready()
    step.make_state()
    assert step.ready()
    for k in range(3):
        for trainer in trainers:
            generator = torch.Generator().manual_seed(k)
            for p in trainer.model.parameters():
                p.grad = torch.randn(p.shape, generator=generator)
            trainer.optimizer.step()
    params = list(zip(*(t.model.parameters() for t in trainers), strict=True))
    assert all(torch.equal(a, b) for a, b in params)
    states = [t.optimizer.state for t in trainers]
    for a, b in params:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            x, y = states[0][a][key], states[1][b][key]
            assert torch.equal(x, y) and x.dtype == y.dtype and x.device == y.device


def test_packed_gradients_are_views_of_one_buffer_in_the_parameters_layouts():
    """The static gradients share one flat buffer (one ``where`` neutralises an overflowed
    step, one ``zero_`` clears them) and keep each parameter's shape and strides."""
    from falconet_graphs_cuda.static_update import packed_like

    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    params = [conv.weight, conv.bias, torch.nn.Parameter(torch.randn(5, 4))]
    flat, views = packed_like(params)
    assert flat.numel() == sum(p.numel() for p in params) and float(flat.abs().sum()) == 0
    for param, view in zip(params, views, strict=True):
        assert view.shape == param.shape and view.stride() == param.stride()
        assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    views[0].add_(1.0)
    views[2].add_(2.0)
    assert float(flat.sum()) == params[0].numel() + 2.0 * params[2].numel()  # no overlap
    with pytest.raises(TypeError, match="one dtype"):
        packed_like([conv.weight, torch.nn.Parameter(torch.randn(3, dtype=torch.float64))])


def test_recording_time_is_counted_and_logged(keys, installed_falconet_plugins, caplog):
    """Each recording's host time adds to the step's ``capture_seconds`` and is in its log
    line with the phases the recorder timed (tools/bench_train.py reports the sum for an
    end-to-end run)."""

    class SlowRecorder(EagerStepRecorder):
        def micro(self, *args, **kwargs):
            time.sleep(0.05)
            recording = super().micro(*args, **kwargs)
            recording.phases = {"warm-up (3)": 0.04, "capture": 0.01}  # as CudaStepRecorder's
            return recording

    whole = run_for(keys, installed_falconet_plugins, SlowRecorder())
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        train(whole, batches(whole, 6), padded((32, 64)))  # one bucket, and the one above
    stats = whole.step.stats()
    assert stats.recorded == 2
    assert stats.capture_seconds >= 0.1
    assert re.search(
        r"captured the step for input .* with target bucket .* in \d+ ms, "
        r"warm-up \(3\) 40 ms, capture 10 ms",
        caplog.text,
    )


def test_micro_casts_weights_and_counts_batches_in_one_kernel_each(
    keys, installed_falconet_plugins
):
    """In bf16 (autocast on the CPU), the static step's forward + loss + backward dispatches
    one cast per convolution parameter fewer in each direction and no per-BatchNorm counter
    add, against the trainer's own eager forward, loss and backward of the same batch: those
    became two multi-tensor copies and one multi-tensor add. The counters still advance
    (the numbers are tested in test_the_static_step_trains_like_the_eager_step)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    from falconet_graphs_cuda.static_step import StaticStep

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    run = run_for({**keys, "amp_dtype": "bf16"}, installed_falconet_plugins)
    batch = batches(run, 1)[0]
    images = batch["images"].float().div_(255)
    targets = Targets.from_batch(batch)
    step = StaticStep(run.parts, cuda_keys(run))
    eager, static = Ops(), Ops()
    with eager:
        with run.precision.autocast(run.device):
            outputs = run.model(images)
        loss, _ = run.parts.loss(outputs, targets)
        torch.autograd.grad(loss * run.parts.loss_gain, step.params)  # as micro: no .grad
    counters = [m.num_batches_tracked for _, m in step.counted]
    before = [int(c) for c in counters]
    with static:
        step.micro(images, targets)
    casts, norms = len(step.cast_indices), len(step.counted)
    assert casts > 0 and norms > 0
    assert eager.count["aten._to_copy"] - static.count["aten._to_copy"] == 2 * casts
    assert static.count["aten._foreach_copy_"] == 2
    assert eager.count["aten.add_"] - static.count["aten.add_"] == norms
    assert [int(c) for c in counters] == [b + 1 for b in before]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_a_bucket_recorded_after_the_update_hands_back_its_own_loss(
    keys, installed_falconet_plugins
):
    """The recordings share one memory pool. A bucket recorded after the update is replayed
    before it at every update step, and the update's temporaries may lie where that recording
    put its loss: the loss a replay hands back must still be its own (it read 0 at the update
    steps of detr-n's paired check on the H200 before the outputs were held outside the pool)."""
    from falconet_graphs_cuda.recording import CudaStepRecorder

    plugins = installed_falconet_plugins
    keys = {**keys, "device": "cuda:0", "amp_dtype": "fp32", "deterministic": "true"}
    eager = run_for(keys, plugins)
    whole = run_for(keys, plugins, CudaStepRecorder())
    data = batches(eager, 12)
    few_slots = [b for b in data if Targets.from_batch(b).bucket[0] == 8][:3]
    assert len(few_slots) == 3  # as in test_a_new_box_count_records_at_the_largest_slot_count
    plan = [(data[:6], (32, 32)), (few_slots, (8, 64)), (data[:4], (32, 64))]
    device = eager.device

    def on_device(bucket):
        return lambda targets: targets.padded(bucket).to(device)

    plan = [([{**b, "images": b["images"].to(device)} for b in part], b) for part, b in plan]
    reference = [loss for part, bucket in plan for loss in train(eager, part, on_device(bucket))]
    got = [loss for part, bucket in plan for loss in train(whole, part, on_device(bucket))]
    step = whole.step
    assert step.stats().recorded >= 2 and step.stats().replayed >= 6  # (32, 64) after the update
    assert min(abs(x) for x in got) > 0.1
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_a_bucket_its_eager_batches_ran_is_recorded_without_a_pass_and_trains_as_eager(
    keys, installed_falconet_plugins
):
    """A new target bucket at a recorded image shape, whose batches of exactly that bucket ran
    on the eager step first, is captured with no warm-up pass; its replays give the eager
    step's losses."""
    from falconet_graphs_cuda.recording import CudaStepRecorder

    plugins = installed_falconet_plugins
    keys = {**keys, "device": "cuda:0", "amp_dtype": "fp32", "deterministic": "true"}
    eager = run_for(keys, plugins)
    whole = run_for(keys, plugins, CudaStepRecorder())
    data = batches(eager, 12)
    device = eager.device
    # past the bucket recorded ahead with the first, (64, 64), at its slots per image
    plan = [(data[:6], (32, 32)), (data[6:], (64, 128))]
    plan = [([{**b, "images": b["images"].to(device)} for b in part], b) for part, b in plan]

    def on_device(bucket):
        return lambda targets: targets.padded(bucket).to(device)

    reference = [loss for part, bucket in plan for loss in train(eager, part, on_device(bucket))]
    got = [loss for part, bucket in plan for loss in train(whole, part, on_device(bucket))]
    recordings = next(iter(whole.step.micros.values()))
    assert [r.bucket for r in recordings] == [(32, 32), (64, 64), (64, 128)]
    phases = [next(iter(r.phases)) for r in recordings]
    assert phases == ["warm-up (3)", "warm-up (1)", "warm-up (0)"]
    assert whole.step.stats().replayed >= 6
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
