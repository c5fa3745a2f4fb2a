"""What needs Transformer Engine itself: the recipes, the FP8 linear layer, the product timer.
Imported only once a run has chosen ``amp_dtype=fp8`` (Transformer Engine takes seconds to
import)."""

from __future__ import annotations

import statistics

import torch
import transformer_engine.pytorch as te
from torch import nn
from transformer_engine.common import recipe as te_recipe

from falconet_precision_te_fp8.gating import Product, Timing


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


def autocast(recipe, group=None):
    """Transformer Engine's FP8 region (amax reduced over ``group`` in a distributed run)."""
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe, fp8_group=group)


def time_product(product: Product, recipe, warmup: int = 5, repeats: int = 20) -> Timing:
    """Median forward + backward time of one product in bf16 (``nn.Linear`` under autocast)
    and in FP8 (:class:`Fp8Linear` under :func:`autocast`), on the current GPU."""
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

    def median_ms(run) -> float:
        for _ in range(warmup):
            run()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    return Timing(bf16_ms=median_ms(bf16_pass), fp8_ms=median_ms(fp8_pass))
