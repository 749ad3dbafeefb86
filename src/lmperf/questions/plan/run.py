"""What runs a plan: the lmperf command line of a candidate (one GPU: `lmperf bench`; N GPUs with
DDP, ZeRO or FSDP: `lmperf dist train`), and its torchtitan job config (TOML, the keys of
torchtitan's own schema, written by hand: no dependency) for the engine users scale on; both
from a plan record's spec (the request and the candidate)."""

from __future__ import annotations

import json

from lmperf.errors import SpecError
from lmperf.model.presets import DEFAULT_COURSE, require_plain, resolve_preset
from lmperf.questions.plan.spec import OPTIMIZER

# lmperf plan's strategy -> dist train's: torch's own engines, as the plan models them on GPUs;
# on CPU ranks the readable ones, whose blocking collectives the CPU plan models (--confirm's)
DIST = {"ddp": "torch-ddp", "zero1": "torch-zero1", "zero2": "torch-zero2", "fsdp": "fsdp2"}
READABLE = {"ddp": "flat", "zero1": "zero1", "fsdp": "fsdp"}
TORCHTITAN = ("torchtitan v0.2.2 (commit 73a0e69, 2026-02-20): torchtitan/config/job_config.py, "
              "torchtitan/models/llama3/train_configs/llama3_8b.toml")
FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B"}  # torchtitan's llama3_args of lmperf's presets


def _sizes(spec: dict, row: dict) -> tuple[int, int, int]:
    """(data-parallel degree d, sequences per replica and step, of which the last micro-batch)."""
    d = spec["gpus"] // row["tp"]
    per_replica = spec["global_batch"] // d
    return d, per_replica, per_replica - row["micro_batch"] * (row["grad_accum"] - 1)


def command(spec: dict, row: dict) -> str | None:
    """The lmperf command line that runs candidate `row` of the plan whose record spec is
    `spec`, with notes in parentheses after it; None where lmperf does not run it (FSDP x TP,
    a --model or a preset dist train does not build: the torchtitan config is the way)."""
    size, b, n = spec["size"] or "mini", row["micro_batch"], row["grad_accum"]
    notes = []
    if _sizes(spec, row)[2] != b:
        notes.append(f"the plan's last micro-batch holds {_sizes(spec, row)[2]}: this runs "
                     f"{n} x {b} sequences per rank and step")
    what = (f" --size {size}" + (f" --course {spec['course']}" if spec["course"] != DEFAULT_COURSE
                                 else "")
            + f" --context {spec['context']} --batch {b}" + (f" --grad-accum {n}" if n > 1 else "")
            + (f" --checkpoint {row['checkpoint']}" if row["checkpoint"] else "")
            + f" --attention {spec['attention']}" + (" --device cpu" if spec["device"] == "cpu"
                                                     else ""))
    if spec["gpus"] == 1:
        model = f" --model {spec['model']}" if spec["model"] else ""
        return (f"lmperf bench --mode train-step{model}{what} --precision {row['precision']}"
                f" --optimizer {OPTIMIZER[spec['device']]}"
                + (f"  ({'; '.join(notes)})" if notes else ""))
    try:
        require_plain(size, spec["course"], "dist train")
    except SpecError:
        return None
    names = READABLE if spec["device"] == "cpu" else DIST
    if row["tp"] > 1 or spec["model"] or row["strategy"] not in names:
        return None
    if row["strategy"] == "zero2" and n > 1:
        notes.append("torch-zero2 gathers the parameters once per micro-batch, the planned "
                     "ZeRO-2 once per step")
    flags = {"bf16-fsdp": " --compute-dtype bf16", "bf16-mixed": " --precision bf16-mixed"}
    return (f"lmperf dist train --world-size {spec['gpus']} --strategy {names[row['strategy']]}"
            + what + flags.get(row["precision"], "")
            + (" --bucket-mb 25" if names[row["strategy"]].startswith("torch-") else "")
            + " --no-reference" + (f"  ({'; '.join(notes)})" if notes else ""))


def torchrun(spec: dict, config: str) -> tuple[str, str]:
    """(torchtitan's launch line for `spec`'s GPUs, a note): every node's, meeting at HOST."""
    per_node = spec.get("gpus_per_node", 8)
    nodes = -(-spec["gpus"] // per_node)
    return (f"torchrun --nnodes={nodes} --nproc_per_node={min(spec['gpus'], per_node)}"
            + (" --rdzv-backend=c10d --rdzv-endpoint=HOST:29500" if nodes > 1 else "")
            + f" -m torchtitan.train --job.config_file {config}",
            "run it on every node; HOST: the first node's address" if nodes > 1 else "")


def torchtitan_toml(spec: dict, row: dict) -> str:
    """The torchtitan job config (TOML, torchtitan's keys; see TORCHTITAN) of candidate `row`
    of the plan whose record spec is `spec`: the model, data-parallel shard (or replicate)
    degree, tensor-parallel degree, activation checkpointing, local batch (the micro-batch),
    global batch (with torchtitan's gradient accumulation), sequence length and mixed
    precision; a comment wherever torchtitan has no exact equivalent."""
    d, _, last = _sizes(spec, row)
    b, n, g, strategy, t = (row[k] for k in ("micro_batch", "grad_accum", "checkpoint",
                                             "strategy", "tp"))
    size, ddp = spec["size"] or "mini", strategy == "ddp"
    doc = {"job": {"description": f"lmperf plan: {spec['model'] or size} on {spec['gpus']} GPUs, "
                                  f"context {spec['context']}, global batch {spec['global_batch']}"},
           "model": {"name": "llama3", "flavor": FLAVORS.get(size, size)},
           "training": {"local_batch_size": b, "global_batch_size": b * d * n,
                        "seq_len": spec["context"], "mixed_precision_param":
                        "float32" if row["precision"] == "fp32" else "bfloat16",
                        "mixed_precision_reduce": "float32"},
           "parallelism": {"data_parallel_replicate_degree": d if ddp else 1,
                           "data_parallel_shard_degree": 1 if ddp else d,
                           "tensor_parallel_degree": t},
           "activation_checkpoint": {"mode": "full" if g else "none"}}
    notes = {("model", "name"): spec["model"] and f"lmperf planned your model {spec['model']}: "
             "give torchtitan its own model (name, flavor) built the same way"}
    if size not in FLAVORS and not spec["model"]:
        p = resolve_preset(size, spec["course"])
        notes["model", "flavor"] = (
            f"torchtitan has no llama3 flavor for lmperf's {size}: add one to llama3_args "
            f"(torchtitan/models/llama3/__init__.py): dim={p.d_model}, n_layers={p.num_layers}, "
            f"n_heads={p.num_heads}, n_kv_heads={p.num_kv_heads or p.num_heads}, vocab_size="
            f"{p.vocab_size or 10000}, FFN hidden {p.d_ff}")
    if last != b:
        notes["training", "global_batch_size"] = (
            f"the plan's {spec['global_batch']}: torchtitan accumulates {n} micro-batches of {b}, "
            f"the plan's last holds {last}")
    if row["precision"] == "bf16-mixed" and not ddp:
        notes["training", "mixed_precision_param"] = (
            "the plan's bf16-mixed is autocast over fp32 weights; under FSDP torchtitan computes "
            "in bf16 through its MixedPrecisionPolicy (nearest)")
    if strategy == "zero2":  # torch's SHARD_GRAD_OP: gathered in forward, kept through backward
        doc["parallelism"]["fsdp_reshard_after_forward"] = "never"
    if t > 1:
        notes["parallelism", "tensor_parallel_degree"] = (
            "torchtitan's TP also applies sequence parallelism to the norms and loss parallelism, "
            "which lmperf's prediction does not model: memory and time differ")
    if strategy in ("zero1", "zero2"):
        notes["parallelism", "data_parallel_shard_degree"] = (
            f"torchtitan has no {strategy}: FSDP is nearest, with the parameters sharded too"
            + (" (kept from forward to backward)" if strategy == "zero2" else ""))
    if g > 1:
        notes["activation_checkpoint", "mode"] = (
            f"the plan checkpoints groups of {g} blocks; torchtitan one block at a time at most: "
            "'full' is nearest (the same recompute, more block inputs kept)")
    lines = [f"# torchtitan job config of an lmperf plan (search {spec.get('search', '?')}): "
             + (f"fsdp x tp {t}" if t > 1 else strategy) + f", {row['precision']}, "
             f"checkpoint groups {g or 'none'}, micro-batch {b} x {n}",
             f"# PREDICTED by lmperf, not measured; keys of {TORCHTITAN}",
             "# run: {} ({})".format(*torchrun(spec, "THIS_FILE")).replace(" ()", ""),
             "# yours to set: [training] steps (torchtitan's default 10000), dataset, and "
             "[model] hf_assets_path (the tokenizer)"]
    for section, keys in doc.items():
        lines += ["", f"[{section}]"]
        for key, value in keys.items():
            if notes.get((section, key)):
                lines.append(f"# {notes[section, key]}")
            lines.append(f"{key} = {json.dumps(value)}")  # a JSON string or int is TOML's too
    return "\n".join(lines) + "\n"
