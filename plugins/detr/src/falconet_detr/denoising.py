"""Denoising queries (DN-DETR, DINO's contrastive form), in a static number of groups.

Each group holds every target slot of the batch's bucket twice: a positive query (the box
jittered within half its size, the label sometimes flipped), to be reconstructed, and a
negative one (jittered further), to be called background. The query count is ``2 x groups x
M`` for a bucket of ``M`` slots, whatever the images hold, so the shapes are static per bucket
and nothing reads the counts on the host; slots past an image's count are queries that no other
query sees and no loss reads, so padding the targets to a larger bucket (as a recorded step
does) changes no real query. A batch with no box at all is an all-padding group that trains
nothing and costs a few masked rows (a known hang elsewhere: dynamic group counts of zero).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from falconet.data.targets import Targets
from falconet_detr.boxes import inverse_sigmoid, xyxy_to_cxcywh


@dataclass(frozen=True, eq=False)
class DenoisingQueries:
    """All ``[B, T]`` with ``T = 2 x groups x M`` (group after group, positives then
    negatives within a group): ``labels`` the noised labels, ``reference_logits [B, T, 4]``
    the noised boxes before the sigmoid, ``target_labels`` and ``target_boxes [B, T, 4]``
    (``cx, cy, w, h`` in ``[0, 1]``) what each query should become, ``positive`` (1 for a
    real slot's positive query) and ``real`` (1 for a real slot's queries) as float masks,
    and ``mask [B, 1, T, T]`` bool, where a query may attend (its own group's real slots,
    and itself)."""

    labels: torch.Tensor
    reference_logits: torch.Tensor
    target_labels: torch.Tensor
    target_boxes: torch.Tensor
    positive: torch.Tensor
    real: torch.Tensor
    mask: torch.Tensor


def denoising_queries(
    targets: Targets,
    scale: torch.Tensor,
    classes: int,
    groups: int,
    *,
    label_noise: float = 0.5,
    box_noise: float = 1.0,
) -> DenoisingQueries:
    """The denoising queries of ``targets`` (boxes in pixels; ``scale`` is ``(W, H, W, H)``)."""
    boxes, labels, counts = targets.boxes, targets.labels, targets.counts
    b, m = labels.shape
    device = boxes.device
    real_slot = (torch.arange(m, device=device) < counts[:, None]).float()  # [B, M]
    xyxy = (boxes / scale).clamp(0, 1)
    # [B, groups, 2, M]: group, positive or negative, slot
    shape = (b, groups, 2, m)
    xyxy = xyxy[:, None, None].expand(*shape, 4)
    true_labels = labels[:, None, None].expand(shape)
    draws = slot_draws(shape, device)
    flip = draws[..., 0] < label_noise * 0.5
    drawn_labels = (draws[..., 1] * classes).long().clamp(max=classes - 1)
    noised_labels = torch.where(flip, drawn_labels, true_labels)
    half = (xyxy[..., 2:] - xyxy[..., :2]).repeat(1, 1, 1, 1, 2) / 2 * box_noise
    sign = (draws[..., 2:6] < 0.5) * 2.0 - 1.0
    part = draws[..., 6:10]
    kind = torch.arange(2, device=device, dtype=torch.float32)  # 0 positive, 1 negative
    part = part + kind.view(1, 1, 2, 1, 1)  # negatives: jittered further
    noised = (xyxy + sign * part * half).clamp(0, 1)
    real = real_slot[:, None, None].expand(shape)
    positive = real * (1 - kind).view(1, 1, 2, 1)
    t = groups * 2 * m
    group_of = torch.arange(t, device=device) // (2 * m)
    same_group = group_of[:, None] == group_of[None, :]
    mask = same_group[None] & (real.reshape(b, 1, t) > 0)
    mask = (mask | torch.eye(t, dtype=torch.bool, device=device)[None])[:, None]
    return DenoisingQueries(
        labels=noised_labels.reshape(b, t),
        reference_logits=inverse_sigmoid(xyxy_to_cxcywh(noised)).reshape(b, t, 4),
        target_labels=true_labels.reshape(b, t),
        target_boxes=xyxy_to_cxcywh(xyxy).reshape(b, t, 4),
        positive=positive.reshape(b, t),
        real=real.reshape(b, t),
        mask=mask,
    )


def slot_draws(shape: tuple[int, int, int, int], device: torch.device) -> torch.Tensor:
    """``[B, groups, 2, M, 10]`` uniforms, every random number of the queries (flip, label,
    four signs, four jitters), drawn in one call slot by slot: a bucket padded to more slots
    draws the same numbers for the real ones first, on a generator that fills in order (the
    CPU's), so padding the targets leaves the loss as it was."""
    b, groups, kinds, m = shape
    return torch.rand(m, b, groups, kinds, 10, device=device).permute(1, 2, 3, 0, 4)
