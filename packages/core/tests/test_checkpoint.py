"""Checkpoints: atomic writes, the restricted unpickler, RNG round trips."""

from __future__ import annotations

import random
import threading

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
from falconet.training.host_snapshot import PinnedSnapshot
from falconet_testing.devices import cpu_and_cuda


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


def test_snapshot_copies_each_tensor_once_and_rebuilds_containers():
    shared = torch.ones(3)
    # two objects of one memory, as two state_dict() calls return them
    state = {"a": shared, "b": [shared.detach(), (torch.zeros(2), 7)], "n": "x"}
    snap = PinnedSnapshot().take([state])[0]
    assert snap["a"] is snap["b"][0]  # stored once, as torch.save would store the original
    assert snap["a"].data_ptr() != shared.data_ptr()
    assert isinstance(snap["b"][1], tuple) and snap["b"][1][1] == 7 and snap["n"] == "x"
    shared.add_(1)
    assert torch.equal(snap["a"], torch.ones(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pinned snapshot copies from a GPU")
def test_gpu_snapshot_keeps_layouts_reuses_its_buffers_and_files_hold_their_sections(tmp_path):
    conv = torch.randn(8, 4, 3, 3, device="cuda").to(memory_format=torch.channels_last)
    ema = {"conv": conv, "tracked": torch.tensor(3, device="cuda")}
    momentum = torch.randn(1000, 100, device="cuda")
    base = torch.randn(6, 8, device="cuda")
    strided = base[:, ::2]  # not dense: gathered again at every snapshot
    last = {"format": FORMAT, "weights": ema, "ema": {"state": dict(ema)}, "optimizer": momentum}
    last["model"] = {"strided": strided}
    best = {"format": FORMAT, "weights": {k: v.detach() for k, v in ema.items()}}
    snapshot = PinnedSnapshot()
    taken_last, taken_best = snapshot.take([last, best])
    torch.cuda.synchronize()
    assert snapshot.copied is not None and snapshot.copied.query()
    view = taken_last["weights"]["conv"]
    assert view.is_pinned() and view.stride() == conv.stride()  # channels_last kept
    assert torch.equal(view, conv.cpu()) and torch.equal(taken_last["optimizer"], momentum.cpu())
    assert taken_best["weights"]["conv"] is view and taken_last["ema"]["state"]["conv"] is view
    before = view.data_ptr()
    assert torch.equal(taken_last["model"]["strided"], strided.cpu())
    conv.mul_(2)
    base.mul_(3)
    assert torch.equal(view * 2, conv.cpu())  # the snapshot is a copy
    expected = conv.clone()
    again = snapshot.take([last, best])[0]
    # the copies run on the snapshot's stream; the caller's goes on at once, and changing the
    # state there does not reach the snapshot (gathered on the caller's stream before)
    conv.add_(1)
    snapshot.copied.synchronize()
    assert torch.equal(again["weights"]["conv"], expected.cpu())
    conv.copy_(expected)
    torch.cuda.synchronize()
    assert again["weights"]["conv"].data_ptr() == before  # the same buffers, refilled
    assert torch.equal(again["weights"]["conv"], conv.cpu())
    assert torch.equal(again["model"]["strided"], strided.cpu())
    alone = snapshot.take([last])[0]  # other states: laid out anew
    torch.cuda.synchronize()
    assert torch.equal(alone["weights"]["conv"], conv.cpu())
    for name, state in (("last", taken_last), ("best", taken_best)):
        save_atomic(state, tmp_path / f"{name}.pt")
    # best.pt holds its weights' buffers only, not the 400 kB of the optimizer's
    assert (tmp_path / "best.pt").stat().st_size < 20_000
    assert (tmp_path / "last.pt").stat().st_size > 400_000
    loaded = load_checkpoint(tmp_path / "best.pt")["weights"]
    assert torch.equal(loaded["conv"], conv.cpu()) and int(loaded["tracked"]) == 3


@pytest.mark.parametrize("device", cpu_and_cuda("the pinned copies need a CUDA GPU"))
def test_background_write_holds_the_state_of_submit_time(tmp_path, monkeypatch, device):
    """A slow disk: the write starts only after training has changed the weights in place.
    The file must still hold the weights as they were when the epoch ended (on a GPU, the
    pinned copies queued behind the epoch's last step)."""
    go = threading.Event()
    real_save = checkpoint.save_atomic

    def slow_save(state, path):
        go.wait(timeout=30)
        return real_save(state, path)

    monkeypatch.setattr(checkpoint, "save_atomic", slow_save)
    weights = torch.ones(4, device=device)
    writer = checkpoint.CheckpointWriter()
    for epoch in (1, 2):  # a second save, after the first one's write
        go.clear()
        writer.submit([({"format": FORMAT, "w": weights}, tmp_path / "last.pt")])
        weights.mul_(5)  # the next epoch's first update, before the file is written
        go.set()
        writer.wait()
        expected = torch.full((4,), 5.0 ** (epoch - 1))
        assert torch.equal(load_checkpoint(tmp_path / "last.pt")["w"], expected)


def test_a_failed_background_write_is_raised_at_wait_and_keeps_the_previous_file(tmp_path):
    writer = checkpoint.CheckpointWriter()
    good = tmp_path / "weights" / "last.pt"
    writer.submit([({"format": FORMAT, "epoch": 1}, good)])
    writer.wait()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    writer.submit([({"format": FORMAT, "epoch": 2}, blocked / "last.pt")])
    with pytest.raises(CheckpointError, match=r"writing a checkpoint failed.*previous checkpoint"):
        writer.wait()
    writer.wait()  # reported once
    assert load_checkpoint(good)["epoch"] == 1


def test_a_held_write_waits_for_release_and_wait_releases_it(tmp_path):
    """The trainer holds an epoch's write until the next epoch is under way: nothing is
    serialised before :meth:`release`, and :meth:`wait` (the run's end) never waits forever
    on a write that nobody released."""
    writer = checkpoint.CheckpointWriter()
    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    writer.hold()
    writer.write([({"format": FORMAT, "epoch": 1}, first)])
    written = writer._written[writer._current]
    assert not written.wait(timeout=0.5)  # time enough to write a small file, were it not held
    assert writer.held and not first.exists()
    writer.release()
    writer.wait()
    assert not writer.held and load_checkpoint(first)["epoch"] == 1
    writer.hold()
    writer.write([({"format": FORMAT, "epoch": 2}, second)])
    writer.wait()  # no release: wait releases
    assert load_checkpoint(second)["epoch"] == 2


@pytest.mark.parametrize("device", cpu_and_cuda("the pinned copies need a CUDA GPU"))
def test_a_copy_during_a_slow_write_takes_a_second_snapshot_and_files_land_in_order(
    tmp_path, monkeypatch, device
):
    """An epoch shorter than its files' write: the next epoch's copy goes ahead while the
    previous files are still being written (into the second snapshot, so the file being
    written keeps its values), the copy after it waits for the first write (its buffers are
    reused), and the files land in the order submitted."""
    gate, saved = threading.Event(), []
    real_save = checkpoint.save_atomic

    def gated_save(state, path):
        gate.wait(timeout=10)
        real_save(state, path)
        saved.append((state["epoch"], load_checkpoint(path)["w"].tolist()))

    monkeypatch.setattr(checkpoint, "save_atomic", gated_save)
    weights = torch.ones(4, device=device)
    last = tmp_path / "last.pt"
    writer = checkpoint.CheckpointWriter()
    writer.submit([({"format": FORMAT, "epoch": 1, "w": weights}, last)])
    first = writer._written[writer._current]  # set once epoch 1's file is written
    weights.mul_(2)  # the next epoch's updates
    second = writer.copy([{"format": FORMAT, "epoch": 2, "w": weights}])[0]
    assert not first.is_set(), "the copy waited for the previous files"
    writer.write([(second, last)])
    weights.mul_(2)
    third: list = []
    copying = threading.Thread(
        target=lambda: third.append(writer.copy([{"format": FORMAT, "epoch": 3, "w": weights}]))
    )
    copying.start()
    copying.join(timeout=0.5)
    assert copying.is_alive(), "the third copy reused the buffers of a file being written"
    gate.set()
    copying.join(timeout=10)
    writer.write([(third[0][0], last)])
    threads = [t.name for t in threading.enumerate()]
    assert threads.count("falconet-checkpoint") == 1  # one for the run, not one a write
    writer.wait()
    assert saved == [(1, [1.0] * 4), (2, [2.0] * 4), (3, [4.0] * 4)]
    assert load_checkpoint(last)["epoch"] == 3
