"""`lmperf train`: train a small LM once per precision regime; summary table, records, plots."""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid
from pathlib import Path
from typing import Iterator

DEFAULT_OUT = Path("results") / "train.jsonl"
DEFAULT_PLOTS = Path("results") / "train-plots"
PLOT_NAME = "train.png"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `lmperf train`."""
    from lmperf.model import ATTENTION, PRESETS
    from lmperf.runtime.precision import REGIMES
    from lmperf.train.config import CPU_DEFAULTS, CUDA_DEFAULTS

    cpu, cuda = CPU_DEFAULTS, CUDA_DEFAULTS
    p = sub.add_parser(
        "train", help="train a small LM under each precision regime: loss, scale, time, memory",
        description="Train the reference LM once per precision regime, from the same seed on the "
                    "same batches, and compare loss curves, gradient norms, GradScaler scale, step "
                    "time and memory. A regime whose loss turns NaN or diverges stops there with "
                    "that outcome recorded; the others go on.")
    p.add_argument("--regime", nargs="+", metavar="REGIME",
                   help=f"regimes to train, in order: {', '.join(REGIMES)} (default: "
                        f"{' '.join(cpu['regimes'])} on CPU; {' '.join(cuda['regimes'])} on CUDA)")
    p.add_argument("--size", metavar="SIZE", help=f"model preset: {', '.join(PRESETS)} "
                   f"(default: {cpu['size']} on CPU, {cuda['size']} on CUDA)")
    p.add_argument("--context", type=int, metavar="T",
                   help=f"tokens per window (default: {cpu['context']} on CPU, {cuda['context']} on CUDA)")
    p.add_argument("--batch", type=int, metavar="B",
                   help=f"windows per step (default: {cpu['batch']} on CPU, {cuda['batch']} on CUDA)")
    p.add_argument("--steps", type=int, metavar="N",
                   help=f"optimiser steps per regime (default: {cpu['steps']} on CPU, {cuda['steps']} on CUDA)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: 3e-3)")
    p.add_argument("--warmup-steps", type=int, default=20,
                   help="linear warm-up steps, then cosine decay to lr/10 (default: 20)")
    p.add_argument("--clip", type=float, default=1.0,
                   help="max gradient norm, applied after unscaling; 0: no clipping (default: 1.0)")
    p.add_argument("--eps", type=float, default=1e-8,
                   help="AdamW eps (default: 1e-8; note it is 0 in fp16, see fp16-true)")
    p.add_argument("--eval-interval", type=int, default=50, metavar="N",
                   help="steps between validation losses (default: 50)")
    p.add_argument("--eval-batches", type=int, default=8, metavar="N",
                   help="fixed validation batches per evaluation (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and batches (default: 0)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--data", type=Path, metavar="FILE.txt",
                      help="train on a text file, byte-level (default: the bundled generated corpus)")
    data.add_argument("--tokens", type=Path, metavar="FILE",
                      help="train on a token file: a flat uint16 array of ids (raw, as "
                           "ids.tofile(), or .npy), read by memory map")
    p.add_argument("--vocab-size", type=int, metavar="V",
                   help="model vocabulary (default: 256 for text, 10000 for --tokens)")
    p.add_argument("--attention", default="naive", choices=list(ATTENTION),
                   help="attention implementation (default: naive)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="(default: auto)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch intra-op threads for the run (default: 1 on CPU, where a thread "
                        "pool stalls whenever other processes compete for the cores; torch's own "
                        "on CUDA)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"JSONL file, one record per regime appended (default: {DEFAULT_OUT})")
    p.add_argument("--plots", type=Path, default=DEFAULT_PLOTS, metavar="DIR",
                   help=f"folder for {PLOT_NAME} (default: {DEFAULT_PLOTS}; overwritten each run)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG")
    p.add_argument("--format", default="text", choices=["text", "markdown"],
                   help="format of the summary table (default: text)")
    p.add_argument("--log-every", type=int, metavar="N",
                   help="progress line every N steps (default: --eval-interval; 0: none)")
    p.set_defaults(func=cmd_train)


def build_config(args: argparse.Namespace, device_type: str):
    """Arguments + device defaults -> a checked TrainConfig (SpecError on bad values)."""
    from lmperf.model.presets import VOCAB_SIZE
    from lmperf.train.config import CPU_DEFAULTS, CUDA_DEFAULTS, TrainConfig
    from lmperf.train.data import BYTE_VOCAB

    d = CUDA_DEFAULTS if device_type == "cuda" else CPU_DEFAULTS
    pick = lambda value, key: d[key] if value is None else value  # noqa: E731
    vocab = args.vocab_size if args.vocab_size is not None else (
        VOCAB_SIZE if args.tokens is not None else BYTE_VOCAB)
    return TrainConfig.from_size(
        pick(args.size, "size"), tuple(pick(args.regime, "regimes")),
        vocab_size=vocab, context=pick(args.context, "context"), batch=pick(args.batch, "batch"),
        steps=pick(args.steps, "steps"), lr=args.lr, warmup_steps=args.warmup_steps,
        clip=args.clip, eps=args.eps, eval_interval=args.eval_interval,
        eval_batches=args.eval_batches, seed=args.seed, device=device_type,
        attention=args.attention)


def resolve_threads(args: argparse.Namespace, device_type: str) -> int | None:
    """--threads, else the device's default (None: leave torch's setting alone)."""
    from lmperf.train.config import CPU_DEFAULTS, CUDA_DEFAULTS

    if args.threads is not None:
        return args.threads
    return (CUDA_DEFAULTS if device_type == "cuda" else CPU_DEFAULTS)["threads"]


def cmd_train(args: argparse.Namespace) -> int:
    """Check everything, train each regime (records appended as each ends), print the table."""
    from dataclasses import replace

    from lmperf.errors import ResultsFileError, SpecError
    from lmperf.results.store import append_record, ensure_writable
    from lmperf.runtime.device import device_name, resolve_device
    from lmperf.runtime.precision import get_regime, slowness_warning, unsupported_reason
    from lmperf.train.data import load_corpus, prepare_corpus
    from lmperf.train.loop import train_all
    from lmperf.train.report import caption, render_summary

    if args.log_every is not None and args.log_every < 0:
        raise SpecError(f"--log-every must be >= 0, got {args.log_every}")
    if args.threads is not None and args.threads <= 0:
        raise SpecError(f"--threads must be a positive integer, got {args.threads}")
    device = resolve_device(args.device)
    cfg = build_config(args, device.type)
    ids, source, name = load_corpus(args.data, args.tokens)
    corpus = prepare_corpus(ids, source, name, cfg.context, cfg.vocab_size)
    cfg = replace(cfg, data=corpus.describe())
    ensure_writable(args.out)
    if not args.no_plots:
        try:
            args.plots.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsFileError(f"cannot create the plot folder {args.plots}: {exc.strerror or exc}") from None
    for regime in cfg.regimes:
        r = get_regime(regime)
        if (why := unsupported_reason(r, device)):
            _err(f"warning: {regime} will be recorded as unsupported: {why}")
        elif (slow := slowness_warning(r, device)):
            _err(f"warning: {slow}")
    _err(f"training {len(cfg.regimes)} regime(s) x {cfg.steps} steps of {cfg.size} (B={cfg.batch}, "
         f"T={cfg.context}, vocab {cfg.vocab_size}) on {device_name(device)}; data: {source}"
         f"{'' if source == 'builtin' else ' ' + name} ({corpus.describe()['tokens']:,} tokens)")
    run_id = uuid.uuid4().hex[:12]

    def keep(record: dict) -> None:
        record["run_id"] = run_id  # groups the records of one invocation in the JSONL file
        append_record(args.out, record)

    log_every = cfg.eval_interval if args.log_every is None else args.log_every
    with _threads(resolve_threads(args, device.type)):  # recorded in env.torch_threads
        records = train_all(cfg, corpus, device, progress=_Progress(cfg.steps, log_every),
                            on_record=keep)
    sys.stdout.write(render_summary(records, args.format))
    where = [f"{len(records)} record(s) appended to {args.out}"]
    if not args.no_plots:
        from lmperf.train.plots import plot_records

        where.append(f"plots: {plot_records(records, args.plots / PLOT_NAME, caption(records, notes=False))}")
    _err("; ".join(where))
    return 1 if any(r["status"] == "error" for r in records) else 0


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """Run with `n` intra-op threads (None: leave torch's setting), restored afterwards."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Progress:
    """Plain progress lines on stderr: a regime's start, every N steps, and its end."""

    def __init__(self, steps: int, every: int):
        self.steps, self.every = steps, every

    def __call__(self, regime: str, event: dict) -> None:
        kind = event["event"]
        if kind == "start":
            _err(f"{regime}: validation loss at step 0: {event['val_loss']:.4f}")
        elif kind == "step" and self.every and (event["step"] % self.every == 0 or event["step"] == 1):
            scale = "" if event["scale"] is None else f"  scale {event['scale']:g}"
            val = "" if event["val_loss"] is None else f"  val {event['val_loss']:.4f}"
            _err(f"  {regime:<18} step {event['step']:>5}/{self.steps}  loss {event['loss']:.4f}"
                 f"{val}  grad norm {event['grad_norm']:.3g}{scale}  {event['step_ms']:.1f} ms")
        elif kind == "end":
            from lmperf.train.report import status_text

            rec = event["record"]
            m = rec.get("metrics") or {}
            detail = m.get("outcome_detail") or rec.get("message") or ""
            _err(f"{regime}: {status_text(rec)}" + (f" ({detail})" if detail else ""))
