"""``falconet export`` and ``Detector.export``: the ONNX file of each family against PyTorch on
real images (onnxruntime on the CPU), its dynamic or fixed batch, the weights it takes, and the
errors that say what to change.

Parity is held to what the core's own check states (:mod:`falconet.export.parity`): class
probabilities within 1e-4, box coordinates within 1e-4 of the input's side (0.0096 px at the
96 px used here). The networks are random, with BatchNorm statistics taken from the test
images: a barely trained network's evaluation-mode outputs hardly depend on its input (its
running variances are still near their initial 1), so every candidate would score alike and
NMS's choice among equals would decide the comparison instead of the graph.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from falconet import Detector
from falconet.cli import build_cli
from falconet.data.shapes import CLASSES
from falconet.export import ExportError
from falconet.export.model_export import check_images, exportable_graph
from falconet.export.parity import BOX_TOLERANCE, SCORE_TOLERANCE, session
from falconet.export.weights import choose_weights
from falconet.training.checkpoint import FORMAT, load_checkpoint, save_atomic

pytest.importorskip("onnxruntime", reason="the export extra: pip install 'falconet-core[export]'")
onnx = pytest.importorskip("onnx")

IMGSZ = 96
CONF = 0.001  # low enough that every image keeps detections of these untrained networks


def val_images(tiny_shapes: Path) -> Path:
    return tiny_shapes.parent / "images" / "val"


def random_checkpoint(plugins, model: str, images: torch.Tensor, path: Path) -> Path:
    """A checkpoint of ``model`` with random weights, BatchNorm statistics of ``images``."""
    family = plugins.families.get(model)
    torch.manual_seed(0)
    network = family.build_model(model, len(CLASSES))
    for module in network.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # the average over every batch seen: here, the one batch
    with torch.no_grad():
        network.train()(images)
    spec = {"family": family.name, "model": model, "names": list(CLASSES)}
    state = {"format": FORMAT, "spec": spec, "weights": network.eval().state_dict()}
    return save_atomic({**state, "config": {"imgsz": IMGSZ, "ema": False}}, path)


def assert_same_detections(expected: dict, got: dict) -> None:
    """Equal counts; the scores, sorted, within tolerance; each expected box within tolerance
    of a box of the same class (equal scores may come out in either order)."""
    assert len(got["scores"]) == len(expected["scores"])
    if not len(expected["scores"]):
        return
    scores = (expected["scores"].sort().values - got["scores"].sort().values).abs()
    assert float(scores.max()) <= SCORE_TOLERANCE
    distance = (expected["boxes"][:, None] - got["boxes"][None]).abs().amax(-1)
    other = expected["labels"][:, None] != got["labels"][None]
    nearest = distance.masked_fill(other, float("inf")).min(1).values
    assert float(nearest.max()) <= BOX_TOLERANCE * IMGSZ


@pytest.fixture(scope="module")
def trained(tiny_shapes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The weights folder of a one-epoch yolo-n run (EMA on): best.pt and last.pt."""
    summary = Detector("yolo-n").train(
        data=str(tiny_shapes),
        imgsz=64,
        batch=8,
        workers=0,
        epochs=1,
        plots=False,
        project=str(tmp_path_factory.mktemp("runs")),
    )
    return Path(summary["run_dir"]) / "weights"


@pytest.mark.parametrize("model", ["yolo-n", "detr-n"])
def test_the_file_gives_pytorchs_detections_at_batch_1_and_3(
    model, tiny_shapes, tmp_path, installed_falconet_plugins
):
    plugins = installed_falconet_plugins
    images = check_images(str(val_images(tiny_shapes)), IMGSZ, 8)
    checkpoint = random_checkpoint(plugins, model, images, tmp_path / "best.pt")
    detector = Detector(checkpoint, plugins=plugins)

    result = detector.export(dynamic=True, imgsz=IMGSZ, source=str(val_images(tiny_shapes)))

    assert result.path == tmp_path / "best.onnx" and result.path.is_file()
    assert (result.batch, result.weights, result.opset) == (None, "raw", 17)
    assert [p.batch for p in result.parity] == [1, 3]
    assert all(p.ok for p in result.parity), result.parity
    network = detector.module(torch.device("cpu"))
    graph = exportable_graph(detector.family, network)
    run = session(result.path)
    for batch in (1, 3):
        chunk = images[:batch].contiguous()
        boxes, scores = (torch.from_numpy(a) for a in run.run(None, {"images": chunk.numpy()}))
        with torch.no_grad():
            reference = graph.module(chunk)
            expected = detector.family.postprocess(
                network(chunk), [(IMGSZ, IMGSZ)] * batch, conf=CONF, iou=0.7, max_det=100
            )
        assert boxes.shape == reference[0].shape and scores.shape == reference[1].shape
        got = graph.detections(boxes, scores, conf=CONF, iou=0.7, max_det=100)
        for want, have in zip(expected, got, strict=True):
            assert len(want["scores"]) > 0
            assert_same_detections(want, have)
    candidates = reference[1].shape[1]
    assert result.shapes == {
        "images": ["batch", 3, IMGSZ, IMGSZ],
        "boxes": ["batch", candidates, 4],
        "scores": ["batch", candidates, len(CLASSES)],
    }
    metadata = {p.key: p.value for p in onnx.load(str(result.path)).metadata_props}
    assert json.loads(metadata["names"]) == list(CLASSES)
    assert (metadata["family"], metadata["model"], metadata["batch"]) == (
        detector.family.name,
        model,
        "dynamic",
    )
    assert metadata["selection"] == graph.selection


def test_cli_writes_a_fixed_batch_file_of_the_ema_weights(trained, tmp_path):
    from falconet.plugins import get_plugins

    plugins = get_plugins()
    out = tmp_path / "yolo.onnx"
    result = CliRunner().invoke(
        build_cli(plugins),
        ["export", f"model={trained / 'last.pt'}", "batch=2", f"out={out}", "opset=11"],
        obj=plugins,
    )
    assert result.exit_code == 0, result.output
    assert f"exported {out} (onnx, opset 11, batch 2, 64x64, ema weights)" in result.stdout
    assert "parity with PyTorch, onnxruntime CPU, batch 2" in result.stdout
    run = session(out)
    assert run.run(None, {"images": torch.rand(2, 3, 64, 64).numpy()})[0].shape[0] == 2
    with pytest.raises(Exception, match="images"):  # onnxruntime: the batch is fixed at 2
        run.run(None, {"images": torch.rand(3, 3, 64, 64).numpy()})


def test_ema_weights_by_default_raw_ones_from_last_pt(trained):
    last, best = load_checkpoint(trained / "last.pt"), load_checkpoint(trained / "best.pt")
    assert any(not torch.equal(last["ema"]["state"][k], v) for k, v in last["model"].items())

    assert choose_weights(last, None, "last.pt") == ("ema", last["ema"]["state"])
    assert choose_weights(last, "raw", "last.pt") == ("raw", last["model"])
    assert choose_weights(best, None, "best.pt") == ("ema", best["weights"])
    with pytest.raises(
        ExportError,
        match=r"weights=raw: best.pt holds only the EMA weights.*"
        r"last.pt beside it",
    ):
        choose_weights(best, "raw", "best.pt")
    no_ema = {**best, "config": {**best["config"], "ema": False}}
    assert choose_weights(no_ema, None, "best.pt") == ("raw", best["weights"])
    with pytest.raises(ExportError, match=r"no EMA weights.*export its weights with weights=raw"):
        choose_weights(no_ema, "ema", "best.pt")


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (["format=tensorrt"], "format='tensorrt': falconet exports format=onnx only"),
        (
            ["opset=5"],
            "opset=5: the yolo family's graph needs opset 11 or newer, and torch",
        ),
        (["opset=5"], "use opset=17 (the default) or another of 11.."),
        (["dynamic=maybe"], "dynamic='maybe'"),
        (["weights=best"], "weights='best': expected 'ema' or 'raw'"),
        (["imgsz=100"], "imgsz='100': must be a multiple of 32"),
        (["batch_size=2"], "unknown export key(s) batch_size"),
    ],
)
def test_bad_values_say_what_is_wrong_and_what_to_use(trained, keys, expected):
    from falconet.plugins import get_plugins

    plugins = get_plugins()
    args = ["export", f"model={trained / 'best.pt'}", *keys]
    result = CliRunner().invoke(build_cli(plugins), args, obj=plugins)
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    assert not (trained / "best.onnx").exists()


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("runs/none/weights/best.pt", "model=runs/none/weights/best.pt: no such checkpoint file"),
        ("", "export needs model=PATH"),
    ],
)
def test_a_missing_checkpoint_is_named(model, expected):
    from falconet.plugins import get_plugins

    plugins = get_plugins()
    args = ["export", *([f"model={model}"] if model else [])]
    result = CliRunner().invoke(build_cli(plugins), args, obj=plugins)
    assert result.exit_code == 2 and expected in result.stderr


def test_detr_needs_opset_16_for_grid_sample(tiny_shapes, tmp_path, installed_falconet_plugins):
    images = check_images(None, 64, 1)
    path = random_checkpoint(installed_falconet_plugins, "detr-n", images, tmp_path / "d.pt")
    with pytest.raises(ExportError, match="opset=15: the detr family's graph needs opset 16"):
        Detector(path, plugins=installed_falconet_plugins).export(opset=15)


def test_missing_packages_name_the_extra(trained, monkeypatch, tmp_path):
    out = tmp_path / "x.onnx"
    for module in ("onnx", "onnxruntime"):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, module, None)  # import fails as if not installed
            with pytest.raises(
                ExportError,
                match=rf"{module} does not import here.*"
                r"pip install 'falconet-core\[export\]'",
            ):
                Detector(trained / "best.pt").export(out=str(out))
    assert not out.exists()


def test_a_family_without_export_graph_is_refused():
    with pytest.raises(ExportError, match="the toy family does not say how to export"):
        exportable_graph(SimpleNamespace(name="toy"), torch.nn.Identity())


def test_random_weights_are_refused():
    with pytest.raises(ExportError, match="has random weights: export takes a trained"):
        Detector("yolo-n").export()
