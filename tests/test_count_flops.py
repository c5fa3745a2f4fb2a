"""tools/count_flops.py: its grid_sample formula on one call (a known answer), and detr-n's
sampling term at 384 px equal to the count of its deformable attention's samples."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def test_grid_sample_counts_eight_flops_a_sampled_value_and_channel(load_tool):
    count_flops = load_tool("count_flops")

    class Sampler(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(5, 7)

        def forward(self, x):
            grid = torch.rand(1, 4, 6, 2) * 2 - 1
            maps = x.expand(2, 3, 5, 5)
            sampled = F.grid_sample(maps, grid.expand(2, -1, -1, -1), align_corners=False)
            return self.linear(sampled[..., :5])

    counted = count_flops.count(Sampler(), 5)
    sampling = 8 * 2 * 3 * 4 * 6  # N x C x H_out x W_out, four taps of a multiply-add
    linear = 2 * (2 * 3 * 4) * 5 * 7
    assert counted["flops_by_op"]["aten.grid_sampler_2d"] == sampling
    assert counted["gflops_sampling"] == round(sampling / 1e9, 3)
    assert sum(counted["flops_by_op"].values()) == sampling + linear  # the same counter
    assert counted["params"] == 5 * 7 + 7


def test_detr_n_sampling_term_is_its_sampled_values_times_eight(load_tool):
    count_flops = load_tool("count_flops")
    from falconet_detr.network import SCALES

    scale = SCALES["detr-n"]
    counted = count_flops.count(count_flops.falconet_model("detr-n"), 384)
    levels, dh = 3, scale.dim // scale.heads
    samples = scale.layers * scale.heads * dh * scale.queries * levels * scale.points
    assert counted["flops_by_op"]["aten.grid_sampler_2d"] == 8 * samples
    assert 4.0 < counted["gflops_without_sampling"] < 4.2  # docs/detr.md: 4.08
