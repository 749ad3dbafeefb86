"""Kernel and operator classifier: one category per CUDA kernel name or aten/CPU operator name.

`RULES` is an ordered list of (category, regex): the first that matches (`re.search`) wins, and
a name no rule matches is "other". Before matching, `autograd::engine::evaluate_function: ` is
dropped and an autograd node `XxxBackwardN` is read as the op it differentiates (`MmBackward0`
-> `aten::mm`). Every rule, the names it matches and why it comes where it does:
docs/commands/profile.md, "How operators and kernels are classified".
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
