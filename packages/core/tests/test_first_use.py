"""The GPU's first use beside the start-up (:mod:`falconet.training.first_use`): while the
start-up's imports and cache fill run on threads of their own, a copy of the network trains a
synthetic batch on the calling (training) thread and leaves the run's network, its statistics
and its gradients as they were; the copy's loss sees this process alone while the other threads'
still see every rank. What it saves in time is measured on the GPU machine by
tools/bench_startup.py (docs/training.md, the GPU's first use)."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from falconet import ops
from falconet.precision import BF16, FP16
from falconet.training.first_use import imports_ahead, run_beside_first_use

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the first use it hides is a CUDA device's"
)


def network() -> nn.Module:
    """Convolutions with batch norm (statistics a training forward updates)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(), nn.Conv2d(8, 4, 1)
    )


def mean_loss(model: nn.Module):
    """A loss over the network's output that needs its targets to have been made."""

    def loss(outputs: torch.Tensor, targets) -> tuple[torch.Tensor, dict]:
        assert targets.counts.sum() > 0
        return outputs.float().square().mean(), {}

    return loss


def test_a_rank_local_section_holds_for_the_thread_that_entered_it():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        entered, seen_by_main = threading.Event(), threading.Event()
        seen: dict[str, int] = {}

        def inside() -> None:
            with ops.rank_local():
                entered.set()
                seen["thread"] = ops.world_size()
                seen_by_main.wait(10)
            seen["thread after"] = ops.world_size()

        thread = threading.Thread(target=inside)
        thread.start()
        entered.wait(10)
        seen["main"] = ops.world_size()
        seen_by_main.set()
        thread.join(10)
        assert seen == {"thread": 1, "main": 2, "thread after": 2}
    finally:
        dist.destroy_process_group()


def test_off_cuda_the_start_up_runs_on_this_thread_and_no_copy_is_made():
    built: list[nn.Module] = []
    ran = []

    def start_up() -> str:
        ran.append(threading.current_thread())
        return "filled"

    loss_for = lambda copy: built.append(copy) or mean_loss(copy)  # noqa: E731
    cpu = torch.device("cpu")
    assert run_beside_first_use(start_up, network(), loss_for, BF16, (2, 32, 3, 4), cpu) == "filled"
    assert ran == [threading.current_thread()] and built == []

    def refused() -> None:
        raise ValueError("the store does not fit")

    with pytest.raises(ValueError, match="does not fit"):
        run_beside_first_use(refused, network(), loss_for, BF16, (2, 32, 3, 4), cpu)


def test_imports_ahead_imports_on_a_thread_and_leaves_a_failure_to_the_run(tmp_path, monkeypatch):
    (tmp_path / "imported_ahead_for_the_test.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imported_ahead_for_the_test", raising=False)
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    thread = imports_ahead(["no_such_module_for_the_test", "imported_ahead_for_the_test"])
    assert thread.daemon and thread is not threading.current_thread()
    thread.join(timeout=30)
    assert not thread.is_alive() and failures == []  # the thread ended without raising
    assert sys.modules["imported_ahead_for_the_test"].IMPORTED  # the failure stopped nothing
    with pytest.raises(ModuleNotFoundError):  # the run's own import raises it
        import no_such_module_for_the_test  # noqa: F401


@needs_cuda
def test_the_copy_trains_on_this_thread_beside_the_start_up_and_leaves_the_network(
    caplog, tmp_path, monkeypatch
):
    (tmp_path / "imported_beside_the_copy.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imported_beside_the_copy", raising=False)
    device = torch.device("cuda")
    model = network().to(device, memory_format=torch.channels_last)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    interval, drawn = sys.getswitchinterval(), torch.cuda.get_rng_state(device)
    caplog.set_level(logging.INFO, logger="falconet.train")
    threads = []

    def start_up() -> str:
        threads.append(threading.current_thread())
        threads.append(torch.cuda.current_device())
        threads.append(torch.cuda.current_stream(device))
        return "started"

    imports = ["imported_beside_the_copy"]
    got = run_beside_first_use(start_up, model, mean_loss, FP16, (4, 64, 3, 5), device, imports)
    assert got == "started" and threads[0] is not threading.current_thread()
    assert sys.modules["imported_beside_the_copy"].IMPORTED  # done before it returned
    assert threads[1] == torch.cuda.current_device()  # the run's device, on that thread too
    # its GPU work is off the stream the copy's convolutions are timed on
    assert threads[2] != torch.cuda.current_stream(device)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats included
    assert all(p.grad is None for p in model.parameters())
    assert any(
        "a copy of the network trained a synthetic batch" in r.message for r in caplog.records
    )
    assert sys.getswitchinterval() == interval
    assert torch.equal(torch.cuda.get_rng_state(device), drawn)


@needs_cuda
def test_a_copy_that_fails_is_a_warning_and_the_start_up_still_counts(caplog):
    device = torch.device("cuda")

    def broken(model: nn.Module):
        def loss(outputs, targets):
            raise RuntimeError("a loss that cannot run here")

        return loss

    caplog.set_level(logging.WARNING, logger="falconet.train")
    model = network().to(device)
    got = run_beside_first_use(lambda: 7, model, broken, FP16, (2, 32, 3, 4), device)
    assert got == 7
    assert any("a loss that cannot run here" in r.message for r in caplog.records)


@needs_cuda
def test_what_the_start_up_raises_beside_the_copy_is_raised():
    device = torch.device("cuda")

    def refused() -> None:
        raise ValueError("the store does not fit")

    with pytest.raises(ValueError, match="does not fit"):
        run_beside_first_use(refused, network().to(device), mean_loss, FP16, (2, 32, 3, 4), device)


@needs_cuda
def test_an_interrupt_during_the_copy_is_raised_without_waiting_for_the_start_up():
    """Ctrl-C while the copy trains ends the start-up at once: the start-up's thread (a cache
    still filling) is not waited for."""
    device = torch.device("cuda")

    def interrupted(model):
        def loss(outputs, targets):
            raise KeyboardInterrupt

        return loss

    begun = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        run_beside_first_use(
            lambda: time.sleep(30), network().to(device), interrupted, FP16, (2, 32, 3, 4), device
        )
    assert time.perf_counter() - begun < 10
