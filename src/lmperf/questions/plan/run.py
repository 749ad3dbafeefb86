"""What runs a plan with lmperf: the command line of a candidate (one GPU: `lmperf bench`; N GPUs
with DDP, ZeRO, FSDP or an fp32 layout of TP, PP and HSDP: `lmperf dist train`), from a plan
record's spec (the request and the candidate); torchtitan's line for the engine users scale on
is `plan/torchtitan.py`'s."""

from __future__ import annotations

from lmperf.errors import SpecError
from lmperf.model.presets import DEFAULT_COURSE, require_plain
from lmperf.questions.plan.spec import OPTIMIZER

# lmperf plan's strategy -> dist train's: torch's own engines, as the plan models them
DIST = {"ddp": "torch-ddp", "zero1": "torch-zero1", "zero2": "torch-zero2", "fsdp": "fsdp2"}


def _sizes(spec: dict, row: dict) -> tuple[int, int, int]:
    """(data-parallel degree d, sequences per replica and step, of which the last micro-batch)."""
    d = spec["gpus"] // (row["tp"] * row["pp"] * row["cp"])
    per_replica = spec["global_batch"] // d
    return d, per_replica, per_replica - row["micro_batch"] * (row["grad_accum"] - 1)


def _layout(spec: dict, row: dict, what: str) -> str | None:
    """`lmperf dist train`'s line for a layout (TP, PP, HSDP) where it runs it: fp32, no
    checkpointing, no accumulation outside a pipeline, no context parallelism (torch's covers
    CUDA kernels only); its data-parallel part FSDP2 or none; None elsewhere."""
    if row["precision"] != "fp32" or row["checkpoint"] not in ("none", 0) or row["cp"] > 1 or \
            row["pp"] == 1 and row["grad_accum"] > 1:
        return None
    local = _sizes(spec, row)[1]
    what = what.replace(f" --batch {row['micro_batch']}", f" --batch {local}")
    flags = "".join(f" --{k.replace('_', '-')} {row[k]}" for k in ("tp", "pp", "dp_replicate")
                    if row[k] > 1)
    if row["pp"] > 1:
        flags += f" --pp-schedule {row['pp_schedule']} --micro-batch {row['micro_batch']}" + (
            f" --pp-virtual {row['pp_virtual']}" if row["pp_virtual"] > 1 else "")
    return (f"lmperf dist train --world-size {spec['gpus']} --strategy "
            f"{'fsdp2' if row['strategy'] == 'fsdp' else 'none'}{what}{flags} --no-reference")


def command(spec: dict, row: dict) -> str | None:
    """The lmperf command line that runs candidate `row` of the plan whose record spec is
    `spec`, with notes in parentheses after it; None where lmperf does not run it (a layout in
    bf16 or checkpointed, a --model or a preset dist train does not build: torchtitan's line
    is the way)."""
    size, b, n = spec["size"] or "mini", row["micro_batch"], row["grad_accum"]
    notes = []
    if _sizes(spec, row)[2] != b:
        notes.append(f"the plan's last micro-batch holds {_sizes(spec, row)[2]}: this runs "
                     f"{n} x {b} sequences per rank and step")
    what = (f" --size {size}" + (f" --course {spec['course']}" if spec["course"] != DEFAULT_COURSE
                                 else "")
            + f" --context {spec['context']} --batch {b}" + (f" --grad-accum {n}" if n > 1 else "")
            + (f" --checkpoint {row['checkpoint']}" if row["checkpoint"] not in ("none", 0)
               else "")
            + f" --attention {spec['attention']}" + (" --device cpu" if spec["device"] == "cpu"
                                                     else ""))
    levers = (" --compile on" if row.get("compile") else "") + (
        f" --float8 {row['float8']}" if row.get("float8", "none") != "none" else "")
    if spec["gpus"] == 1:
        model = f" --model {spec['model']}" if spec["model"] else ""
        return (f"lmperf bench --mode train-step{model}{what} --precision {row['precision']}"
                f" --optimizer {OPTIMIZER[spec['device']]}{levers}"
                + (f"  ({'; '.join(notes)})" if notes else ""))
    if levers:  # dist train compiles nothing and runs no float8: torchtitan's line
        return None
    try:
        require_plain(size, spec["course"], "dist train")
    except SpecError:
        return None
    if spec["model"]:
        return None
    if row["tp"] > 1 or row["pp"] > 1 or row["cp"] > 1 or \
            row["dp_replicate"] > 1 and row["strategy"] != "ddp":
        return _layout(spec, row, what)
    if row["strategy"] not in DIST:
        return None
    if row["strategy"] == "zero2" and n > 1:
        notes.append("torch-zero2 gathers the parameters once per micro-batch, the planned "
                     "ZeRO-2 once per step")
    flags = {"bf16-fsdp": " --compute-dtype bf16", "bf16-mixed": " --precision bf16-mixed"}
    return (f"lmperf dist train --world-size {spec['gpus']} --strategy {DIST[row['strategy']]}"
            + what + flags.get(row["precision"], "")
            + (" --bucket-mb 25" if DIST[row["strategy"]].startswith("torch-") else "")
            + " --no-reference" + (f"  ({'; '.join(notes)})" if notes else ""))

