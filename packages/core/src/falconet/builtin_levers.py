"""The levers of the core's own keys, registered by the built-in plugin (``register_levers``).

``workers`` and ``cache`` for a step that waits for data, ``graph=compile`` and a larger
``batch`` for one that waits for the host, ``amp_dtype`` for a busy GPU, a smaller ``batch``
for a full one. A plugin's keys are its own levers (:mod:`falconet.levers`). The priorities
sit between those of the plugins that ship with falconet; docs/plugins.md lists them all.
"""

from __future__ import annotations

from falconet.levers import LeverContext, Suggestion, lever

ON_GPU_CACHES = ("gpu", "encoded", "stream")
"""``cache`` values that augment on the GPU: no loader workers there to add."""

TENSOR_CORE_SHARE = 0.50
"""Below this share of kernel time on Tensor Cores, a compute-bound eager step compiles."""


@lever("workers", "more loader workers", ("dataloader",), 20)
def more_workers(c: LeverContext) -> Suggestion | None:
    if c.workers >= c.cpu_count or c.cache in ON_GPU_CACHES:
        return None
    more = min(c.cpu_count, max(2 * c.workers, 1))
    return Suggestion(
        "workers", more, f"{c.workers} loader workers; this machine has {c.cpu_count} CPUs"
    )


@lever(
    "cache",
    "decode once: in GPU memory, as bytes decoded on the GPU, or in RAM",
    ("dataloader",),
    15,
)
def cache(c: LeverContext) -> Suggestion | None:
    if c.cache in ON_GPU_CACHES:
        return None
    if c.device == "cuda" and c.gpu_store_fits is not False:
        why = (
            "decode once into GPU memory and augment each batch on the GPU: the CPU workers "
            "leave the step's path (docs/gpu-data.md, its memory cost)"
        )
        return Suggestion("cache", "gpu", why)
    if c.device == "cuda":
        why = (
            "the images do not fit in half the GPU's free memory decoded: hold the files' "
            "bytes in host memory and decode each batch on the GPU (nvJPEG), augmented there; "
            "cache=stream reads them per batch (docs/data.md)"
        )
        return Suggestion("cache", "encoded", why)
    if c.cache == "none":
        return Suggestion("cache", "ram", "decode each image once instead of every epoch")
    return None


@lever(
    "compile", "graph=compile: Inductor fuses elementwise kernels", ("host-launch", "compute"), 10
)
def compile_graph(c: LeverContext) -> Suggestion | None:
    if c.graph != "eager":
        return None
    if c.verdict == "host-launch":
        return Suggestion("graph", "compile", "fuse elementwise kernels: fewer launches")
    share = c.evidence.get("tensor_core_share")
    low = share is not None and share < TENSOR_CORE_SHARE
    if c.device == "cpu" or c.precision == "fp32" or not low:
        return None  # fp32 moves to bf16 first (amp-bf16)
    why = f"only {share:.0%} of kernel time is on Tensor Cores; fuse the rest"
    return Suggestion("graph", "compile", why)


@lever("amp-fp16", "amp_dtype=fp16 from bf16: BatchNorm on cuDNN", ("compute",), 5)
def amp_fp16(c: LeverContext) -> Suggestion | None:
    if c.device == "cpu" or c.precision != "bf16" or "fp16" not in c.precision_backends:
        return None
    why = (
        "BatchNorm runs on cuDNN in fp16 and on slower native kernels in bf16 "
        "(tools/bench_batchnorm.py times the two; the overfit check trained fp16 to the same "
        "mAP: docs/performance.md, 'amp_dtype'); fp16 adds a gradient scaler, which a graph "
        "backend that records the optimizer step may carry with some optimizers only"
    )
    return Suggestion("amp_dtype", "fp16", why)


@lever("batch-up", "a larger batch: more work per launch", ("host-launch",), 0)
def batch_up(c: LeverContext) -> Suggestion | None:
    peak = c.evidence.get("peak_reserved_fraction")
    if peak is not None and peak >= 0.5:
        return None
    why = "more work per launch; nbs keeps the optimizer's nominal batch"
    return Suggestion("batch", 2 * c.batch, why)


@lever("batch-down", "a smaller batch: less activation memory", ("memory-pressure",), 0)
def batch_down(c: LeverContext) -> Suggestion | None:
    if c.batch <= 1:
        return None
    why = "halve activation memory; nbs keeps the optimizer's nominal batch"
    return Suggestion("batch", max(c.batch // 2, 1), why)


@lever("amp-bf16", "amp_dtype=bf16 from fp32", ("compute", "memory-pressure"), -10)
def amp_bf16(c: LeverContext) -> Suggestion | None:
    if c.precision != "fp32" or c.device == "cpu":
        return None
    if c.verdict == "memory-pressure":
        return Suggestion("amp_dtype", "bf16", "half-size activations")
    return Suggestion("amp_dtype", "bf16", "Tensor Cores and half the memory traffic")


LEVERS = (more_workers, cache, compile_graph, amp_fp16, batch_up, batch_down, amp_bf16)
