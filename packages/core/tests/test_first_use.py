"""The GPU's first use beside the start-up's imports (:mod:`falconet.training.first_use`): a copy
of the network trains a synthetic batch on a thread and leaves the run's network, its
statistics and its gradients as they were; the copy's loss sees this process alone while the
training thread's still sees every rank. What it saves in time is measured on the GPU machine
by tools/bench_startup.py (docs/data.md)."""

from __future__ import annotations

import logging
import sys
import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn

from falconet import ops
from falconet.precision import BF16, FP16
from falconet.training.first_use import first_use_beside, import_ahead

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


def test_off_cuda_nothing_runs_beside_the_body():
    built: list[nn.Module] = []
    ran = []
    with first_use_beside(
        network(),
        lambda copy: built.append(copy) or mean_loss(copy),
        BF16,
        (2, 32, 3, 4),
        torch.device("cpu"),
    ):
        ran.append(True)
    assert ran == [True] and built == []


def test_import_ahead_imports_what_it_is_given(tmp_path, monkeypatch):
    (tmp_path / "imported_ahead_for_the_test.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imported_ahead_for_the_test", raising=False)
    import_ahead(["imported_ahead_for_the_test"])
    assert sys.modules["imported_ahead_for_the_test"].IMPORTED
    with pytest.raises(ModuleNotFoundError):
        import_ahead(["no_such_module_for_the_test"])


@needs_cuda
def test_the_copy_trains_beside_and_leaves_the_network_as_it_was(caplog):
    device = torch.device("cuda")
    model = network().to(device, memory_format=torch.channels_last)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    interval, drawn = sys.getswitchinterval(), torch.cuda.get_rng_state(device)
    caplog.set_level(logging.INFO, logger="falconet.train")
    with first_use_beside(model, mean_loss, FP16, (4, 64, 3, 5), device):
        import_ahead(["torch._dynamo"])
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats included
    assert all(p.grad is None for p in model.parameters())
    assert any(
        "a copy of the network trained a synthetic batch" in r.message for r in caplog.records
    )
    assert sys.getswitchinterval() == interval
    assert torch.equal(torch.cuda.get_rng_state(device), drawn)


@needs_cuda
def test_a_copy_that_fails_is_a_warning_and_the_run_goes_on(caplog):
    device = torch.device("cuda")

    def broken(model: nn.Module):
        def loss(outputs, targets):
            raise RuntimeError("a loss that cannot run here")

        return loss

    caplog.set_level(logging.WARNING, logger="falconet.train")
    with first_use_beside(network().to(device), broken, FP16, (2, 32, 3, 4), device):
        pass
    assert any("a loss that cannot run here" in r.message for r in caplog.records)
