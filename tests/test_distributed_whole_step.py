"""graph=whole-step under DDP, on two Gloo ranks: the whole step with its collectives inside
(the gradients' all-reduce and the buffers' broadcast in the update, agreement on each batch's
key on the host) trains bit for bit as the eager DDP step, YOLO's loss and BatchNorm included.

CUDA graphs need a GPU, so the recorder "replays" by running the recorded functions on the
static buffers (falconet_graphs_cuda.recording.EagerStepRecorder), collectives included;
tools/check_graphs.py --ddp records them in CUDA graphs over NCCL on the GPU machine.

Both tests read one two-rank run (the ``arms`` fixture): the eager DDP reference is trained
once, then the whole step twice from the same batches, once with every recording succeeding
and once with rank 1's failing; each test asserts on its own arm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ARMS_SCRIPT = """
import gc
import json
import os
import sys

import torch
import torch.distributed as dist

from falconet.data.targets import Targets
from falconet.contract import GraphContext
from falconet.plugins import get_plugins
from falconet.training.assembly import assemble
from falconet.training.distributed import stop
from falconet.training.planning import plan_run
from falconet_graphs_cuda.keys import GraphsCudaKeys
from falconet_graphs_cuda.recording import EagerStepRecorder
from falconet_graphs_cuda.whole_step import WholeStep

keys = json.loads(sys.argv[2])
plugins = get_plugins()


def arm(failing_rank=None):
    # the eager DDP run, or (failing_rank given; -1: none) the whole step's, whose recordings
    # fail on that rank
    run = assemble(plan_run(keys, plugins), plugins)
    if failing_rank is not None:  # the eager DDP step assemble made is dropped (and its
        run.step = None  # reducer's hooks with it)
        gc.collect()
        options = GraphContext(run.device, run.precision, config=run.config)
        recorder = EagerStepRecorder(fail=dist.get_rank() == failing_rank)
        run.step = WholeStep(run.parts, options.keys(GraphsCudaKeys), recorder)
    return run


def train(run, data):
    losses = []
    for i, batch in enumerate(data):
        images = batch["images"].float().div_(255)
        update = (i + 1) % run.accumulate == 0
        losses.append(float(run.step(images, Targets.from_batch(batch), update=update).loss))
    return losses


def state(run):
    tensors = dict(run.model.state_dict())
    tensors |= {f"ema.{k}": v for k, v in run.ema.module.state_dict().items()}
    for i, s in enumerate(run.optimizer.state.values()):
        tensors[f"momentum.{i}"] = s["momentum_buffer"]
    return {k: v.detach().clone() for k, v in tensors.items()}


initial = state(arm())  # every rank: assembling a run is collective (DDP's set-up)
eager = arm()
eager.train_loader.batch_sampler.set_epochs(0, 8)  # 3 batches an epoch
data = list(eager.train_loader)
reference = train(eager, data)
rank = dist.get_rank()
buckets = [None] * dist.get_world_size()
dist.all_gather_object(buckets, [list(Targets.from_batch(b).bucket) for b in data])
results = {}
for name, failing_rank in {"whole": -1, "rank 1 fails": 1}.items():
    whole = arm(failing_rank)
    got = train(whole, data)
    mine = torch.cat([p.detach().flatten() for p in whole.model.parameters()])
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    stats = whole.step.stats()
    results[name] = {
        "eager": state(eager),
        "whole": state(whole),
        "initial": initial,
        "losses": [reference, got],
        "buckets": buckets,
        "ranks_equal": all(torch.equal(g, gathered[0]) for g in gathered),
        "counts": {"replayed": stats.replayed, "recorded": stats.recorded,
                   "failed": stats.failed, "eager": stats.eager},
        "updates": [eager.progress.updates, whole.progress.updates],
        "failure": whole.step.failed,
        "trained": whole.step.recorder.trained,
    }
    del whole
    gc.collect()
if rank == 0:
    torch.save(results, sys.argv[1])
stop()
os._exit(0)  # as in test_distributed: no interpreter teardown after the results are written
"""


@pytest.fixture(scope="module")
def arms(tiny_keys, tmp_path_factory) -> dict:
    """The eager and both whole-step DDP arms on two Gloo ranks (ARMS_SCRIPT): rank 0's
    results, by arm."""
    tmp_path = tmp_path_factory.mktemp("arms")
    keys = {**tiny_keys(tmp_path / "runs"), "device": "cpu", "nbs": "16", "val": "false"}
    keys |= {"seed": "5"}
    keys |= {"optimizer": "sgd", "close_mosaic": "0"}
    script = tmp_path / "arms.py"
    script.write_text(ARMS_SCRIPT)
    out = tmp_path / "arms.pt"
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29541"]
    done = subprocess.run(
        [sys.executable, *torchrun, str(script), str(out), json.dumps(keys)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)


def _same_training(result: dict) -> None:
    assert result["updates"] == [12, 12]
    assert result["ranks_equal"]
    assert result["losses"][0] == result["losses"][1]
    floats = [n for n, v in result["initial"].items() if v.is_floating_point()]
    moved = [n for n in floats if not torch.equal(result["eager"][n], result["initial"][n])]
    assert len(moved) > 0.9 * len(floats)  # the optimizer stepped (DFL's fixed conv did not)
    for name, value in result["eager"].items():
        assert torch.equal(result["whole"][name], value), name


def test_the_whole_step_under_ddp_is_bit_for_bit_the_eager_ddp_step(arms):
    """yolo-n on two Gloo ranks, each its own share of 24 batches (4 images a rank, 2 batches an
    update, SGD with momentum, EMA, BatchNorm): the whole step (recordings replayed from the
    4th batch) ends with the weights, BatchNorm statistics, EMA and momentum of the eager DDP
    step, bit for bit, with the same losses, on both ranks alike; some batches had another
    target bucket on each rank, so the agreement on the bucket was exercised."""
    result = arms["whole"]
    counts = result["counts"]
    assert counts["recorded"] >= 1 and counts["replayed"] >= 4 and counts["failed"] == 0
    # a rank's eager batches ran its own bucket, not the agreed one: never recorded as trained
    assert result["trained"] == [False] * counts["recorded"]
    rank0, rank1 = result["buckets"]
    assert any(a != b for a, b in zip(rank0, rank1, strict=True)), "no batch's bucket differed"
    _same_training(result)


def test_a_recording_that_fails_on_one_rank_is_given_up_on_every_rank(arms):
    """Rank 1's capture fails: rank 0, whose own recording succeeded, gives up too (it would
    otherwise replay an update whose all-reduce rank 1 never joins), and both train on
    eagerly, as the eager DDP step does."""
    result = arms["rank 1 fails"]
    counts = result["counts"]
    assert counts["failed"] == 1 and counts["replayed"] == 0 and counts["recorded"] == 0
    assert result["failure"] == "another rank's recording failed"
    _same_training(result)
