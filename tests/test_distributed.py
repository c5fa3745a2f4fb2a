"""Distributed training on the CPU: two Gloo processes launched by torchrun train what one
process trains at the same global batch, rank 0 owns the files, and the logic that decides the
world, the devices and the per-rank batch.

The two-process run is not bit for bit the one-process run: each rank's BatchNorm normalises
over its own half of the batch (``sync_bn`` is not built), and DDP sums the ranks' gradients
in another order than one backward sums the batch's. The test bounds the difference against
how far the training moved the weights.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from falconet.training.config import ConfigError
from falconet.training.distributed import World, per_rank_batch, rank_device, world_from_env


def test_the_world_comes_from_torchruns_environment():
    assert world_from_env({}) == World(0, 0, 1)
    world = world_from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
    assert (world.rank, world.local_rank, world.size, world.main) == (3, 1, 4, False)
    with pytest.raises(ConfigError, match="RANK, LOCAL_RANK and WORLD_SIZE"):
        world_from_env({"WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match=r"not in 0\.\.1"):
        world_from_env({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"})


def test_the_global_batch_must_divide_and_the_error_names_the_nearest_values():
    assert per_rank_batch(16, World(0, 0, 2)) == 8
    with pytest.raises(ConfigError, match=r"batch=15 .*\(2 processes\); use batch=14 or batch=16"):
        per_rank_batch(15, World(0, 0, 2))
    with pytest.raises(ConfigError, match=r"use batch=4$"):
        per_rank_batch(3, World(0, 0, 4))


def test_each_rank_takes_its_device():
    assert rank_device("cpu", World(1, 1, 2)) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert rank_device("auto", World(1, 1, 2)) == torch.device("cpu")
    with pytest.raises(ConfigError, match="torchrun --nproc-per-node 2"):
        rank_device("0,1", World())
    with pytest.raises(ConfigError, match="one device for 2 ranks"):
        rank_device("0", World(0, 0, 2))


def _train(args: list[str], keys: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pairs = [f"{k}={v}" for k, v in keys.items()]
    return subprocess.run(
        [sys.executable, *args, "-m", "falconet", "train", *pairs],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _python(command: list[str], *, timeout: int = 300, cwd: Path | None = None):
    """``python *command`` with one OpenMP thread a process; it must exit cleanly."""
    done = subprocess.run(
        [sys.executable, *command],
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _torchrun(port: int) -> list[str]:
    return ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port)]


DRIVER = """
import os
import sys
import traceback

import torch

from falconet.training.distributed import start, stop, world_from_env

# the parts (scripts of this file, beside this one) run in turn in one process group; each
# reads sys.argv[1:] as its own: its output path and its data
world = world_from_env()
start(world, torch.device("cpu"), 120)
folder = sys.argv[1]
for part in sys.argv[2:]:
    name, _, data = part.partition("=")
    sys.argv = [name, os.path.join(folder, name), data]
    try:
        with open(os.path.join(os.path.dirname(__file__), name + ".py")) as handle:
            exec(compile(handle.read(), name + ".py", "exec"), {"__name__": "__main__"})
    except BaseException:
        # kept for the part's test; the other rank may wait on this one: end the launch now
        with open(os.path.join(folder, f"{name}.error.{world.rank}"), "w") as handle:
            handle.write(traceback.format_exc())
        os._exit(1)
stop()
# the results are written; leave without the interpreter's teardown, where a thread of the
# process group's library, still joining, aborted a rank now and then ("terminate called
# without an active exception") after everything had passed
os._exit(0)
"""


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> SimpleNamespace:
    """The scripts below run once as one process and once as two torchrun ranks, each launch
    running its parts in turn (a launch's start-up costs seconds; one serves every part):
    ``one`` and ``two`` are the folders of their results, ``done`` the launches' processes."""
    from falconet.data.shapes import write_shapes

    root = tmp_path_factory.mktemp("scripts")
    gather = write_shapes(root / "gather-data", {"train": 2, "val": 9}, size=64)
    cache = write_shapes(root / "cache-data", {"train": 24, "val": 4}, size=64)
    sources = {"driver": DRIVER, "step": STEP_SCRIPT, "graphed": GRAPHED_SCRIPT}
    sources |= {"gather": GATHER_SCRIPT, "auto_cache": AUTO_CACHE_SCRIPT}
    for name, source in sources.items():
        (root / f"{name}.py").write_text(source)
    launches = {  # auto_cache last: it replaces torch.cuda.mem_get_info for the process
        "one": ([], ["step=", f"gather={gather}"]),
        "two": (_torchrun(29521), ["step=", "graphed=", f"gather={gather}", f"auto_cache={cache}"]),
    }
    done = {}
    for name, (launcher, parts) in launches.items():
        (root / name).mkdir()
        done[name] = subprocess.run(
            [sys.executable, *launcher, str(root / "driver.py"), str(root / name), *parts],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    return SimpleNamespace(one=root / "one", two=root / "two", done=done)


def _part(scripts: SimpleNamespace, launch: str, name: str) -> Path:
    """Where the part ``name`` of the ``launch`` (one or two) wrote its result; it must have
    run without an error, and a launch whose parts all ran must have exited cleanly."""
    folder, done = getattr(scripts, launch), scripts.done[launch]
    errors = sorted(folder.glob(f"{name}.error.*"))
    assert not errors, f"{name} failed on rank {errors[0].suffix[1:]}:\n{errors[0].read_text()}"
    if not list(folder.glob("*.error.*")):
        assert done.returncode == 0, done.stderr[-3000:]
    assert list(folder.glob(f"{name}*")), f"{name} wrote nothing: {done.stderr[-3000:]}"
    return folder / name


STEP_SCRIPT = """
import functools
import sys

import torch

from falconet import ops
from falconet.data.targets import Targets
from falconet.training.config import TrainConfig
from falconet.training.distributed import replicate, start, world_from_env
from falconet.training.optimization import ModelEMA, Schedule, build_optimizer
from falconet.training.phases import Phases
from falconet.contract import Progress, StepParts
from falconet.graph_backends.eager_step import EagerStep


class FP32:
    name = "fp32"

    def autocast(self, device):
        import contextlib

        return contextlib.nullcontext()


def loss(outputs, targets):
    # a normaliser that depends on the batch's content, as the YOLO loss's does
    weight = targets.counts.float()[:, None, None, None] + 1.0
    norm = ops.rank_sum(weight.sum() * outputs[0].numel()).clamp(min=1.0)
    if (ranks := ops.world_size()) > 1:
        norm = norm / ranks
    total = (outputs.pow(2) * weight).sum() / norm
    return total, {"total": total.detach()}


world = world_from_env()
device = torch.device("cpu")
start(world, device, 120)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(8, 2, 1)
)
cfg = TrainConfig(batch=8, nbs=16, warmup_epochs=0, lr0=0.05, clip_grad=0.0)
parts = StepParts(
    model=model,
    loss=loss,
    optimizer=build_optimizer(model, cfg, 2),
    precision=FP32(),
    scaler=None,
    ema=ModelEMA(model, cfg.ema_decay, cfg.ema_tau),
    clip_grad=0.0,
    loss_gain=float(cfg.batch),  # the global batch, whatever the world size
    schedule=Schedule(cfg, 4),
    progress=Progress(),
    phases=Phases(),
    device=device,
    replicate=functools.partial(replicate, device=device) if world.distributed else None,
)
step = EagerStep(parts)
generator = torch.Generator().manual_seed(1)
for i in range(8):
    images = torch.rand(8, 3, 8, 8, generator=generator)
    counts = torch.randint(0, 4, (8,), generator=generator)
    share = slice(world.rank, None, world.size)  # the sampler's strided share
    boxes, labels = torch.zeros(8, 4, 4)[share], torch.zeros(8, 4).long()[share]
    targets = Targets.from_padded(boxes, labels, counts[share])
    step(images[share], targets, update=(i + 1) % 2 == 0)
if world.main:
    torch.save({"model": model.state_dict(), "updates": parts.progress.updates}, sys.argv[1])
"""


def _toy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(8, 2, 1)
    )


def test_ddp_averages_to_the_one_process_step_at_the_same_global_batch(scripts):
    """Two Gloo ranks of 4 images (a loss whose normaliser depends on the batch, gradient
    accumulation through DDP's no_sync) end where one process of 8 does, to float rounding:
    DDP sums the ranks' gradients in another order than one backward sums the batch's."""
    paths = [_part(scripts, launch, "step") for launch in ("one", "two")]
    one, two = (torch.load(path, weights_only=True) for path in paths)
    assert one["updates"] == two["updates"] == 4
    initial = _toy().state_dict()
    for name, reference in one["model"].items():
        assert not torch.equal(reference, initial[name])  # the optimizer really stepped
        torch.testing.assert_close(two["model"][name], reference, rtol=1e-5, atol=1e-6)


AUTO_CACHE_SCRIPT = """
import sys

import torch

from falconet.data.resolve import load_dataset
from falconet.training.config import TrainConfig
from falconet.training.distributed import start, world_from_env
from falconet.training.loaders import gpu_shard, resolve_cache

world = world_from_env()
start(world, torch.device("cpu"), 60)
dataset = load_dataset(sys.argv[2], splits=("train",))
cfg = TrainConfig(data=sys.argv[2], imgsz=64, cache="auto")
need = len(gpu_shard(dataset.splits["train"].samples, world)) * 64 * 64 * 3
choices = []
for short in (1, None):  # rank 1's device a byte short of room for its shard; then none short
    free = 2 * need - (world.rank == short)
    torch.cuda.mem_get_info = lambda device, free=free: (free, 10 * need)  # the device's answer
    choices.append(resolve_cache(cfg, dataset, torch.device("cuda", world.local_rank), world))
with open(f"{sys.argv[1]}.{world.rank}", "w") as out:
    out.write(" ".join(choices))
"""


def test_cache_auto_is_one_choice_for_every_rank(scripts):
    """Each rank measures its own device's free memory; where one rank's shard would not fit,
    no rank takes the GPU path (a rank holding its shard beside one drawing from its share of
    the whole set would train some images twice an epoch and others never). Two Gloo ranks
    (24 training images, 64 px); the free memory is each device's answer, given here."""
    choice = _part(scripts, "two", "auto_cache")
    choices = [choice.with_name(f"auto_cache.{rank}").read_text() for rank in (0, 1)]
    assert choices == ["none gpu", "none gpu"]


GRAPHED_SCRIPT = """
import functools
import sys

import torch
import torch.distributed as dist

from falconet.data.targets import Targets
from falconet.training.config import TrainConfig
from falconet.training.distributed import replicate, start, world_from_env
from falconet.training.optimization import build_optimizer, Schedule
from falconet.training.phases import Phases
from falconet.contract import Progress, StepParts
from falconet.graph_backends.eager_step import EagerStep
from falconet_graphs_cuda.graphed import GraphedNetwork
from falconet_graphs_cuda.recording import BufferRecorder


class FP32:
    name = "fp32"

    def autocast(self, device):
        import contextlib

        return contextlib.nullcontext()


def loss(outputs, targets):
    return outputs.pow(2).mean(), {}


def arm(graphed):
    torch.manual_seed(0)  # both arms start from the same weights
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.SiLU(),
        torch.nn.Conv2d(8, 2, 1),
    )
    cfg = TrainConfig(batch=8, nbs=16, warmup_epochs=0, lr0=0.05, clip_grad=0.0)
    parts = StepParts(
        model=model, loss=loss, optimizer=build_optimizer(model, cfg, 2), precision=FP32(),
        scaler=None, ema=None, clip_grad=0.0, loss_gain=8.0, schedule=Schedule(cfg, 4),
        progress=Progress(), phases=Phases(), device=torch.device("cpu"),
        replicate=functools.partial(replicate, device=torch.device("cpu")),
    )
    if not graphed:
        return model, EagerStep(parts), None
    network = GraphedNetwork(model, BufferRecorder(), capture_after=1)
    return model, EagerStep(parts, network, network.stats), network


world = world_from_env()
start(world, torch.device("cpu"), 120)
arms = {name: arm(name == "graphed") for name in ("eager", "graphed")}
initial = {k: v.clone() for k, v in arms["eager"][0].state_dict().items()}
generator = torch.Generator().manual_seed(1 + world.rank)  # each rank its own images
for i in range(6):
    images = torch.rand(4, 3, 8, 8, generator=generator)
    counts = torch.ones(4, dtype=torch.long)
    targets = Targets.from_padded(torch.zeros(4, 1, 4), torch.zeros(4, 1).long(), counts)
    for model, step, _ in arms.values():
        step(images, targets, update=i % 2 == 1)
eager, graphed = arms["eager"][0], arms["graphed"][0]
mine = torch.cat([p.detach().flatten() for p in graphed.parameters()])
gathered = [torch.empty_like(mine) for _ in range(world.size)]
dist.all_gather(gathered, mine)
if world.main:
    torch.save(
        {
            "eager": eager.state_dict(),
            "graphed": graphed.state_dict(),
            "initial": initial,
            "ranks_equal": all(torch.equal(g, gathered[0]) for g in gathered),
            "counts": arms["graphed"][2].counts,
        },
        sys.argv[1],
    )
"""


def test_the_graphed_network_under_ddp_is_bit_for_bit_the_eager_ddp_step(scripts):
    """graph=cuda-graph's network logic (replays from static buffers, CPU recorder) called
    through DDP on two Gloo ranks with different images: the gradients a replay hands the
    parameters are all-reduced (the ranks end with one model) and the run equals eager DDP bit
    for bit after real updates (3 updates of 2 accumulated batches)."""
    result = torch.load(_part(scripts, "two", "graphed"), weights_only=True)
    assert result["counts"]["replayed"] == 6 and result["counts"]["recorded"] == 1
    assert result["ranks_equal"]
    for name, weight in result["eager"].items():
        if weight.is_floating_point():
            assert not torch.equal(weight, result["initial"][name]), name  # it trained
        assert torch.equal(result["graphed"][name], weight), name


@pytest.fixture(scope="module")
def two_ranks(tiny_keys, tmp_path_factory) -> SimpleNamespace:
    """One uninterrupted run of two Gloo ranks under torchrun (3 epochs, seed 3), trained once
    for the tests that check its files, resume from it or compare an interrupted run with it;
    none of them writes into it. ``keys``, ``project``, ``run`` (rank 0's folder), ``stdout``."""
    project = tmp_path_factory.mktemp("two-ranks") / "runs"
    keys = {**tiny_keys(project), "device": "cpu", "nbs": "8", "epochs": "3", "val": "false"}
    keys |= {"seed": "3"}
    done = _train(_torchrun(29517), {**keys, "name": "whole"}, project.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return SimpleNamespace(
        keys=keys, project=project, run=project / "whole", stdout=done.stdout, stderr=done.stderr
    )


def test_rank_1_keeps_quiet_and_ddp_warns_of_nothing(two_ranks):
    """Rank 0 says what the run does once: the other rank logs warnings only, from its first
    line on (before the trainer exists), and DDP's keyword for the buffers is the one the
    installed torch does not call deprecated."""
    lines = two_ranks.stderr.splitlines()
    for start in ("distributed: rank", "threads:", "data train:", "cache=auto:", "graph=auto:"):
        assert sum(line.startswith(start) for line in lines) == 1, start
    assert "distributed: rank 0 of 2" in two_ranks.stderr
    assert "FutureWarning" not in two_ranks.stderr


def test_two_gloo_ranks_train_yolo_with_rank_0_owning_the_files(two_ranks, tmp_path):
    """The YOLO family under torchrun on the CPU: the same updates as one process at the same
    global batch, one run folder and one summary (rank 0's). Its weights are not compared with
    the one-process run's: each rank's BatchNorm normalises over its half of the batch, and
    SyncBatchNorm needs a GPU, so the two runs train slightly different networks."""
    project = tmp_path / "runs"
    one = _train([], {**two_ranks.keys, "project": str(project), "name": "one"}, tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    assert sorted(p.name for p in two_ranks.project.iterdir()) == ["whole"]
    assert two_ranks.stdout.count("run folder:") == 1
    made = sorted(p.name for p in two_ranks.run.iterdir())
    assert made == sorted(p.name for p in (project / "one").iterdir())
    a = torch.load(project / "one/weights/last.pt", weights_only=True)
    b = torch.load(two_ranks.run / "weights/last.pt", weights_only=True)
    assert (a["world_size"], b["world_size"]) == (1, 2)
    assert a["step"] == b["step"] == 9  # 24 images, global batch 8, 3 epochs: 9 updates
    assert all(torch.isfinite(t).all() for t in b["model"].values() if t.is_floating_point())
    # img/s counts every rank's images: each epoch's rate over its time is the whole set's 24
    # (the rate is rounded to 0.1), in the two-rank run as in the one-process run
    for run in (project / "one", two_ranks.run):
        with (run / "results.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == 3
        for row in rows:
            images = float(row["img/s"]) * float(row["epoch_time"])
            assert images == pytest.approx(24, rel=0.02), (run.name, row)


def test_resume_with_another_world_size_is_refused(two_ranks, tmp_path):
    run = shutil.copytree(two_ranks.run, tmp_path / "two")  # the shared run stays untouched
    again = _train([], {"resume": str(run / "weights/last.pt")}, tmp_path)
    assert again.returncode == 2
    assert "trained by 2 process(es) and this run has 1" in again.stderr


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks' processes in /proc")
def test_a_killed_rank_ends_the_whole_job_quickly_naming_it(tiny_run, tmp_path):
    """SIGKILL to rank 1 mid-run: torchrun ends the job (no hang), names the rank and its
    signal, and no rank's process is left."""
    import signal
    import time

    keys = {**tiny_run, "device": "cpu", "nbs": "8", "epochs": "50", "val": "false"}
    command = [sys.executable, *_torchrun(29519), "-m", "falconet", "train"]
    launcher = subprocess.Popen(
        [*command, *(f"{k}={v}" for k, v in keys.items())],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        csv = next(iter(Path(tiny_run["project"]).glob("*/results.csv")), None)
        deadline = time.monotonic() + 300
        while csv is None and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.5)  # an epoch done: both ranks are in the training loop
            csv = next(iter(Path(tiny_run["project"]).glob("*/results.csv")), None)
        assert csv is not None, "the run did not get through an epoch"
        workers = _children(launcher.pid)
        victim = next(pid for pid in workers if _rank_of(pid) == 1)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
        assert time.monotonic() - killed < 60
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", stderr), stderr[-2000:]
    assert re.search(r"exitcode\s*:\s*-9|SIGKILL", stderr), stderr[-2000:]
    assert not [
        pid for pid in workers if Path(f"/proc/{pid}").exists() and _rank_of(pid) is not None
    ]


def test_a_device_list_is_a_list_of_distinct_gpus():
    from falconet.training.launch import gpu_list

    assert gpu_list("auto") is None and gpu_list("0") is None and gpu_list("cuda:1") is None
    assert gpu_list("0,1") == [0, 1] and gpu_list("cuda:2, cuda:3") == [2, 3]
    with pytest.raises(ConfigError, match="distinct GPU indices"):
        gpu_list("0,0")
    with pytest.raises(ConfigError, match="distinct GPU indices"):
        gpu_list("cpu,cpu")


def test_a_device_list_without_gpus_is_refused_before_anything_starts(tiny_run, tmp_path):
    if torch.cuda.device_count() >= 2:
        pytest.skip("two GPUs are here: the launch itself is run by tools/ on the GPU machine")
    from falconet import Detector

    with pytest.raises(ConfigError, match=r"device=0,1: only \d CUDA device"):
        Detector("yolo-n").train(**tiny_run, device="0,1", epochs=1)
    assert not Path(tiny_run["project"]).exists()


def test_a_device_list_refuses_bad_keys_before_any_worker_starts(tiny_run):
    """What would fail in every worker fails here, in the caller: a global batch that does
    not divide by the GPUs, and a callback given as an object (only names cross into the
    workers), named in the error."""
    from falconet import Detector

    class Recorder:
        def __repr__(self) -> str:
            return "Recorder()"

    with pytest.raises(ConfigError, match=r"batch=15 .*\(2 processes\); use batch=14 or"):
        Detector("yolo-n").train(**{**tiny_run, "batch": 15}, device=[0, 1])
    with pytest.raises(ConfigError, match=r"Recorder\(\) is an object: register its factory"):
        Detector("yolo-n").train(**tiny_run, device="0,1", callbacks=[Recorder()])
    assert not Path(tiny_run["project"]).exists()


def test_a_trained_detector_launches_its_workers_from_the_weights_it_holds(
    tiny_run, monkeypatch
):
    """Detector("yolo-n") trained once holds that run's best.pt: a second train on a device
    list hands the workers that file, as a second train in this process starts from it (the
    launcher is recorded here: CUDA devices are what it would start the workers on)."""
    from falconet import Detector
    from falconet.training import launch

    detector = Detector("yolo-n")
    first = detector.train(**tiny_run, epochs=1, val=True, verbose=False)
    best = Path(first["run_dir"]) / "weights" / "best.pt"
    launched = []
    monkeypatch.setattr(launch, "launch", lambda keys, gpus: launched.append(keys) or first)
    detector.train(**tiny_run, epochs=1, device=[0, 1], verbose=False)
    assert launched[0]["model"] == str(best)
    assert Detector("yolo-n")._launch_keys({})["model"] == "yolo-n"  # nothing held: the name
    assert detector._launch_keys({"model": "yolo-s"})["model"] == "yolo-s"


def test_the_launcher_runs_falconets_command_and_returns_rank_0s_summary(
    tiny_run, tmp_path, monkeypatch
):
    """What device=0,1 does, on two CPU processes: torchrun runs `falconet train` with the
    caller's keys (not the caller's script), and rank 0's summary comes back."""
    from falconet.training.launch import launch

    keys = {**tiny_run, "nbs": "8", "epochs": "1", "val": "true", "name": "launched"}
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    summary = launch(keys, None, processes=2)
    run_dir = Path(summary["run_dir"])
    assert run_dir.name == "launched" and (run_dir / "weights" / "best.pt").exists()
    assert summary["epochs"] == 1 and "AP" in summary["metrics"]


def test_a_plain_script_without_a_guard_launches_once_and_is_not_imported_again(tiny_run, tmp_path):
    """A user's script with no ``if __name__ == "__main__":`` guard starts a two-process run
    (the launcher that device=0,1 uses, here with CPU processes) and prints at import: its
    line appears once, since the workers run falconet's command, never the script."""
    keys = {**tiny_run, "nbs": "8", "epochs": "1", "val": "false", "name": "plain"}
    script = tmp_path / "train_plain.py"
    script.write_text(
        "from falconet.training.launch import launch\n"
        "print('imported the user script', flush=True)\n"
        f"summary = launch({keys!r}, None, processes=2)\n"
        "print('run folder', summary['run_dir'], flush=True)\n"
    )
    done = _python([str(script)], timeout=600, cwd=tmp_path)
    assert done.stdout.count("imported the user script") == 1
    assert (Path(tiny_run["project"]) / "plain" / "weights" / "last.pt").exists()


def test_sigkill_of_the_launcher_then_resume_is_bit_identical(two_ranks, tmp_path):
    """torchrun's agent killed with SIGKILL mid-epoch takes its ranks with it; resumed with the
    same world size, the run ends with every entry of last.pt equal to the uninterrupted
    distributed run's (weights, EMA, optimizer, counters, RNG states)."""
    import signal
    import time

    from falconet_testing.checkpoints import assert_same_tensors

    project = tmp_path / "runs"
    pairs = [f"{k}={v}" for k, v in {**two_ranks.keys, "project": project}.items()]
    killed = subprocess.Popen(
        [sys.executable, *_torchrun(29527), "-m", "falconet", "train", *pairs, "name=killed"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    last = project / "killed" / "weights" / "last.pt"
    deadline = time.monotonic() + 300
    while not last.exists():
        assert killed.poll() is None, killed.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    time.sleep(0.3)  # inside the next epoch
    ranks = _children(killed.pid)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and _rank_of(pid) is not None for pid in ranks):
        assert time.monotonic() < deadline, "a rank outlived its launcher"
        time.sleep(0.1)
    at_kill = torch.load(last, weights_only=True)
    assert at_kill["epoch"] < 3, "the run finished before it was killed"
    resumed = _train(_torchrun(29529), {"resume": str(last)}, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = torch.load(two_ranks.run / "weights" / "last.pt", weights_only=True)
    b = torch.load(last, weights_only=True)
    for part in a.keys() - {"config"}:
        assert_same_tensors(a[part], b[part], part)
    assert b["step"] == 9 > at_kill["step"] and b["world_size"] == 2


def test_sync_bn_needs_gpus_and_small_per_rank_batches_are_warned_about(caplog):
    from falconet.training.distributed import batch_norm_across_ranks

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    cpu, two = torch.device("cpu"), World(0, 0, 2)
    assert batch_norm_across_ranks(net, True, 4, World(), cpu) is net  # one process: as is
    with pytest.raises(ConfigError, match="sync_bn=true needs CUDA devices"):
        batch_norm_across_ranks(net, True, 4, two, cpu)
    with caplog.at_level("WARNING", logger="falconet.train"):
        assert batch_norm_across_ranks(net, False, 8, two, cpu) is net
    assert "over each rank's 8 images (batch 16 over 2 ranks)" in caplog.text
    if torch.cuda.is_available():
        synced = batch_norm_across_ranks(net, True, 8, two, torch.device("cuda"))
        assert isinstance(synced[1], torch.nn.SyncBatchNorm)


GATHER_SCRIPT = """
import json
import sys

import numpy as np
import torch

from falconet.evaluation.accumulator import DetectionAccumulator
from falconet.training.distributed import start, world_from_env
from falconet.training.loaders import build_val_loader
from falconet.training.planning import plan_run
from falconet.training import validation
from falconet.data.resolve import load_dataset
from falconet.plugins import get_plugins

world = world_from_env()
start(world, torch.device("cpu"), 120)
plan = plan_run({"data": sys.argv[2], "imgsz": "64", "batch": "2", "workers": "0"}, get_plugins())
dataset = load_dataset(plan.config.data, splits=("val",))
loader = build_val_loader(plan.config, dataset, torch.device("cpu"), world)
accumulator = DetectionAccumulator(validation.category_ids(dataset))
for batch in loader:  # stand-in detections near the truth, a function of the image alone
    outputs = []
    for j, image_id in enumerate(batch["image_ids"].tolist()):
        g = torch.Generator().manual_seed(int(image_id))
        n = int(batch["counts"][j])
        boxes = batch["boxes"][j, :n] + torch.randn(n, 4, generator=g)
        outputs.append({"boxes": boxes, "scores": torch.rand(n, generator=g),
                        "labels": batch["labels"][j, :n]})
    accumulator.add(batch["image_ids"].tolist(), validation.to_original_pixels(outputs, batch))
truth = validation.ground_truth(dataset, dataset.splits["val"])
result = validation.evaluate_split(accumulator, truth, backend="pycocotools", plugins=get_plugins())
if world.main:
    with open(sys.argv[1], "w") as handle:
        json.dump({"stats": result.stats, "images": len(accumulator.images)}, handle)
"""


def test_validation_shards_gather_to_the_single_process_metric(scripts):
    """Each rank predicts its share of the val split (9 images over 2 ranks: one repeats to
    even the shares); rank 0 merges every image once and scores the same stats as one process
    over the whole split."""
    paths = [_part(scripts, launch, "gather") for launch in ("one", "two")]
    one, two = (json.loads(path.read_text()) for path in paths)
    assert one["images"] == 9 and two["images"] == 5  # rank 0's share: images 0, 2, 4, 6, 8
    assert one["stats"] == two["stats"] and one["stats"]["AR100"] > 0


def test_the_profiler_under_torchrun_profiles_rank_0_and_never_hangs(tiny_run, tmp_path):
    keys = {**tiny_run, "device": "cpu", "nbs": "8", "epochs": "3", "val": "false"}
    keys |= {"profile": "true", "profile_warmup": "0", "profile_steps": "2"}
    keys |= {"profile_then_stop": "true"}
    done = _train(_torchrun(29537), keys, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (profile,) = Path(tiny_run["project"]).glob("*/profile.json")
    doc = json.loads(profile.read_text())
    assert (doc["run"]["rank"], doc["run"]["world_size"]) == (0, 2)
    assert "rank 0 of 2 profiled its own steps" in done.stderr
    last = torch.load(profile.parent / "weights" / "last.pt", weights_only=True)
    assert last["epoch"] == 1  # the stop took effect at the end of the window's epoch


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks' processes in /proc")
def test_an_elastic_restart_resumes_from_the_last_checkpoint_bit_identically(two_ranks, tmp_path):
    """torchrun --max-restarts 1, rank 1 killed with SIGKILL after the first epoch's
    checkpoint: torchrun restarts both ranks, which resume from the run's last.pt (their own
    rendezvous prefix, so no rank reads the dead generation's addresses) and end with every
    entry of last.pt equal to the uninterrupted distributed run's."""
    import signal
    import time

    from falconet_testing.checkpoints import assert_same_tensors

    project = tmp_path / "runs"
    elastic = [*_torchrun(29547), "--max-restarts", "1"]
    pairs = [f"{k}={v}" for k, v in {**two_ranks.keys, "project": project}.items()]
    launcher = subprocess.Popen(
        [sys.executable, *elastic, "-m", "falconet", "train", *pairs, "name=elastic"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    last = project / "elastic" / "weights" / "last.pt"
    try:
        deadline = time.monotonic() + 300
        while not last.exists():
            assert launcher.poll() is None, launcher.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        victim = next(pid for pid in _children(launcher.pid) if _rank_of(pid) == 1)
        os.kill(victim, signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, stderr[-3000:]
    assert "torchrun restarted the workers: resuming from" in stderr
    a = torch.load(two_ranks.run / "weights" / "last.pt", weights_only=True)
    b = torch.load(last, weights_only=True)
    for part in a.keys() - {"config"}:
        assert_same_tensors(a[part], b[part], part)
    assert b["epoch"] == 3 and b["world_size"] == 2
