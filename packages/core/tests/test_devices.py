"""``device=``: the spellings a user types, and the errors for the rest."""

from __future__ import annotations

import pytest
import torch

from falconet.training.config import ConfigError
from falconet.training.devices import resolve_device


def test_cpu_and_auto_spellings():
    assert resolve_device(" CPU ") == torch.device("cpu")
    expected = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device("auto") == expected


@pytest.mark.parametrize("spec", ["cuda", "0", "cuda:0", "CUDA:0"])
def test_the_first_gpu_by_any_of_its_names(spec):
    if torch.cuda.is_available():
        assert resolve_device(spec) == torch.device("cuda:0")
    else:  # the name is understood; the machine has no GPU, and the error says what to do
        with pytest.raises(ConfigError, match=r"no CUDA device is visible here; use device=cpu"):
            resolve_device(spec)


def test_an_unknown_device_names_the_spellings_it_takes():
    with pytest.raises(ConfigError, match=r"device='gpu': expected auto, cpu, cuda, a GPU index"):
        resolve_device("gpu")
