"""A small ResNet-style backbone (basic residual blocks), features at strides 8, 16 and 32.
Trained from scratch here, like the rest of the model: no pretrained weights are read."""

from __future__ import annotations

import torch
from torch import nn

from falconet import ops
from falconet.grad_checkpoint import checkpoint


class ConvNorm(nn.Sequential):
    """Convolution, BatchNorm and (unless ``act=False``) SiLU: ``[B, cin, H, W] ->
    [B, cout, H / stride, W / stride]``.

    BatchNorm and SiLU go through :func:`falconet.ops.batch_norm_silu`, so a backend that
    replaces the op reaches this family as it reaches the yolo family (graphs-cuda's
    ``bn_silu=triton`` does in the whole step, which does not take this family's loss yet:
    docs/detr.md); run as is, it is BatchNorm then SiLU. A sequence of the convolution and
    the BatchNorm, so the weights keep their names (``0.weight``, ``1.running_mean``, ...)
    in saved checkpoints."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1, act: bool = True) -> None:
        super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv, bn = self
        y = conv(x)
        return ops.batch_norm_silu(y, bn) if self.act else bn(y)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (strided 1x1 where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            ConvNorm(cin, cout, 3, stride), ConvNorm(cout, cout, 3, act=False)
        )
        self.shortcut = (
            nn.Identity()
            if stride == 1 and cin == cout
            else ConvNorm(cin, cout, 1, stride, act=False)
        )
        self.act = nn.SiLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.body(x) + self.shortcut(x))


class Backbone(nn.Module):
    """``widths = (stem, stride 8, stride 16, stride 32)`` channels, ``depth`` blocks a stage;
    with ``grad_checkpoint`` the stem and each stage recompute their activations in the
    backward (:func:`falconet.grad_checkpoint.checkpoint`)."""

    def __init__(
        self, widths: tuple[int, int, int, int], depth: int, grad_checkpoint: bool = False
    ) -> None:
        super().__init__()
        self.grad_checkpoint = grad_checkpoint
        stem, *stages = widths
        self.stem = nn.Sequential(ConvNorm(3, stem, 3, 2), ConvNorm(stem, stem, 3, 2))
        blocks, cin = [], stem
        for cout in stages:
            blocks.append(
                nn.Sequential(
                    BasicBlock(cin, cout, 2), *(BasicBlock(cout, cout) for _ in range(depth - 1))
                )
            )
            cin = cout
        self.stages = nn.ModuleList(blocks)
        self.channels = tuple(stages)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        run = checkpoint if self.grad_checkpoint else _plain
        x = run(self.stem, x)
        features = []
        for stage in self.stages:
            x = run(stage, x)
            features.append(x)
        return features


def _plain(block: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    return block(*inputs)
