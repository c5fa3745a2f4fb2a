"""Readable names for GPU kernels: what a kernel does, and in which precision.

A trace names kernels as the compiler mangled them: ``void at::native::elementwise_kernel<128,
4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(...)...`` is a copy,
``sm90_xmma_wgrad_indexed_implicit_gemm_f16f16_...`` a convolution's weight gradient in fp16,
``void cudnn::batchnorm_bwtr_nhwc_semiPersist<__half, ...>`` BatchNorm's backward. Cut to a
report's width, every such name reads ``void at::native::elementwise_kernel<128, 4, at::n``.
:func:`label` gives what the kernel does (``copy (fp16)``, ``convolution weight gradient
(fp16)``); the full name stays in the profile for whoever needs the variant.

The patterns come from the kernels of yolo-n's training step on an H200 (cuDNN 9, PyTorch
2.11: ``docs/bench-results/*profile*.json``); a name none of them matches keeps its function
name, without its namespaces and template arguments.
"""

from __future__ import annotations

import re

# (pattern searched in the raw name, what the kernel does); the first match wins, so the
# convolutions (whose names contain "gemm") come before matrix products
KINDS: tuple[tuple[str, str], ...] = (
    # a fused BatchNorm+SiLU op on Triton kernels: statistics and their merge, the
    # normalisation, the backward's sums and their merge, the input's gradient
    (r"^bn_silu_(stats|grad_sums|stats_merge|grad_merge)", "BatchNorm+SiLU reduction (Triton)"),
    (r"^bn_silu_(normalise|input_grad)", "BatchNorm+SiLU elementwise (Triton)"),
    (
        r"batchnorm_fwtr|batchnorm_fwd|batch_norm_collect_statistics|batch_norm_transform_input",
        "BatchNorm forward",
    ),
    (r"batchnorm_bwtr|batchnorm_bwd|batch_norm_backward", "BatchNorm backward"),
    (r"batch_norm_update_stats|batch_norm_elementwise", "BatchNorm statistics"),
    (r"init_device_workspace", "cuDNN workspace initialisation"),
    (r"nhwcAddPadding", "cuDNN padding"),
    (r"(?i)fprop|convolve_common_engine", "convolution forward"),
    (r"(?i)dgrad", "convolution input gradient"),
    (r"(?i)wgrad", "convolution weight gradient"),
    (r"splitKreduce", "matrix product, split-K reduction"),
    (r"nvjet|gemm|gemv|cublas", "matrix product"),
    (r"CatArrayBatchedCopy", "concatenation"),
    (r"bfloat16_copy_kernel", "cast to bf16"),
    (r"float16_copy_kernel", "cast to fp16"),
    (r"direct_copy_kernel|copy_kernel|memcpy|Memcpy", "copy"),
    (r"memset|Memset", "memset"),
    (r"silu_backward", "SiLU backward"),
    (r"silu_kernel", "SiLU"),
    (r"max_pool_backward", "max-pool backward"),
    (r"max_pool_forward|max_pool2d", "max-pool forward"),
    (r"upsample\w*backward", "upsampling backward"),
    (r"upsample", "upsampling"),
    (r"softmax_backward|SoftMaxBackward", "softmax backward"),
    (r"softmax|SoftMax", "softmax"),
    (r"multi_tensor_apply|foreach", "multi-tensor op"),
    (r"indexFuncLargeIndex\w*<[^>]*ReduceAdd|index_add", "index_add"),
    (r"indexFuncLargeIndex|index_reduce", "index_reduce"),
    (r"index_elementwise|index_put|gpu_index_kernel", "indexing"),
    (r"scatter_gather|scatter_add", "gather or scatter"),
    (r"topk|mbtopk|radixSort|sort", "top-k or sort"),
    (r"sum_functor", "sum"),
    (r"MinNan|MinOps|min_kernel", "min"),
    (r"MaxNan|MaxOps|max_kernel", "max"),
    (r"reduce_kernel", "reduction"),
    (r"CUDAFunctor_add|add_kernel", "add"),
    (r"MulFunctor|mul_kernel", "mul"),
    (r"DivFunctor|div_\w*kernel", "div"),
    (r"lerp", "lerp"),
    (r"FillFunctor|fill_kernel", "fill"),
    (r"where_kernel", "where"),
    (r"sigmoid", "sigmoid"),
)
_KINDS = tuple((re.compile(pattern), what) for pattern, what in KINDS)

# the data type the kernel computes in, from how each library spells it
_PRECISIONS = (
    (re.compile(r"BFloat16|bfloat16|bf16"), "bf16"),
    (re.compile(r"c10::Half|__half\b|_f16|f16_|_hsh_"), "fp16"),  # hsh: cuBLAS's nvjet fp16
    (re.compile(r"\bfloat\b|f32f32_f32|tf32"), "fp32"),
)


def precision(name: str) -> str | None:
    """The floating-point type ``name`` says its kernel works on, where it says one."""
    for pattern, dtype in _PRECISIONS:
        if pattern.search(name):
            return dtype
    return None


def function_name(name: str) -> str:
    """``name`` without ``void``, namespaces, template arguments and parameters."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "").strip()
    depth, head = 0, []
    for char in name:  # drop everything inside <...> and from the first "(" at depth 0
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(depth - 1, 0)
        elif char == "(" and depth == 0:
            break
        elif depth == 0:
            head.append(char)
    return "".join(head).split("::")[-1] or name


# Inductor's generated kernels: triton_<kind>_fused_<the ops it fuses>_<n>
_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem)_")
_INDUCTOR_KINDS = {
    "poi": "pointwise",
    "red": "reduction",
    "per": "persistent reduction",
    "tem": "template (matrix product)",
}


def inductor_label(name: str) -> str | None:
    """``Inductor pointwise``, ``Inductor BatchNorm reduction``, ...: what an Inductor kernel
    is, or ``None`` for another kernel. A fused kernel is not the op its name lists first
    (``triton_poi_fused_upsample_nearest2d_add_silu_3`` is no upsampling kernel), so only its
    kind is read, and whether it is part of a BatchNorm (the largest share of a fused
    convolutional network's Inductor time, and the first thing to ask of it)."""
    match = _INDUCTOR.match(name)
    if match is None:
        return None
    part = "BatchNorm " if "batch_norm" in name else ""
    return f"Inductor {part}{_INDUCTOR_KINDS[match.group(1)]}"


def label(name: str) -> str:
    """What the kernel ``name`` does, with its precision where the name gives one."""
    if (inductor := inductor_label(name)) is not None:
        return inductor  # its name gives no precision
    what = next((kind for pattern, kind in _KINDS if pattern.search(name)), None)
    what = what or function_name(name)
    dtype = None if what.startswith("cast to") else precision(name)  # a cast names its own
    return f"{what} ({dtype})" if dtype else what
