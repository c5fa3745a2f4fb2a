"""The Hungarian assigner's solver on the GPU: torch-linear-assignment's Triton kernel (one
program per image), called so that matching reads nothing back to the host.

The library's public ``batch_linear_assignment`` checks the costs for NaN and its result for
infeasibility on the host, two synchronisations a call. Here the costs are made finite before
the call and every problem is feasible (a row the columns cannot serve is left unassigned), so
its Triton entry point is called with those checks off: matching then needs no synchronisation,
and a backend may record the whole step. That entry point lives in the library's private
module; the dependency is pinned to the release line that has it, and where it is missing the
assigner solves on the CPU as before.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

log = logging.getLogger("falconet.train")

Solver = Callable[[torch.Tensor], torch.Tensor]
"""``cost [B, W, T] -> [B, W]`` (int64): each row's column, ``-1`` where it has none."""

MIN_CAPABILITY = (8, 0)
"""The library's own floor for its Triton path (Ampere)."""

EXTREME = 1e6
"""What a NaN or infinite cost becomes: beyond every real cost (a few units), so the solver
still runs and the step goes on. Only a diverged prediction makes one, and that image is then
matched coarsely (float32 keeps about 0.06 near 1e6)."""


@functools.cache
def gpu_solver() -> Solver | None:
    """The Triton solver, or ``None`` where it cannot run here (no CUDA GPU of compute
    capability 8.0+, no Triton, the library absent or without its Triton entry point, or a
    kernel that does not build or answer right: Triton compiles it on the first call, and a
    machine without a C compiler cannot). It is tried once, on a problem whose answer is
    known, so that a run falls back to scipy at set-up rather than failing in its first step."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_CAPABILITY:
        return None
    try:
        from torch_linear_assignment import _triton
    except ImportError:  # the library, or Triton, is not installed
        return None
    solve = functools.partial(_triton.batch_linear_assignment, validation="off")
    try:
        answer = solve(torch.tensor([[[4.0, 1.0], [2.0, 3.0]]], device="cuda")).tolist()
    except Exception as exc:  # Triton's build errors have no common type
        log.warning("hungarian: the GPU solver does not run here (%s); scipy on the CPU", exc)
        return None
    if answer != [[1, 0]]:
        log.warning("hungarian: the GPU solver answered %s, not [[1, 0]]; scipy on the CPU", answer)
        return None
    return solve


def match_on_device(
    cost: torch.Tensor, counts: torch.Tensor, solve: Solver
) -> tuple[torch.Tensor, torch.Tensor]:
    """``owner [B, A]`` (each anchor's slot) and ``foreground [B, A]`` (1 where matched) from
    ``cost [B, M, A]`` of slots against anchors and each image's box count, all on the device.

    Padded slots (``slot >= count``) get a cost above every real one, the same for every
    anchor: with at least as many anchors as slots that adds a constant to every assignment, so
    the real slots' optimum is the one of their own problem; with fewer anchors, the solver
    leaves padded slots unassigned first. Their anchors are then dropped. NaN and infinite
    costs (a diverged prediction) become finite extremes instead of failing the step.
    """
    batch, slots, anchors = cost.shape
    if slots == 0 or anchors == 0:  # no box slot in the bucket: nothing to match
        empty = torch.zeros(batch, anchors, device=cost.device)
        return empty.long(), empty
    cost = torch.nan_to_num(cost.float(), nan=EXTREME, posinf=EXTREME, neginf=-EXTREME)
    slot = torch.arange(slots, device=cost.device)
    real = slot[None] < counts[:, None]  # [B, M]
    padding = cost.amax(dim=(1, 2), keepdim=True) + 1.0
    column = solve(torch.where(real[..., None], cost, padding))  # [B, M]
    matched = real & (column >= 0)
    index = torch.where(matched, column, anchors)  # unmatched slots write a spare column
    spare = (batch, anchors + 1)
    owner = torch.zeros(spare, dtype=torch.int64, device=cost.device).scatter_(
        1, index, slot.expand(batch, slots)
    )
    foreground = torch.zeros(spare, device=cost.device).scatter_(1, index, matched.float())
    return owner[:, :anchors], foreground[:, :anchors]
