"""The fused BatchNorm + SiLU op's logic on the CPU, its Triton kernels run by Triton's
interpreter: output, gradients and running statistics against the same computation in
float64, several reduction programs and ragged tiles included; a channel whose mean dwarfs its
spread; which calls the mode takes and which it leaves to PyTorch; the family's Conv block
through it. On a CUDA GPU the same checks run on the compiled kernels
(:func:`test_compiled_kernels_match_float64_on_the_gpu`); speed is
``tools/bench_bn_silu.py``'s.

Triton decides at decoration whether a kernel (its own library's helpers included) runs
interpreted, and Triton is imported with torch, before a test could ask. So the tests that
launch kernels run in a child pytest with ``TRITON_INTERPRET=1`` set from the start
(:func:`test_kernels_in_the_triton_interpreter`); in this process they are skipped.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from falconet import ops
from falconet_graphs_cuda.keys import GraphsCudaKeys

pytest.importorskip("triton", reason="the fused op's kernels are Triton's")

from falconet_graphs_cuda import bn_silu
from falconet_graphs_cuda.bn_silu import FusedBatchNormSiLU
from falconet_graphs_cuda.bn_silu_tiling import Tiling
from falconet_graphs_cuda.step_modes import fused_bn_silu

MOMENTUM, EPS = 0.03, 1e-3
NAMES = ("z", "dx", "dw", "db", "running mean", "running var")  # what _run returns
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="launches kernels: runs in test_kernels_in_the_triton_interpreter"
)


# A kernel whose loop bound is an argument, as the statistics kernel's is: Triton's interpreter
# hands ``range`` a one-element array, which Triton 3.6's interpreter turns into an index with
# ``int()``, an error since NumPy 2.4 (later Triton squeezes it first). Only that error skips;
# any other failure is left to the child run, which reports it.
_NUMPY_INDEX_ERROR = "only 0-dimensional arrays can be converted to Python scalars"
_RUNTIME_BOUND_PROBE = """
import torch, triton, triton.language as tl
@triton.jit
def count(out_ptr, n):
    total = 0
    for _ in range(0, n, 1):
        total += 1
    tl.store(out_ptr, total)
out = torch.zeros(1, dtype=torch.int32)
count[(1,)](out, 3)
assert out.item() == 3, out
"""


def _runtime_bound_error(env: dict[str, str]) -> str | None:
    """The last line of the probe's error in the interpreter, None where it ran."""
    run = subprocess.run(
        [sys.executable, "-c", _RUNTIME_BOUND_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = run.stderr.strip().splitlines() or ["no output"]
    return None if run.returncode == 0 else lines[-1]


@pytest.mark.skipif(INTERPRETED, reason="this is the child run")
def test_kernels_in_the_triton_interpreter():
    """This file's kernel tests, in a pytest started with the interpreter on; skipped where
    this Triton's interpreter cannot index by a loop bound that is an argument (NumPy 2.4+)."""
    env = os.environ | {"TRITON_INTERPRET": "1"}
    error = _runtime_bound_error(env)
    if error is not None and _NUMPY_INDEX_ERROR in error:
        import numpy
        import triton

        pytest.skip(
            f"Triton {triton.__version__}'s interpreter with NumPy {numpy.__version__} fails "
            f"a loop bounded by a kernel argument ({error}); a Triton whose interpreter squeezes "
            "the bound, e.g. 3.9, runs these tests"
        )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " skipped" in run.stdout  # the child skips only this


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _bn(channels: int, seed: int = 0) -> nn.BatchNorm2d:
    torch.manual_seed(seed)
    bn = nn.BatchNorm2d(channels, eps=EPS, momentum=MOMENTUM)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.normal_()
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2.0)
    return bn


def _run(x: torch.Tensor, bn: nn.Module, fused: bool, dz: torch.Tensor, seen=None):
    """Output, the gradients of input, weight and bias, and the running statistics after;
    the fused op compiled for the GPU where ``x`` is on one, else in the interpreter. ``seen``
    (an :class:`_Ops`) records what the forward dispatched."""
    x = x.detach().requires_grad_()
    if fused:
        with FusedBatchNormSiLU(interpret=not x.is_cuda), seen or _Ops():
            z = ops.batch_norm_silu(x, bn)
    else:
        z = F.silu(bn(x))
    grads = torch.autograd.grad(z, (x, bn.weight, bn.bias), dz.to(z.dtype))
    return (z, *grads, bn.running_mean.clone(), bn.running_var.clone())


@interpreted
@pytest.mark.parametrize(
    "shape",
    [
        (2, 16, 7, 5),  # one reduction program, ragged row tile
        (3, 16, 31, 29),  # several programs, the last one short
        (2, 80, 6, 7),  # two channel blocks, the second ragged
        (4, 24, 1, 1),  # one pixel: channels-last and contiguous coincide
    ],
)
@pytest.mark.parametrize(
    "tiling",
    [
        Tiling(),
        # (3, 16, 31, 29): 34 partial results, merged 16 at a time; (2, 80, 6, 7): 5 merge
        # programs of 16 channels where the other kernels take 2 blocks of 64
        Tiling(reduce_elements=256, programs_per_sm=20, merge_elements=256, merge_channels=16),
    ],
    ids=["default", "narrow-merges"],
)
def test_fused_op_matches_float64(shape, tiling, monkeypatch):
    """Against ``F.silu(batch_norm(x))`` in float64 from the same state: the fused op's
    float32 results within float32 rounding, and the batch counter advanced once."""
    monkeypatch.setattr(bn_silu, "TILING", tiling)
    torch.manual_seed(1)
    x = (torch.randn(shape) * 2 + 0.5).contiguous(memory_format=torch.channels_last)
    dz = torch.randn(shape).contiguous(memory_format=torch.channels_last)
    bn, reference = _bn(shape[1]), _bn(shape[1]).double()
    got = _run(x, bn, True, dz)
    want = _run(x.double(), reference, False, dz.double())
    assert got[0].dtype == torch.float32
    assert got[0].is_contiguous(memory_format=torch.channels_last)
    for name, a, b in zip(NAMES, got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5, msg=name)
    assert bn.num_batches_tracked.item() == 1


def _worst_errors(got, want) -> list[float]:
    return [(a.double() - b).abs().max().item() for a, b in zip(got, want, strict=True)]


on_the_gpu = pytest.mark.skipif(
    INTERPRETED or not torch.cuda.is_available(),
    reason="compiles the kernels for a CUDA GPU: runs on the GPU machine",
)


@on_the_gpu
@pytest.mark.parametrize(
    "shape",
    [
        (2, 16, 7, 5),  # one reduction program, ragged row tile
        (3, 16, 31, 29),  # several programs, the last one short
        (2, 80, 6, 7),  # two channel blocks, the second ragged
        (16, 32, 160, 160),  # yolo-n's widest map at 640 px, batch 16: 409,600 per channel
    ],
)
def test_compiled_kernels_match_float64_on_the_gpu(shape):
    """The kernels as the GPU runs them (compiled, not interpreted), float32 in: output,
    gradients and running statistics within ``rtol = atol = 1e-4`` of the same computation
    in float64 (the sums over up to 409,600 values per channel round in float32; PyTorch's
    own float32 BatchNorm is compared the same way beside it), and the fused op really
    dispatched."""
    torch.manual_seed(1)
    cuda = torch.device("cuda")
    x = (torch.randn(shape, device=cuda) * 2 + 0.5).contiguous(memory_format=torch.channels_last)
    dz = torch.randn(shape, device=cuda).contiguous(memory_format=torch.channels_last)
    seen = _Ops()
    got = _run(x, _bn(shape[1]).to(cuda), True, dz, seen)
    assert "falconet_graphs.bn_silu" in seen.names, seen.names
    want = _run(x.double(), _bn(shape[1]).double().to(cuda), False, dz.double())
    native = _run(x, _bn(shape[1]).to(cuda), False, dz)
    for name, a, n, b in zip(NAMES, got, native, want, strict=True):
        torch.testing.assert_close(n.double(), b, rtol=1e-4, atol=1e-4, msg=f"native {name}")
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=name)


@on_the_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_kernels_in_half_precision_on_the_gpu(dtype):
    """fp16 and bf16 on the GPU, as the whole step runs them: every result at most as far
    from float64 (on the same rounded inputs) as PyTorch's own BatchNorm and SiLU in that
    dtype, give or take one rounding of the output."""
    torch.manual_seed(2)
    cuda = torch.device("cuda")
    shape = (16, 64, 80, 80)
    x = torch.randn(shape, device=cuda).to(dtype).contiguous(memory_format=torch.channels_last)
    dz = torch.randn(shape, device=cuda).to(dtype).contiguous(memory_format=torch.channels_last)
    want = _run(x.double(), _bn(64).double().to(cuda), False, dz.double())
    seen = _Ops()
    got = _run(x, _bn(64).to(cuda), True, dz, seen)
    assert "falconet_graphs.bn_silu" in seen.names, seen.names
    assert got[0].dtype == got[1].dtype == dtype
    fused = _worst_errors(got, want)
    native = _worst_errors(_run(x, _bn(64).to(cuda), False, dz), want)
    slack = [torch.finfo(dtype).eps * w.abs().max().item() for w in want[:2]] + [1e-5] * 4
    for name, f, n, s in zip(NAMES, fused, native, slack, strict=True):
        assert f <= n + s, (name, f, n)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_op_in_half_precision_is_as_close_to_float64_as_pytorch(dtype):
    """fp16 and bf16 in, the same dtype out, statistics and the affine parameters' gradients
    in float32; every result at most as far from float64 (on the same rounded inputs) as
    PyTorch's own BatchNorm and SiLU in that dtype, give or take one rounding of the output."""
    torch.manual_seed(2)
    shape = (2, 32, 9, 8)
    x = torch.randn(shape).to(dtype).contiguous(memory_format=torch.channels_last)
    dz = torch.randn(shape).to(dtype).contiguous(memory_format=torch.channels_last)
    want = _run(x.double(), _bn(32).double(), False, dz.double())
    got = _run(x, _bn(32), True, dz)
    assert got[0].dtype == got[1].dtype == dtype
    assert all(t.dtype == torch.float32 for t in got[2:])
    fused = _worst_errors(got, want)
    native = _worst_errors(_run(x, _bn(32), False, dz), want)
    slack = [torch.finfo(dtype).eps * w.abs().max().item() for w in want[:2]] + [1e-6] * 4
    for name, f, n, s in zip(NAMES, fused, native, slack, strict=True):
        assert f <= n + s, (name, f, n)


@pytest.mark.parametrize(
    "case",
    ["eval", "no-momentum", "strided-input", "no-affine"],
)
def test_mode_leaves_to_pytorch_what_it_does_not_fuse(case):
    """Evaluation (running statistics), a cumulative average, an input not dense in
    channels-last and a BatchNorm without weights run as the family wrote them: the same
    result bit for bit, and no fused op dispatched."""
    bn = _bn(8)
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    if case == "eval":
        bn.eval()
    elif case == "no-momentum":
        bn.momentum = None
    elif case == "strided-input":
        x = x.contiguous()
    else:
        bn = nn.BatchNorm2d(8, affine=False)
    expect_bn = _bn(8) if case != "no-affine" else nn.BatchNorm2d(8, affine=False)
    expect_bn.load_state_dict(bn.state_dict())
    expect_bn.train(bn.training)
    expect_bn.momentum = bn.momentum
    seen = _Ops()
    with FusedBatchNormSiLU(interpret=True), seen:
        z = ops.batch_norm_silu(x, bn)
    assert torch.equal(z, F.silu(expect_bn(x)))
    assert not any(name.startswith("falconet_graphs") for name in seen.names)


def test_mode_takes_a_cuda_tensor_only_outside_the_interpreter():
    """Without ``interpret`` a CPU tensor is PyTorch's: Triton compiles for the GPU."""
    bn = _bn(8)
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    seen = _Ops()
    with FusedBatchNormSiLU(), seen:
        ops.batch_norm_silu(x, bn)
    assert not any(name.startswith("falconet_graphs") for name in seen.names)


@interpreted
def test_family_conv_block_runs_the_fused_op():
    """The family's Conv-BN-SiLU goes through ``ops.batch_norm_silu``: under the mode its
    forward dispatches the fused op, and trains to the same values within rounding."""
    from falconet_detect.blocks import Conv

    torch.manual_seed(4)
    block = Conv(4, 16, 3).train().to(memory_format=torch.channels_last)
    plain = Conv(4, 16, 3).train().to(memory_format=torch.channels_last)
    plain.load_state_dict(block.state_dict())
    x = torch.randn(2, 4, 12, 10).contiguous(memory_format=torch.channels_last)
    seen = _Ops()
    with FusedBatchNormSiLU(interpret=True), seen:
        y = block(x)
    assert "falconet_graphs.bn_silu" in seen.names
    (grad,) = torch.autograd.grad(y.square().sum(), [block.conv.weight])
    y_ref = plain(x)
    (grad_ref,) = torch.autograd.grad(y_ref.square().sum(), [plain.conv.weight])
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(block.bn.running_var, plain.bn.running_var)


@pytest.mark.parametrize(
    ("value", "device", "mode"),
    [("native", "cuda", False), ("triton", "cuda", True), ("triton", "cpu", False)],
)
def test_whole_step_choice_of_the_fused_op(value, device, mode, caplog):
    """``bn_silu=triton`` gives the whole step the mode on a GPU, with a warning that it is
    not bit for bit; on the CPU it says why it runs PyTorch's kernels."""
    with caplog.at_level(logging.INFO, logger="falconet.train"):
        got = fused_bn_silu(GraphsCudaKeys(bn_silu=value), torch.device(device))
    assert isinstance(got, FusedBatchNormSiLU) is mode
    if value == "triton":
        assert ("not bit for bit" if mode else "need a CUDA device") in caplog.text


@pytest.mark.parametrize("fuse", ["inductor", "inductor-all"])
def test_fused_op_refused_with_a_compiled_network(fuse):
    """TorchDynamo traces the family's ``F.silu(bn(x))``, not the mode: the two together
    would silently be Inductor's BatchNorm, so they are refused, saying what works."""
    with pytest.raises(ValueError, match="fuse=inductor-loss"):
        fused_bn_silu(GraphsCudaKeys(bn_silu="triton", fuse=fuse), torch.device("cuda"))


def test_tiling_from_the_environment():
    """Each field of the tiling from ``FALCONET_BN_SILU_<FIELD>``, the rest the defaults; a
    value that is not a positive whole number, or a tile or warp count that is not a power
    of two (a tile of at least 64 elements), is an error naming the variable."""
    from falconet_graphs_cuda.bn_silu_tiling import tiling_from_env

    assert tiling_from_env({}) == Tiling()
    got = tiling_from_env({"FALCONET_BN_SILU_MAP_WARPS": "8", "OTHER": "x"})
    assert got == Tiling(map_warps=8)
    with pytest.raises(ValueError, match="FALCONET_BN_SILU_REDUCE_ELEMENTS='many'"):
        tiling_from_env({"FALCONET_BN_SILU_REDUCE_ELEMENTS": "many"})
    with pytest.raises(ValueError, match="at least 1"):
        tiling_from_env({"FALCONET_BN_SILU_PROGRAMS_PER_SM": "0"})
    assert tiling_from_env({"FALCONET_BN_SILU_PROGRAMS_PER_SM": "3"}).programs_per_sm == 3
    with pytest.raises(ValueError, match="power of two of at least 64"):
        tiling_from_env({"FALCONET_BN_SILU_MAP_ELEMENTS": "3000"})
    with pytest.raises(ValueError, match="power of two of at least 64"):
        tiling_from_env({"FALCONET_BN_SILU_REDUCE_ELEMENTS": "32"})
    with pytest.raises(ValueError, match="power of two of at least 1"):
        tiling_from_env({"FALCONET_BN_SILU_MAP_WARPS": "6"})
    assert tiling_from_env({"FALCONET_BN_SILU_MERGE_ELEMENTS": "2048"}).merge_elements == 2048
    with pytest.raises(ValueError, match="power of two of at least 16"):
        tiling_from_env({"FALCONET_BN_SILU_MERGE_CHANNELS": "8"})


# --------------------------------------------------------------------------- in place
@interpreted
def test_residual_added_and_output_written_into_a_channel_slice():
    """With a residual and ``out`` a slice of a wider channels-last buffer's channels: the
    result lands in that slice (the other channels untouched) and is returned without a
    copy; output and every gradient, the residual's included, within float32 rounding of
    ``residual + silu(batch_norm(x))`` in float64."""
    torch.manual_seed(5)
    shape = (2, 16, 7, 5)
    x = (torch.randn(shape) * 2 + 0.5).contiguous(memory_format=torch.channels_last)
    res = torch.randn(shape).contiguous(memory_format=torch.channels_last)
    dz = torch.randn(shape)
    cat = ops.ChannelConcat(40)
    cat.buffer = torch.full((2, 40, 7, 5), float("nan")).contiguous(
        memory_format=torch.channels_last
    )
    buffer = cat.buffer
    bn, reference = _bn(16), _bn(16).double()
    xs, rs = x.clone().requires_grad_(), res.clone().requires_grad_()
    cat.part(8)
    with FusedBatchNormSiLU(interpret=True):
        z = ops.batch_norm_silu(xs, bn, rs, cat.part(16))
    assert z.data_ptr() == buffer[:, 8:24].data_ptr()
    assert buffer[:, :8].isnan().all() and buffer[:, 24:].isnan().all()
    got = (z, *torch.autograd.grad(z, (xs, bn.weight, bn.bias, rs), dz))
    xd, rd = x.double().requires_grad_(), res.double().requires_grad_()
    want_z = rd + F.silu(reference(xd))
    want = (want_z, *torch.autograd.grad(want_z, (xd, reference.weight, reference.bias, rd), dz))
    for name, a, b in zip(("z", "dx", "dw", "db", "dres"), got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5, msg=name)


def _plain_c2f(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """C2f as written before its parts went in place: split, blocks, concatenation."""
    y = list(block.cv1(x).chunk(2, 1))
    for b in block.m:
        y.append(b(y[-1]))
    return block.cv2(torch.cat(y, 1))


@interpreted
@pytest.mark.parametrize(("shortcut", "n"), [(True, 2), (False, 1)])
def test_c2f_joins_its_parts_without_copying_them(shortcut, n):
    """Under the mode C2f's parts are written into the concatenation's buffer and the
    bottlenecks' residuals added by the fused op: no ``cat`` and no ``add`` dispatched in
    the forward; outputs, every parameter's gradient and the running statistics within
    rounding of the plain block's."""
    from falconet_detect.blocks import C2f

    torch.manual_seed(6)
    block = C2f(8, 32, n, shortcut).train().to(memory_format=torch.channels_last)
    plain = C2f(8, 32, n, shortcut).train().to(memory_format=torch.channels_last)
    plain.load_state_dict(block.state_dict())
    x = torch.randn(2, 8, 9, 7).contiguous(memory_format=torch.channels_last)
    seen = _Ops()
    with FusedBatchNormSiLU(interpret=True), seen:
        y = block(x)
    assert "aten.cat" not in seen.names and "aten.add" not in seen.names
    assert seen.names.count("falconet_graphs.bn_silu") == 2 + 2 * n
    y_ref = _plain_c2f(plain, x)
    grads = torch.autograd.grad(y.square().sum(), list(block.parameters()))
    grads_ref = torch.autograd.grad(y_ref.square().sum(), list(plain.parameters()))
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for (name, _), g, r in zip(block.named_parameters(), grads, grads_ref, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4, msg=name)
    for a, b in zip(block.buffers(), plain.buffers(), strict=True):
        torch.testing.assert_close(a, b)


def _leaf_slices(buffer: torch.Tensor, widths) -> list[torch.Tensor]:
    """Slices of ``buffer``'s channels as leaves that take gradients, as the fused op
    returns its outputs (aliases of the slices)."""
    parts, first = [], 0
    for w in widths:
        parts.append(bn_silu._alias(buffer[:, first : first + w]).requires_grad_())
        first += w
    return parts


def test_concatenation_returns_the_buffer_when_its_parts_lie_in_it():
    """``concat_channels`` of parts lying in order in the mode's buffer is the buffer itself:
    no copy dispatched, and each part's gradient is its slice of the output's. Parts out of
    order, or one elsewhere, are concatenated by copying, to the same values."""
    torch.manual_seed(7)
    cat = ops.ChannelConcat(10)
    cat.buffer = buffer = torch.randn(2, 10, 3, 5).contiguous(memory_format=torch.channels_last)
    parts = _leaf_slices(buffer, (4, 2, 4))
    grad = torch.randn(2, 10, 3, 5)
    seen = _Ops()
    with FusedBatchNormSiLU(interpret=True), seen:
        joined = cat(parts)
    assert "aten.cat" not in seen.names
    assert joined.data_ptr() == buffer.data_ptr() and torch.equal(joined, buffer)
    got = torch.autograd.grad(joined, parts, grad)
    assert all(torch.equal(g, w) for g, w in zip(got, grad.split((4, 2, 4), 1), strict=True))
    elsewhere = torch.randn(2, 4, 3, 5, requires_grad=True)
    for other in ([parts[1], parts[0], parts[2]], [parts[0], parts[1], elsewhere]):
        seen = _Ops()
        with FusedBatchNormSiLU(interpret=True), seen:
            joined = cat(other)
        assert "aten.cat" in seen.names and torch.equal(joined, torch.cat(other, 1))


def test_without_the_mode_the_ops_are_the_familys():
    """Run as is: no buffer, a plain concatenation, the residual added after the SiLU (the
    family's ``x + silu(bn(x))``), bit for bit, and a channel slice copied dense."""
    bn = _bn(8)
    x = torch.randn(2, 8, 4, 4)
    res = torch.randn(2, 8, 4, 4)
    cat = ops.ChannelConcat(16)
    y = ops.batch_norm_silu(x, bn, res, cat.part(8))
    assert cat.buffer is None and torch.equal(y, res + F.silu(_bn(8)(x)))
    assert torch.equal(cat([x, res]), torch.cat([x, res], 1))
    assert ops.dense(x[:, 2:6]).is_contiguous() and ops.dense(x) is x


@pytest.mark.parametrize(
    ("shape", "index", "stride"),
    [
        ((2, 40, 7, 5), slice(8, 24), 40),  # a slice of a channels-last tensor's channels
        ((2, 16, 7, 5), slice(None), 16),  # channels-last itself
        ((3, 24, 1, 1), slice(4, 12), 24),  # one pixel
    ],
)
def test_row_stride_of_a_channel_slice(shape, index, stride):
    """The row stride the normalising kernel writes with: a channels-last tensor's channel
    count (that of the whole tensor for a slice); None for a layout whose pixels are not
    evenly spaced rows of adjacent channels (NCHW)."""
    t = torch.empty(shape).contiguous(memory_format=torch.channels_last)[:, index]
    assert bn_silu._row_stride(t) == stride
    assert bn_silu._row_stride(torch.empty(2, 16, 7, 5)[:, 4:12]) is None


@interpreted
def test_the_family_network_trains_through_the_mode():
    """yolo-n's whole training pass under the mode: every C2f's concatenation is gone from
    the dispatched ops (the neck's, SPPF's and the head's stay), and the loss and every
    parameter's gradient are within rounding of PyTorch's kernels' (float32; the fused op
    sums in other orders through 57 layers)."""
    import contextlib
    import copy

    from falconet_detect.blocks import C2f
    from falconet_detect.family import YoloFamily

    torch.manual_seed(8)
    net = YoloFamily().build_model("yolo-n", num_classes=5).train()
    net = net.to(memory_format=torch.channels_last)
    plain = copy.deepcopy(net)
    images = torch.rand(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    results = []
    for model, mode in (
        (net, FusedBatchNormSiLU(interpret=True)),
        (plain, contextlib.nullcontext()),
    ):
        seen = _Ops()
        with mode, seen:
            box, cls, _, _ = model(images)
        loss = box.float().square().mean() + cls.float().sigmoid().sum()
        results.append((loss, torch.autograd.grad(loss, list(model.parameters())), seen.names))
    (loss, grads, names), (loss_ref, grads_ref, names_ref) = results
    c2f_blocks = sum(isinstance(m, C2f) for m in net.modules())
    assert names.count("aten.cat") == names_ref.count("aten.cat") - c2f_blocks
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    for (name, _), g, r in zip(net.named_parameters(), grads, grads_ref, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-3 * r.abs().max().item(), msg=name)
