"""GEMM-name decoding on real kernel names (issue 4's examples, seed 002's Nsight list, and
cuBLAS/CUTLASS names found in public profiles), and non-GEMM names that must decode to None."""

from __future__ import annotations

import pytest

from lmperf.questions.profile.gemm import FIELDS, decode_gemm, describe_gemm


def test_issue_example_xmma() -> None:
    g = decode_gemm("sm80_xmma_gemm_f32f32_tn_n_tilesize128x128x8")
    assert (g["family"], g["arch"], g["arch_family"]) == ("cublas", "sm80", "Ampere")
    assert g["inputs"] == "fp32"
    assert g["math"] is None  # the name states neither SIMT nor a tensor-core shape
    assert (g["tile"], g["tile_k"], g["layout"], g["layout_c"]) == ("128x128x8", 8, "tn", "n")
    assert describe_gemm("sm80_xmma_gemm_f32f32_tn_n_tilesize128x128x8") == (
        "Ampere (sm80), fp32 inputs, tile 128x128x8, layout tn (A transposed, B not), "
        "output layout n")


def test_issue_example_ampere_sgemm() -> None:
    g = decode_gemm("ampere_sgemm_128x64_tn")
    assert g["arch"] is None and g["arch_family"] == "Ampere"  # "ampere_" names no sm number
    assert (g["inputs"], g["accumulate"], g["math"], g["mma"]) == ("fp32", "fp32", "simt", None)
    assert (g["tile"], g["layout"], g["stages"]) == ("128x64", "tn", None)
    assert describe_gemm("ampere_sgemm_128x64_tn") == (
        "Ampere, fp32 SIMT, tile 128x64, layout tn (A transposed, B not)")


def test_issue_example_cutlass_simt() -> None:
    name = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nt_align1>(T1::Params)"
    g = decode_gemm(name)
    assert (g["family"], g["arch"], g["math"], g["inputs"]) == ("cutlass", "sm80", "simt", "fp32")
    assert (g["tile"], g["tile_k"], g["stages"], g["layout"], g["alignment"]) == ("128x32", 8, 5, "nt", 1)
    assert describe_gemm(name) == (
        "Ampere (sm80), fp32 SIMT, tile 128x32, K-tile 8, 5 stages, layout nt (B transposed, A not), "
        "align1")


@pytest.mark.parametrize("name, expected", [
    ("ampere_sgemm_32x128_tn", {"tile": "32x128", "layout": "tn", "math": "simt"}),
    ("ampere_sgemm_128x32_sliced1x4_nn", {"tile": "128x32", "sliced_k": "1x4", "layout": "nn"}),
    ("cutlass_80_simt_sgemm_128x64_8x5_nn_align1",
     {"arch": "sm80", "tile": "128x64", "tile_k": 8, "stages": 5, "layout": "nn", "alignment": 1}),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     {"arch": "sm90", "arch_family": "Hopper", "inputs": "bf16", "compute": "bf16",
      "accumulate": "fp32", "tile": "128x256x64", "layout": "tn", "layout_c": "n",
      "types": "bf16bf16_bf16f32_f32"}),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     {"inputs": "fp32", "compute": "tf32", "math": "tensor core"}),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize96x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel",
     {"inputs": "fp16", "accumulate": "fp32", "mma": "16x8x16", "math": "tensor core", "stages": 4}),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
     {"arch_family": "Ampere", "inputs": "fp16", "accumulate": "fp32", "mma": "16x8x16",
      "math": "tensor core", "tile": "128x128", "tile_k": 32, "stages": 5, "layout": "nn"}),
    ("ampere_fp16_s16816gemm_fp16_64x64_sliced1x2_ldg8_relu_f2f_stages_64x5_tn",
     {"epilogue": "relu", "sliced_k": "1x2", "tile_k": 64, "stages": 5}),
    ("volta_sgemm_128x64_nn", {"arch_family": "Volta", "inputs": "fp32", "math": "simt", "layout": "nn"}),
    ("void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1>"
     "(cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1::Params)",
     {"arch": "sm75", "arch_family": "Turing", "mma": "16x8x8", "output": "fp16", "tile": "256x128",
      "tile_k": None, "stages": None}),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8",
     {"inputs": "bf16", "output": "bf16", "accumulate": "fp32", "epilogue": "relu", "alignment": 8}),
    ("cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_align8_warpspecialized_pingpong_epi_tma",
     {"arch": "sm90", "mma": "64x128x16", "inputs": "bf16", "accumulate": "fp32", "output": "bf16",
      "tile": "128x128x64", "layout": "tn", "layout_c": "n", "alignment": 8}),
    ("nvjet_sm100_tst_64x16_64x16_2x4_2cta_h_bz_splitK_TNT",
     {"family": "cublas nvjet", "arch": "sm100", "split_k": True, "tile": None, "layout": None}),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
     "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >"
     "(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>, "
     "float, float)",
     {"kind": "gemv", "family": "cublas", "inputs": None, "layout": None}),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>"
     "(cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, "
     "float const*, float const*, float*, void*, long, float*, int*)",
     {"kind": "split-K reduction", "split_k": True}),
])
def test_real_gemm_names(name: str, expected: dict) -> None:
    g = decode_gemm(name)
    assert g is not None and set(g) == set(FIELDS)
    for key, value in expected.items():
        assert g[key] == value, key


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


def test_describe_tensor_core_and_nvjet() -> None:
    assert describe_gemm("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn") == (
        "Ampere, fp16 inputs, fp32 accumulate, tensor core (mma 16x8x16), tile 128x128, K-tile 32, "
        "5 stages, layout nn (neither transposed)")
    assert describe_gemm("nvjet_sm100_tst_64x16_64x16_2x4_2cta_h_bz_splitK_TNT") == (
        "cuBLAS nvjet GEMM (naming undocumented), Blackwell (sm100), split-K")


def test_unread_tokens_are_kept() -> None:
    g = decode_gemm("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn")
    assert g["unread"] == ["ldg8", "f2f"]


@pytest.mark.parametrize("name, unread", [
    ("ampere_sgemm_128x64_tn_splitK", []),
    ("ampere_h16816gemm_256x128_ldg8__splitk_nn", ["ldg8"]),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize96x128x32_stage3_SPLITK_warpsize2x2x1",
     ["warpsize2x2x1"]),
    ("nvjet_sm90_tst_128x128_64x4_1x2__v_bz_splitK_TNT", ["tst", "128x128", "64x4", "1x2", "v",
                                                          "bz", "TNT"]),
])
def test_every_family_reads_split_k_and_drops_empty_tokens(name: str, unread: list[str]) -> None:
    # What no family-specific rule reads goes through one rule in every family: splitK in any
    # case sets split_k, an empty token (a doubled underscore) is dropped, the rest is unread.
    g = decode_gemm(name)
    assert g["split_k"] is True
    assert g["unread"] == unread
