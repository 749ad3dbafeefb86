"""A plan's job on torchtitan 0.3.0: the `torchrun ... -m torchtitan.train` line (a config
function, `--section.key value` overrides, the activation-checkpoint subcommand) and, where 0.3
takes a setting only inside a config function (float8, a model flavor it lacks), the text of a
small config module lmperf writes beside the records; from a plan record's spec."""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

from lmperf.model.presets import DEFAULT_COURSE, VOCAB_SIZE as VOCAB, resolve_preset

TORCHTITAN = "torchtitan 0.3.0"  # torchtitan/config/{manager,configs}.py, models/llama3/
# lmperf preset -> torchtitan's llama3 flavor, its layer count (torchtitan splits pipeline stages
# over its own model's layers), its config function (None: none in 0.3), its HF assets folder
FLAVORS = {"llama3-1b": ("1B", 16, None, "Llama-3.2-1B"),
           "llama3-3b": ("3B", 28, None, "Llama-3.2-3B"),
           "llama3-8b": ("8B", 32, "llama3_8b", "Llama-3.1-8B"),
           "llama3-70b": ("70B", 80, "llama3_70b", "Llama-3.1-70B"),
           "llama3-405b": ("405B", 126, "llama3_405b", "Llama-3.1-405B")}
CHECKPOINT = {"none": "none", "full": "full", "op": "selective"}  # lmperf -> 0.3's subcommand
CONFIG = "lmperf_plan"  # the config function of the module lmperf writes
# what a record written before PP, CP, float8 and compile were planned means by their absence
DEFAULTS = {"course": DEFAULT_COURSE, "model": None, "gpus_per_node": 8, "pp": 1, "cp": 1,
            "pp_virtual": 1, "async_tp": False, "float8": "none", "compile": False}


def _plan(spec: dict) -> dict:
    """`spec` with the fields records written before PP/CP/float8 were planned lack, filled:
    one pipeline and context rank, no async TP, float8 or compile; the data-parallel degrees
    from the strategy (DDP replicates, ZeRO and FSDP shard)."""
    s = {**spec, **{k: v for k, v in DEFAULTS.items() if spec.get(k) is None}}
    if spec.get("dp_shard") is None:
        d = s["gpus"] // (s["tp"] * s["pp"] * s["cp"])
        s["dp_replicate"], s["dp_shard"] = (d, 1) if s["strategy"] == "ddp" else (1, d)
    if s["dp_shard"] * s["dp_replicate"] * s["tp"] * s["pp"] * s["cp"] != s["gpus"]:
        raise ValueError(f"degrees {s['dp_replicate']} x {s['dp_shard']} x tp {s['tp']} x pp "
                         f"{s['pp']} x cp {s['cp']} do not make {s['gpus']} GPUs")
    return s


def module_path(results: str | Path, search: str) -> Path:
    """Where the config module of search `search` goes beside the records file `results`: an
    importable name (torchtitan's --module takes a dotted path), absolute (torchtitan is run
    from its own checkout, whose recipes read ./assets)."""
    path = Path(results).resolve()
    name = re.sub(r"\W", "_", f"{path.stem}_{search}_torchtitan")
    return path.with_name(("m" if name[0].isdigit() else "") + name + ".py")


def _stages(layers: int, stages: int) -> tuple[str, list[str]]:
    """(override, note) that make torchtitan split `layers` blocks into `stages` stages by its
    own rule (embedding and output each weigh one layer): pipeline_parallel_layers_per_stage L
    where ceil((layers + 2) / L) is `stages`, else the stages' modules listed."""
    weighted = layers + 2
    per = math.ceil(weighted / stages)
    if math.ceil(weighted / per) == stages:
        return f"--parallelism.pipeline_parallel_layers_per_stage {per}", []
    base, extra = divmod(weighted, stages)  # torchtitan's _generate_llm_fqn_per_model_part
    parts, at = [], 0
    for i in range(stages):
        take = base + (i < extra) - (i == 0) - (i == stages - 1)
        names = [f"layers.{k}" for k in range(at, min(at + take, layers))]
        at += take
        parts.append(",".join((["tok_embeddings"] if i == 0 else []) + names
                              + (["norm", "lm_head"] if i == stages - 1 else [])))
    return ("--parallelism.module_fqns_per_model_part " + " ".join(parts),
            [f"no layers_per_stage splits {layers} layers into {stages} stages: the stages are "
             "listed"])


def _checkpoint(value: int | str) -> tuple[str, list[str]]:
    """(0.3's activation-checkpoint subcommand, note) of lmperf's checkpoint setting."""
    name = {0: "none", 1: "full", "every-1": "full"}.get(value, value)
    if name in CHECKPOINT:
        return CHECKPOINT[name], []
    what = (f"groups of {value} blocks" if isinstance(value, int)
            else f"one block in {value.removeprefix('every-')}")
    # full recomputes what the plan recomputes and keeps less: it fits where the plan does
    return "full", [f"the plan checkpoints {what}; {TORCHTITAN} checkpoints every block or per "
                    "op only: full is nearest (more recompute, less memory)"]


MODULE = '''"""{tt} config of an lmperf plan (search {search}): {size} on {gpus} GPUs.
PREDICTED by lmperf, not measured. torchtitan's {base} recipe, with what {tt} sets only in
a config function: the {what}. The command line sets the rest (yours to add: --training.steps,
--dataloader.dataset, --hf_assets_path: the recipe's otherwise):

    {line}
"""

{imports}


def lmperf_plan() -> Trainer.Config:
    """{base}() with this plan's {what}."""
    config = {base}()
{body}    config.loss.loss_fn.global_vocab_size = config.model_spec.model.vocab_size
    return config
'''
PRESET = '''    # lmperf's {size} (course {course}), a flavor torchtitan lacks: torchtitan's llama3
    # blocks at its shape (RoPE without Llama 3.1's frequency scaling, as lmperf's); its
    # vocabulary is {vocab}: --hf_assets_path a tokenizer of it
    dim, vocab = {dim}, {vocab}
    model = Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying={tied},
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab,
                              param_init=_output_linear_init(dim)),
        layers=_build_llama3_layers(
            n_layers={layers}, dim=dim, n_heads={heads}, n_kv_heads={kv}, hidden_dim={ff},
            rope=ComplexRoPE.Config(dim=dim // {heads}, max_seq_len={context}, theta={theta}),
            attn_backend="flex"))
'''


def _module(s: dict, line: str, flavor: str | None, base: str, assets: str | None) -> str:
    """The config module's text: torchtitan's recipe `base` with the plan's model (torchtitan's
    `flavor`, else lmperf's preset in torchtitan's llama3 blocks), float8 when planned."""
    llama3, imports, body = ["model_registry"], [], ""
    if s["float8"] != "none":
        imports.append("from torchtitan.components.quantization import Float8LinearConverter")
        body += ("    float8 = Float8LinearConverter.Config(  # lm_head kept bf16, as llama3_405b "
                 "does\n        recipe_name=\"rowwise\", filter_fqns=[\"lm_head\"], "
                 f"model_compile_enabled={s['compile']})\n")
    converters = ", converters=[float8]" if s["float8"] != "none" else ""
    if flavor:
        body += f'    config.model_spec = model_registry("{flavor}"{converters})\n'
    else:
        p = resolve_preset(s["size"], s["course"])
        llama3 = ["Llama3Model", "_build_llama3_layers", "_EMBEDDING_INIT", "_NORM_INIT",
                  "_output_linear_init", "model_registry"]
        imports.append("from torchtitan.models.common import ComplexRoPE, Embedding, Linear, "
                       "RMSNorm")
        body += PRESET.format(size=s["size"], course=s["course"], dim=p.d_model,
                              vocab=p.vocab_size or VOCAB, tied=p.tie_embeddings,
                              layers=p.num_layers, heads=p.num_heads,
                              kv=p.num_kv_heads or p.num_heads, ff=p.d_ff, context=s["context"],
                              theta=p.rope_theta or 10000.0)
        body += ("    model = float8.build().convert(model)\n" if converters else "") + (
            '    config.model_spec = dataclasses.replace(model_registry("8B"), '
            f'flavor="lmperf-{s["size"]}",\n                                            '
            "model=model)\n")
    if flavor == "405B" and base != "llama3_405b":  # llama3_405b's optimizer, not 70B's
        imports.append("from torchtitan.components.optimizer import default_adamw")
        body += ("    config.optimizer = default_adamw(lr=8e-5)  # llama3_405b's\n"
                 "    config.lr_scheduler.warmup_steps = 600\n")
    if assets:
        body += f'    config.hf_assets_path = "./assets/hf/{assets}"\n'
    imports += [f"from torchtitan.models.llama3 import {llama3[0]}" if len(llama3) == 1 else
                "from torchtitan.models.llama3 import (\n    " + ",\n    ".join(llama3) + ")",
                f"from torchtitan.models.llama3.config_registry import {base}",
                "from torchtitan.trainer import Trainer"]
    what = "model" + (" and float8" if s["float8"] != "none" else "")
    return MODULE.format(tt=TORCHTITAN, search=s.get("search", "?"), size=s["size"],
                         gpus=s["gpus"], base=base, what=what, line=line, body=body,
                         imports=("" if flavor else "import dataclasses\n\n")
                         + "\n".join(sorted(imports)))


def _flags(s: dict, layers: int, base: str) -> tuple[list[str], list[str]]:
    """(the overrides of plan `s` on torchtitan's recipe `base`, notes): degrees, batches,
    sequence length, precision, compile and async TP, pipeline stages of `layers` blocks."""
    notes, dp = [], s["dp_replicate"] * s["dp_shard"]
    flags = [f"--parallelism.data_parallel_shard_degree {s['dp_shard']}",
             f"--parallelism.tensor_parallel_degree {s['tp']}"]  # 70B's and 405B's recipes: 8
    if s["dp_replicate"] > 1:
        flags.insert(0, f"--parallelism.data_parallel_replicate_degree {s['dp_replicate']}")
    if s["cp"] > 1:
        flags.append(f"--parallelism.context_parallel_degree {s['cp']}")
    if s["pp"] > 1:  # local batch: the rank's whole batch, split into pipeline micro-batches
        local = math.ceil(s["global_batch"] / dp / s["micro_batch"]) * s["micro_batch"]
        split, more = _stages(layers, s["pp"] * s["pp_virtual"])
        notes += more
        flags += [f"--parallelism.pipeline_parallel_degree {s['pp']}",
                  f"--parallelism.pipeline_parallel_schedule {s.get('pp_schedule') or '1F1B'}",
                  split,
                  f"--parallelism.pipeline_parallel_microbatch_size {s['micro_batch']}",
                  "--training.disable_cuda_graphs"]  # 0.3 refuses PP with CUDA graphs on
        total = local * dp
    else:  # local batch: the micro-batch; torchtitan accumulates global / (local x dp) of them
        per_replica, local = s["global_batch"] // dp, s["micro_batch"]
        if per_replica % local:  # torchtitan's micro-batches are equal: keep the global batch
            local = max(b for b in range(1, local) if per_replica % b == 0)
            notes.append(f"the plan's micro-batches of {s['micro_batch']} leave a last one of "
                         f"{per_replica % s['micro_batch']}; torchtitan's are equal: "
                         f"{per_replica // local} of {local} (less memory)")
        total = local * dp * (per_replica // local)
    if total != s["global_batch"]:
        notes.append(f"the plan's global batch {s['global_batch']} does not split into whole "
                     f"micro-batches of {s['micro_batch']}: torchtitan runs {total}")
    flags += [f"--training.local_batch_size {local}", f"--training.global_batch_size {total}",
              f"--training.seq_len {s['context']}", "--training.mixed_precision_param "
              + ("float32" if s["precision"] == "fp32" else "bfloat16")]
    if s["precision"] == "bf16-mixed":
        notes.append(f"{TORCHTITAN} has no autocast: bf16 through FSDP2's mixed-precision policy "
                     "(bf16 compute and activations, fp32 master weights) is nearest")
    if s["strategy"] == "zero2":  # torch's SHARD_GRAD_OP: gathered in forward, kept for backward
        flags.append("--parallelism.fsdp_reshard_after_forward never")
    if s["strategy"] in ("zero1", "zero2"):
        notes.append(f"torchtitan has no {s['strategy']}: FSDP is nearest, parameters sharded too")
    if s["strategy"] == "ddp":
        notes.append("torchtitan replicates through FSDP2 on a replicate mesh, not torch DDP")
    if s["async_tp"] and not s["compile"]:
        notes.append("torchtitan's async TP needs torch.compile: compile is on")
    flags.append("--compile.enable" if s["compile"] or s["async_tp"] else "--compile.no-enable")
    if s["tp"] > 1 or s["async_tp"] or base == "llama3_405b":  # 405B's recipe turns it on
        flags.append("--compile.enable_async_tensor_parallel" if s["async_tp"]
                     else "--compile.no-enable-async-tensor-parallel")
    return flags, notes


def job(spec: dict, module: Path | None = None) -> tuple[str | None, str | None, list[str]]:
    """(the command line that runs `spec`'s plan on torchtitan 0.3, the text of the config
    module it needs at `module` or None, short notes: what 0.3 runs otherwise than the plan,
    and how to run the line). The line is None for a user's --model, which torchtitan cannot
    build. `module` None: the line names DIR and MODULE for the module's folder and name.
    Yours to add, as for any torchtitan job: --training.steps, --dataloader.dataset and
    --hf_assets_path (the recipe's otherwise)."""
    s = _plan(spec)
    if s["model"]:
        return None, None, [f"torchtitan cannot build your model {s['model']}: no torchtitan "
                            "form (port it to a torchtitan model with a config_registry)"]
    s["size"] = s["size"] or "mini"
    flavor, layers, function, assets = FLAVORS.get(s["size"], (None, 0, None, None))
    notes = [f"{TORCHTITAN} has no tensorwise float8: rowwise is nearest"] \
        if s["float8"] == "tensorwise" else []
    # torchtitan's own config function where it builds the plan's model as is (llama3_405b
    # converts a compiled model to float8), else a module on the recipe of the nearest size
    as_is = function is not None and (s["float8"] != "none") == (function == "llama3_405b") \
        and (function != "llama3_405b" or s["compile"])
    base = function if as_is else ("llama3_70b" if flavor in ("70B", "405B") else "llama3_8b")
    if not flavor:
        layers = resolve_preset(s["size"], s["course"]).num_layers
    flags, more = _flags(s, layers, base)
    mode, ckpt = _checkpoint(s["checkpoint"])
    nodes = -(-s["gpus"] // s["gpus_per_node"])
    where = module or Path("DIR/MODULE.py")
    line = ("" if as_is else f"PYTHONPATH={shlex.quote(str(where.parent))} ") + shlex.join(
        ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={min(s['gpus'], s['gpus_per_node'])}"]
        + (["--rdzv-backend=c10d", "--rdzv-endpoint=HOST:29500"] if nodes > 1 else [])
        + ["-m", "torchtitan.train", "--module"]
        + (["llama3", "--config", base] if as_is else [where.stem, "--config", CONFIG])
        + [w for f in flags for w in f.split(" ")] + [f"activation-checkpoint:{mode}"])
    head = (["DIR/MODULE.py: the config module, written beside the records (--out)"]
            if not as_is and module is None else [])
    if nodes > 1:
        head.append("run it on every node; HOST: the first node's address"
                    + ("; the config module at this path on each" if not as_is else ""))
    notes = head + notes + more + ckpt
    return line, None if as_is else _module(s, line, flavor, base, assets), notes


def write_beside(spec: dict, results: str | Path | None) -> dict:
    """The metrics that record `spec`'s torchtitan job: `torchtitan_command` (the line, None for
    a --model), `torchtitan_notes`, and `torchtitan_config`, the config module's path, written
    beside `results` when the job needs one (nothing is written when `results` is None)."""
    module = module_path(results, spec.get("search", "plan")) if results is not None else None
    line, text, notes = job(spec, module)
    out: dict = {"torchtitan_command": line, "torchtitan_notes": notes}
    if text is not None and module is not None:
        module.write_text(text, encoding="utf-8")
        out["torchtitan_config"] = str(module)
    return out
