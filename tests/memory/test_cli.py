"""`lmperf memory` through `lmperf.cli.main`: runs, records, the launcher, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lmperf.cli import main
from tests.conftest import CPU_CAP_GIB

QUICK = ["--size", "tiny", "--batch", "2"]


def run(argv: list[str], tmp_path: Path, capsys) -> tuple[str, str, list[dict]]:
    """Run `lmperf memory ARGV --out tmp/memory.jsonl`; (stdout, stderr, records appended)."""
    out = tmp_path / "memory.jsonl"
    code = main(["memory", *argv, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return captured.out, captured.err, records


def test_default_run_prints_phases_and_saved_tensors(tmp_path, capsys):
    text, err, records = run([*QUICK, "--context", "16", "32", "--inline", "--plots",
                              str(tmp_path / "p")], tmp_path, capsys)
    assert (tmp_path / "p" / "memory_vs_context.png").stat().st_size > 0
    assert "peak memory per step (peak RSS MiB (CPU process))" in text
    assert text.startswith("peak of a step: ") and "fits: every step ran" in text.split("\n")[0]
    assert "saved for backward at context 32 (fp32): " in text.split("\n")[1]
    assert "x the residual stream" in text  # the tables behind it: --details
    assert "saved for backward per group: fp32, context 32" not in text
    more = main(["table", str(tmp_path / "memory.jsonl"), "--details"])
    detail = capsys.readouterr().out
    assert more == 0 and "saved for backward per group: fp32, context 32" in detail
    assert "largest saved activations" in detail
    assert {r["kind"] for r in records} == {"memory"}
    analyses = [r["spec"]["analysis"] for r in records]
    assert analyses.count("phases") == 4 and analyses.count("saved") == 2
    assert len({r["job_id"] for r in records}) == 2  # one job per analysis of one precision
    phases = next(r for r in records if r["spec"]["analysis"] == "phases"
                  and r["spec"]["mode"] == "train-step")
    assert phases["status"] == "ok" and phases["metrics"]["memory"]["kind"] == "cpu_process_peak_rss"
    assert set(phases["metrics"]["memory"]["phases"]) == {"forward", "backward", "optimizer"}
    assert phases["spec"]["warmup"] == 1 and phases["spec"]["threads"] == 1
    saved = next(r for r in records if r["spec"]["analysis"] == "saved")
    assert saved["metrics"]["saved"]["activation_bytes"] > 0


def test_estimate_allocates_nothing_and_answers_fits(tmp_path, capsys, monkeypatch):
    from lmperf.workload import build

    monkeypatch.setattr(build, "prepare", lambda *a, **k: pytest.fail("--estimate built a model"))
    text, _, records = run(["--size", "small", "--context", "256", "--gib", "2"], tmp_path,
                           capsys)
    # one simulated row per mode (default: forward, train-step), each with its own answer
    assert [r["spec"]["mode"] for r in records] == ["forward", "train-step"]
    totals = [r["metrics"]["simulation"]["total_bytes"] for r in records]
    assert totals[0] < 2 * 2**30 < totals[1]
    assert [r["metrics"]["fits"] for r in records] == [True, False]
    head = " ".join(text.split("\n\n")[0].split())
    assert head.startswith(f"estimated peak (simulated): {totals[1] / 2**30:.3g} GiB, small fp32 "
                           "train-step at context 256, batch 4, naive attention, no "
                           "checkpointing, AdamW fused; 1 of 2 fit in 2 GiB ")
    assert "train-step at context 256 does not fit" in head  # and what would
    table = text.split("\n\n")[1].splitlines()  # the fits column, in the default table
    assert table[1].split()[-1] == "fits" and [x.split()[-1] for x in table[2:4]] == [
        "True", "False"]
    flat = " ".join(text.split())  # findings are wrapped to 120 columns
    assert "not an upper bound" in flat and "total (upper bound)" not in flat
    latex, _, _ = run(["--size", "tiny", "--estimate", "--format", "latex"], tmp_path, capsys)
    assert "\\begin{tabular}" in latex and "optimizer state" in latex
    # an estimate for a GPU needs no GPU: 512 B blocks and the stated allowance
    cuda, _, recs = run(["--size", "tiny", "--context", "64", "--precision", "bf16-mixed",
                         "--device", "cuda", "--mode", "train-step", "--estimate"],
                        tmp_path, capsys)
    sim = recs[-1]["metrics"]["simulation"]
    assert "estimate (cuda), simulated step" in cuda and "CUDA context 512 MiB" in cuda
    assert sim["total_bytes"] == sim["peak_bytes"] + sim["allowance_bytes"] > sim["peak_bytes"]


def test_estimate_honours_every_option(tmp_path, capsys):
    """--mode (each its own row), --precision (several), --optimizer, --attention and
    --checkpoint (one row per group) reach the simulation."""
    text, _, records = run([*QUICK, "--context", "16", "32", "--mode", "forward", "train-step",
                            "--precision", "fp32", "bf16-mixed", "--checkpoint", "1", "2",
                            "--estimate"], tmp_path, capsys)
    keys = [(r["spec"]["mode"], r["spec"]["precision"], r["spec"]["context"],
             r["spec"]["checkpoint_group"]) for r in records]
    assert len(keys) == len(set(keys)) == 2 * 2 * 2 * 3
    assert "lowest simulated peak with checkpointing" in text
    peaks = {k: r["metrics"]["simulation"]["peak_bytes"] for k, r in zip(keys, records)}
    none = ("forward", "fp32", 32, "none")
    assert peaks[("forward", "fp32", 32, "full")] == peaks[none]
    assert peaks[("forward", "bf16-mixed", 32, "none")] != peaks[none]

    def peak(*argv: str) -> int:
        _, _, recs = run([*QUICK, "--context", "32", "--mode", "train-step", "--estimate", *argv],
                         tmp_path, capsys)
        return recs[-1]["metrics"]["simulation"]["phase_peaks"]

    assert peak("--optimizer", "foreach")["optimizer"] > peak("--optimizer", "loop")["optimizer"]
    assert peak("--attention", "sdpa")["backward"] < peak("--attention", "naive")["backward"]


def test_gpu_name_is_the_budget(tmp_path, capsys):
    from lmperf.runtime.peaks import require_device

    text, _, records = run([*QUICK, "--context", "16", "--mode", "train-step", "--gpu", "t4"],
                           tmp_path, capsys)
    m = records[0]["metrics"]
    assert records[0]["spec"]["device"] == "cuda" and m["gpu"] == "T4"
    assert m["gib"] == require_device("T4").memory_gib and m["fits"] is True
    assert f"1 of 1 fit on T4 ({m['gib']:g} GiB)" in " ".join(text.split("\n\n")[0].split())
    # --gib replaces the GPU's memory, the one rule of plan and dist --estimate
    _, _, records = run([*QUICK, "--context", "16", "--mode", "train-step", "--gpu", "t4",
                         "--gib", "8"], tmp_path / "eight", capsys)
    assert records[0]["metrics"]["gpu"] == "T4" and records[0]["metrics"]["gib"] == 8


def test_estimate_simulates_a_users_model(tmp_path, capsys):
    _, _, records = run([*QUICK, "--model", "tests.fixtures.models:bigram", "--context", "16",
                         "--estimate"], tmp_path, capsys)
    assert records and all(r["metrics"]["simulation"]["peak_bytes"] > 0 for r in records)
    assert all("estimate" not in r["metrics"] for r in records)  # no analytic terms for it


def test_checkpoint_sweep_prints_the_tradeoff(tmp_path, capsys):
    text, _, records = run([*QUICK, "--context", "16", "--checkpoint", "1", "2", "--steps", "1",
                            "--warmup", "0", "--format", "markdown", "--inline"], tmp_path, capsys)
    assert "#### activation checkpointing: fp32, context 16" in text
    assert [r["spec"]["checkpoint_group"] for r in records] == ["none", "full", 2]
    assert all(r["metrics"]["saved_bytes"] == r["metrics"]["expected_saved_bytes"] for r in records)
    assert {r["spec"]["warmup"] for r in records} == {0}


def test_snapshot_is_delegated(tmp_path, capsys, monkeypatch):
    import lmperf.questions.memory.snapshot_read as snapshot

    calls = []

    def fake(path, out_png=None):
        calls.append((Path(path), out_png))
        return SimpleNamespace(tables=[("memory snapshot: x", pd.DataFrame({"peak_active_mib": [1.5]})),
                                       ("largest allocations (top 1)", pd.DataFrame({"size_mib": [1.0]}))],
                               notes=["a note"], png=None)

    monkeypatch.setattr(snapshot, "summarize_snapshot", fake)
    text, _, records = run(["--snapshot", str(tmp_path / "s.pickle"), "--plots", str(tmp_path)],
                           tmp_path, capsys)
    assert calls == [(tmp_path / "s.pickle", tmp_path / "s_active_memory.png")]
    assert "memory snapshot: x" in text and "largest allocations" in text and "a note" in text
    assert records == []


def test_out_of_memory_is_an_oom_row(tmp_path, capsys):
    """A spec that does not fit under --max-memory-gib ends as oom rows, exit 0, no traceback:
    the logits of (16, 2048) tokens over a 10,000-token vocabulary are 1.2 GiB alone."""
    out = tmp_path / "memory.jsonl"
    code = main(["memory", "--size", "tiny", "--context", "2048", "--batch", "16", "--mode",
                 "forward", "--max-memory-gib", str(CPU_CAP_GIB), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0 and "Traceback" not in captured.out + captured.err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    phases = [r for r in records if r["spec"]["analysis"] == "phases"]
    assert [r["status"] for r in phases] == ["oom"]
    assert "out of memory while" in phases[0]["message"] and "RLIMIT_AS" in phases[0]["memory_cap"]
    assert "1 oom" in captured.err


def test_bare_json_is_only_the_records(tmp_path, capsys):
    out = tmp_path / "memory.jsonl"
    assert main(["memory", *QUICK, "--context", "16", "--mode", "forward", "--inline",
                 "--warmup", "0", "--json", "--out", str(out)]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["spec"]["analysis"] for r in records} == {"phases", "saved"}
    assert {r["spec"]["warmup"] for r in records} == {0}  # --warmup 0 recorded as given
    assert len(out.read_text().splitlines()) == len(records)


@pytest.mark.parametrize("argv, fragment", [
    (["--context", "64", "--model-context", "32"], "context 64 is longer than the model allows"),
    (["--size", "huge"], "unknown size 'huge'"),
    (["--precision", "fp32", "fp9"], "--precision: unknown regime 'fp9'"),
    (["--attention", "flash"], "--attention: unknown implementation 'flash'"),
    (["--mode", "inference"], "unknown mode 'inference'"),
    (["--batch", "0"], "--batch must be a positive integer, got 0"),
    (["--context", "0"], "--context must be a positive integer, got 0"),
    (["--gib", "0"], "--gib must be a positive number of GiB, got 0"),
    (["--top", "0"], "--top must be a positive integer"),
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--warmup", "-1"], "--warmup must be a non-negative integer"),
    (["--timeout", "0"], "--timeout must be a positive number"),
    (["--checkpoint", "3"], "--checkpoint 3 is larger than the model's 2 blocks"),
    (["--checkpoint", "-1"], "unknown checkpointing policy '-1'"),
    (["--checkpoint", "every-3"], "--checkpoint every-3 is larger than the model's 2 blocks"),
    (["--estimate", "--float8", "rowwise", "--precision", "bf16-mixed"], "phantom tensors"),
    (["--model", "tests.fixtures.models:bigram", "--checkpoint", "1"], "reference LM only"),
    (["--estimate", "--attention", "flash-triton"], "cannot run on phantom tensors"),
    (["--estimate", "--warmup", "0"], "--warmup 0 is measured, not simulated"),
    (["--model", "tests.fixtures.models:bigram_short_context", "--context", "64"],
     "longer than the model allows"),
])
def test_bad_input_is_one_line_and_exit_2(argv, fragment, tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    code = main(["memory", *QUICK, *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # nothing ran, nothing written
