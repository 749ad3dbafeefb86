"""GEMM-name decoding on real kernel names (issue 4's examples, seed 002's Nsight list, and
cuBLAS/CUTLASS names found in public profiles), and non-GEMM names that must decode to None."""

from __future__ import annotations

import pytest

from lmperf.questions.profile.gemm import FIELDS, decode_gemm, describe_gemm


@pytest.mark.parametrize("name, expected, text", [
    ("ampere_sgemm_128x64_tn",  # seed 002's top kernel
     {"arch_family": "Ampere", "arch": None, "inputs": "fp32", "math": "simt", "tile": "128x64",
      "layout": "tn"}, "Ampere, fp32 SIMT, tile 128x64, layout tn"),
    ("ampere_sgemm_128x32_sliced1x4_nn", {"tile": "128x32", "layout": "nn", "math": "simt"}, None),
    ("volta_sgemm_128x64_nn", {"arch_family": "Volta", "inputs": "fp32", "math": "simt"}, None),
    ("sm80_xmma_gemm_f32f32_tn_n_tilesize128x128x8",
     {"family": "cublas", "arch": "sm80", "arch_family": "Ampere", "inputs": "fp32",
      "math": None, "tile": "128x128x8", "layout": "tn"},
     "Ampere (sm80), fp32 inputs, tile 128x128x8, layout tn"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nt_align1>(T1::Params)",
     {"family": "cutlass", "arch": "sm80", "math": "simt", "inputs": "fp32", "tile": "128x32",
      "layout": "nt"}, "Ampere (sm80), fp32 SIMT, tile 128x32, layout nt"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize1x1x1_execute_"
     "segment_k_off_kernel__5x_cublas",
     {"arch_family": "Hopper", "inputs": "bf16", "accumulate": "fp32", "tile": "128x256x64",
      "layout": "tn"}, None),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_"
     "segment_k_off_kernel__5x_cublas",
     {"inputs": "fp32 (TF32 compute)", "math": "tensor core"}, None),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize96x128x32_stage4_warpsize2x2x1_tensor16x8x16_"
     "kernel", {"inputs": "fp16", "accumulate": "fp32", "math": "tensor core"},
     "Ampere (sm80), fp16 inputs, fp32 accumulate, tensor cores, tile 96x128x32, layout tn"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
     {"inputs": "fp16", "accumulate": "fp32", "math": "tensor core", "tile": "128x128",
      "layout": "nn"}, "Ampere, fp16 inputs, fp32 accumulate, tensor cores, tile 128x128, layout nn"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1>"
     "(cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1::Params)",
     {"arch": "sm75", "arch_family": "Turing", "math": "tensor core", "tile": "256x128"}, None),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8",
     {"inputs": "bf16", "accumulate": "fp32", "math": "tensor core"}, None),
    ("cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_"
     "align8_warpspecialized_pingpong_epi_tma",
     {"arch": "sm90", "inputs": "bf16", "accumulate": "fp32", "math": "tensor core",
      "tile": "128x128x64", "layout": "tn"}, None),
    ("nvjet_sm100_tst_64x16_64x16_2x4_2cta_h_bz_splitK_TNT",
     {"family": "cublas nvjet", "arch": "sm100", "tile": None}, "cuBLAS nvjet GEMM, Blackwell (sm100)"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
     "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >"
     "(...)", {"kind": "gemv", "family": "cublas", "inputs": None}, "cuBLAS gemv"),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>"
     "(cublasSplitKParams<float>, float const*, float const*, float*, float const*)",
     {"kind": "split-K reduction"}, None),
])
def test_real_gemm_names(name: str, expected: dict, text: str | None) -> None:
    g = decode_gemm(name)
    assert g is not None and set(g) == set(FIELDS)
    for key, value in expected.items():
        assert g[key] == value, key
    if text is not None:
        assert describe_gemm(name) == text


@pytest.mark.parametrize("name", [
    "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
    "std::array<char *, (unsigned long)3>>(int, T2, T3)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, "
    "float const*, float const*, float const*, float*, float*, float*)",
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80",
    "ampere_scudnn_128x64_relu_interior_nn_v1",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
    "aten::mm",
    "",
])
def test_non_gemm_names_are_none(name: str) -> None:
    assert decode_gemm(name) is None
    assert describe_gemm(name) == ""
