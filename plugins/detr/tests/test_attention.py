"""Multi-scale deformable attention's sampling (``grid_sample`` per level) against a loop over
every query, head, level and point with bilinear interpolation written out."""

from __future__ import annotations

import math

import torch

from falconet_detr.attention import DeformableAttention, deformable_sample


def slow_sample(value, shapes, locations, weights):
    """The same sum, one point at a time (``align_corners=False``: pixel ``i`` covers
    ``[i, i + 1)``, its centre at ``(i + 0.5) / size``; zeros outside the map)."""
    b, _, heads, dh = value.shape
    q, points = locations.shape[1], locations.shape[4]
    out = torch.zeros(b, q, heads, dh, dtype=torch.float64)
    starts = [0]
    for h, w in shapes:
        starts.append(starts[-1] + h * w)
    for bi in range(b):
        for qi in range(q):
            for hi in range(heads):
                for li, (h, w) in enumerate(shapes):
                    cells = value[bi, starts[li] : starts[li + 1], hi].double().view(h, w, dh)
                    for pi in range(points):
                        x = locations[bi, qi, hi, li, pi, 0].item() * w - 0.5
                        y = locations[bi, qi, hi, li, pi, 1].item() * h - 0.5
                        x0, y0 = math.floor(x), math.floor(y)
                        sample = torch.zeros(dh, dtype=torch.float64)
                        for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
                            for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
                                if 0 <= yy < h and 0 <= xx < w:
                                    sample += wy * wx * cells[yy, xx]
                        out[bi, qi, hi] += weights[bi, qi, hi, li, pi].item() * sample
    return out.view(b, q, heads * dh)


def test_the_sampling_is_the_per_point_bilinear_sum():
    torch.manual_seed(0)
    shapes = ((6, 5), (3, 3), (2, 1))
    b, q, heads, dh, points = 2, 4, 2, 3, 3
    value = torch.randn(b, sum(h * w for h, w in shapes), heads, dh)
    locations = torch.rand(b, q, heads, len(shapes), points, 2) * 1.4 - 0.2  # some outside
    weights = torch.rand(b, q, heads, len(shapes), points)
    got = deformable_sample(value, shapes, locations, weights)
    torch.testing.assert_close(
        got.double(), slow_sample(value, shapes, locations, weights), atol=1e-5, rtol=1e-5
    )


def test_the_module_keeps_shapes_and_its_offsets_start_on_rays():
    torch.manual_seed(0)
    attention = DeformableAttention(32, heads=4, levels=2, points=2)
    shapes = ((4, 4), (2, 2))
    out = attention(torch.randn(2, 5, 32), torch.rand(2, 5, 4), torch.randn(2, 20, 32), shapes)
    assert out.shape == (2, 5, 32)
    rays = attention.offsets.bias.view(4, 2, 2, 2)
    assert torch.equal(rays[:, :, 1], 2 * rays[:, :, 0])  # point k at k times the first
    assert (rays.abs().amax(-1) > 0).all()
