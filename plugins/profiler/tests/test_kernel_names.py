"""What a kernel does, read from its name: real names from yolo-n's training step on an H200
(cuDNN 9, PyTorch 2.11; docs/bench-results/2026-12-01-profile-whole-step-fp16-b16.json and
2026-11-30-profile-whole-step-b16.json), cut where the rest adds nothing."""

from __future__ import annotations

import pytest

from falconet_profiler.kernel_names import function_name, label

CASES = [  # (what it does, the kernel's name)
    # falconet-graphs-cuda's Triton kernels (bn_silu=triton) go by their function names
    ("BatchNorm+SiLU reduction (Triton)", "bn_silu_stats"),
    ("BatchNorm+SiLU reduction (Triton)", "bn_silu_grad_merge"),
    ("BatchNorm+SiLU elementwise (Triton)", "bn_silu_normalise"),
    ("BatchNorm+SiLU elementwise (Triton)", "bn_silu_input_grad"),
    (
        "BatchNorm backward (fp16)",
        "void cudnn::batchnorm_bwtr_nhwc_semiPersist<__half, float, __half, 512, 16, 3, 4, 1,"
        " 0, true, 2>(cudnn::NhwcBatchNormBwdParams<__half, float>)",
    ),
    (
        "BatchNorm forward (fp16)",
        "void cudnn::batchnorm_fwtr_nhwc_semiPersist<__half, float, __half, 512, 16, 5, 4, 1,"
        " 0, false, false, true, 2>(cudnn::NhwcBatchNormFwdParams<__half, float>)",
    ),
    (
        "BatchNorm forward (bf16)",
        "void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var,"
        " c10::BFloat16, float, 4>(c10::BFloat16 const*, float*)",
    ),
    (
        "copy (fp16)",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::n"
        "ative::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
        "const::{lambda()#10}::operator()() const::{lambda(c10::Half)#1}>(at::TensorIteratorB"
        "ase&)",
    ),
    (
        "cast to fp16",
        "void at::native::vectorized_elementwise_kernel<8, at::native::float16_copy_kernel_cu"
        "da(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int)",
    ),
    (
        "convolution weight gradient (fp16)",
        "sm90_xmma_wgrad_indexed_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x64x"
        "64_warpgroupsize1x1x1_g1_execute_segment_k_on_kernel__5x_cudnn",
    ),
    (
        "convolution input gradient (bf16)",
        "sm80_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x32x32_s"
        "tage4_warpsize4x1x1_g1_tensor16x8x16_t1r3s3_execute_kernel__5x_cudnn",
    ),
    (
        "convolution forward (fp16)",
        "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warp"
        "groupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn",
    ),
    (
        "convolution input gradient (fp16)",
        "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816dgrad_optimized_f16_256x64"
        "_32x4_nhwc_unity_stride_align8>(cutlass_tensorop_f16_s16816dgrad_optimized_f16_256x6"
        "4_32x4_nhwc_unity_stride_align8::Params)",
    ),
    (
        "convolution weight gradient (bf16)",
        "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadb"
        "lock22ImplicitGemmMultistageINS_4gemm9GemmShapeILi64ELi128ELi32EEENS4_52Conv2dWgradO"
        "utputGradientTileAccessIteratorOptimizedINS_11MatrixShapeILi64ELi32EEENS_10bfloat16_"
        "tE",
    ),
    (
        "convolution forward (bf16)",
        "void convolve_common_engine_float_NHWC<__nv_bfloat16, __nv_bfloat16, 128, 5, 5, 3, 3"
        ", 3, true, false, false, false, false>(int, int, int)",
    ),
    (
        "matrix product (fp16)",
        "nvjet_sm90_hsh_64x32_64x16_1x2_h_bz_splitK_NTT",
    ),
    (
        "matrix product, split-K reduction (fp16)",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __half, float, __half, false,"
        " float, __half, __half, true, false, false, false>(cublasLt::cublasSplitKParams<floa"
        "t>)",
    ),
    (
        "max-pool backward (fp16)",
        "void at::native::(anonymous namespace)::max_pool_backward_nhwc<c10::Half, float>(c10"
        "::Half const*, long const*, int)",
    ),
    (
        "concatenation",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy_alignedK_contig<at::nati"
        "ve::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 128, 1, 8>(at::native::O"
        "paqueType<2u>*)",
    ),
    (
        "add (fp32)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>"
        ", std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*"
        ", 3ul>)",
    ),
    (
        "min (fp32)",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_"
        "wrapper_t<float, at::native::MinNanFunctor<float> >, unsigned int, float, 4, 4> >(at"
        "::native::ReduceOp<float>)",
    ),
    (
        "index_add (fp32)",
        "void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true, at::"
        "native::(anonymous namespace)::ReduceAdd>(at::cuda::detail::TensorInfo<float, unsign"
        "ed int>)",
    ),
    (
        "cuDNN workspace initialisation",
        "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cu"
        "dnn::implicit_gemm::wgrad_indexed::Warp_specialized_params<xmma__5x_cudnn::Grid_cons"
        "tant_params> >(xmma__5x_cudnn::implicit_gemm::wgrad_indexed::Warp_specialized_params"
        "<>, bool)",
    ),
    (
        "copy",
        "memcpy128",
    ),
]


@pytest.mark.parametrize(("what", "name"), CASES, ids=[what for what, _ in CASES])
def test_real_kernel_names_say_what_they_do(what, name):
    assert label(name) == what


def test_an_unknown_kernel_keeps_its_function_name():
    name = "void at::native::(anonymous namespace)::fancy_new_kernel<c10::Half, 4>(c10::Half*, int)"
    assert function_name(name) == "fancy_new_kernel"
    assert label(name) == "fancy_new_kernel (fp16)"
    assert label("reduction_prod_kernel") == "reduction_prod_kernel"
    # a fused Inductor kernel is not the op its name lists first
    assert label("triton_poi_fused_upsample_nearest2d_add_silu_3") == "Inductor pointwise"


@pytest.mark.parametrize(
    ("name", "what"),
    [  # from the fused fp16 step's profile on the H200 (2026-12-01-profile-fused-fp16-b16.json)
        ("triton_red_fused__native_batch_norm_legit_functional_17", "Inductor BatchNorm reduction"),
        (
            "triton_per_fused__native_batch_norm_legit_functional_copy__3",
            "Inductor BatchNorm persistent reduction",
        ),
        (
            "triton_poi_fused__native_batch_norm_legit_functional_silu_20",
            "Inductor BatchNorm pointwise",
        ),
        ("triton_per_fused_cat_max_pool2d_with_indices_54", "Inductor persistent reduction"),
        (
            "triton_poi_fused__to_copy__unsafe_index_put_new_zeros_slice_unsqueeze_1",
            "Inductor pointwise",
        ),
    ],
)  # fmt: skip
def test_inductor_kernels_say_their_kind_and_whether_they_are_batchnorm(name, what):
    assert label(name) == what
