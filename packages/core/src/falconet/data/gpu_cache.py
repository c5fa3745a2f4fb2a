"""``cache=gpu``: a split's images decoded once into GPU memory, resized to long side ``imgsz``.

The store (:class:`~falconet.data.gpu_augment.ImageStore`) holds every image in a slot of
``imgsz x imgsz x 3`` bytes, so its size is known before anything is decoded:
:func:`store_bytes` is logged, and a store that would take more than :data:`STORE_SHARE` of
the device's free memory is refused with the numbers (``cache=encoded`` keeps the files' bytes
in host memory and decodes each batch on the GPU instead: :mod:`falconet.data.gpu_decode`).

JPEG files are decoded on the GPU by nvJPEG (``torchvision.io.decode_jpeg(device="cuda")``, in
batches; torchvision is not a dependency of falconet-core: without it every file goes to the
CPU decoder, and the log says so once), everything else by the CPU decoder the loader always
uses (OpenCV): any JPEG nvJPEG refuses, and any JPEG stored turned or mirrored (an EXIF
orientation other than 1, :attr:`Sample.exif_oriented`), which OpenCV turns as the dataset
check measured it and nvJPEG would not. A store of fewer JPEG files than :data:`NVJPEG_FROM`
decodes them all on the CPU threads, which start at once where nvJPEG's first call waits for
torchvision's import and the decoder's creation. An image neither can decode is left out with one
counted warning, never a crash: its slot holds another image of the store, so the store keeps
its length and every rank of a distributed run as many batches an epoch. Each image is resized
on the device (area averaging when shrinking, bilinear when enlarging, as OpenCV's
``INTER_AREA`` and ``INTER_LINEAR`` are used on the CPU), to the size
:func:`~falconet.data.loader.resized_shape` gives it, so the plans of both paths see the same image
sizes. The decoders and resamplers are not OpenCV's, so a stored image differs from the CPU cache's
by a few levels (docs/gpu-data.md); the augmentation that follows is the CPU path's up to rounding.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from falconet.data.gpu_augment import ImageStore
from falconet.data.loader import resized_shape
from falconet.data.records import DataError, Sample
from falconet.data.transforms import read_image

log = logging.getLogger("falconet.data")

STORE_SHARE = 0.5
"""The largest share of the device's free memory a store may take: the rest is the step's."""

DECODE_BATCH = 64
"""JPEG files handed to nvJPEG per call."""

NVJPEG_FROM = 1024
"""The fewest JPEG files a store hands to nvJPEG; a store of fewer decodes them on the CPU
threads. nvJPEG's first call waits for torchvision's import, which imports ``torch._dynamo``
(made ahead beside the GPU's first use: :mod:`falconet.training.first_use`), and creates the
decoder, while the CPU threads start at once: in that time they decode more images than a
small store holds (the measurement: docs/gpu-data.md, "Which decoder")."""

JPEG_SUFFIXES = (".jpg", ".jpeg")


GPU_DECODER = "torchvision.io"
"""The module of nvJPEG's decoder (:func:`gpu_decoder`)."""


def gpu_decoder() -> str | None:
    """:data:`GPU_DECODER` where torchvision is installed (found, not imported), else ``None``."""
    return GPU_DECODER if importlib.util.find_spec("torchvision") is not None else None


def store_bytes(count: int, size: int) -> int:
    """Bytes of a store of ``count`` images at long side ``size``."""
    return count * size * size * 3


def store_fits(count: int, size: int, free: int) -> bool:
    """Whether a store of ``count`` images at ``size`` takes at most :data:`STORE_SHARE` of
    ``free`` bytes (``cache=gpu`` refuses one that does not; ``cache=auto`` then takes none)."""
    return store_bytes(count, size) <= STORE_SHARE * free


def check_fits(count: int, size: int, free: int, total: int, where: str) -> None:
    """Log the store's size; refuse one above :data:`STORE_SHARE` of ``free`` bytes, with the
    numbers and what to use instead."""
    need, gib = store_bytes(count, size), 2**30
    log.info(
        "cache=gpu: %d images at %d px take %.2f GiB of %s (%.1f GiB free of %.1f GiB)",
        count,
        size,
        need / gib,
        where,
        free / gib,
        total / gib,
    )
    if not store_fits(count, size, free):
        raise DataError(
            f"cache=gpu: {count} images at imgsz={size} need {need / gib:.1f} GiB of GPU "
            f"memory, more than {STORE_SHARE:.0%} of the {free / gib:.1f} GiB free on {where}; "
            "use cache=encoded (the files' bytes in host memory, decoded per batch on the "
            "GPU), cache=stream (read per batch, for a set larger than host memory too) or a "
            "smaller imgsz"
        )


@dataclass(frozen=True)
class Filled:
    """A filled store, the samples it holds (those that decoded), and how they decoded."""

    store: ImageStore
    samples: list[Sample]
    on_gpu: int
    on_cpu: int
    left_out: list[str]


def fill_store(
    samples: Sequence[Sample],
    size: int,
    device: torch.device,
    *,
    threads: int = 8,
    memory: tuple[int, int] | None = None,
    nvjpeg_from: int = NVJPEG_FROM,
) -> Filled:
    """Decode ``samples`` into a store on ``device`` (module docstring). ``memory``: the
    device's free and total bytes to check the store against, where the caller read them
    before memory that is about to be given back was taken (the device's now by default).
    nvJPEG decodes the JPEGs where there are at least ``nvjpeg_from`` of them
    (:data:`NVJPEG_FROM`), the CPU threads otherwise."""
    if device.type == "cuda":
        free, total = memory or torch.cuda.mem_get_info(device)
        check_fits(len(samples), size, free, total, str(device))
    pixels = torch.zeros(len(samples), size, size, 3, dtype=torch.uint8, device=device)
    shapes = [resized_shape(s, size) for s in samples]
    decoded = [False] * len(samples)
    on_gpu = 0
    jpegs = for_nvjpeg(samples) if device.type == "cuda" else []
    nvjpeg = len(jpegs) >= max(nvjpeg_from, 1)
    if nvjpeg and gpu_decoder() is None:
        log.info(
            "cache=gpu: torchvision is not installed, so every image is decoded on the CPU; "
            "pip install torchvision (the build matching torch %s) to decode JPEGs with nvJPEG",
            torch.__version__,
        )
    elif nvjpeg:
        on_gpu = _decode_jpegs_on_gpu(samples, jpegs, pixels, shapes, decoded, threads)
    left_out: list[str] = []
    on_cpu = 0
    rest = [i for i, done in enumerate(decoded) if not done]
    with ThreadPoolExecutor(threads) as pool:
        for i, image in zip(rest, pool.map(_cpu_decode, (samples[i] for i in rest)), strict=True):
            if image is None:
                left_out.append(str(samples[i].image))
                continue
            place(pixels, i, torch.from_numpy(image).to(device).permute(2, 0, 1), shapes[i])
            decoded[i] = True
            on_cpu += 1
    kept = [i for i, done in enumerate(decoded) if done]
    if not kept:
        raise DataError(
            f"cache=gpu: none of the {len(samples)} images could be decoded (first: "
            f"{samples[0].image if samples else 'none given'}); run `falconet data check` on "
            "the dataset"
        )
    held = list(samples)
    if left_out:
        log.warning(
            "cache=gpu: %d image(s) could not be decoded and are left out of training "
            "(first: %s), their slots holding other images of the store; run `falconet data "
            "check` on the dataset",
            len(left_out),
            left_out[0],
        )
        for k, slot in enumerate(i for i, done in enumerate(decoded) if not done):
            source = kept[k % len(kept)]
            pixels[slot] = pixels[source]
            shapes[slot], held[slot] = shapes[source], samples[source]
    if device.type == "cuda":  # the store is whole for any stream that reads it
        torch.cuda.current_stream(device).synchronize()
    return Filled(ImageStore(pixels, shapes), held, on_gpu, on_cpu, left_out)


def _cpu_decode(sample: Sample) -> np.ndarray | None:
    try:
        return read_image(str(sample.image))
    except OSError:
        return None


def _decode_jpegs_on_gpu(
    samples: Sequence[Sample],
    jpegs: list[int],
    pixels: torch.Tensor,
    shapes: list[tuple[int, int]],
    decoded: list[bool],
    threads: int,
) -> int:
    """nvJPEG for the JPEG files stored upright (``jpegs``, :func:`for_nvjpeg`'s), in
    batches; a batch nvJPEG refuses is retried file by file, and a file it refuses alone, or
    decodes to another shape than the dataset check measured, is left to the CPU decoder. The
    files of the next batch are read while a batch decodes, and those of the first while
    torchvision imports (the import holds the GIL, a file read does not).

    Before each call the host waits for the stream's work so far: torchvision allocates the
    decoded images on the caller's stream but writes them on a stream of its own, without
    first waiting for the caller's, so a block freed by the previous batch's resizes (still
    queued) could be written before they read it."""
    chunks = [jpegs[start : start + DECODE_BATCH] for start in range(0, len(jpegs), DECODE_BATCH)]
    count = 0

    def read_file(i: int) -> bytes | None:
        try:
            return samples[i].image.read_bytes()
        except OSError:  # left to the CPU decoder, which leaves it out with the others
            return None

    stream = torch.cuda.current_stream(pixels.device)
    with ThreadPoolExecutor(threads) as pool:
        reading = [pool.submit(read_file, i) for i in chunks[0]] if chunks else []
        from torchvision.io import ImageReadMode, decode_jpeg

        for k, chunk in enumerate(chunks):
            read = [(i, done.result()) for i, done in zip(chunk, reading, strict=True)]
            reading = (
                [pool.submit(read_file, i) for i in chunks[k + 1]] if k + 1 < len(chunks) else []
            )
            chunk = [i for i, b in read if b]  # an empty or unreadable file: the CPU decoder's
            data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for _, b in read if b]
            if not data:
                continue
            stream.synchronize()
            try:
                images = decode_jpeg(data, mode=ImageReadMode.RGB, device=pixels.device)
            except RuntimeError:
                images = [_one_jpeg(d, pixels.device, stream) for d in data]
            for i, image in zip(chunk, images, strict=True):
                if image is None or tuple(image.shape[1:]) != (samples[i].height, samples[i].width):
                    continue  # refused, or not as the check saw it: the CPU decoder's
                place(pixels, i, image, shapes[i])
                decoded[i] = True
                count += 1
    return count


def for_nvjpeg(samples: Sequence[Sample]) -> list[int]:
    """The indices of the ``samples`` nvJPEG decodes: JPEG files stored upright. nvJPEG does
    not apply an EXIF orientation (torchvision applies it on the CPU only), so a file stored
    turned or mirrored goes to the CPU decoder, which does."""
    return [
        i
        for i, s in enumerate(samples)
        if s.image.suffix.lower() in JPEG_SUFFIXES and not s.exif_oriented
    ]


def _one_jpeg(
    data: torch.Tensor, device: torch.device, stream: torch.cuda.Stream
) -> torch.Tensor | None:
    from torchvision.io import ImageReadMode, decode_jpeg

    stream.synchronize()  # as before a batch (_decode_jpegs_on_gpu)
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return None


def place(pixels: torch.Tensor, index: int, image: torch.Tensor, shape: tuple[int, int]) -> None:
    """``image [3, H, W]`` uint8 resized to ``shape`` into slot ``index`` (top left)."""
    h, w = shape
    if tuple(image.shape[1:]) != (h, w):
        shrink = h * w < image.shape[1] * image.shape[2]
        resized = F.interpolate(
            image[None].float(),
            size=(h, w),
            mode="area" if shrink else "bilinear",
            align_corners=None if shrink else False,
        )
        image = resized[0].round_().clamp_(0, 255).to(torch.uint8)
    pixels[index, :h, :w] = image.permute(1, 2, 0)
