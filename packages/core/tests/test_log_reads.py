"""Mid-epoch loss reads one interval late, the last exact (falconet.training.log_reads)."""

import pytest
import torch

from falconet.training.log_reads import LaggedReads


def _reads(device: str) -> None:
    reads = LaggedReads()
    assert reads.read(torch.tensor([1.0, 2.0], device=device), now=False) is None
    assert reads.read(torch.tensor([3.0, 4.0], device=device), now=False) == [1.0, 2.0]
    assert reads.read(torch.tensor([5.0, 6.0], device=device), now=False) == [3.0, 4.0]
    # the epoch's last read returns its own values and leaves nothing queued
    assert reads.read(torch.tensor([7.0, 8.0], device=device), now=True) == [7.0, 8.0]
    assert reads.read(torch.tensor([9.0, 0.0], device=device), now=False) is None
    reads.reset()  # a new epoch: the previous epoch's queued read is not returned
    assert reads.read(torch.tensor([1.5, 2.5], device=device), now=False) is None
    assert reads.read(torch.tensor([0.0, 0.0], device=device), now=False) == [1.5, 2.5]


def test_mid_epoch_reads_return_the_previous_interval():
    _reads("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mid_epoch_reads_on_the_gpu_go_through_pinned_memory():
    _reads("cuda")
