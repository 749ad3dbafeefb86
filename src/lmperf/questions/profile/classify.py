"""Kernel and operator classifier: one category per CUDA kernel name or aten/CPU operator name.

`classify(name)` returns one of `CATEGORIES`. It is table-driven: `RULES` is an ordered list of
(category, regex); the first regex that matches (`re.search`) wins, and a name no rule matches is
"other". Names are matched as the profilers print them: torch.profiler's demangled kernel names
(`void at::native::vectorized_elementwise_kernel<4, ...>(...)`), Nsight's demangled names (the same
templates with `(int)4` and `[lambda() (instance 1)]`), cuBLAS/cutlass names, and aten operator
names (`aten::mm`). Before matching, two wrappers are unwrapped: the prefix
`autograd::engine::evaluate_function: ` is dropped, and an autograd node `XxxBackwardN` is read as
the op it differentiates (`MmBackward0` -> `aten::mm`, `NativeLayerNormBackward0` ->
`aten::native_layer_norm`).

The rules, in order (why the order matters is given after each):

 1. communication  NCCL kernels (`ncclDevKernel_*`, `ncclKernel_*`), `nccl:*` / `c10d::*` ops,
                   `record_param_comms`. First: `ncclDevKernel_ReduceScatter` is not a reduction.
 2. optimizer      `multi_tensor_apply_kernel` (foreach and fused Adam/SGD kernels), fused Adam
                   functors, `aten::_foreach_*`, `aten::_fused_adam(w)_` / `_fused_sgd_`,
                   `Optimizer.step#...` / `Optimizer.zero_grad#...`. Before elementwise and
                   reductions: a foreach add is not an elementwise op of the model, and
                   `_foreach_norm` (grad clipping) counts here too.
 3. attention_softmax (fused attention)  flash / memory-efficient / cuDNN SDPA kernels
                   (`flash_fwd_kernel`, `fmha_cutlassF_*`, `cudnn_generated_fort_native_sdpa_*`)
                   and the SDPA ops (`aten::scaled_dot_product_attention`,
                   `aten::_scaled_dot_product_*`, `aten::_flash_attention_*`,
                   `aten::_efficient_attention_*`). A fused kernel computes scores, softmax and the
                   value matmul in one launch and cannot be split, so it is filed under attention,
                   NOT under matmul: the matmul share of a run with SDPA excludes attention's
                   matmuls. Before matmul because `fmha_cutlassF` and FlashAttention-3 kernels are
                   cutlass templates.
 4. loss           `log_softmax` in any spelling (`aten::_log_softmax`, `LogSoftMaxForwardEpilogue`,
                   `softmax_warp_forward<..., is_log_softmax=true, ...>`), `nll_loss`,
                   `cross_entropy`, `ClassNLLCriterion`. cross_entropy = log_softmax + nll_loss is
                   the LM loss (a quarter of forward for a large vocabulary); attention never
                   calls log_softmax, so filing it under attention_softmax would show a softmax
                   share for a model whose attention has no softmax kernel at all (the naive
                   attention is amax/sub/exp/sum/div). Before the softmax rule (it contains
                   "softmax") and before reductions (`nll_loss_forward_reduce_cuda_kernel_2d`).
 4b. convolution   the aten convolution ops (`aten::conv2d`, `aten::convolution`,
                   `aten::cudnn_convolution`, `aten::convolution_backward`, `ConvolutionBackward0`)
                   and cuDNN / cutlass convolution kernels: `scudnn` and winograd kernels,
                   `implicit_convolve_sgemm`, `ImplicitGemmConvolution`, `dgrad` / `wgrad` /
                   `fprop` engines (`sm80_xmma_dgrad_implicit_gemm_*`, `wgrad_alg0_engine`,
                   `dgrad_engine`), depthwise and grouped direct convolutions. Before matmul:
                   an implicit-GEMM convolution is a convolution even where its name says gemm.
 5. Inductor kernels (`triton_<kind>_fused_<ops>_<n>`): by the op names Inductor writes into the
                   name -- softmax -> attention_softmax, layer/rms/group/batch norm -> normalization
                   -- then by kind: `triton_tem_*` -> matmul (templates are GEMMs in practice; a
                   flex-attention template would be misfiled), `triton_poi_*` -> elementwise,
                   `triton_red_*` / `triton_per_*` -> reduction. Before matmul: a fused reduction
                   may carry a GEMM wrapper op in its name
                   (`triton_red_fused_..._unquantized_gemm_rsqrt_0`).
 6. matmul         GEMM/GEMV kernels (`*gemm*`, `*gemv*`, cutlass, `sm80_xmma`, cuBLAS `nvjet_*`,
                   `splitKreduce_kernel` -- the second half of a split-K GEMM), and the aten ops
                   `mm, bmm, addmm, baddbmm, addbmm, matmul, linear, einsum, mv, addmv, dot, vdot,
                   _scaled_mm, _addmm_activation, _int_mm`. `aten::matmul`, `aten::linear` and
                   `aten::einsum` are parents of `aten::mm`/`aten::bmm` and carry little self time,
                   but they are matmul wherever they are counted. Before reductions because of
                   `splitKreduce`.
 7. attention_softmax  any remaining name with "softmax" (`cunn_SoftMaxForward`,
                   `softmax_warp_forward`, `aten::_softmax`, `aten::_softmax_backward_data`).
 8. normalization  layer/RMS/group/batch/instance norm in any spelling (`vectorized_layer_norm_kernel`,
                   `aten::native_layer_norm`, `aten::_fused_rms_norm`, `RMSNorm`, cuDNN's batch norm
                   `cudnn::bn_fw_tr_1C11_kernel_NCHW` / `bn_bw_1C11_kernel_new`) and the LayerNorm
                   backward helpers (`GammaBetaBackwardCUDAKernel`, `RowwiseMomentsCUDAKernel`,
                   `ComputeInternalGradientsCUDAKernel`, ...). The reference LM's RMSNorm is written
                   as pow/mean/rsqrt/mul, so on that model its time shows as elementwise and
                   reduction, not here.
 9. copy_cast      `direct_copy_kernel_cuda` (also dtype casts), `*copy_kernel*`,
                   `CatArrayBatchedCopy`, cuDNN's layout changes (`nchwToNhwcKernel`),
                   memcpy/memset in any spelling (`Memcpy HtoD`,
                   `[CUDA memcpy Host-to-Device]`, `cudaMemcpyAsync`), and the ops `copy_, to,
                   _to_copy, contiguous, clone, cat, stack, type_as, _copy_from`. Before
                   elementwise: a copy runs inside `at::native::elementwise_kernel<...direct_copy...>`.
10. reduction      `reduce_kernel` and anything else containing "reduce", CUB device reductions,
                   and the ops `sum, mean, amax, amin, max, min, argmax, argmin, norm,
                   linalg_vector_norm, prod, std, var, var_mean, std_mean, logsumexp, all, any,
                   cumsum, nansum`.
11. elementwise    `vectorized_/unrolled_/elementwise_kernel` and the pointwise ops (add, mul, div,
                   sub, neg, exp, pow, rsqrt, sqrt, sigmoid, silu, gelu, relu, tanh, where, fill_,
                   zero_, tril/triu, comparisons, lerp, addcmul, addcdiv, ... and their backward
                   ops such as `sigmoid_backward`).
12. other          everything else: views and reshapes, factories (`aten::empty`, `aten::ones`),
                   embedding/indexing, `aten::item`, annotation ranges, CUDA runtime calls
                   (`cudaLaunchKernel`), `AccumulateGrad`.

Names are classified by what they are, not by where they run: a single-tensor AdamW's
`aten::mul_` inside `Optimizer.step#AdamW.step` is elementwise; per-phase tables (the optimizer
range) are where optimizer time is read. Do not classify annotation range names: "computing
softmax" contains "softmax".
"""

from __future__ import annotations

import re

CATEGORIES: tuple[str, ...] = (
    "matmul", "convolution", "attention_softmax", "loss", "elementwise", "normalization",
    "reduction", "copy_cast", "optimizer", "communication", "other",
)


def _aten(*ops: str) -> str:
    """A regex for `aten::op`, `aten::_op`, `aten::op_` and `aten::_op_` (exact op names only)."""
    return r"^aten::_?(?:" + "|".join(ops) + r")_?$"


# softmax_warp_forward/backward<input_t, output_t, acc_t, log2_elements, is_log_softmax, ...>:
# the fifth template argument says whether the kernel is a log-softmax (PersistentSoftmax.cuh);
# demanglers print it as `true` (torch.profiler), `(bool)1` (Nsight) or `1` (cuobjdump).
_WARP_LOG_SOFTMAX = r"softmax_warp_(?:forward|backward)<(?:[^,<>]+,\s*){4}(?:true|\(bool\)1|1)\s*[,>]"

RULES: list[tuple[str, re.Pattern[str]]] = [
    ("communication", re.compile(r"(?i:nccl)|^c10d::|record_param_comms|^gloo:")),
    ("optimizer", re.compile(
        r"multi_tensor_apply|(?i:fused_?adam)|FusedSgd|^aten::_foreach_|"
        r"^aten::_fused_(?:adam|adamw|sgd|adagrad)_?$|^Optimizer\.(?:step|zero_grad)")),
    ("attention_softmax", re.compile(
        r"(?i:flash_?(?:fwd|bwd|attn|attention))|FlashAttn|fmha|(?i:scaled_dot_product)|"
        r"(?i:efficient_attention)|MemEffAttention|(?i:_sdpa_|native_sdpa)|^aten::_cudnn_attention")),
    ("loss", re.compile(
        r"(?i:log_?softmax)|" + _WARP_LOG_SOFTMAX + r"|(?i:nll_?loss)|(?i:cross_?entropy)|"
        r"ClassNLLCriterion")),
    ("convolution", re.compile(
        r"^aten::(?:_?convolution|conv(?:_transpose)?[123]d|cudnn_convolution|"
        r"_?convolution_backward|mkldnn_convolution|slow_conv\w*|thnn_conv\w*)(?:_backward)?$|"
        r"(?i:convolve|ImplicitGemmConvolution|scudnn|winograd)|(?:^|_)[dw]grad_|"
        r"(?:^|[_:])(?:fprop|dgrad|wgrad)(?:_|$)|wgrad_alg\d|dgrad_engine|conv2d_grouped_direct|"
        r"(?i:depthwise_?conv)")),
    # Inductor kernels: the op names it writes into the kernel name, then the kernel kind.
    ("attention_softmax", re.compile(r"^triton_\w*softmax")),
    ("normalization", re.compile(r"^triton_\w*(?:layer|rms|group|batch)_?norm")),
    ("matmul", re.compile(r"^triton_tem_")),
    ("elementwise", re.compile(r"^triton_poi_")),
    ("reduction", re.compile(r"^triton_(?:red|per)_")),
    ("matmul", re.compile(
        r"(?i:gemm|gemv)|cutlass|xmma|nvjet|cublas|" + _aten(
            "mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "einsum", "mv",
            "addmv", "dot", "vdot", "scaled_mm", "addmm_activation", "int_mm"))),
    ("attention_softmax", re.compile(r"(?i:softmax)")),
    ("normalization", re.compile(
        r"(?i:(?:layer|rms|group|batch|instance)_?norm)|(?:^|::)bn_(?:fw|bw)_|RowwiseMoments|GammaBetaBackward|"
        r"ComputeInternalGradients|ComputeGradientFusedParams|ComputeFusedParams|"
        r"Compute1dBackwardFusedParams|cuApplyLayerNorm|cuApplyRMSNorm|cuComputePartGradGammaBeta|"
        r"cuComputeGradGammaBeta|cuComputeGradInput")),
    ("copy_cast", re.compile(
        r"(?i:memcpy|memset)|copy_kernel|CatArrayBatchedCopy|(?i:nchwToNhwc|nhwcToNchw)|" + _aten(
            "copy", "to", "to_copy", "contiguous", "clone", "cat", "stack", "type_as",
            "copy_from", "copy_from_and_resize"))),
    ("reduction", re.compile(
        r"(?i:reduce)|" + _aten(
            "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm",
            "linalg_vector_norm", "prod", "std", "var", "var_mean", "std_mean", "logsumexp",
            "all", "any", "cumsum", "nansum"))),
    ("elementwise", re.compile(
        r"elementwise_kernel|triu_tril_kernel|" + _aten(
            "add", "sub", "rsub", "mul", "div", "neg", "exp", "exp2", "log", "log1p", "pow",
            "rsqrt", "sqrt", "square", "reciprocal", "abs", "sign", "sin", "cos", "erf",
            "sigmoid", "silu", "gelu", "relu", "tanh", "where", "masked_fill", "clamp",
            "clamp_min", "clamp_max", "maximum", "minimum", "fill", "zero", "lerp", "addcmul",
            "addcdiv", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
            "logical_not", "tril", "triu", "dropout", "native_dropout", "sigmoid_backward",
            "silu_backward", "gelu_backward", "threshold_backward", "tanh_backward"))),
]

_EVALUATE = "autograd::engine::evaluate_function: "
_BACKWARD_NODE = re.compile(r"^([A-Z][A-Za-z0-9]*?)Backward\d*$")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def normalize(name: str) -> str:
    """The name the rules see: the evaluate_function prefix dropped and an autograd node
    `XxxBackwardN` rewritten as `aten::xxx` (CamelCase -> snake_case)."""
    name = name.strip()
    if name.startswith(_EVALUATE):
        name = name[len(_EVALUATE):]
    node = _BACKWARD_NODE.match(name)
    if node:
        return "aten::" + _CAMEL_BOUNDARY.sub("_", node.group(1)).lower()
    return name


def classify(name: str) -> str:
    """The category (one of `CATEGORIES`) of a CUDA kernel or operator name; "other" if no rule
    matches. See the module docstring for the rules and their order."""
    key = normalize(name)
    for category, pattern in RULES:
        if pattern.search(key):
            return category
    return "other"



_LAMBDA = re.compile(r"::\{lambda\([^()]*\)#\d+\}|::operator\(\)\(\) const|\{lambda\([^()]*\)#\d+\}")
_NOISE = ("(anonymous namespace)::", "at::native::", "at::detail::", "at::cuda::", "at::",
          "c10::", "binary_internal::")


def short_name(name: str, depth: int = 2, width: int = 100) -> str:
    """A demangled kernel name shortened for reading: no leading `void`, no argument list, no
    `(anonymous namespace)::` / `at::native::` qualifiers or lambda frames, template arguments
    nested deeper than `depth` and parameter lists inside them written as `…`, at most `width`
    characters. Names without templates or arguments (`volta_sgemm_128x64_nn`, `aten::mm`) come
    back unchanged."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    for noise in _NOISE:
        text = text.replace(noise, "")
    text = _LAMBDA.sub("", text)
    out: list[str] = []
    level = paren = 0
    for i, ch in enumerate(text):
        if ch == "(" and level == 0 and paren == 0 and i > 0:
            break  # the kernel's own argument list
        if ch in "()" and level > 0:  # a function type or cast inside the template arguments
            if ch == "(" and paren == 0 and level <= depth:
                out.append("(…)")
            paren += 1 if ch == "(" else -1
            continue
        if paren > 0:
            continue
        if ch == "<":
            level += 1
            if level == depth + 1:
                out.append("<…>")
            if level > depth:
                continue
        elif ch == ">":
            level -= 1
            if level >= depth:
                continue
        elif level > depth:
            continue
        out.append(ch)
    text = "".join(out).strip()
    return text if len(text) <= width else text[:width - 1] + "…"
