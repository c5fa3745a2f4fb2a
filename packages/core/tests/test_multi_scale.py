"""multi_scale=: the key's forms, the size set it gives (rounded to the stride, bounded), the
errors at plan time, the per-batch draw and the resize of a batch."""

from __future__ import annotations

import pytest
import torch

from falconet.data.targets import Targets
from falconet.training.config import ConfigError, TrainConfig, build_config
from falconet.training.multi_scale import (
    MAX_SIZES,
    RANGE_SIZES,
    SizeDraw,
    rescale,
    size_draw,
    size_set,
)


def sizes_of(value, imgsz: int = 640) -> tuple[int, ...]:
    config = build_config(TrainConfig, {"multi_scale": value, "imgsz": imgsz})
    return size_set(config.multi_scale, config.imgsz)


@pytest.mark.parametrize(
    ("value", "kept", "sizes"),
    [
        (False, "false", ()),
        ("false", "false", ()),
        (True, "0.5-1.5", (320, 480, 640, 800, 960)),  # Ultralytics' ±50%
        ("true", "0.5-1.5", (320, 480, 640, 800, 960)),
        (0.5, "0.5-1.5", (320, 480, 640, 800, 960)),
        ("0.25", "0.75-1.25", (480, 576, 640, 704, 800)),
        ("0.7-1.3", "0.7-1.3", (448, 544, 640, 736, 832)),  # 0.7 x 640 / 32 is 14, not 15
        ("640,320,480", "320,480,640", (320, 480, 640)),
        ([480, 640], "480,640", (480, 640)),
        ("480", "480", (480,)),
    ],
)
def test_the_key_forms_and_their_size_sets(value, kept, sizes):
    assert TrainConfig(multi_scale=value).multi_scale == kept  # what args.yaml keeps
    assert sizes_of(value) == sizes


def test_a_range_gives_every_stride_multiple_or_at_most_range_sizes_spread_over_it():
    assert sizes_of("0.5-1.5", imgsz=64) == (32, 64, 96)
    assert sizes_of("0.9-1.1", imgsz=640) == (576, 608, 640, 672, 704)
    wide = sizes_of("0.25-2", imgsz=640)
    assert len(wide) == RANGE_SIZES and (wide[0], wide[-1]) == (160, 1280)
    assert all(size % 32 == 0 for size in wide)
    assert sizes_of("0.1-0.5", imgsz=64) == (32,)  # no size under the stride


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("320,500", "500 is not a multiple of 32 (the network's largest stride); try 512"),
        ("1.5-0.5", "empty range"),
        ("0.96-0.97", "holds no multiple of 32"),
        ("320-960", "to name sizes in pixels, list them"),
        (",".join(str(32 * k) for k in range(1, MAX_SIZES + 2)), f"at most {MAX_SIZES}"),
        ("2", "neither a fraction between 0 and 1"),
        ("big", "is not a number"),
        ("0.5-", "not a range of two fractions"),
        ("16,32", "16 is not a size in pixels"),
    ],
)
def test_bad_values_are_refused_at_plan_time_naming_the_key(value, message):
    with pytest.raises(ConfigError, match="multi_scale=") as raised:
        build_config(TrainConfig, {"multi_scale": value, "imgsz": 640})
    assert message in str(raised.value)


def test_the_draw_is_a_function_of_seed_epoch_and_batch_and_covers_the_set():
    draw = size_draw("0.5-1.5", 640, seed=3)
    again = SizeDraw(draw.sizes, 3)  # a resumed run's draw
    keys = [(epoch, batch) for epoch in range(4) for batch in range(50)]
    drawn = [draw(*key) for key in keys]
    assert drawn == [again(*key) for key in reversed(keys)][::-1]  # order does not matter
    assert set(drawn) == set(draw.sizes)
    other = size_draw("0.5-1.5", 640, seed=4)
    assert drawn != [other(*key) for key in keys]
    assert size_draw("false", 640, seed=0) is None


def test_rescale_resizes_the_images_and_scales_the_boxes():
    images = torch.rand(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    boxes = torch.zeros(2, 8, 4)
    boxes[0, 0] = torch.tensor([8.0, 16.0, 32.0, 48.0])
    targets = Targets.from_padded(boxes, torch.zeros(2, 8, dtype=torch.long), torch.tensor([1, 0]))
    resized, scaled = rescale(images, targets, 96)
    assert resized.shape == (2, 3, 96, 96)
    assert resized.is_contiguous(memory_format=torch.channels_last)
    assert scaled.boxes[0, 0].tolist() == [12.0, 24.0, 48.0, 72.0]
    assert not scaled.boxes[0, 1:].any() and not scaled.boxes[1].any()  # padding stays zeros
    assert scaled.counts is targets.counts and scaled.bucket == targets.bucket
    same_images, same_targets = rescale(images, targets, 64)
    assert same_images is images and same_targets is targets
