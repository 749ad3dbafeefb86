"""Classifier cases on real names.

CUDA kernel names are copied as profilers printed them: the Nsight `cuda_gpu_kern_sum` list in
/work/shared/seeds/002 (A100, fp32, reference LM), and torch.profiler / Nsight tables found in
public repositories (cuDNN/xFormers SDPA, FlashAttention, NCCL, reductions, softmax). aten names
are those of a CPU torch.profiler trace of one TransformerLM train step (naive and sdpa attention,
fused and foreach AdamW) on torch 2.13.
"""

from __future__ import annotations

import pytest

from lmperf.questions.profile.classify import CATEGORIES, RULES, classify, normalize, short_name

SEED_COPY = (
    "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast"
    "<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 3)]::operator "
    "()() const::[lambda() (instance 7)]::operator ()() const::[lambda(float) (instance 1)]>"
    "(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)"
)
SEED_MUL = (
    "void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<float, float, "
    "float, at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)3>>"
    "(int, T2, T3)"
)
SEED_MUL_NOCAST = (
    "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast"
    "<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>"
    "(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)"
)
SEED_ADD = (
    "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
    "std::array<char *, (unsigned long)3>>(int, T2, T3)"
)

CUDA_CASES = [
    # GEMM: cuBLAS, cutlass (seed 002), xmma, nvjet, gemv / split-K helpers
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("ampere_sgemm_32x128_tn", "matmul"),
    ("ampere_sgemm_128x32_sliced1x4_nn", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nt_align1>(T1::Params)", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(T1::Params)", "matmul"),
    ("ampere_sgemm_64x32_sliced1x4_nt", "matmul"),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize96x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel",
     "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "matmul"),
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_32x6_nn", "matmul"),
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "matmul"),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>"
     "(cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, "
     "float const*, float const*, float*, void*, long, float*, int*)", "matmul"),
    # elementwise (seed 002)
    (SEED_MUL, "elementwise"),
    (SEED_MUL_NOCAST, "elementwise"),
    (SEED_ADD, "elementwise"),
    # copies and casts: direct_copy runs inside elementwise_kernel, the copy rule comes first
    (SEED_COPY, "copy_cast"),
    ("void at::native::vectorized_elementwise_kernel<(int)8, at::native::bfloat16_copy_kernel_cuda"
     "(at::TensorIteratorBase &)::[lambda() (instance 2)]", "copy_cast"),
    ("Memcpy HtoD (Pageable -> Device)", "copy_cast"),
    ("[CUDA memcpy Host-to-Device]", "copy_cast"),
    # softmax, and the loss's log-softmax which is not attention
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::Half*, c10::Half const*, int)",
     "attention_softmax"),
    ("softmax_warp_forward<float, float, float, 10, false, false>", "attention_softmax"),
    ("void <unnamed>::softmax_warp_backward<c10::BFloat16, c10::BFloat16, float, (int)9, (bool)1, "
     "(bool)0>(T2 *, const T1 *, const T1 *, int, int, int, const bool *)", "loss"),
    ("nll_loss_forward_reduce_cuda_kernel_2d<float, long>", "loss"),
    # fused attention: under attention_softmax, not matmul although fmha is a cutlass kernel
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention_softmax"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
     "cutlass::half_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::half_t> >, false, false, false, "
     "false, false, true, false, false>(pytorch_flash::Flash_fwd_params)", "attention_softmax"),
    ("cudnn_generated_fort_native_sdpa_sm120_flash_fprop_f16_knob_3_64x64x128_4x1x1_cga1x1x1",
     "attention_softmax"),
    # normalization
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, "
     "float const*, float const*, float const*, float*, float*, float*)", "normalization"),
    ("triton_per_fused_native_layer_norm_0", "normalization"),
    # cuDNN batch norm, as the real V100 trace (data/v100_ddp_sgd_5steps.json.gz) names it
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, "
     "float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, "
     "float*, float*, float*, float, float)", "normalization"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float, "
     "float, cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, "
     "float*, float const*, float*, float*, float const*, float const*, float)", "normalization"),
    # reductions (NormTwoOps is grad-norm, not normalization)
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
     "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float>, "
     "unsigned int, float, 4>)", "reduction"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
     "at::native::NormTwoOps<c10::BFloat16, float, c10::BFloat16>, unsigned int, c10::BFloat16, 4, 4> >",
     "reduction"),
    # an Inductor reduction (RMSNorm) whose fused-op list names a GEMM wrapper op
    ("triton_red_fused__to_copy_add_mean_mul_pow_rocm_unquantized_gemm_rsqrt_0.kd", "reduction"),
    # optimizer: foreach and fused AdamW kernels are multi_tensor_apply kernels
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
     "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor"
     "<float, 2, 2, 0>, std::plus<float>, float>", "optimizer"),
    # communication: a ReduceScatter is not a reduction
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
     "communication"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>",
     "communication"),
    # Inductor
    ("triton_poi_fused_add_addmm_gelu_mul_0", "elementwise"),
    ("triton_tem_fused__to_copy__unsafe_view_mm_mul_silu_split_view_7", "matmul"),
]

# Names of a CPU torch.profiler trace of a TransformerLM train step (torch 2.13).
ATEN_CASES = [
    ("aten::mm", "matmul"), ("aten::bmm", "matmul"), ("aten::matmul", "matmul"),
    ("aten::linear", "matmul"), ("aten::einsum", "matmul"), ("aten::addmm", "matmul"),
    ("MmBackward0", "matmul"),
    ("autograd::engine::evaluate_function: BmmBackward0", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention_softmax"),
    ("aten::scaled_dot_product_attention", "attention_softmax"),
    ("ScaledDotProductFlashAttentionForCpuBackward0", "attention_softmax"),
    ("aten::_log_softmax", "loss"), ("aten::log_softmax", "loss"),
    ("aten::_log_softmax_backward_data", "loss"), ("LogSoftmaxBackward0", "loss"),
    ("aten::cross_entropy_loss", "loss"), ("aten::nll_loss_forward", "loss"),
    # convolutions (issue 21 §6: were "other"), aten ops and cuDNN / cutlass kernels from the
    # real A100 and V100 traces of tests/profile/data
    ("aten::conv2d", "convolution"), ("aten::cudnn_convolution", "convolution"),
    ("aten::convolution_backward", "convolution"), ("ConvolutionBackward0", "convolution"),
    ("autograd::engine::evaluate_function: ConvolutionBackward0", "convolution"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, "
     "float const*, int, float const*, int, float*, kernel_grad_params, unsigned long long, int, "
     "unsigned long long, int, float, int, int, int)", "convolution"),
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "convolution"),
    ("void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, "
     "int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, "
     "int, int)", "convolution"),
    ("sm80_xmma_dgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_"
     "stage4_warpsize2x2x1_g1_tensor16x8x8_kernel", "convolution"),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnn::dimensionOrder_t)0>"
     "(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)", "copy_cast"),
    ("aten::_convert_indices_from_coo_to_csr", "other"),
    ("aten::add", "elementwise"), ("aten::add_", "elementwise"), ("aten::mul", "elementwise"),
    ("aten::div_", "elementwise"), ("aten::sub", "elementwise"), ("aten::neg", "elementwise"),
    ("aten::exp", "elementwise"), ("aten::pow", "elementwise"), ("aten::rsqrt", "elementwise"),
    ("aten::sigmoid", "elementwise"), ("aten::sigmoid_backward", "elementwise"),
    ("aten::where", "elementwise"), ("aten::fill_", "elementwise"), ("aten::tril", "elementwise"),
    ("aten::gelu", "elementwise"), ("aten::addcmul_", "elementwise"), ("aten::lerp_", "elementwise"),
    ("aten::native_layer_norm", "normalization"), ("aten::layer_norm", "normalization"),
    ("aten::rms_norm", "normalization"), ("aten::_fused_rms_norm", "normalization"),
    ("aten::sum", "reduction"), ("aten::mean", "reduction"), ("aten::amax", "reduction"),
    ("aten::linalg_vector_norm", "reduction"), ("SumBackward1", "reduction"),
    ("aten::copy_", "copy_cast"), ("aten::to", "copy_cast"), ("aten::_to_copy", "copy_cast"),
    ("aten::clone", "copy_cast"), ("aten::cat", "copy_cast"), ("aten::stack", "copy_cast"),
    ("aten::_foreach_add_", "optimizer"), ("aten::_foreach_addcdiv_", "optimizer"),
    ("aten::_fused_adamw_", "optimizer"), ("Optimizer.step#AdamW.step", "optimizer"),
    ("aten::view", "other"), ("aten::transpose", "other"), ("aten::embedding", "other"),
    ("aten::empty", "other"), ("aten::item", "other"), ("aten::_local_scalar_dense", "other"),
    ("torch::autograd::AccumulateGrad", "other"), ("cudaLaunchKernel", "other"),
]


@pytest.mark.parametrize("name, expected", CUDA_CASES + ATEN_CASES)
def test_real_names(name: str, expected: str) -> None:
    assert classify(name) == expected


def test_enough_real_cases() -> None:
    assert len(CUDA_CASES) + len(ATEN_CASES) >= 40


def test_rules_use_known_categories_and_cover_them() -> None:
    ruled = {category for category, _ in RULES}
    assert ruled <= set(CATEGORIES)
    assert set(CATEGORIES) - ruled == {"other"}  # the fallback needs no rule


def test_normalize_autograd_nodes() -> None:
    assert normalize("autograd::engine::evaluate_function: NativeLayerNormBackward0") == "aten::native_layer_norm"
    assert normalize("NllLossBackward0") == "aten::nll_loss"
    assert normalize("TBackward0") == "aten::t"
    assert normalize("ampere_sgemm_128x64_tn") == "ampere_sgemm_128x64_tn"


def test_unknown_is_other() -> None:
    assert classify("indexSelectLargeIndex") == "other"
    assert classify("") == "other"


@pytest.mark.parametrize("name, short", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
     "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, Array<char*, 3> >"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, "
     "float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps"
     "<float, float, float, float>, unsigned int, float, 4>)",
     "reduce_kernel<512, 1, ReduceOp<float, MeanOps<…>, unsigned int, float, 4> >"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
     "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::"
     "ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::"
     "{lambda(float)#1}, at::detail::Array<char*, 2> >(int, float, at::detail::Array<char*, 2>)",
     "vectorized_elementwise_kernel<4, launch_clamp_scalar(…), Array<char*, 2> >"),
    ("volta_sgemm_128x64_nn", "volta_sgemm_128x64_nn"),
    ("aten::mm", "aten::mm"),
])
def test_short_name(name: str, short: str) -> None:
    assert short_name(name) == short


def test_short_name_width() -> None:
    long = "void k<" + ", ".join(f"int{i}" for i in range(60)) + ">(int)"
    out = short_name(long, width=40)
    assert len(out) == 40 and out.endswith("…") and out.startswith("k<int0, int1")
