"""The training step as two functions of static tensors, so that each can be one CUDA graph.

``micro(images, targets)`` is a batch's forward, loss and backward: the gradient of
``loss x loss_gain`` (the batch size, as the eager step scales it) is added to static gradient
buffers, which are the parameters' ``.grad`` while the whole step is in use. Under autocast it
makes the convolutions' low-precision weights itself, all in one kernel
(:meth:`StaticStep._make_casts`), and advances BatchNorm's batch counters in one kernel too.
On a GPU, with the network not compiled, its convolutions' weight gradients run on a second
stream (``wgrad_stream``, :mod:`falconet_graphs_cuda.side_weight_grads`), joined before the
gradients are read.
``update()`` is the optimizer step: clipping, SGD with momentum (Nesterov or not, per-group
weight decay) or AdamW, the EMA update and zeroing the gradients. Everything a step changes
on the host side lives in device tensors that are filled before each call: each group's
learning rate and momentum or betas (the warm-up ramps both), AdamW's bias corrections, and
the EMA's weight. The optimizer's state is the eager step's own (``optimizer.state[p]``; AdamW's
step counts stay host tensors, advanced on the host), so checkpoints and resume are unchanged.

The arithmetic is ``torch.optim.SGD``'s and ``torch.optim.AdamW``'s. SGD's is bit for bit
torch's (its fused multiply-adds by a Python number become ``addcmul`` by the tensor broadcast
to the parameter's shape, which rounds once too); AdamW's multiplies its step size in as a
tensor where torch fuses it in as a Python number, so it agrees to rounding, not bit for bit.
A replay agrees with this module run eagerly bit for bit.

With fp16's gradient scaler (SGD only), the scaler's work moves to the device as well: the
loss is scaled with the scaler's own ``scale``, the update unscales the gradients and finds
overflows with the kernel ``GradScaler.unscale_`` uses, then updates the scale with the kernel
``GradScaler.update`` uses. Eager skips ``optimizer.step()`` after an overflow, reading the
flag on the host, which a graph cannot; here an overflowed step is made a no-op instead
(:meth:`StaticStep._neutralise_overflow`): the decayed gradients, views of one flat buffer,
become zeros in one ``torch.where``, and the step's momentum and learning rate become 1 and
0, so ``b = 1 x b + 0`` and ``p = p + 0 x step`` leave the weights and momentum as they were,
exactly. AdamW is not offered with the scaler: a skipped step must not advance its step
count, which the host keeps.

Run eagerly on the CPU, these functions are what the CPU tests compare with the eager step's own
step; :mod:`falconet_graphs_cuda.whole_step` records them as CUDA graphs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.func import functional_call

from falconet.precision import autocast_dtype
from falconet_graphs_cuda.optimizer_state import has_state, make_state, state_tensors
from falconet_graphs_cuda.side_weight_grads import SideWeightGrads
from falconet_graphs_cuda.static_update import (
    Group,
    adamw_update,
    packed_like,
    sgd_update,
    unsupported,
)
from falconet_graphs_cuda.step_modes import COMPILED_NETWORK, fused_bn_silu, side_stream_applies

if TYPE_CHECKING:
    from falconet.contract import StepParts
    from falconet_graphs_cuda.keys import GraphsCudaKeys

log = logging.getLogger("falconet.train")


class StaticStep:
    """Forward + loss + backward and the optimizer step of ``parts``, on static tensors;
    ``keys`` are the plugin's own (``fuse``, ``wgrad_stream``, ``bn_silu``)."""

    def __init__(self, parts: StepParts, keys: GraphsCudaKeys) -> None:
        self.parts = parts
        self.keys = keys
        self.network = parts.model
        named = [(n, p) for n, p in self.network.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.flat_grads, self.grads = packed_like(self.params)
        self.buffers = list(self.network.buffers())
        self._make_casts()
        # BatchNorm's batch counters, advanced in one kernel by micro (see there)
        self.counted = [
            (f"{name}.num_batches_tracked", m)
            for name, m in self.network.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
            and m.momentum is not None
            and m.num_batches_tracked is not None
        ]
        # the scalars in the parameters' dtype, as torch.optim's Python floats become
        scalar = {"device": parts.device, "dtype": self.params[0].dtype}
        index = {id(p): i for i, p in enumerate(self.params)}
        scaler = parts.scaler
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        if reason := unsupported(parts.optimizer, scaled=self.scaler is not None):
            raise TypeError(f"no static update: {reason}")
        self.adamw = isinstance(parts.optimizer, torch.optim.AdamW)
        self.groups = [
            Group(
                [index[id(p)] for p in group["params"]],
                float(group["weight_decay"]),
                bool(group.get("nesterov", False)),
                *(torch.zeros((), **scalar) for _ in range(4)),
            )
            for group in parts.optimizer.param_groups
            if group["params"]
        ]
        self.ema_weight = torch.zeros((), **scalar)
        self.flat_ema_weight: torch.Tensor | None = None  # made by _ema, once the EMA is bound
        self.ema_weights: list[torch.Tensor] | None = None
        # GradScaler.unscale_'s overflow flag, and what an overflowed step's scalars become
        self.found_inf = torch.zeros((), device=parts.device, dtype=torch.float32)
        self.zero, self.one = torch.zeros((), **scalar), torch.ones((), **scalar)
        # SGD's step multiplies by -lr broadcast to each parameter's shape (see _sgd)
        self.ones = [] if self.adamw else [torch.ones_like(p) for p in self.params]
        # fuse: Inductor's default mode (fused kernels, no CUDA graphs of its own: the step's
        # recorder captures the compiled kernels with everything else)
        fuse = keys.fuse
        self.forward = self._eager_forward
        if fuse in COMPILED_NETWORK:
            self.forward = torch.compile(self._eager_forward, dynamic=False)
        self.side: SideWeightGrads | None = None
        if side_stream_applies(keys, parts.device):
            self.side = SideWeightGrads(torch.cuda.Stream(parts.device))
        self.bn_silu = fused_bn_silu(keys, parts.device)
        if fuse != "none":
            log.warning(
                "fuse=%s: the captured step runs Inductor's kernels, which are not bit for bit "
                "eager, and their accuracy depends on the precision; this run is %s: check "
                "your accuracy with the overfit check before keeping it (docs/performance.md, "
                "'How a lever is checked')",
                fuse,
                parts.precision.name,
            )
        self.loss_fn = parts.loss
        self.calls = _Calls(self.network)
        if fuse in ("inductor-loss", "inductor-all"):
            # the assigner's [B, M, A] and the loss's [B, A, C] elementwise chains, each a
            # full pass over memory per op when eager
            self.loss_fn = torch.compile(parts.loss, dynamic=False)

    def _make_casts(self) -> None:
        """Under autocast, buffers for the weights autocast would cast: every parameter of a
        plain ``nn.Conv*`` or ``nn.Linear`` (their ops are on autocast's lower-precision list;
        a subclass may override ``forward`` and is left alone). :meth:`micro` casts them all
        with one multi-tensor copy and passes the copies as the leaves, where autocast cast
        each one in a kernel of its own in the forward and again in the backward (the cast's
        gradient). Autocast leaves a tensor already in its dtype as it is, and both casts are
        exact conversions, so the step's numbers do not change."""
        dtype = autocast_dtype(self.parts.precision, self.parts.device)
        kinds = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
        cast = {id(p) for m in self.network.modules() if type(m) in kinds for p in m.parameters()}
        self.cast_indices = [
            i for i, p in enumerate(self.params) if dtype is not None and id(p) in cast
        ]
        self.cast_weights = [  # the leaves the forward reads
            torch.empty_like(self.params[i], dtype=dtype) for i in self.cast_indices
        ]
        self.cast_grads = [torch.empty_like(self.params[i]) for i in self.cast_indices]

    def _eager_forward(self, leaves: dict[str, torch.Tensor | None], images: torch.Tensor) -> Any:
        return functional_call(self.network, leaves, (images,))

    def _loss(self, leaves: dict[str, torch.Tensor], outputs: Any, targets: Any) -> Any:
        """The loss, with the network's parameters being the leaves while it runs. A loss may
        run part of the network itself (DETR's denoising pass runs the decoder on the
        denoising queries): it then reads the leaves, as the forward did, and its gradients
        reach them (on the parameters they would be lost, and a recording would read
        tensors made outside it)."""
        named = {f"network.{name}": leaf for name, leaf in leaves.items()}
        return functional_call(self.calls, named, (self.loss_fn, outputs, targets))

    # ------------------------------------------------------------------------ host to device
    def make_state(self) -> None:
        """Give the optimizer its state before its first step (:func:`make_state`)."""
        make_state(self.parts.optimizer, self.params, adamw=self.adamw)

    def ready(self) -> bool:
        """Whether the optimizer has its state (:func:`has_state`)."""
        return has_state(self.parts.optimizer, self.params, adamw=self.adamw)

    def state_tensors(self) -> list[torch.Tensor]:
        """The optimizer's device state the update writes (for a recorder to save and
        restore around its warm-up)."""
        return state_tensors(self.parts.optimizer, self.params, adamw=self.adamw)

    def bind(self) -> None:
        """Make the static buffers the parameters' ``.grad``, keeping any gradient already
        accumulated; a ``None`` gradient (the eager step's optimizer update set it so)
        becomes zeros."""
        for param, static in zip(self.params, self.grads, strict=True):
            grad = param.grad
            if grad is static:
                continue
            if grad is None:
                static.zero_()
            else:
                static.copy_(grad)
            param.grad = static

    def fill_scalars(self, *, update: bool) -> None:
        """Copy this step's learning rates and momenta (the schedule has just set them on the
        optimizer) and the EMA weight into their device tensors."""
        if not update:
            return
        state = self.parts.optimizer.state
        for group, source in zip(self.groups, self._nonempty_groups(), strict=True):
            lr = source["lr"]
            if not self.adamw:
                group.b.fill_(source["momentum"])
                group.c.fill_(-lr)
                continue
            beta1, beta2 = source["betas"]
            step = float(state[self.params[group.indices[0]]]["step"]) + 1  # a host tensor
            group.a.fill_(1 - lr * group.weight_decay)
            group.b.fill_(1 - beta1)
            group.c.fill_((1 - beta2**step) ** 0.5)
            group.d.fill_(-lr / (1 - beta1**step))
        ema = self.parts.ema
        if ema is not None:
            self.ema_weight.fill_(ema.weight(ema.updates + 1))

    def _nonempty_groups(self) -> list[dict[str, Any]]:
        return [g for g in self.parts.optimizer.param_groups if g["params"]]

    # ------------------------------------------------------------------------ the functions
    def micro(
        self, images: torch.Tensor, targets: dict[str, torch.Tensor], *, accumulate: bool = True
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward, loss and backward of one batch; adds ``d(loss x batch)/dparams`` to the
        static gradients unless ``accumulate`` is false (a warm-up pass)."""
        step = self.parts
        pairs = zip(self.names, self.params, strict=True)
        leaves = {n: p.detach().requires_grad_() for n, p in pairs}
        if self.cast_indices:  # autocast's casts of the weights, in one kernel (_make_casts)
            torch._foreach_copy_(self.cast_weights, [self.params[i] for i in self.cast_indices])
            for i, weight in zip(self.cast_indices, self.cast_weights, strict=True):
                leaves[self.names[i]] = weight.detach().requires_grad_()
        # each training BatchNorm adds 1 to its batch counter, a kernel of its own; with a
        # momentum the counter changes no number, so the forward gets None for it (BatchNorm
        # then skips the add) and all counters advance in one kernel here, to the same counts
        counters = [m.num_batches_tracked for _, m in self.counted if m.training]
        uncounted = {name: None for name, m in self.counted if m.training}
        with contextlib.ExitStack() as modes:
            modes.enter_context(step.precision.autocast(step.device))
            for mode in (self.side, self.bn_silu):
                if mode is not None:
                    modes.enter_context(mode)
            outputs = self.forward(leaves | uncounted, images)
        if counters:
            torch._foreach_add_(counters, 1)
        loss, parts = self._loss(leaves, outputs, targets)
        scaled = loss * step.loss_gain
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        grads = list(torch.autograd.grad(scaled, list(leaves.values()), allow_unused=True))
        if self.side is not None:  # the weight gradients are done before anything reads them
            self.side.join()
        made = zip(self.cast_indices, self.cast_grads, strict=True)
        cast = [(i, g) for i, g in made if grads[i] is not None]
        if cast:  # back to the parameters' dtype, in one kernel: the casts' gradients
            torch._foreach_copy_([g for _, g in cast], [grads[i] for i, _ in cast])
            for i, g in cast:
                grads[i] = g
        if accumulate:
            used = [(s, g) for s, g in zip(self.grads, grads, strict=True) if g is not None]
            torch._foreach_add_([s for s, _ in used], [g for _, g in used])
        return loss.detach(), parts

    @torch.no_grad()
    def update(self) -> None:
        """Clip, SGD step, EMA update, zero the gradients: the eager step's optimizer phase
        (with the scaler: unscale first, undo an overflowed step, update the scale). Each part
        is a method of its own, which ``tools/bench_update.py`` times on its own.

        In a distributed run it begins by averaging the gradients over the ranks (one
        all-reduce of the flat buffer, where DDP reduces bucket by bucket during the
        backward) and gives every rank rank 0's buffers before the EMA, as the eager step
        does: both are collectives a CUDA graph records with the rest."""
        collectives = self.parts.collectives
        if collectives is not None:
            collectives.average_gradients_(self.flat_grads)
        if self.scaler is not None:
            self._unscale()
        self._clip()
        self._step()
        if self.scaler is not None:
            self._update_scale()
        if collectives is not None and self.buffers:
            collectives.broadcast_(self.buffers)
        self._ema()
        self.flat_grads.zero_()

    def _clip(self) -> None:
        if self.parts.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.parts.clip_grad, foreach=True)

    def _step(self) -> None:
        """The optimizer's step, group by group. SGD's weight decay goes into the static
        gradients first (in place: the same ``add`` as torch's), so that with the scaler an
        overflowed step can be made a no-op before any state changes."""
        groups = list(zip(self.groups, self._nonempty_groups(), strict=True))
        if not self.adamw:
            for group, _ in groups:
                if group.weight_decay:
                    params, grads = self._members(group)
                    torch._foreach_add_(grads, params, alpha=group.weight_decay)
            if self.scaler is not None:
                self._neutralise_overflow()
        update = self._adamw if self.adamw else self._sgd
        for group, source in groups:
            update(group, source, *self._members(group))

    def _members(self, group: Group) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return [self.params[i] for i in group.indices], [self.grads[i] for i in group.indices]

    def _neutralise_overflow(self) -> None:
        """After an overflow, make SGD's step a no-op: gradients 0, momentum 1, learning rate
        0 (``b x 1 + 0 = b`` and ``p + step x 0 = p``, exactly: the step is finite once the
        gradients are zeros). Without one, every value stays as it was: ``where`` picks it
        unchanged. Three kernels per group and one for all gradients (their flat buffer), where
        copying the weights and momentum and putting them back took two per tensor."""
        overflowed = self.found_inf > 0
        torch.where(overflowed, self.zero, self.flat_grads, out=self.flat_grads)
        for group in self.groups:
            torch.where(overflowed, self.one, group.b, out=group.b)
            torch.where(overflowed, self.zero, group.c, out=group.c)

    def _ema(self) -> None:
        """``ModelEMA.update``: its ``lerp`` by the EMA weight, which is a device tensor here.
        ``_foreach_lerp_`` takes no single tensor weight, and a list of the 0-dim tensor made
        it one kernel per tensor (docs/lab/2026-11-step-time.md, "The update and the weights'
        casts"); the weight copied into a buffer shaped like the EMA's tensors (one kernel)
        lets the lerp run as a few multi-tensor kernels, with the same formula and the same
        float32 weight."""
        floats, others = self.ema_tensors()
        if floats[0]:
            if self.ema_weights is None:
                self.flat_ema_weight, self.ema_weights = packed_like(
                    floats[0], "the EMA's float tensors"
                )
            self.flat_ema_weight.fill_(self.ema_weight)
            torch._foreach_lerp_(*floats, self.ema_weights)
        if others[0]:
            torch._foreach_copy_(*others)

    def _unscale(self) -> None:
        """``GradScaler.unscale_``: the gradients times ``1 / scale``, and ``found_inf`` set
        where one is not finite (the same kernel, :meth:`LossScaler.unscale_grads_`)."""
        self.scaler.unscale_grads_(self.grads, self.found_inf)

    def _update_scale(self) -> None:
        """``GradScaler.update``: back off after an overflow, grow after enough steps without."""
        self.scaler.update_from_(self.found_inf)

    def scaler_tensors(self) -> list[torch.Tensor]:
        """The scaler's device state the update writes (for a recorder to save and restore
        around its warm-up); empty without a scaler."""
        if self.scaler is None:
            return []
        return self.scaler.device_state(self.parts.device)

    def _sgd(self, group: Group, source: dict[str, Any], params: list, grads: list) -> None:
        """``torch.optim.SGD`` after its weight decay (:meth:`_step`), :func:`sgd_update`."""
        buffers = [self.parts.optimizer.state[p]["momentum_buffer"] for p in params]
        ones = [self.ones[i] for i in group.indices]  # the weight decay is in grads (_step)
        sgd_update(group, params, grads, buffers, ones)

    def _adamw(self, group: Group, source: dict[str, Any], params: list, grads: list) -> None:
        """``torch.optim.AdamW`` (no amsgrad), :func:`adamw_update`."""
        state = self.parts.optimizer.state
        first = [state[p]["exp_avg"] for p in params]
        second = [state[p]["exp_avg_sq"] for p in params]
        adamw_update(group, params, grads, first, second, source["betas"][1], source["eps"])

    def ema_tensors(self) -> tuple[tuple[list, list], tuple[list, list]]:
        """``(ema floats, model floats), (ema others, model others)``: the pairs the EMA
        update reads (empty without EMA)."""
        ema = self.parts.ema
        if ema is None:
            return ([], []), ([], [])
        return ema.tensors(self.network)

    def after_update(self) -> None:
        """Host-side bookkeeping of an update done by :meth:`update` (eager or replayed): the
        EMA's update count and AdamW's step counts (host tensors, as torch keeps them)."""
        if self.parts.ema is not None:
            self.parts.ema.advance()
        if self.adamw:
            state = self.parts.optimizer.state
            torch._foreach_add_([state[p]["step"] for p in self.params], 1)


class _Calls(nn.Module):
    """Calls a function while :func:`torch.func.functional_call` has given ``network`` other
    parameters: the loss, with the leaves in place of the parameters."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, function: Callable[..., Any], *args: Any) -> Any:
        return function(*args)
