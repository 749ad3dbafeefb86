"""`lmperf memory`: peaks per phase, saved activations, estimates, checkpointing, snapshots."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the module stays cheap to import: lmperf.cli imports it for --help
    from lmperf.workload.spec import RunSpec

DEFAULT_OUT = Path("results") / "memory.jsonl"
CPU_DEFAULTS = {"size": "mini", "contexts": [128, 256, 512]}
CUDA_DEFAULTS = {"size": "small", "contexts": [128, 256, 512, 1024]}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf memory`."""
    from lmperf.workload.spec import MODES
    from lmperf.model import ATTENTION, PRESETS
    from lmperf.runtime.precision import REGIMES

    p = sub.add_parser(
        "memory", help="where the memory goes: peaks per phase, saved activations, estimates, "
                       "checkpointing, CUDA snapshots",
        description="Peak memory per phase (forward-only and train step) across context lengths, "
                    "what autograd saves per block, the analytic estimate (--estimate, --gib), "
                    "activation checkpointing's trade-off (--checkpoint) and CUDA snapshot "
                    "summaries (--snapshot). CPU figures are process RSS, never GPU memory.")
    # bench's spec flags, one model per run: --context and --precision take lists (rows and
    # columns of the table), the others one value.
    p.add_argument("--size", metavar="SIZE",
                   help=f"model size preset: {', '.join(PRESETS)} "
                        "(default: mini on CPU, small on CUDA)")
    p.add_argument("--model", metavar="PKG.MOD:FACTORY",
                   help="your own model (factory taking lmperf.model.ModelConfig); no --estimate "
                        "or --checkpoint for it")
    p.add_argument("--context", type=int, nargs="+", metavar="T",
                   help="context lengths (default: 128 256 512 on CPU; up to 1024 on CUDA)")
    p.add_argument("--model-context", type=int, default=0, metavar="T",
                   help="the model's maximum context length (default: the longest --context)")
    p.add_argument("--batch", type=int, default=4, metavar="B", help="batch size (default: 4)")
    p.add_argument("--precision", nargs="+", metavar="REGIME", default=["fp32"],
                   help=f"precision regime(s), one column each: {', '.join(REGIMES)} "
                        "(default: fp32)")
    p.add_argument("--mode", nargs="+", metavar="MODE", default=["forward", "train-step"],
                   help=f"steps to measure: {', '.join(MODES)} (default: forward train-step)")
    p.add_argument("--attention", default="naive", metavar="IMPL",
                   help=f"attention implementation: {', '.join(ATTENTION)} (default: naive)")
    p.add_argument("--optimizer", default="auto", choices=["auto", "fused", "foreach", "loop"],
                   help="AdamW implementation (default: auto)")
    p.add_argument("--warmup", type=int, default=1,
                   help="train steps before measuring: AdamW's state exists after the first "
                        "(default: 1)")
    p.add_argument("--steps", type=int, default=3,
                   help="timed steps per --checkpoint size (default: 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and batch (default: 0)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="(default: auto)")
    p.add_argument("--estimate", action="store_true",
                   help="print the analytic estimate only (nothing is allocated; --device cuda "
                        "estimates for a GPU from any machine)")
    p.add_argument("--gib", type=float, metavar="N", help="will it fit in N GiB? (implies --estimate)")
    p.add_argument("--checkpoint", type=int, nargs="+", metavar="G",
                   help="activation checkpointing trade-off over block-group sizes (0: none)")
    p.add_argument("--snapshot", type=Path, metavar="FILE",
                   help="summarise a CUDA memory snapshot pickle (no browser, no GPU needed)")
    p.add_argument("--top", type=int, default=10, help="rows of the top tables (default: 10)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"JSONL results file the records are appended to (default: {DEFAULT_OUT})")
    p.add_argument("--format", default="text", choices=["text", "markdown", "latex"])
    p.add_argument("--plot", type=Path, metavar="PNG",
                   help="memory vs context length (with --snapshot: active memory over time)")
    p.set_defaults(func=cmd_memory)


def _positive(name: str, value: float | None, allow_zero: bool = False) -> None:
    from lmperf.errors import SpecError

    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        what = "non-negative" if allow_zero else "positive"
        raise SpecError(f"{name} must be {what}, got {value:g}")


def build_spec(args: argparse.Namespace) -> tuple[RunSpec, list[int], list[str], list[str]]:
    """The base RunSpec (longest context), contexts, precisions and modes; raises SpecError."""
    import torch

    from lmperf.workload.build import resolve_optimizer
    from lmperf.workload.spec import RunSpec
    from lmperf.runtime.device import resolve_device

    if args.estimate and args.device == "cuda":
        device = torch.device("cuda")  # an estimate for a GPU needs no GPU here
    else:
        device = resolve_device(args.device)
    defaults = CUDA_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    contexts = sorted(dict.fromkeys(args.context or defaults["contexts"]))
    for t in contexts:
        _positive("--context", t)
    _positive("--top", args.top)
    _positive("--gib", args.gib)
    _positive("--warmup", args.warmup, allow_zero=True)
    _positive("--steps", args.steps)
    # RunSpec checks names and sizes; its warmup must be positive, and --warmup 0 is allowed
    # here (the first measured train step then creates AdamW's state).
    optimizer = "fused" if args.estimate else resolve_optimizer(args.optimizer, device)
    base = RunSpec.from_size(args.size or defaults["size"], context_length=contexts[-1],
                             model_context_length=args.model_context, batch_size=args.batch,
                             precision=args.precision[0], mode=args.mode[0],
                             attention=args.attention, optimizer=optimizer,
                             warmup=max(args.warmup, 1), steps=args.steps, seed=args.seed,
                             device=device.type, model=args.model)
    precisions = list(dict.fromkeys(args.precision))
    modes = list(dict.fromkeys(args.mode))
    for value in precisions[1:]:
        base.with_(precision=value)
    for value in modes:
        base.with_(mode=value)
    if args.model:
        from lmperf.workload.build import check_user_models

        check_user_models([base])
    return base, contexts, precisions, modes


def cmd_memory(args: argparse.Namespace) -> int:
    """Run what the flags ask for, print tables and findings, append the records."""
    from lmperf.errors import SpecError
    from lmperf.memory import report
    from lmperf.results.store import append_record, ensure_writable

    started = time.perf_counter()
    if args.snapshot is not None:
        from lmperf.memory.snapshot import summarize_snapshot  # the other half of this command

        summary = summarize_snapshot(args.snapshot, args.plot)
        sys.stdout.write(report.render(summary.tables, summary.notes, args.format))
        if summary.png:
            print(f"plot: {summary.png}", file=sys.stderr)
        return 0
    if args.gib is not None:
        args.estimate = True  # --gib asks a question only the estimate answers
    base, contexts, precisions, modes = build_spec(args)
    if args.model and (args.estimate or args.checkpoint):
        raise SpecError("--estimate and --checkpoint know the reference LM only, not --model")
    if args.checkpoint:
        from lmperf.memory.checkpointing import check_groups

        check_groups(args.checkpoint, base.num_layers)  # bad sizes fail before anything runs
    ensure_writable(args.out)
    if args.estimate:
        tables, notes, recs = _estimate(base, contexts, precisions, modes, args.gib)
    elif args.checkpoint:
        tables, notes, recs = _checkpoint(base, contexts, precisions, args)
    else:
        tables, notes, recs = _phases_and_saved(base, contexts, precisions, modes, args)
    for record in recs:
        append_record(args.out, record)
    sys.stdout.write(report.render(tables, notes, args.format))
    print(f"({time.perf_counter() - started:.1f} s; {len(recs)} record(s) appended to {args.out})",
          file=sys.stderr)
    return 0


Outcome = tuple[list, list[str], list[dict]]  # (titled tables, findings, records)


def _estimate(base: RunSpec, contexts: list[int], precisions: list[str], modes: list[str],
              gib: float | None) -> Outcome:
    """The analytic breakdown per (precision, context); allocates nothing."""
    from lmperf.memory import report
    from lmperf.memory.estimate import estimate

    mode = "train-step" if "train-step" in modes else modes[-1]
    ests = [estimate(base.model_config(), base.batch_size, t, p, base.attention, mode,
                     device=base.device) for p in precisions for t in contexts]
    tables, notes = report.estimate_section(ests, gib)
    items = [({"context_length": e.context, "precision": e.regime, "mode": e.mode},
              "ok", {"estimate": {**e.__dict__, "total_bytes": e.total_bytes},
                     "gib": gib, "fits": None if gib is None else e.total_bytes <= gib * 2**30})
             for e in ests]
    return tables, notes, report.records(base, "estimate", items, ests[0].params if ests else None)


def _phases_and_saved(base: RunSpec, contexts: list[int], precisions: list[str],
                      modes: list[str], args: argparse.Namespace) -> Outcome:
    """Per-phase peaks (one model per precision) and saved-tensor accounting per context."""
    import torch

    from lmperf.memory import report
    from lmperf.memory.estimate import estimate
    from lmperf.memory.phases import baseline_mib, measure_phases
    from lmperf.memory.saved import measure_spec, meta_equivalent

    device = torch.device(base.device)
    baseline = baseline_mib(device)
    _progress(f"peak memory per phase: {len(precisions)} precision(s) x {len(contexts)} context(s) "
              f"x {', '.join(modes)} ...")
    rows = measure_phases(base, contexts, precisions, tuple(modes), warmup=args.warmup)
    reference = base.model is None
    estimates = {(r.precision, r.context, r.mode): estimate(
        r.spec.model_config(), r.spec.batch_size, r.context, r.precision, r.spec.attention, r.mode,
        device=device.type) for r in rows if reference}
    tables, notes = report.phases_section(rows, estimates, baseline)
    saved, saved_est = {}, {}
    for p in precisions:
        for t in contexts:
            spec = base.with_(precision=p, context_length=t)
            on = torch.device("meta") if meta_equivalent(spec) else device
            _progress(f"saved for backward: {p}, context {t} (on {on.type}) ...")
            saved[(p, t)] = measure_spec(spec, on)
            saved_est[(p, t)] = (estimate(spec.model_config(), spec.batch_size, t, p,
                                          spec.attention, "train-step", device=device.type)
                                 if reference else None)
    more, more_notes = report.saved_section(saved, saved_est, args.top)
    if args.plot:
        path = report.plot_contexts(rows, saved, estimates, baseline or 0.0, args.plot)
        more_notes.append(f"plot: {path}")
    items = [({"context_length": r.context, "precision": r.precision, "mode": r.mode},
              r.status, {"memory": {"kind": r.memory_kind, "unit": "MiB", "phases": r.peaks},
                         "start": r.start, "held": r.held, "baseline_mib": baseline,
                         "message": r.message}) for r in rows]
    params = next((r.params for r in rows if r.params), None)  # one shape for every row
    recs = report.records(base, "phases", items, params)
    recs += report.records(base, "saved", [
        ({"context_length": t, "precision": p, "mode": "train-step"}, "ok",
         {"saved": {"activation_bytes": rep.total(), "weight_copy_bytes": rep.total("weight copy"),
                    "residual_bytes": rep.residual_bytes, "measured_on": rep.device,
                    "per_group": rep.group_bytes(), "top": rep.top(args.top).to_dict("records")},
          "estimate_bytes": saved_est[(p, t)].saved_bytes if saved_est[(p, t)] else None})
        for (p, t), rep in saved.items()], params)
    return tables + more, notes + more_notes, recs


def _progress(message: str) -> None:
    """A stage line on stderr, so a long measurement is never silent."""
    print(message, file=sys.stderr, flush=True)


def _checkpoint(base: RunSpec, contexts: list[int], precisions: list[str],
                args: argparse.Namespace) -> Outcome:
    """The checkpointing trade-off per (precision, context)."""
    from lmperf.memory import report
    from lmperf.memory.checkpointing import sweep_checkpointing

    results = {}
    for p in precisions:
        for t in contexts:
            _progress(f"checkpointing groups {args.checkpoint}: {p}, context {t} ...")
            results[(p, t)] = sweep_checkpointing(base.with_(precision=p, context_length=t),
                                                  args.checkpoint, steps=args.steps,
                                                  warmup=args.warmup)
    tables, notes = report.checkpoint_section(results)
    items = [({"context_length": t, "precision": p, "mode": "train-step",
               "checkpoint_group": r.group},
              r.status, {"saved_bytes": r.saved_bytes,
                         "expected_saved_bytes": r.expected_saved_bytes,
                         "recompute_bytes": r.recompute_bytes, "peak_mib": r.peak_mib,
                         "start_mib": r.start_mib, "memory_kind": r.memory_kind,
                         "step_ms": r.step_ms, "saved_measured_on": r.saved_device,
                         "message": r.message})
             for (p, t), rows in results.items() for r in rows]
    return tables, notes, report.records(base, "checkpoint", items, None)
