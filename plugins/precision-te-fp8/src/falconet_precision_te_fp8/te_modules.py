"""What needs Transformer Engine itself: the recipes, the FP8 linear layer, the product timer.
Imported only once a run has chosen ``amp_dtype=fp8`` (Transformer Engine takes seconds to
import)."""

from __future__ import annotations

import importlib
import logging
import statistics

import torch
from torch import nn

from falconet_precision_te_fp8.gating import Product, Timing
from falconet_precision_te_fp8.te_import import import_te

te = import_te()
te_recipe = importlib.import_module("transformer_engine.common.recipe")

log = logging.getLogger("falconet.train")


def build_recipe(name: str):
    """Transformer Engine's recipe object for ``fp8_recipe=name``."""
    if name == "current":
        return te_recipe.Float8CurrentScaling()
    if name == "delayed":
        return te_recipe.DelayedScaling(amax_history_len=16, amax_compute_algo="max")
    if name == "block":
        return te_recipe.Float8BlockScaling()
    if name == "mxfp8":
        return te_recipe.MXFP8BlockScaling()
    return te_recipe.NVFP4BlockScaling()


class Fp8Linear(te.Linear):
    """Transformer Engine's ``Linear`` over the parameters of the ``nn.Linear`` it replaces
    (the same tensors: the optimizer, the EMA and the checkpoints keep seeing them), with the
    plain layer's state dict: Transformer Engine's extra state (its scaling metadata) is left
    out, so ``last.pt`` and ``best.pt`` load into the family's network without Transformer
    Engine. What resume loses by that: with ``delayed``, the amax history restarts; the other
    recipes keep none."""

    get_extra_state = nn.Module.get_extra_state
    set_extra_state = nn.Module.set_extra_state

    @classmethod
    def replacing(cls, linear: nn.Linear) -> Fp8Linear:
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            params_dtype=linear.weight.dtype,
            device=linear.weight.device,
        )
        layer.weight = linear.weight
        if linear.bias is not None:
            layer.bias = linear.bias
        return layer

    def forward(self, inp: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """``nn.Linear``'s contract, an output a family may modify in place (a residual
        ``+=``): Transformer Engine reshapes its 2-D product back to the input's shape inside
        its autograd Function, and autograd forbids modifying in place a view made there
        (detr-n with every layer converted failed so). The input goes in flat and the output
        is shaped back here, outside the Function; a view it still returns is copied."""
        shape = inp.shape
        out = super().forward(inp.reshape(-1, shape[-1]), *args, **kwargs)
        if out._is_view():
            out = out.clone()
        return out.view(*shape[:-1], out.shape[-1])


def autocast(recipe, group=None):
    """Transformer Engine's FP8 region (amax reduced over ``group`` in a distributed run)."""
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe, fp8_group=group)


def time_product(
    product: Product, recipe, replayed: bool = True, repeats: int = 7, passes: int = 20
) -> Timing:
    """Forward + backward time of one product in bf16 (``nn.Linear`` under autocast) and in FP8
    (:class:`Fp8Linear` under :func:`autocast`), on the current GPU: the median over ``repeats``
    of ``passes`` passes back to back.

    ``replayed``: the passes are replays of one pass recorded in a CUDA graph, so the time is
    the kernels' alone, as a step under a capturing graph backend (``cuda-graph``,
    ``whole-step``) pays it; Transformer Engine's module launches several times the host work
    of ``nn.Linear``, which a replay does not repeat. Otherwise (an eager or compiled step)
    each pass is launched, its host time included. A pass that cannot be recorded is timed
    as launched, and the timing says so."""
    device = torch.device("cuda", torch.cuda.current_device())
    linear = nn.Linear(product.in_features, product.out_features, device=device)
    fp8 = Fp8Linear.replacing(nn.Linear(product.in_features, product.out_features, device=device))
    x = torch.randn(product.rows, product.in_features, device=device, requires_grad=True)

    def bf16_pass() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = linear(x)
        out.float().sum().backward()

    def fp8_pass() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16), autocast(recipe):
            out = fp8(x)
        out.float().sum().backward()

    bf16_ms, bf16_replayed = _median_ms(bf16_pass, replayed, repeats, passes)
    fp8_ms, fp8_replayed = _median_ms(fp8_pass, replayed, repeats, passes)
    return Timing(bf16_ms=bf16_ms, fp8_ms=fp8_ms, replayed=bf16_replayed and fp8_replayed)


def _median_ms(run, replayed: bool, repeats: int, passes: int) -> tuple[float, bool]:
    """Median milliseconds of one pass of ``run``, and whether it was timed as graph replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as capture wants
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    launch = run
    if replayed:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                run()
            launch = graph.replay
        except RuntimeError as exc:  # Transformer Engine's pass not capturable here
            log.warning("fp8: timing the products as launched (no capture: %s)", exc)
            torch.cuda.synchronize()
            replayed = False
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(passes):
            launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / passes)
    return statistics.median(times), replayed
