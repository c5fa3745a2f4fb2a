"""The optimizer's state as the static step needs it: made before the first step, checked,
listed.

The update graph reads and writes the optimizer's state, so nothing can be recorded before
that state exists; torch makes it on the optimizer's first step. With fp16 that first step
waits for the gradient scaler's first taken update (the first ones overflow while the scale
comes down from its start), and with gradient accumulation it comes after ``accumulate``
batches, all of them eager until then. :func:`make_state` makes it up front instead, as torch
would; the state stays the optimizer's own (``optimizer.state[p]``), so eager steps,
checkpoints and resume read it as they always do.
"""

from __future__ import annotations

import torch

# what the static update reads of each parameter's state
_KEYS = {True: ("exp_avg", "exp_avg_sq"), False: ("momentum_buffer",)}


def make_state(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], *, adamw: bool
) -> None:
    """Give ``optimizer`` its state for ``params`` before its first step: SGD's momentum
    buffers as zeros, AdamW's state as torch itself makes it; a state already there (a
    resumed run's) is kept.

    SGD makes a buffer as a copy of the gradient; a zero buffer gives the same numbers:
    torch's step with a buffer is ``b = momentum x b + (1 - dampening) x g``, and with
    ``dampening`` 0 that is ``0 + g = g``, exactly (at most a zero's sign differs). AdamW
    (without ``amsgrad``, ``fused`` or ``capturable``) starts from exactly what this makes:
    a host step count of 0 in torch's scalar dtype and zero moments. torch's own step takes
    these as it takes its own, so eager batches, checkpoints and resume are unchanged. In the
    other cases nothing is made, and the state comes from the first eager step."""
    groups = optimizer.param_groups
    if adamw:
        if any(g.get(k) for g in groups for k in ("amsgrad", "fused", "capturable")):
            return
    elif any(g["dampening"] for g in groups):
        return
    # torch.optim's scalar dtype for the host step count (its _get_scalar_dtype)
    step_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    stepped = {id(p) for p in params}
    for group in groups:  # in torch's order, as its own step fills state
        for param in group["params"]:
            state = optimizer.state[param]
            if id(param) not in stepped:
                continue
            if adamw and not state:
                state["step"] = torch.tensor(0.0, dtype=step_dtype)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            elif not adamw and state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(param)


def has_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], *, adamw: bool) -> bool:
    """Whether ``optimizer`` has the state of every one of ``params`` (:func:`make_state`, or
    its first eager step: AdamW with ``amsgrad``, SGD with ``dampening``)."""
    state = optimizer.state
    key = _KEYS[adamw][0]
    return all(state.get(p, {}).get(key) is not None for p in params)


def state_tensors(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], *, adamw: bool
) -> list[torch.Tensor]:
    """The device state of ``params`` that the static update writes, parameter by parameter."""
    state = optimizer.state
    return [state[p][k] for p in params for k in _KEYS[adamw]]
