"""``grad_checkpoint`` from a run's keys to the network, for both families, through
``Detector.train`` and ``falconet train``; the numbers it must not change are the family
contract's (``falconet_testing.contracts.FamilyContract``)."""

from __future__ import annotations

import pytest

from falconet.training.planning import plan_run


@pytest.mark.parametrize(
    ("value", "backbone", "neck"),
    [(False, False, False), ("backbone", True, False), (True, True, True)],
)
def test_the_key_reaches_both_families_networks(
    installed_falconet_plugins, tiny_shapes, value, backbone, neck
):
    keys = {"data": str(tiny_shapes), "device": "cpu", "grad_checkpoint": value}
    yolo = plan_run({**keys, "model": "yolo-n"}, installed_falconet_plugins)
    net = yolo.family.build_model("yolo-n", 2)
    assert ("backbone" in net.grad_checkpoint, "neck" in net.grad_checkpoint) == (backbone, neck)
    detr = plan_run({**keys, "model": "detr-n"}, installed_falconet_plugins)
    net = detr.family.build_model("detr-n", 2)
    assert (net.backbone.grad_checkpoint, net.encoder.grad_checkpoint) == (backbone, neck)
    assert detr.family.query_groups == 1  # the family's own keys still read


def test_detector_train_with_it(tiny_run, tmp_path):
    from falconet import Detector

    summary = Detector("yolo-n").train(
        **tiny_run, epochs=1, device="cpu", grad_checkpoint=True, verbose=False
    )
    run = tmp_path / "runs" / "exp"
    assert summary["run_dir"] == str(run)
    assert "grad_checkpoint: backbone+neck" in (run / "args.yaml").read_text()


def test_falconet_train_refuses_a_bad_value(falconet_cli, tiny_run):
    """The command line reads the key as ``Detector.train`` does (one configuration); a bad
    value fails before any data is read."""
    pairs = [f"{k}={v}" for k, v in tiny_run.items()]
    bad = falconet_cli("train", *pairs, "grad_checkpoint=encoder")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "grad_checkpoint='encoder': not one of false (off), backbone" in bad.stderr
