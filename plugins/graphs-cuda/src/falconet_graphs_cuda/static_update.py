"""The optimizer arithmetic of the static step, on device tensors a CUDA graph can replay.

:class:`Group` holds one parameter group's constants and the device scalars its update reads
(filled on the host before each replay: the schedule moves them); :func:`unsupported` says
which optimizers it can step, from the optimizer itself; :func:`sgd_update` and
:func:`adamw_update` are ``torch.optim.SGD``'s and ``torch.optim.AdamW``'s steps written with
those tensors in place of Python numbers; :func:`packed_like` makes the static buffers (the
gradients, the EMA's weight) as views of one flat tensor, so one kernel acts on all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Group:
    """One optimizer parameter group: indices into the step's parameters, its constants and
    the device tensors its update reads.

    SGD: ``b`` is the momentum, ``c`` minus the learning rate. AdamW: ``a`` is ``1 - lr x
    weight_decay`` (the decoupled decay), ``b`` is ``1 - beta1``, ``c`` is the square root of
    the second moment's bias correction and ``d`` is ``-lr / (first moment's bias
    correction)``, all computed on the host from the step count the host keeps.
    """

    indices: list[int]
    weight_decay: float
    nesterov: bool
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor


def unsupported(optimizer: torch.optim.Optimizer | None, *, scaled: bool) -> str | None:
    """Why the static update cannot take ``optimizer``'s steps (``scaled``: with a loss
    scaler, which skips a step after an overflow), or ``None``: SGD with momentum, with or
    without the scaler, and AdamW without it. The whole-step backend declines with this
    reason and the static step refuses what it names, so both decide by the same rule."""
    if isinstance(optimizer, torch.optim.AdamW):
        if scaled:
            return (
                "AdamW with a loss scaler (fp16): a step the scaler skips must not advance "
                "AdamW's step count, which lives on the host (use sgd, or bf16)"
            )
        return None
    if isinstance(optimizer, torch.optim.SGD):
        if not optimizer.defaults.get("momentum"):
            return "SGD without momentum is not captured (the update reads momentum buffers)"
        return None
    kind = "no optimizer" if optimizer is None else type(optimizer).__name__
    return f"{kind}: only SGD and AdamW steps are captured"


def packed_like(
    params: list[torch.Tensor], what: str = "the trained parameters"
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Zeroed buffers shaped and strided like ``params`` (channels_last stays channels_last),
    as views of one flat tensor, so that one kernel can act on all of them."""
    dtypes = {p.dtype for p in params}
    dense = all(
        p.is_contiguous() or p.is_contiguous(memory_format=torch.channels_last) for p in params
    )
    if len(dtypes) != 1 or not dense:
        raise TypeError(
            f"graph=whole-step needs {what} in one dtype and densely laid out "
            f"(got {sorted(map(str, dtypes))}, dense: {dense}); keep the model in one float "
            "dtype (precision comes from amp_dtype), or train with graph=cuda-graph"
        )
    flat = torch.zeros(
        sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
    )
    views, offset = [], 0
    for p in params:
        views.append(flat.as_strided(p.shape, p.stride(), offset))
        offset += p.numel()
    return flat, views


def sgd_update(
    group: Group,
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    buffers: list[torch.Tensor],
    ones: list[torch.Tensor],
) -> None:
    """``torch.optim.SGD`` after its weight decay (already in ``grads``): momentum (Nesterov
    or not), step; ``ones`` are ones shaped like each parameter.

    torch adds ``alpha x buffer`` with ``alpha`` a Python number, in one fused multiply-add
    (one rounding). A device-tensor ``alpha`` has no such overload, so the tensor is broadcast
    to each parameter's shape (``ones x alpha`` is exact) and the step is ``addcmul``, which
    rounds once as well: bit for bit torch's result."""
    torch._foreach_mul_(buffers, group.b)
    torch._foreach_add_(buffers, grads)
    if group.nesterov:
        steps = torch._foreach_addcmul(grads, buffers, torch._foreach_mul(ones, group.b))
    else:
        steps = buffers
    torch._foreach_addcmul_(params, steps, torch._foreach_mul(ones, group.c))


def adamw_update(
    group: Group,
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    first: list[torch.Tensor],
    second: list[torch.Tensor],
    beta2: float,
    eps: float,
) -> None:
    """``torch.optim.AdamW`` (no amsgrad): decoupled decay, moments ``first`` and ``second``,
    bias-corrected step. ``beta2`` and ``eps`` are constants of the run (the schedule moves
    only ``beta1``, in ``group.b``)."""
    if group.weight_decay:
        torch._foreach_mul_(params, group.a)
    torch._foreach_lerp_(first, grads, [group.b] * len(first))
    torch._foreach_mul_(second, beta2)
    torch._foreach_addcmul_(second, grads, grads, 1 - beta2)
    denominators = torch._foreach_sqrt(second)
    torch._foreach_div_(denominators, group.c)
    torch._foreach_add_(denominators, eps)
    torch._foreach_div_(denominators, group.d)  # d < 0: the step's sign and size
    torch._foreach_addcdiv_(params, first, denominators)
