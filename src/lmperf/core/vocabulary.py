"""The shared vocabulary: every option that more than one command has, defined once (OPTIONS;
the table of them: docs/concepts.md, "One vocabulary"), and the device-dependent (CPU vs CUDA)
defaults of every command (DEFAULTS), here and nowhere else.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from lmperf.names import COMPILE_MODES  # --compile-mode's choices (imported here by others)
# --checkpoint's one parse (and its sort key): defined in lmperf.validate, below every layer, so
# that the model can apply what the commands accept; every command calls it from here
from lmperf.validate import checkpoint_order, checkpoint_phrase, checkpoint_policy  # noqa: F401

# The thread policy, for the CLI and the Python API alike: on the CPU one intra-op thread unless
# --threads says otherwise, as torch.utils.benchmark.Timer does (why: docs/architecture.md);
# --threads 0 is torch's own default; on CUDA the host threads are left as torch sets them.
CPU_THREADS = 1

# command -> device type -> option -> default (None elsewhere means "the device's default").
# On CUDA the defaults of bench, profile and memory follow an edition of the course: see
# COURSE_DEFAULTS, which override these. A CPU default's bf16 regimes run only on a CPU with
# native bf16 (avx512_bf16 / AMX, else a measured matmul ratio): elsewhere they are 6-10x slower
# than fp32, so the plans leave them out with a one-line note (runtime.precision.default_regimes).
DEFAULTS: dict[str, dict[str, dict[str, object]]] = {
    "bench": {
        "cpu": {"size": ["tiny", "mini"], "context": [128], "precision": ["fp32", "bf16-mixed"]},
        "cuda": {"precision": ["fp32"]},
    },
    "profile": {
        "cpu": {"size": "mini", "context": 128, "precision": "fp32"},
        "cuda": {"precision": "fp32"},
    },
    "memory": {
        "cpu": {"size": "mini", "context": [128, 256, 512], "precision": ["fp32"]},
        "cuda": {"precision": ["fp32"]},
    },
    # Sized so that `lmperf train` with no arguments ends well inside two minutes on a 2-core
    # CPU with a loss still falling; on a GPU fp16 is fast, so the fp16 regimes join.
    "train": {
        "cpu": {"size": "tiny", "context": 64, "batch": 16, "steps": 200,
                "precision": ["fp32", "bf16-mixed", "bf16-true"]},
        "cuda": {"size": "mini", "context": 256, "batch": 32, "steps": 500,
                 "precision": ["fp32", "bf16-mixed", "bf16-true", "fp16-mixed",
                               "fp16-mixed-noscale", "fp16-true"]},
    },
    # `lmperf dist` with no arguments ends inside two minutes on a 2-core CPU (gloo, one thread
    # per rank); on CUDA "local" means every local GPU count from 2 up (comm) and all of them
    # (train, beside the single-GPU baseline).
    "dist": {
        "cpu": {"comm_world_size": [2, 4], "train_world_size": [1, 2],
                "sizes": ["1KiB", "16KiB", "256KiB", "1MiB", "4MiB", "16MiB"],
                "size": "tiny", "context": 64, "batch": 4, "warmup": 2, "steps": 5},
        "cuda": {"comm_world_size": ["local"], "train_world_size": ["local"],
                 "sizes": ["1MB", "4MB", "16MB", "64MB", "256MB", "1GB"],
                 "size": "xl", "context": 128, "batch": 4, "warmup": 3, "steps": 10},
    },
}

# THE shape a --model factory gets when no --size is given, in every command and on every
# device (docs/concepts.md, "Your own model"): one small preset that runs in seconds on a CPU.
MODEL_SIZE = "mini"


def model_shape_note(model: str, shape: str, size: str = MODEL_SIZE) -> str:
    """The one line every command prints for a --model run: what its factory was handed."""
    return f"model {model}: its factory receives {size}'s shape ({shape})"


# course edition -> command -> the CUDA defaults that edition's questions ask for (its
# benchmarking table, nsys_profile and memory_profiling runs).
COURSE_DEFAULTS: dict[str, dict[str, dict[str, object]]] = {
    "2025": {
        "bench": {"size": ["small", "medium", "large", "xl", "2.7B"],
                  "context": [128, 256, 512, 1024]},
        "profile": {"size": "small", "context": 128},
        "memory": {"size": "small", "context": [128, 256, 512, 1024]},
    },
    "2026": {
        "bench": {"size": ["small", "medium", "large", "xl", "10B"], "context": [512]},
        "profile": {"size": "small", "context": 256},
        "memory": {"size": "xl", "context": [128, 2048]},
    },
}


def device_defaults(command: str, device_type: str, course: str | None = None) -> dict[str, object]:
    """The defaults of `command` on a device type ('cpu' or 'cuda'); on CUDA the edition
    `course` (default: the current one) decides the course-shaped sweeps."""
    from lmperf.model.presets import DEFAULT_COURSE

    defaults = dict(DEFAULTS.get(command, {}).get(device_type, {}))
    if device_type == "cuda":
        defaults.update(COURSE_DEFAULTS.get(course or DEFAULT_COURSE, {}).get(command, {}))
    return defaults


def as_list(value: object) -> list | None:
    """The values of an option that may take several: None stays None, a scalar becomes a
    one-element list, a list or tuple a list (the API accepts `context=64` or `[64, 128]`)."""
    if value is None:
        return None
    return list(value) if isinstance(value, (list, tuple)) else [value]


def resolve_threads(threads: int | None, device_type: str) -> int:
    """The thread policy: None -> 1 on the CPU, 0 (torch's default) on CUDA; else as given."""
    if threads is None:
        return CPU_THREADS if device_type == "cpu" else 0
    return threads


@dataclass(frozen=True)
class Option:
    """One shared option: its flag, argparse type and help; `choices` lists accepted names
    (computed when the parser is built, so registries are read only then)."""

    flag: str
    help: str
    type: Callable | None = str
    metavar: str | None = None
    choices: Callable[[], Sequence[str]] | None = None
    default: object = None
    strict: bool = False  # argparse checks the choices (the spec checks the others, with a
                          # message that lists what is accepted)

    @property
    def dest(self) -> str:
        """The attribute name (and the Python API's keyword)."""
        return self.flag.lstrip("-").replace("-", "_")


def _names(module: str, attribute: str) -> Callable[[], Sequence[str]]:
    """The names of a registry, read when the parser is built (`--help` imports no more)."""
    return lambda: list(getattr(importlib.import_module(module), attribute))


OPTIONS: dict[str, Option] = {o.dest: o for o in [
    Option("--size", "model size preset (its shape depends on --course)", metavar="SIZE",
           choices=_names("lmperf.model.presets", "PRESETS")),
    Option("--course", "the edition of CS336 whose size table and CUDA default sweeps apply "
                       "(2026: xl = d 2560 / 32 layers, 10B, leaderboard; 2025: xl = d 1600 / "
                       "48 layers, 2.7B)", choices=_names("lmperf.model.presets", "COURSES"),
           strict=True, default="2026"),
    Option("--model", "your own model: a factory taking lmperf.model.ModelConfig and returning an "
                      "nn.Module mapping token ids (B, T) to logits (B, T, vocab); without --size "
                      f"it gets {MODEL_SIZE}'s shape, in every command", metavar="PKG.MOD:FACTORY"),
    Option("--context", "sequence length T", type=int, metavar="T"),
    Option("--batch", "batch size B", type=int, metavar="B", default=4),
    Option("--grad-accum", "N micro-batches of --batch per optimizer step, each loss / N "
                           "(gradient accumulation)", type=int, metavar="N", default=1),
    Option("--precision", "precision regime", metavar="REGIME",
           choices=_names("lmperf.names", "REGIME_NAMES")),
    Option("--checkpoint", "activation checkpointing: none, full (every block, torchtitan's "
                           "full), op (torchtitan's selective per-op policy: the outputs of "
                           "matmuls and attention saved, every other matmul and the rest "
                           "recomputed), every-K (one block in K, torchtitan 0.2's selective "
                           "layer option), or G (groups of G blocks; 0 = none, 1 = full)",
           metavar="POLICY"),
    Option("--float8", "float8 training of the Linear layers as torchao does it "
                       "(convert_to_float8_training with the recipe's scaling; the output head "
                       "left out, as torchtitan does), the rest of the step in --precision (a "
                       "bf16 regime); FP8 tensor cores: NVIDIA sm_89 and newer",
           choices=_names("lmperf.names", "FLOAT8_RECIPES"), strict=True, default="none"),
    Option("--attention", "attention implementation", metavar="IMPL",
           choices=_names("lmperf.names", "ATTENTION_NAMES"), default="naive"),
    Option("--device", "where to run: auto (CUDA when present), cpu or cuda", default="auto",
           choices=lambda: ["auto", "cpu", "cuda"], strict=True),
    Option("--threads", "torch CPU threads per run (default: 1 on the CPU, as "
                        "torch.utils.benchmark; 0: torch's default, all cores; untouched on CUDA)",
           type=int, metavar="N"),
    Option("--warmup", "untimed steps before measuring (0 allowed)", type=int, metavar="N"),
    Option("--steps", "measured steps", type=int, metavar="N"),
    Option("--seed", "seed of weights and data", type=int, default=0),
    Option("--out", "JSONL results file, appended to", type=Path, metavar="FILE"),
    Option("--format", "format of the printed tables", default="text",
           choices=lambda: ["text", "markdown", "latex", "csv"], strict=True),
    Option("--details", "text: every table and note in full (default: the answer first, then the "
                        "one or two tables behind it)", type=None),
    Option("--plots", "write the plots (PNG) into this folder", type=Path, metavar="DIR"),
    Option("--inline", "run in this process instead of one child process per job (debugging)",
           type=None),
    Option("--timeout", "kill a job after S seconds (an error row)", type=float, metavar="S"),
    Option("--max-memory-gib", "cap each job's memory so that a job that does not fit is an oom "
                               "row (CPU: the address space, which includes what a job maps "
                               "before it runs, about 0.94 GiB with a CPU build of torch and ~3 "
                               "GiB with a CUDA build; a cap within 256 MiB of it is refused "
                               "before anything runs; CUDA: the allocator's limit)",
           type=float, metavar="G"),
    Option("--resume", "skip jobs already 'ok' in --out", type=None),
    Option("--force", "run a job even when its pre-flight (one step simulated, as memory "
                      "--estimate does) says it cannot fit in the memory available; without it "
                      "such a job is an oom row marked predicted, in seconds", type=None),
    # the target of an estimate or a prediction (estimate.target.cluster builds it once)
    Option("--gpu", "a GPU of the peak table (lmperf.runtime.peaks: B200, H200, H100-SXM, "
                    "A100-80GB, RTX-4090, ...)", metavar="NAME"),
    Option("--gpus", "GPUs in all (CPU ranks with --device cpu)", type=int, metavar="N"),
    Option("--gpus-per-node", "GPUs per node; a group larger crosses the network (50 GB/s per "
                              "GPU unless said)", type=int, metavar="G", default=8),
    Option("--gib", "memory per device, GiB (default: the GPU's datasheet capacity)",
           type=float, metavar="G"),
    Option("--host-us", "the host's time to issue one op, microseconds (default: measured on the "
                        "GPU at hand, else 5; docs/accuracy.md)", type=float, metavar="US"),
    Option("--node-bandwidth", "network bandwidth between nodes, GB/s per GPU and direction "
                               "(default: 50, one 400 Gb/s NIC per GPU)", type=float,
           metavar="GB/S"),
    # the layout of a parallel step (estimate.layout.Layout validates it, once); in `plan` each
    # takes one or more values and a dimension not given is searched over all of its values
    Option("--tp", "tensor-parallel degree (Megatron's split with sequence and loss "
                   "parallelism, as torchtitan applies them)", type=int, metavar="T"),
    Option("--pp", "pipeline-parallel degree (ranks; torch.distributed.pipelining)", type=int,
           metavar="P"),
    Option("--cp", "context-parallel degree (the sequence split over ranks, ring attention as "
                   "torch's context_parallel runs it)", type=int, metavar="C"),
    Option("--dp-replicate", "data-parallel replicas (HSDP: replicate across, shard within; the "
                             "shard degree is what the other degrees leave)", type=int,
           metavar="R"),
    Option("--pp-schedule", "pipeline schedule, torch's names in any case",
           choices=_names("lmperf.names", "PP_SCHEDULES"), metavar="NAME"),
    Option("--pp-virtual", "pipeline stages per rank (looped schedules: 2 or more)", type=int,
           metavar="V"),
    Option("--micro-batch", "sequences per forward on a rank: torchtitan's local batch, or its "
                            "pipeline micro-batch under --pp", type=int, metavar="B"),
    Option("--async-tp", "overlap tensor parallelism's collectives with its matmuls (torch's "
                         "async TP)", choices=lambda: ["off", "on"], strict=True),
    # a model's shape beyond the presets (dist --estimate, plan; a preset's when not given)
    Option("--d-model", "model width", type=int, metavar="C"),
    Option("--d-ff", "feed-forward width", type=int, metavar="F"),
    Option("--num-layers", "blocks", type=int, metavar="L"),
    Option("--num-heads", "attention heads", type=int, metavar="H"),
    Option("--num-kv-heads", "K/V heads (grouped-query attention)", type=int, metavar="H"),
    Option("--vocab-size", "vocabulary (logits' columns; a user's model's own when it differs "
                           "from the default)", type=int, metavar="V"),
]}

LAUNCH = ("inline", "timeout", "max_memory_gib", "resume")
TARGET = ("gpu", "gpus", "gpus_per_node", "gib", "host_us")
LAYOUT = ("tp", "pp", "cp", "dp_replicate", "pp_schedule", "pp_virtual", "micro_batch",
          "async_tp")
SHAPE = ("d_model", "d_ff", "num_layers", "num_heads", "num_kv_heads", "vocab_size")


def on_off(flag: str, value: object) -> bool:
    """'on' / 'off' (or a bool) as a bool; SpecError naming `flag` otherwise."""
    from lmperf.errors import SpecError

    if isinstance(value, bool):
        return value
    if value in ("on", "off"):
        return value == "on"
    raise SpecError(f"{flag} takes off or on, got {value!r}")


def check_target(*, gpu: str | None = None, gpus: object = None, gpus_per_node: object = None,
                 gib: object = None, host_us: object = None) -> None:
    """THE checks of the target flags (the CLI's and the Python API's): a GPU of the peak
    table, GPU counts and GPUs per node positive integers, a positive memory budget, a host
    time >= 0 microseconds. Raises SpecError naming the flag."""
    from lmperf.errors import SpecError

    for name, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node)):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise SpecError(f"{name} must be a positive integer, got {v!r}")
    for name, value, ok, what in (("--gib", gib, lambda v: v > 0, "a positive number of GiB"),
                                  ("--host-us", host_us, lambda v: 0 <= v < 1e6,
                                   "a number of microseconds >= 0")):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value is not None and not (number and ok(value)):
            raise SpecError(f"{name} must be {what}, got {value!r}")
    if gpu is not None:
        from lmperf.runtime.peaks import require_device

        require_device(gpu)


# command -> removed flag -> what became of it. Removed flags are not options: a command line
# naming one is refused (exit 2) in one line that says so (`renamed`).
RENAMED: dict[str, dict[str, str]] = {
    "attention": {"--seq": "renamed --context", "--impl": "renamed --attention",
                  "--precision": "removed: attention runs no precision regime; --dtype is the "
                                 "tensors' dtype (fp32, bf16, fp16)",
                  "--repeats": "renamed --steps"},
    "train": {"--regime": "renamed --precision", "--warmup-steps": "renamed --lr-warmup",
              "--log-every": "removed: each job logs its first step and every --eval-interval"},
    "memory": {"--plot": "renamed --plots (a folder)"},
    "dist": {"--gpu-gib": "renamed --gib (one target flag for every command)",
             "--compress": "removed: torch-ddp all-reduces the gradients uncompressed",
             "--tflops": "removed with --estimate's preset rows (`lmperf plan` prices a preset)",
             "--host-us": "removed from dist with --estimate's preset rows (`lmperf plan` has it)",
             **dict.fromkeys(("--warmup-ms", "--rep-ms", "--no-checkpointing"),
                             "removed with `lmperf dist leaderboard`")},
    "amp": {"--plot": "renamed --plots (a folder)",
            "--model": "removed: amp trace follows the reference LM (the ToyModel: amp toy)"},
    "report": {"--output": "renamed --out (-o stays)"},
    "profile": {"--diff": "removed: compare two traces with HTA's TraceDiff, or runs with "
                          "lmperf compare",
                "--backend": "removed: torch.profiler is the one backend; for Nsight Systems run "
                             "nsys profile -t cuda,nvtx around lmperf (its phases are NVTX ranges)"},
}


# Flags that take a tensor dtype (fp32, bf16, fp16), never a precision regime.
DTYPE_FLAGS: tuple[str, ...] = ("--dtype", "--compute-dtype", "--comm-dtype")


def renamed(command: str | None, argv: Sequence[str]) -> str | None:
    """'--seq was renamed --context' for the first removed flag of `command` in `argv` (also
    as --flag=value), or '--dtype takes a tensor dtype ...' for a regime given to a dtype flag;
    None when there is neither. Read before argparse parses the line, which would take `--plot`
    for an abbreviation of `--plots`."""
    from lmperf.names import REGIME_NAMES

    table = RENAMED.get(command or "", {})
    flag = next((a.split("=")[0] for a in argv if a.split("=")[0] in table), None)
    if flag is not None:
        return f"{flag} was {table[flag]}"
    for i, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        values = [value] if value else list(argv[i + 1:i + 2])
        if flag in DTYPE_FLAGS and values and values[0] in REGIME_NAMES:
            return (f"{flag} takes a tensor dtype (fp32, bf16, fp16), not a precision regime; "
                    f"{values[0]} is a regime, " + ("and attention runs none" if command ==
                                                    "attention" else "which --precision takes"))
    return None


def did_you_mean(word: str, names: Sequence[str]) -> str:
    """'; did you mean X or Y?' naming the accepted names that `word` may stand for (those it
    begins, else difflib's close matches), or '' when none is close."""
    import difflib

    close = [n for n in names if n.startswith(word) and n != word]
    close = close or difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def add_options(parser: argparse.ArgumentParser, names: Sequence[str], *,
                lists: Sequence[str] = (), defaults: dict[str, object] | None = None,
                helps: dict[str, str] | None = None) -> None:
    """Add the shared options `names` to `parser`.

    lists: options that take several values here (a sweep axis, or rows of a table).
    defaults: this command's fixed defaults (device-dependent ones stay None: see DEFAULTS).
    helps: extra help text per option, appended to the shared one.
    """
    defaults, helps = defaults or {}, helps or {}
    for name in names:
        opt = OPTIONS[name]
        default = defaults.get(name, opt.default)
        text = opt.help + (f"; {helps[name]}" if name in helps else "")
        if opt.choices is not None:
            text += f" ({', '.join(opt.choices())})"
        if name in lists:
            text += "; several values sweep"
        if default is not None:
            shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
            text += f" (default: {shown})"
        if opt.type is None:  # a switch
            parser.add_argument(opt.flag, action="store_true", help=text)
            continue
        kwargs: dict = {"type": opt.type, "metavar": opt.metavar, "help": text}
        if opt.strict and opt.choices is not None:
            kwargs["choices"] = list(opt.choices())
            # the help lists the choices; a metavar keeps argparse from listing them again
            kwargs["metavar"] = opt.metavar or opt.dest.upper()
        if name in lists:
            kwargs["nargs"] = "+"
            default = list(default) if isinstance(default, (list, tuple)) else (
                None if default is None else [default])
        parser.add_argument(opt.flag, default=default, **kwargs)
    if "format" in names:  # a printed report: its records as --json, all of it with --details
        add_json(parser)
        add_options(parser, ("details",))


def add_compile(parser: argparse.ArgumentParser, many: bool, *, searched: bool = False) -> None:
    """--compile off|on (with `many`, both: a sweep axis) and --compile-mode: run the whole model
    through torch.compile; the compiling first step is timed apart (compile_s). `searched`
    (`plan`): the values a search prices, both when not given, and no --compile-mode."""
    if searched:
        parser.add_argument("--compile", nargs="+", choices=["off", "on"], default=None,
                            help="torch.compile of the model: the values searched (default: "
                                 "on; off is never faster in the plan's model)")
        return
    parser.add_argument("--compile", nargs="+" if many else None, choices=["off", "on"],
                        default=["off"] if many else "off",
                        help="torch.compile the whole model: off or on" + (
                            ", or both (a sweep axis)" if many else "")
                        + "; the compiling first step is timed apart as compile_s (default: off)")
    parser.add_argument("--compile-mode", default="default", choices=list(COMPILE_MODES),
                        help="torch.compile's mode (default: default)")


def compile_values(args: argparse.Namespace) -> list[bool] | bool:
    """--compile as the API's keyword: a list of booleans (or one, for a single value)."""
    value = args.compile
    return [v == "on" for v in value] if isinstance(value, list) else value == "on"


def add_json(parser: argparse.ArgumentParser) -> None:
    """--json [FILE]: the records as JSON on stdout (nothing else there), or into FILE."""
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                        help="write the records as JSON: on stdout with no FILE (then nothing "
                             "else is printed there), or into FILE")


def check_args(command: str, args: argparse.Namespace) -> None:
    """Refuse a bad value of a shared option in one line that names its flag, before the command
    imports torch (the specs check everything again, with the same words, for the Python API);
    an --out that cannot take records too (ResultsFileError), so no command starts a job first.

    `--precision` is a regime; `attention` has none (its `--dtype`, a tensor dtype, is checked
    by attention's plan). Raises SpecError.
    """
    from lmperf.errors import SpecError
    from lmperf.model.presets import DEFAULT_COURSE, EDITIONS, resolve_preset
    from lmperf.names import ATTENTION_NAMES, REGIME_NAMES

    def values(name: str) -> list:
        return as_list(getattr(args, name, None)) or []

    for name in ("context", "batch", "steps"):
        for v in values(name):
            if isinstance(v, int) and v <= 0:
                raise SpecError(f"--{name} must be a positive integer, got {v}")
    for name in (*LAYOUT[:3], "dp_replicate", "pp_virtual", "micro_batch", *SHAPE):
        for v in values(name):
            if isinstance(v, int) and v <= 0:
                raise SpecError(f"--{name.replace('_', '-')} must be a positive integer, got {v}")
    for name in ("warmup", "threads", "seed"):
        for v in values(name):
            if isinstance(v, int) and v < 0:
                raise SpecError(f"--{name} must be a non-negative integer, got {v}")
    course = getattr(args, "course", None) or DEFAULT_COURSE
    for v in values("size"):
        try:
            resolve_preset(v, course)
        except ValueError as exc:
            raise SpecError(f"--size: {exc}{did_you_mean(v, list(EDITIONS[course]))}") from None
    for v in values("checkpoint"):
        checkpoint_policy(v)
    if command != "attention":
        for v in values("precision"):
            if v not in REGIME_NAMES:
                raise SpecError(f"--precision: unknown regime {v!r}; accepted: "
                                f"{', '.join(REGIME_NAMES)}{did_you_mean(v, REGIME_NAMES)}")
    check_target(**{name: getattr(args, name) for name in TARGET if hasattr(args, name)})
    for v in values("attention"):
        if v not in ATTENTION_NAMES:
            raise SpecError(f"--attention: unknown implementation {v!r}; accepted: "
                            f"{', '.join(ATTENTION_NAMES)}{did_you_mean(v, ATTENTION_NAMES)}")
    if isinstance(getattr(args, "out", None), Path):  # the results file, before anything runs
        from lmperf.core.command import check_out

        check_out(args.out)
