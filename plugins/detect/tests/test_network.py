"""The YOLO network: output shapes per size, parameters and GFLOPs, the family's contract."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from falconet_detect.assigners import TAL
from falconet_detect.family import YoloFamily
from falconet_detect.network import SCALES
from falconet_testing.contracts import FamilyContract, PluginContract


class TestDetectPlugin(PluginContract):
    plugin = "falconet_detect"
    distribution = "falconet-detect"


@pytest.mark.parametrize("model", list(SCALES))
def test_forward_shapes(model):
    net = YoloFamily().build_model(model, num_classes=7).eval()
    with torch.no_grad():
        box, cls, anchors, strides = net(torch.rand(2, 3, 256, 192))
    cells = sum((256 // s) * (192 // s) for s in (8, 16, 32))
    assert box.shape == (2, cells, 64) and cls.shape == (2, cells, 7)
    assert anchors.shape == (cells, 2) and strides.shape == (cells, 1)
    assert anchors[0].tolist() == [4.0, 4.0] and strides[-1].item() == 32


@pytest.mark.parametrize(
    ("model", "params", "gflops"),
    [
        ("yolo-n", (2.5e6, 3.5e6), (7.0, 9.0)),
        ("yolo-s", (10e6, 12.5e6), (26.0, 31.0)),
        ("yolo-m", (24e6, 28e6), (75.0, 83.0)),
    ],
)
def test_parameters_and_gflops_at_640(model, params, gflops):
    net = YoloFamily().build_model(model, num_classes=80).eval()
    count = sum(p.numel() for p in net.parameters())
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(torch.zeros(1, 3, 640, 640))
    assert params[0] < count < params[1]
    assert gflops[0] < counter.get_total_flops() / 1e9 < gflops[1]


def test_batchnorm_and_priors_follow_the_family():
    net = YoloFamily().build_model("yolo-n", num_classes=80)
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all((m.eps, m.momentum) == (1e-3, 0.03) for m in bns)
    cls_bias = net.head.cls[0][-1].bias
    prior = torch.sigmoid(cls_bias[0]).item()
    assert prior == pytest.approx(5 / 80 / (640 / 8) ** 2, rel=1e-3)


def test_recipe_and_capture_region():
    family = YoloFamily()
    recipe = family.default_recipe("yolo-n")
    assert (recipe["optimizer"], recipe["momentum"], recipe["lr0"], recipe["imgsz"]) == (
        "sgd",
        0.937,
        0.01,
        640,
    )
    net = family.build_model("yolo-n", 3)
    assert family.capture_region(net) is net


class TestYoloFamilyContract(FamilyContract):
    family = YoloFamily()
    model = "yolo-n"
    assigner = TAL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_upsampling_keeps_the_input_dtype_and_values(dtype):
    """The neck's upsampling copies values in the input's dtype under autocast (CUDA's autocast
    runs ``upsample_nearest2d`` in float32, which made the neck's concatenations float32 there;
    what that cost on the GPU is in docs/lab/2026-12-kernel-cost.md, the tries table)."""
    from falconet_detect.blocks import Upsample2x

    x = torch.randn(2, 8, 5, 7).to(dtype).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", torch.bfloat16):
        up = Upsample2x()(x)
    assert up.dtype == dtype and up.shape == (2, 8, 10, 14)
    assert torch.equal(up, x.repeat_interleave(2, 2).repeat_interleave(2, 3))
    assert up.is_contiguous(memory_format=torch.channels_last)


def test_head_rows_are_the_levels_cells_and_contiguous():
    """``box`` and ``cls`` are ``[B, A, C]`` rows, level by level and cell by cell in row-major
    order, as ``flatten(2)``, ``cat`` and a transpose gave; from channels-last maps they come
    out contiguous (one copy: the concatenation), so the loss reads them row by row."""
    net = YoloFamily().build_model("yolo-n", num_classes=5).train()
    net = net.to(memory_format=torch.channels_last)
    images = torch.rand(2, 3, 128, 96).contiguous(memory_format=torch.channels_last)
    features = []
    hook = net.head.register_forward_pre_hook(lambda _m, args: features.extend(args[0]))
    with torch.no_grad():
        box, cls, _, _ = net(images)
        hook.remove()
        levels = [(net.head.box, box), (net.head.cls, cls)]
        for branches, rows in levels:
            maps = [branch(f) for branch, f in zip(branches, features, strict=True)]
            flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)
            assert torch.equal(rows, flat)
            assert rows.is_contiguous()


class _AtenOps(TorchDispatchMode):
    """Records the name of every ATen op run under it."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_conv_block_activation_copies_nothing_and_trains_as_in_place(dtype):
    """Conv-BN-SiLU's SiLU out of place: the same output and gradients, bit for bit, as the
    in-place SiLU it replaced, without the copy of the BatchNorm output that autograd makes
    before an in-place SiLU (its backward needs the input the op overwrites)."""
    from falconet_detect.blocks import Conv

    torch.manual_seed(0)
    block = Conv(4, 8, 3).train()
    in_place = Conv(4, 8, 3).train()
    in_place.load_state_dict(block.state_dict())
    in_place.forward = lambda x: F.silu(in_place.bn(in_place.conv(x)), inplace=True)
    x = torch.randn(2, 4, 9, 7)
    results = []
    for net in (block, in_place):
        ops = _AtenOps()
        with ops, torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
            y = net(x)
        (grad,) = torch.autograd.grad(y.float().square().sum(), [net.conv.weight])
        results.append((y, grad, ops.names))
    (y, grad, names), (y_ref, grad_ref, names_ref) = results
    assert torch.equal(y, y_ref) and torch.equal(grad, grad_ref)
    assert "aten.clone" in names_ref and "aten.clone" not in names


def _c2f_strided(self, x):
    """C2f's forward before its first block read a dense copy of its half."""
    y = list(self.cv1(x).chunk(2, 1))
    for block in self.m:
        y.append(block(y[-1]))
    return self.cv2(torch.cat(y, 1))


def _sppf_in_network_layout(self, x):
    """SPPF's forward before its pools ran in the contiguous layout."""
    x = self.cv1(x)
    p1 = self.pool(x)
    p2 = self.pool(p1)
    return self.cv2(torch.cat((x, p1, p2, self.pool(p2)), 1))


def _head_without_dense_grad(self, features):
    """The head's forward before its last convolutions' gradients were made dense."""
    from falconet_detect.network import _cells

    box = torch.cat([_cells(b(f)) for b, f in zip(self.box, features, strict=True)], 1)
    cls = torch.cat([_cells(c(f)) for c, f in zip(self.cls, features, strict=True)], 1)
    anchors, strides = self.grid([tuple(f.shape[2:]) for f in features], box.device, torch.float32)
    return box, cls, anchors, strides


def _in_old_forms(net: nn.Module) -> nn.Module:
    """A copy of ``net`` with C2f, SPPF and the head in their forms before the copy
    placements."""
    import copy
    import types

    from falconet_detect.blocks import SPPF, C2f

    old = copy.deepcopy(net)
    for module in old.modules():
        if isinstance(module, C2f):
            module.forward = types.MethodType(_c2f_strided, module)
        if isinstance(module, SPPF):
            module.forward = types.MethodType(_sppf_in_network_layout, module)
    old.head.forward = types.MethodType(_head_without_dense_grad, old.head)
    return old


@pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_copy_saving_forms_train_bit_for_bit_as_before(layout, dtype):
    """C2f's dense half, SPPF's contiguous pools and the head's dense gradients change where
    copies happen, not a number: the outputs and every parameter's gradient are bit for bit
    those of the forms they replaced, in either layout; and each does what it is for."""
    from falconet_detect.blocks import SPPF, C2f

    torch.manual_seed(0)
    net = YoloFamily().build_model("yolo-n", num_classes=5).train().to(memory_format=layout)
    old = _in_old_forms(net)
    seen: dict[str, list[bool]] = {"pool": [], "block": [], "head_grad": []}
    sppf = next(m for m in net.modules() if isinstance(m, SPPF))
    sppf.pool.register_forward_pre_hook(lambda _m, a: seen["pool"].append(a[0].is_contiguous()))
    first_blocks = [m.m[0] for m in net.modules() if isinstance(m, C2f)]
    for block in first_blocks:
        block.register_forward_pre_hook(
            lambda _m, a: seen["block"].append(a[0].is_contiguous(memory_format=layout))
        )
    for branch in (*net.head.box, *net.head.cls):
        branch[-1].register_full_backward_hook(
            lambda _m, _gi, go: seen["head_grad"].append(go[0].is_contiguous(memory_format=layout))
        )
    images = torch.rand(2, 3, 128, 96).contiguous(memory_format=layout)
    results = []
    for model in (net, old):
        with torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
            box, cls, _, _ = model(images)
        loss = box.float().square().mean() + cls.float().sigmoid().sum()
        params = [p for p in model.parameters() if p.requires_grad]
        results.append((box, cls, torch.autograd.grad(loss, params)))
    (box, cls, grads), (box_ref, cls_ref, grads_ref) = results
    assert torch.equal(box, box_ref) and torch.equal(cls, cls_ref)
    assert all(torch.equal(g, r) for g, r in zip(grads, grads_ref, strict=True))
    assert seen["pool"] == [True, True, True]  # the pools read the contiguous layout
    assert seen["block"] == [True] * len(first_blocks)  # each first block reads a dense half
    assert seen["head_grad"] == [True] * 6  # every last head convolution gets a dense gradient


def _traced_ops(model: nn.Module, images: torch.Tensor) -> list[str]:
    """The ops torch.compile's tracer records for ``model``'s forward, in order."""
    graphs = []

    def capture(gm, _example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture, fullgraph=True, dynamic=False)(images)
    torch._dynamo.reset()
    return [
        str(getattr(node.target, "__name__", node.target))
        for gm in graphs
        for node in gm.graph.nodes
        if node.op in ("call_function", "call_method")
    ]


def test_a_compiled_network_is_traced_in_the_forms_before_the_copy_placements():
    """The copies placed for PyTorch's own kernels are left out when Inductor writes the
    kernels (the contiguous pools made Inductor's fused step slower;
    docs/lab/2026-12-kernel-cost.md, the tries table): under torch.compile the network traces
    op for op as the old forms do, and eager it keeps the placements (the op lists differ)."""
    torch.manual_seed(0)
    net = YoloFamily().build_model("yolo-n", num_classes=5).train()
    net = net.to(memory_format=torch.channels_last)
    old = _in_old_forms(net)
    images = torch.rand(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    traced, traced_old = _traced_ops(net, images), _traced_ops(old, images)
    assert traced == traced_old
    assert "contiguous" not in traced and "clone" not in traced
    eager, eager_old = _AtenOps(), _AtenOps()
    with eager:
        net(images)
    with eager_old:
        old(images)
    assert "aten.clone" in eager.names and "aten.clone" not in eager_old.names
