"""Checkpoints: atomic writes, the restricted unpickler, RNG round trips."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from falconet.training import checkpoint
from falconet.training.checkpoint import (
    FORMAT,
    CheckpointError,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_atomic,
)


def test_a_crash_during_a_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "weights" / "last.pt"
    save_atomic({"format": FORMAT, "epoch": 1, "w": torch.ones(3)}, path)
    real_save = torch.save

    def dies_half_way(obj, handle):
        real_save(obj, handle)
        handle.truncate(handle.tell() // 2)  # a torn file, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        save_atomic({"format": FORMAT, "epoch": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    state = load_checkpoint(path)
    assert state["epoch"] == 1 and torch.equal(state["w"], torch.ones(3))
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary left behind


def test_refuses_pickled_objects_and_foreign_files(tmp_path):
    from argparse import Namespace

    evil = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "x": Namespace(a=1)}, evil)
    with pytest.raises(CheckpointError, match=r"argparse\.Namespace.*weights_only=True"):
        load_checkpoint(evil)
    bare = tmp_path / "bare.pt"
    torch.save({"conv.weight": torch.ones(1)}, bare)
    with pytest.raises(CheckpointError, match="not a falconet checkpoint"):
        load_checkpoint(bare)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(junk)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")


def test_rng_states_round_trip_through_a_checkpoint(tmp_path):
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    save_atomic({"format": FORMAT, "rng": rng_states()}, tmp_path / "r.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng_states(load_checkpoint(tmp_path / "r.pt")["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1]) and expected[2] == again[2]
