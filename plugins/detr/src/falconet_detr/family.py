"""The ``detr`` family: what falconet needs to train, evaluate and save an RT-DETR-style model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from falconet.contract import Assigner


class DetrFamily:
    """RT-DETR-style detectors: ``detr-n``, ``detr-s`` (docs/detr.md has their sizes).

    ``query_groups``: the decoder's query groups in training (the ``query_groups`` key,
    :mod:`falconet_detr.keys`; a run's family is :meth:`configure`'d with the run's keys)."""

    name = "detr"
    summary = "RT-DETR-style: hybrid encoder, deformable decoder, denoising (falconet-detr)"
    models = ("detr-n", "detr-s")
    priority = 0  # the default model only where no family of higher priority is installed
    grad_checkpoint_regions = ("backbone", "neck")  # falconet.contract.CheckpointingFamily

    def __init__(
        self, query_groups: int = 1, grad_checkpoint: frozenset[str] = frozenset()
    ) -> None:
        self.query_groups = query_groups
        self.grad_checkpoint = frozenset(grad_checkpoint)

    def configure(self, options: Mapping[str, Any]) -> DetrFamily:
        """The family for a run of ``options`` (the run's resolved keys): its own keys read,
        and the regions the core's ``grad_checkpoint`` names (:mod:`falconet.grad_checkpoint`;
        ``neck``: the hybrid encoder)."""
        from falconet.contract import validated_keys
        from falconet.grad_checkpoint import regions
        from falconet_detr.keys import DetrKeys

        return DetrFamily(validated_keys(options, DetrKeys).query_groups, regions(options))

    def build_model(self, model: str, num_classes: int):  # -> DetrNet
        from falconet_detr.network import SCALES, DetrNet

        if model not in SCALES:
            raise ValueError(f"model={model}: the detr family has {', '.join(SCALES)}")
        return DetrNet(SCALES[model], num_classes, self.query_groups, self.grad_checkpoint)

    def build_loss(self, model: Any, assigner: Assigner):  # -> DetrLoss
        """The loss matches each of ``model``'s query groups on its own (its ``query_groups``)."""
        from falconet_detr.loss import DetrLoss

        return DetrLoss(model, assigner)

    def default_recipe(self, model: str) -> Mapping[str, Any]:
        """RT-DETR's recipe where falconet has the key (docs/detr.md), at four times its
        rate: AdamW at 4e-4, the backbone at the same rate, constant after warm-up, gradients
        clipped at 0.1, EMA, no mosaic (its random canvases hurt the set prediction's sense of
        object sizes less than they slow its convergence from scratch; a key like any
        other)."""
        return {
            "optimizer": "adamw",
            "momentum": 0.9,
            # RT-DETR's 1e-4 fine-tunes a pretrained backbone over many epochs; this model
            # starts from scratch, and at 1e-4 it barely learned under augmentation in the
            # overfit check's budget (docs/lab/2026-12-detr-family.md, 2026-12-04)
            "lr0": 4e-4,
            "lrf": 1.0,
            # RT-DETR's 0.1 is for an ImageNet-pretrained backbone; this one starts from
            # scratch and learns at the rest's rate (a 0.1 slowed learning on the CPU check)
            "backbone_lr_scale": 1.0,
            "schedule": "linear",
            "warmup_epochs": 2.0,
            "warmup_bias_lr": 0.0,
            "weight_decay": 1e-4,
            "decay_norm_and_bias": False,
            "clip_grad": 0.1,
            "ema": True,
            "ema_decay": 0.9999,
            "mosaic": 0.0,
            "close_mosaic": 0,
            "imgsz": 640,
            "nbs": 16,
            "amp_dtype": "auto",
            "assigner": "hungarian",
            # one query set: Group DETR's groups (RF-DETR and LW-DETR train 13) are a key,
            # off until the overfit check has measured them (docs/detr.md, ablation pending)
            "query_groups": 1,
        }

    def static_loss(self, assigner: Assigner, device: Any) -> bool:
        """The loss has static shapes (a fixed query count, static denoising groups over the
        padded targets) and reads nothing back to the host where its matching does not, which
        the matcher declares (:meth:`Assigner.static_on`; ``hungarian``: on a GPU where its
        solver runs). Elsewhere a backend that records the whole step declines, and the
        network alone is recorded."""
        return assigner.static_on(device)

    def capture_region(self, model: Any):
        """The whole network: static shapes for a fixed input size (a fixed query count, the
        denoising pass runs in the loss), nothing read back to the host."""
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
        """The ``max_det`` best (query, class) pairs per image above ``conf``: a set
        prediction needs no NMS (``iou`` is unused); every class of a query may score
        (``multi_label`` is what this always does)."""
        from falconet_detr.boxes import cxcywh_to_xyxy

        logits, boxes = outputs
        scores = logits.float().sigmoid().flatten(1)  # [B, Q * C]
        classes = logits.shape[-1]
        keep = min(max_det, scores.shape[1])
        top, index = scores.topk(keep, 1)
        detections = []
        for b, (h, w) in enumerate(image_sizes):
            query = index[b] // classes
            chosen = cxcywh_to_xyxy(boxes[b, query].float())
            chosen[:, 0::2] *= w  # Python scalars: no copy to the device per image
            chosen[:, 1::2] *= h
            above = top[b] > conf
            detections.append(
                {
                    "boxes": chosen[above],
                    "scores": top[b][above],
                    "labels": (index[b] % classes)[above],
                }
            )
        return detections

    def export_graph(self, model: Any):  # -> falconet.contract.ExportGraph
        """The network, its boxes in input pixels; the selection stays outside the graph
        (:mod:`falconet_detr.export`)."""
        from falconet_detr.export import export_graph

        return export_graph(model)
