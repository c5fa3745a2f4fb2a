"""The RT-DETR-style network: backbone, hybrid encoder, query selection, deformable decoder.

Query selection: every encoder cell proposes a box (a correction of an anchor box centred on
the cell, a size per level) with class scores; the ``queries`` cells of highest score seed the
decoder, their features as its queries and their boxes as its references (both detached: the
encoder's proposals are trained by their own loss). Shapes are static for a fixed input size
(``topk`` of a fixed count), and nothing is read back to the host, so the whole network is a
capture region.

Query groups (Group DETR, as RF-DETR and LW-DETR train): with ``query_groups`` G above 1, the
training forward selects G query sets, each by a proposal head of its own (group 0's is the
model's ``proposal``, ``proposal_scores`` and ``proposal_boxes``; the others' are
``group_proposals``), and runs them through the decoder together, each group's self-attention
blind to the others'; the loss matches each group to the boxes on its own. Evaluation runs
group 0 alone, so inference costs what a one-group model's does and computes the same numbers
from the same group-0 weights. G is static (a fixed ``G x queries`` in training).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from falconet_detr.backbone import Backbone
from falconet_detr.boxes import inverse_sigmoid
from falconet_detr.decoder import MLP, PRIOR_LOGIT, Decoder
from falconet_detr.denoising import DenoisingQueries
from falconet_detr.encoder import HybridEncoder


@dataclass(frozen=True)
class Scale:
    widths: tuple[int, int, int, int]
    depth: int
    dim: int
    heads: int
    ffn: int
    fuse_depth: int
    layers: int
    queries: int = 300
    points: int = 4


SCALES = {
    "detr-n": Scale((32, 64, 128, 256), 1, 128, 8, 512, 1, 3),
    "detr-s": Scale((64, 128, 256, 512), 2, 256, 8, 1024, 2, 6),
}


class DetrOutputs(NamedTuple):
    """What the network returns in training mode (all tensors, so graph backends can keep
    them as outputs). Boxes are ``(cx, cy, w, h)`` in ``[0, 1]`` of the input.

    ``logits [L, B, Q, C]`` and ``boxes [L, B, Q, 4]`` per decoder layer; ``enc_logits [B, Q,
    C]`` and ``enc_boxes [B, Q, 4]``, the selected proposals (query ``i`` of the decoder
    started from proposal ``i``); with G query groups ``Q`` is ``G x queries``, group after
    group; ``levels``, the encoder's maps ``[B, D, h, w]`` (the
    denoising pass reads them, and their shapes); ``scale [4]``, ``(W, H, W, H)`` of the
    input, as a tensor made on the device.
    """

    logits: torch.Tensor
    boxes: torch.Tensor
    enc_logits: torch.Tensor
    enc_boxes: torch.Tensor
    levels: tuple[torch.Tensor, ...]
    scale: torch.Tensor


def flatten(levels: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[tuple[int, int], ...]]:
    """The levels' cells as ``[B, S, D]``, row-major level after level, and their shapes."""
    shapes = tuple((f.shape[-2], f.shape[-1]) for f in levels)
    return torch.cat([f.flatten(2).transpose(1, 2) for f in levels], 1), shapes


def anchor_logits(shapes: tuple[tuple[int, int], ...], like: torch.Tensor) -> torch.Tensor:
    """``[S, 4]`` anchor boxes before the sigmoid: each cell's centre, side 0.05 x 2^level."""
    anchors = []
    for level, (h, w) in enumerate(shapes):
        ys, xs = torch.meshgrid(
            (torch.arange(h, device=like.device, dtype=torch.float32) + 0.5) / h,
            (torch.arange(w, device=like.device, dtype=torch.float32) + 0.5) / w,
            indexing="ij",
        )
        side = torch.full_like(xs, 0.05 * 2.0**level)
        anchors.append(torch.stack((xs, ys, side, side), -1).view(-1, 4))
    return inverse_sigmoid(torch.cat(anchors).clamp(0.01, 0.99)).to(like.dtype)


class GroupProposals(nn.Module):
    """The proposal head of a query group past the first: features, class scores and box
    corrections of every encoder cell; initialised as the first group's head is, from draws
    of its own (the groups' different proposals are what makes them different sets)."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim))
        self.scores = nn.Linear(dim, num_classes)
        self.boxes = MLP(dim, dim, 4, 3)
        nn.init.constant_(self.scores.bias, PRIOR_LOGIT)
        nn.init.zeros_(self.boxes.layers[-1].weight)
        nn.init.zeros_(self.boxes.layers[-1].bias)


class DetrNet(nn.Module):
    """``grad_checkpoint``: the regions (``backbone``, ``neck``: the hybrid encoder) whose
    blocks recompute their activations in the backward; the decoder keeps its own."""

    def __init__(
        self,
        scale: Scale,
        num_classes: int,
        query_groups: int = 1,
        grad_checkpoint: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__()
        self.num_classes, self.queries = num_classes, scale.queries
        self.backbone = Backbone(scale.widths, scale.depth, "backbone" in grad_checkpoint)
        self.encoder = HybridEncoder(
            self.backbone.channels,
            scale.dim,
            scale.heads,
            scale.ffn,
            scale.fuse_depth,
            grad_checkpoint="neck" in grad_checkpoint,
        )
        levels = len(self.backbone.channels)
        self.decoder = Decoder(
            scale.dim, scale.heads, scale.ffn, scale.layers, num_classes, levels, scale.points
        )
        self.proposal = nn.Sequential(nn.Linear(scale.dim, scale.dim), nn.LayerNorm(scale.dim))
        self.proposal_scores = nn.Linear(scale.dim, num_classes)
        self.proposal_boxes = MLP(scale.dim, scale.dim, 4, 3)
        nn.init.constant_(self.proposal_scores.bias, PRIOR_LOGIT)
        nn.init.zeros_(self.proposal_boxes.layers[-1].weight)
        nn.init.zeros_(self.proposal_boxes.layers[-1].bias)
        self.denoise_labels = nn.Embedding(num_classes, scale.dim)
        # made last, so group 0 and the rest start from the weights a one-group model has
        self.query_groups = query_groups
        self.group_proposals = nn.ModuleList(
            GroupProposals(scale.dim, num_classes) for _ in range(query_groups - 1)
        )
        self.register_load_state_dict_pre_hook(_drop_groups_past_own)

    def forward(self, images: torch.Tensor):
        """Training: :class:`DetrOutputs`; evaluation: the last layer's ``(logits [B, Q, C],
        boxes [B, Q, 4])``, from query group 0 alone."""
        levels = tuple(self.encoder(self.backbone(images)))
        memory, shapes = flatten(levels)
        groups = self.query_groups if self.training else 1
        heads = [(self.proposal, self.proposal_scores, self.proposal_boxes)]
        heads += [(g.features, g.scores, g.boxes) for g in self.group_proposals[: groups - 1]]
        anchors = None
        selected = []
        for project, score, box in heads:
            features = project(memory)
            if anchors is None:
                anchors = anchor_logits(shapes, features)
            selected.append(self.select(features, score(features), box(features) + anchors))
        if groups > 1:  # [B, G x Q, ...], group after group
            selected = [[torch.cat(x, 1) for x in zip(*selected, strict=True)]]
        enc_logits, enc_box_logits, queries = selected[0]
        logits, boxes = self.decoder(
            queries.detach(), enc_box_logits.detach(), memory, shapes, groups=groups
        )
        if not self.training:
            return logits[-1], boxes[-1]
        h, w = images.shape[-2:]
        scale = torch.stack([images.new_full((), float(v)) for v in (w, h, w, h)]).float()
        return DetrOutputs(logits, boxes, enc_logits, enc_box_logits.sigmoid(), levels, scale)

    def select(
        self, features: torch.Tensor, scores: torch.Tensor, box_logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``queries`` cells of highest class score (``scores [B, S, C]``): their scores
        ``[B, Q, C]``, box logits ``[B, Q, 4]`` and features ``[B, Q, D]``."""
        count = min(self.queries, scores.shape[1])  # a tiny input has fewer cells
        top = scores.max(-1).values.topk(count, 1).indices  # [B, Q]
        enc_logits = scores.gather(1, top[..., None].expand(-1, -1, scores.shape[-1]))
        enc_box_logits = box_logits.gather(1, top[..., None].expand(-1, -1, 4))
        queries = features.gather(1, top[..., None].expand(-1, -1, features.shape[-1]))
        return enc_logits, enc_box_logits, queries

    def denoise(
        self, levels: tuple[torch.Tensor, ...], queries: DenoisingQueries
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder on the denoising queries alone, over the same encoder maps: every
        layer's logits ``[L, B, T, C]`` and boxes ``[L, B, T, 4]``."""
        memory, shapes = flatten(levels)
        # the loop calls the loss outside the forward's autocast: the pass runs in the
        # precision the forward ran in, read from the maps it made
        dtype = memory.dtype
        with torch.autocast(memory.device.type, dtype=dtype, enabled=dtype != torch.float32):
            return self.decoder(
                self.denoise_labels(queries.labels),
                queries.reference_logits,
                memory,
                shapes,
                queries.mask,
            )


def _drop_groups_past_own(module: DetrNet, state_dict, prefix: str, *args) -> None:
    """A checkpoint trained with more query groups loads into a model of fewer (prediction
    builds one group): the proposal heads of groups past the model's own are training-only,
    never run at inference, and are left out rather than refused."""
    own = len(module.group_proposals)
    head = prefix + "group_proposals."
    for key in [k for k in state_dict if k.startswith(head)]:
        if int(key[len(head) :].split(".", 1)[0]) >= own:
            del state_dict[key]
