"""The YOLO network's training pass with and without three copy-saving block changes, side
by side: what each buys, and whether the numbers move.

The changes, each against the form before it:

* ``up`` (kept, ``falconet_detect.blocks.Upsample2x``): the neck's 2x nearest upsampling in
  the input's dtype; before, ``nn.Upsample`` under autocast, which runs in float32 and makes
  the concatenation after it float32 too;
* ``head`` (kept, ``network._cells``): the head's levels joined as ``[B, H x W, C]`` views of
  the channels-last maps; before, ``flatten(2)`` (a copy), ``cat`` along the cells and a
  transpose, which left the loss reading strided rows;
* ``pool`` (tried, not kept: it lives only here): SPPF's 5x5 max-pools as a 1x5 pool then a
  5x1 one, the same maxima and the same winner of a tie, but the backward sums in two steps
  and rounds differently.

Three more, each on top of ``after`` (what the family builds) and compared with it, about the
copies ``tools/kernel_origins.py`` found in the step:

* ``nchw-pool``: SPPF's three max-pools in the contiguous (NCHW) layout, converted there and
  back, instead of PyTorch's channels-last max-pool kernels (forward 46 us and backward 75 us
  per pool at batch 16 on the H200, for a 1.6 MB map);
* ``dense-chunk``: C2f's first bottleneck reads a dense copy of its half of ``cv1``'s output,
  so its convolution's backward does not copy the strided half again (the forward already
  copied it, inside the convolution);
* ``dense-head``: the gradient reaching each of the head's last convolutions made dense once,
  where the convolution's backward made it dense twice (once for the input's gradient, once
  for the weight's);
* ``copies``: the three together.

For each variant (``before``; ``up``, ``head``, ``pool`` alone; ``after`` = ``up`` + ``head``,
what the family now builds; by default, or those of ``--variants``, the first the reference)
one training pass, the network's forward, the trainer's own loss
on a real batch of ``--data`` (COCO128's first, at ``--batch``) and the backward to every
parameter, is recorded as one CUDA graph and replayed: median of ``--repeats`` replays after
``--warmup``, over ``--rounds`` rounds taken round-robin (the median of the rounds is
reported). Every variant starts from the same weights, and its loss and parameter gradients
are compared with the reference's (bit-equal count and largest difference).

    cd tools && python bench_blocks.py --data ../.data/coco128/coco128.yaml --batch 16,64 \
        --amp fp16,bf16 --out blocks.json
    cd tools && python bench_blocks.py --variants after,nchw-pool,dense-chunk,dense-head,copies

With ``--compile`` each variant's network runs under ``torch.compile`` (Inductor's default
mode, as ``fuse=inductor`` compiles it; the loss stays eager): what a copy placement does when
Inductor writes the kernels. The family's blocks leave their placements out when compiled
(``falconet_detect.blocks.on_eager_kernels``); the variants above force theirs in.

    cd tools && python bench_blocks.py --compile --amp fp16 --variants after,copies,nchw-pool

On a machine without CUDA only the comparison runs (fp32 or bf16 autocast on the CPU).
"""

from __future__ import annotations

import copy
import types

import torch
import torch.nn.functional as F
from first_batch import each_case, new_results, replay_parser, save_results  # tools/ is on the path
from torch import nn

VARIANTS = ("before", "up", "head", "pool", "after")
COPY_CHANGES = ("nchw-pool", "dense-chunk", "dense-head")


def head_before(self, features):
    """The head's forward before ``head``: ``flatten(2)``, ``cat`` over cells, transpose."""
    box = torch.cat([b(f).flatten(2) for b, f in zip(self.box, features, strict=True)], 2)
    cls = torch.cat([c(f).flatten(2) for c, f in zip(self.cls, features, strict=True)], 2)
    anchors, strides = self.grid([tuple(f.shape[2:]) for f in features], box.device, torch.float32)
    return box.transpose(1, 2), cls.transpose(1, 2), anchors, strides


def separable_pool(self, x: torch.Tensor) -> torch.Tensor:
    """The ``pool`` try: a 5x5 max-pool as 1x5 then 5x1."""
    x = F.max_pool2d(x, (1, 5), 1, (0, 2))
    return F.max_pool2d(x, (5, 1), 1, (2, 0))


def sppf_nchw_pool(self, x: torch.Tensor) -> torch.Tensor:
    """The ``nchw-pool`` try: SPPF with its pools in the contiguous layout."""
    x = self.cv1(x)
    p1 = self.pool(x.contiguous())
    p2 = self.pool(p1)
    p3 = self.pool(p2)
    cl = torch.channels_last
    pooled = [p.contiguous(memory_format=cl) for p in (p1, p2, p3)]
    return self.cv2(torch.cat((x, *pooled), 1))


def c2f_dense_chunk(self, x: torch.Tensor) -> torch.Tensor:
    """The ``dense-chunk`` try: C2f's first bottleneck on a dense copy of its half."""
    y = list(self.cv1(x).chunk(2, 1))
    y[-1] = y[-1].clone(memory_format=torch.preserve_format)
    for block in self.m:
        y.append(block(y[-1]))
    return self.cv2(torch.cat(y, 1))


class DenseGrad(torch.autograd.Function):
    """Identity forward; the backward hands on its gradient made dense in the layout of the
    forward's tensor (one copy, where a convolution's backward would make two)."""

    @staticmethod
    def forward(ctx, x):
        ctx.channels_last = x.is_contiguous(memory_format=torch.channels_last)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        layout = torch.channels_last if ctx.channels_last else torch.contiguous_format
        return grad.contiguous(memory_format=layout)


def head_dense_grad(self, features):
    """The ``dense-head`` try: each level's last convolution gets a dense gradient."""
    from falconet_detect.network import _cells

    def level(branch, f):
        return _cells(DenseGrad.apply(branch(f)))

    box = torch.cat([level(b, f) for b, f in zip(self.box, features, strict=True)], 1)
    cls = torch.cat([level(c, f) for c, f in zip(self.cls, features, strict=True)], 1)
    anchors, strides = self.grid([tuple(f.shape[2:]) for f in features], box.device, torch.float32)
    return box, cls, anchors, strides


def variant(network: nn.Module, name: str) -> nn.Module:
    """A copy of ``network`` (the family's current form) with ``name``'s changes only."""
    net = copy.deepcopy(network)
    if name in (*COPY_CHANGES, "copies"):  # on top of the current form
        changes = COPY_CHANGES if name == "copies" else (name,)
        for module in net.modules():
            kind = type(module).__name__
            if kind == "SPPF" and "nchw-pool" in changes:
                module.forward = types.MethodType(sppf_nchw_pool, module)
            if kind == "C2f" and "dense-chunk" in changes:
                module.forward = types.MethodType(c2f_dense_chunk, module)
        if "dense-head" in changes:
            net.head.forward = types.MethodType(head_dense_grad, net.head)
        return net
    keep = {"before": (), "after": ("up", "head")}.get(name, (name,))
    if "up" not in keep:
        net.up = nn.Upsample(scale_factor=2, mode="nearest")
    if "head" not in keep:
        net.head.forward = types.MethodType(head_before, net.head)
    if "pool" in keep:
        for module in net.modules():
            if type(module).__name__ == "SPPF":
                # an instance attribute wins over the registered MaxPool2d submodule
                object.__setattr__(module, "pool", types.MethodType(separable_pool, module))
    return net


def pass_fn(net: nn.Module, trainer, images: torch.Tensor, targets: dict, params=None):
    """Forward, the trainer's loss and the gradients of every parameter (or of ``params``):
    one training pass."""
    if params is None:
        params = [p for p in net.parameters() if p.requires_grad]

    def run():
        with trainer.precision.autocast(trainer.device):
            outputs = net(images)
        loss, _ = trainer.loss_fn(outputs, targets)
        grads = torch.autograd.grad(loss * trainer.cfg.batch, params)
        # detached: a loss that kept the autograd graph alive would keep its AccumulateGrad
        # nodes, and with them the stream of this call, into the next (a capture then fails)
        return loss.detach(), grads

    return run


def compare(got, reference) -> dict:
    pairs = [(got[0], reference[0]), *zip(got[1], reference[1], strict=True)]
    gap = max(float((a.double() - b.double()).abs().max()) for a, b in pairs)
    return {
        "loss_equal": bool(torch.equal(got[0], reference[0])),
        "tensors_equal": sum(torch.equal(a, b) for a, b in pairs),
        "tensors": len(pairs),
        "max_abs_diff": gap,
    }


def main() -> None:
    parser = replay_parser(__doc__)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="the first: reference")
    parser.add_argument("--compile", action="store_true", help="the networks under Inductor")
    args = parser.parse_args()
    if args.compile:  # one compiled network per variant and case, all of one forward's code
        torch._dynamo.config.recompile_limit = 64
    names = args.variants.split(",")
    timed = torch.cuda.is_available()
    if timed:
        from graph_replay import replay_ms
    results = new_results()
    for amp, batch_size, trainer, images, targets in each_case(args, "blocks"):
        nets = {name: variant(trainer.model, name) for name in names}
        if args.compile:
            nets = {name: torch.compile(net, dynamic=False) for name, net in nets.items()}
        first = {n: pass_fn(net, trainer, images, targets)() for n, net in nets.items()}
        rows = {
            name: {"amp": amp, "batch": batch_size, "variant": name, "ms": [],
                   **compare(first[name], first[names[0]])}
            for name in names
        }  # fmt: skip
        del first
        for _ in range(args.rounds if timed else 0):
            for name, net in nets.items():
                fn = pass_fn(net, trainer, images, targets)
                rows[name]["ms"].append(replay_ms(fn, args.warmup, args.repeats))
        for row in rows.values():
            row["median_ms"] = sorted(row["ms"])[len(row["ms"]) // 2] if row["ms"] else None
            results["rows"].append(row)
            ms = f"{row['median_ms']:.3f} ms" if row["median_ms"] is not None else "-"
            print(
                f"{amp} b{batch_size} {row['variant']:>11}: {ms}; loss equal "
                f"{row['loss_equal']}, {row['tensors_equal']}/{row['tensors']} tensors "
                f"equal, largest difference {row['max_abs_diff']:.3g}",
                flush=True,
            )
    save_results(args, results)


if __name__ == "__main__":
    main()
