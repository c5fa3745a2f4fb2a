"""The YOLO network: CSP backbone with SPPF, PAN neck, decoupled anchor-free head with DFL.

A size is three numbers (depth and width multipliers and a channel cap), as the YOLO scales
are. In training and in evaluation the network returns the same static-shaped tensors:

* ``box [B, A, 4 * reg_max]``: distribution logits of the distances from each anchor point to
  the box's left, top, right and bottom edges, in stride units;
* ``cls [B, A, C]``: class logits;
* ``anchors [A, 2]``: anchor points ``(x, y)`` in pixels, and ``strides [A, 1]``.

``A`` is the number of grid cells over strides 8, 16 and 32 and depends only on the input
size, so the whole network is one capture region for CUDA graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from falconet import ops
from falconet.grad_checkpoint import checkpoint
from falconet_detect.blocks import SPPF, C2f, Conv, Upsample2x

STRIDES = (8, 16, 32)
REG_MAX = 16


@dataclass(frozen=True)
class Scale:
    """A model size: depth multiplier, width multiplier, channel cap."""

    depth: float
    width: float
    max_channels: int

    def ch(self, c: int) -> int:
        return int(math.ceil(min(c, self.max_channels) * self.width / 8) * 8)

    def n(self, repeats: int) -> int:
        return max(round(repeats * self.depth), 1)


SCALES = {
    "yolo-n": Scale(0.33, 0.25, 1024),
    "yolo-s": Scale(0.33, 0.50, 1024),
    "yolo-m": Scale(0.67, 0.75, 768),
}


def _branch(c_in: int, hidden: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        Conv(c_in, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, c_out, 1)
    )


def _cells(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W] -> [B, H x W, C]``: a view of a channels-last map (the trainer's layout),
    so the levels' concatenation is the head's only copy and the loss reads contiguous rows
    (the DFL softmax runs along them)."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)


class DetectHead(nn.Module):
    """Decoupled head: a box branch (DFL logits) and a class branch per level."""

    def __init__(self, num_classes: int, channels: tuple[int, ...]) -> None:
        super().__init__()
        self.num_classes = num_classes
        c_box = max(16, channels[0] // 4, REG_MAX * 4)
        c_cls = max(channels[0], min(num_classes, 100))
        self.box = nn.ModuleList(
            nn.Sequential(
                Conv(c, c_box, 3), Conv(c_box, c_box, 3), nn.Conv2d(c_box, 4 * REG_MAX, 1)
            )
            for c in channels
        )
        self.cls = nn.ModuleList(
            nn.Sequential(
                Conv(c, c_cls, 3), Conv(c_cls, c_cls, 3), nn.Conv2d(c_cls, num_classes, 1)
            )
            for c in channels
        )
        self._grids: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def init_biases(self, image_size: int = 640) -> None:
        """The family's priors: box logits start flat, class logits at about 5 objects per
        image spread over the classes and cells of each level."""
        for box, cls, stride in zip(self.box, self.cls, STRIDES, strict=True):
            nn.init.constant_(box[-1].bias, 1.0)
            prior = 5 / self.num_classes / (image_size / stride) ** 2
            nn.init.constant_(cls[-1].bias, math.log(prior))

    def grid(
        self, shapes: list[tuple[int, int]], device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Anchor points (cell centres, pixels) and strides for these feature sizes, cached.

        Under ``torch.compile`` nothing is cached: the compiler folds the grid into the graph,
        and a cached tensor made inside a CUDA-graph tree would live in memory the next replay
        overwrites (``compile_mode=reduce-overhead`` failed on exactly that).
        """
        key = (tuple(shapes), device, dtype)
        if key not in self._grids or torch.compiler.is_compiling():
            points, strides = [], []
            for (h, w), stride in zip(shapes, STRIDES, strict=True):
                ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) * stride
                xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) * stride
                yy, xx = torch.meshgrid(ys, xs, indexing="ij")
                points.append(torch.stack((xx, yy), -1).reshape(-1, 2))
                strides.append(torch.full((h * w, 1), float(stride), device=device, dtype=dtype))
            made = (torch.cat(points), torch.cat(strides))
            if torch.compiler.is_compiling():
                return made
            self._grids[key] = made
        return self._grids[key]

    @staticmethod
    def _level(branch: nn.Module, feature: torch.Tensor) -> torch.Tensor:
        """One level's branch output as ``[B, H x W, C]`` cells. Its gradient comes back from
        the concatenation over cells as a strided slice: :func:`falconet.ops.dense_grad`."""
        return _cells(ops.dense_grad(branch(feature)))

    def forward(
        self, features: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        box = torch.cat([self._level(b, f) for b, f in zip(self.box, features, strict=True)], 1)
        cls = torch.cat([self._level(c, f) for c, f in zip(self.cls, features, strict=True)], 1)
        anchors, strides = self.grid(
            [tuple(f.shape[2:]) for f in features], box.device, torch.float32
        )
        return box, cls, anchors, strides


class YoloNet(nn.Module):
    """Backbone, neck and head for ``num_classes`` classes at one :class:`Scale`.

    ``grad_checkpoint``: the regions (``backbone``: the stem and stages 3-5; ``neck``: the
    PAN's C2f blocks) whose blocks recompute their activations in the backward
    (:func:`falconet.grad_checkpoint.checkpoint`); the head keeps its own."""

    def __init__(
        self, scale: Scale, num_classes: int, grad_checkpoint: frozenset[str] = frozenset()
    ) -> None:
        super().__init__()
        self.grad_checkpoint = frozenset(grad_checkpoint)
        c, n = scale.ch, scale.n
        self.stem = nn.Sequential(
            Conv(3, c(64), 3, 2), Conv(c(64), c(128), 3, 2), C2f(c(128), c(128), n(3), True)
        )
        self.stage3 = nn.Sequential(Conv(c(128), c(256), 3, 2), C2f(c(256), c(256), n(6), True))
        self.stage4 = nn.Sequential(Conv(c(256), c(512), 3, 2), C2f(c(512), c(512), n(6), True))
        self.stage5 = nn.Sequential(
            Conv(c(512), c(1024), 3, 2), C2f(c(1024), c(1024), n(3), True), SPPF(c(1024), c(1024))
        )
        self.up = Upsample2x()
        self.top4 = C2f(c(1024) + c(512), c(512), n(3), False)
        self.top3 = C2f(c(512) + c(256), c(256), n(3), False)
        self.down3 = Conv(c(256), c(256), 3, 2)
        self.bottom4 = C2f(c(256) + c(512), c(512), n(3), False)
        self.down4 = Conv(c(512), c(512), 3, 2)
        self.bottom5 = C2f(c(512) + c(1024), c(1024), n(3), False)
        self.head = DetectHead(num_classes, (c(256), c(512), c(1024)))
        self.head.init_biases()

    def forward(
        self, images: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``images [B, 3, H, W]`` float in ``[0, 1]``, H and W multiples of 32."""
        backbone, neck = self._region("backbone"), self._region("neck")
        p3 = backbone(self.stage3, backbone(self.stem, images))
        p4 = backbone(self.stage4, p3)
        p5 = backbone(self.stage5, p4)
        t4 = neck(self.top4, torch.cat((self.up(p5), p4), 1))
        n3 = neck(self.top3, torch.cat((self.up(t4), p3), 1))
        n4 = neck(self.bottom4, torch.cat((self.down3(n3), t4), 1))
        n5 = neck(self.bottom5, torch.cat((self.down4(n4), p5), 1))
        return self.head([n3, n4, n5])

    def _region(self, name: str):
        """How a block of region ``name`` runs: checkpointed, or as a plain call."""
        return checkpoint if name in self.grad_checkpoint else _plain


def _plain(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)
