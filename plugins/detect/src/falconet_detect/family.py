"""The ``yolo`` family: what falconet needs to train, evaluate and save a YOLO model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from falconet.contract import Assigner


class YoloFamily:
    """Anchor-free YOLO (YOLOv8/YOLO11 design): ``yolo-n``, ``yolo-s``, ``yolo-m``."""

    name = "yolo"
    summary = "anchor-free YOLO, C2f backbone, PAN neck, DFL head (n 3.2M / s 11.2M / m 25.9M)"
    models = ("yolo-n", "yolo-s", "yolo-m")
    priority = 10  # with no model= key a run trains yolo-n, the fastest to train
    grad_checkpoint_regions = ("backbone", "neck")  # falconet.contract.CheckpointingFamily

    def __init__(self, grad_checkpoint: frozenset[str] = frozenset()) -> None:
        self.grad_checkpoint = frozenset(grad_checkpoint)

    def configure(self, options: Mapping[str, Any]) -> YoloFamily:
        """The family for a run of ``options``: its networks checkpoint the regions the run's
        ``grad_checkpoint`` names (:mod:`falconet.grad_checkpoint`)."""
        from falconet.grad_checkpoint import regions

        return YoloFamily(regions(options))

    def build_model(self, model: str, num_classes: int):  # -> YoloNet
        from falconet_detect.network import SCALES, YoloNet

        if model not in SCALES:
            raise ValueError(f"model={model}: the yolo family has {', '.join(SCALES)}")
        return YoloNet(SCALES[model], num_classes, self.grad_checkpoint)

    def build_loss(self, model: Any, assigner: Assigner):  # -> YoloLoss
        from falconet_detect.loss import YoloLoss

        return YoloLoss(assigner)

    def default_recipe(self, model: str) -> Mapping[str, Any]:
        """The YOLO family's recipe (docs/models.md explains each key)."""
        return {
            "optimizer": "sgd",
            "momentum": 0.937,
            "nesterov": True,
            "lr0": 0.01,
            "lrf": 0.01,
            "schedule": "linear",
            "warmup_epochs": 3.0,
            "warmup_bias_lr": 0.1,
            "weight_decay": 5e-4,
            "decay_norm_and_bias": False,
            "ema": True,
            "ema_decay": 0.9999,
            "close_mosaic": 10,
            "imgsz": 640,
            "nbs": 64,
            "amp_dtype": "auto",
            "assigner": "tal",
        }

    def static_loss(self, assigner: Assigner, device: Any) -> bool:
        """The loss is static-shaped for a fixed input size and target bucket and reads
        nothing back to the host; whether its assignment does too (so the whole step can be
        one graph) is the assigner's to say (:meth:`Assigner.static_on`)."""
        return assigner.static_on(device)

    def capture_region(self, model: Any):
        """The whole network: static shapes for a fixed input size, no data-dependent
        Python control flow (anchors are cached per input size)."""
        return model

    def postprocess(
        self,
        outputs: Any,
        image_sizes: Sequence[tuple[int, int]],
        *,
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
        multi_label: bool = False,
    ) -> list[dict]:
        from falconet_detect.postprocess import postprocess

        return postprocess(outputs, conf=conf, iou=iou, max_det=max_det, multi_label=multi_label)

    def export_graph(self, model: Any):  # -> falconet.contract.ExportGraph
        """The network and its box decoding; NMS stays outside the graph
        (:mod:`falconet_detect.export`)."""
        from falconet_detect.export import export_graph

        return export_graph(model)
