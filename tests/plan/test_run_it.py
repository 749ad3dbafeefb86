"""A plan you can run (issue 35): the winner's command runs, one GPU and two ranks; the torchtitan
0.3 line holds the winner's fields (tests/plan/test_torchtitan.py parses them with torchtitan);
one row per distinct plan; searches kept apart."""

from __future__ import annotations

import re
import shlex

import pytest

import lmperf
from lmperf.cli import main
from lmperf.core.kinds import build_reports
from lmperf.results.store import read_records


def _run_it(report) -> list[str]:
    """The winner's command line (between the backticks of 'run it: `...`'), as argv."""
    line = next(h for h in report.headline if h.startswith("run it: "))
    return shlex.split(re.search(r"`([^`]*)`", line).group(1))


def _on_this_cpu(argv: list[str], out) -> list[str]:
    """The command with --size tiny --device cpu --out OUT substituted (lmperf dropped)."""
    argv = argv[1:]
    argv[argv.index("--size") + 1] = "tiny"
    return argv + ["--device", "cpu", "--out", str(out)]


@pytest.mark.slow
def test_one_gpu_winner_is_one_process_that_runs(tmp_path) -> None:
    # compiled by default: its line compiles (run here eager, as compiling takes a minute)
    compiled = _run_it(lmperf.plan("medium", gpu="H100-SXM", gpus=1, context=512,
                                   global_batch=8))
    assert compiled[compiled.index("--compile") + 1] == "on"
    report = lmperf.plan("medium", gpu="H100-SXM", gpus=1, context=512, global_batch=8,
                         compile=False)
    seen = [(r["spec"]["precision"], r["spec"]["checkpoint"], r["spec"]["micro_batch"],
             r["spec"]["float8"]) for r in report.records]
    assert len(seen) == len(set(seen)) and {r["spec"]["strategy"] for r in report.records} == {"single"}
    argv = _run_it(report)
    assert argv[:2] == ["lmperf", "bench"] and "--precision" in argv
    assert "tokens/s per GPU" in report.headline[0] and "MFU" in report.headline[0]
    assert main(_on_this_cpu(argv, tmp_path / "run.jsonl")) == 0
    (record,) = read_records(tmp_path / "run.jsonl")
    assert record["status"] == "ok" and record["spec"]["mode"] == "train-step"
    winner = report.records[0]["spec"]
    assert (record["spec"]["batch"], record["spec"]["grad_accum"], record["spec"]["checkpoint"],
            record["spec"]["precision"]) == (winner["micro_batch"], winner["grad_accum"],
                                             winner["checkpoint"], winner["precision"])


@pytest.mark.slow
def test_two_gpu_winner_is_dist_train_that_runs_on_two_gloo_ranks(tmp_path) -> None:
    report = lmperf.plan("medium", gpu="H100-SXM", gpus=2, context=512, global_batch=8,
                         checkpoint=[0, 1], compile=False, float8="none",
                         out=tmp_path / "plan.jsonl")  # dist train runs neither
    argv = _run_it(report)
    assert argv[:3] == ["lmperf", "dist", "train"] and argv[argv.index("--world-size") + 1] == "2"
    assert main(_on_this_cpu(argv, tmp_path / "run.jsonl")) == 0
    (record,) = read_records(tmp_path / "run.jsonl")
    assert record["status"] == "ok" and record["spec"]["world_size"] == 2
    assert record["spec"]["strategy"] in ("torch-ddp", "torch-zero1", "torch-zero2", "fsdp2")


def test_the_torchtitan_line_is_the_winners(tmp_path) -> None:
    report = lmperf.plan("llama3-8b", gpu="H100-SXM", gpus=16, context=8192, global_batch=16,
                         precision="bf16-fsdp", checkpoint=[0, 1], float8="none",
                         out=tmp_path / "plan.jsonl")  # 0.3 takes rowwise in a config module
    winner = report.records[0]
    s, m = winner["spec"], winner["metrics"]
    assert m["fits"] and f"{m['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU" in report.headline[0]
    line = m["torchtitan_command"]
    # two nodes of 8: every node runs 8 processes, meeting at the first; torchtitan 0.3's own
    # llama3_8b recipe, the plan's settings as overrides, checkpointing its subcommand
    assert line.startswith("torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d "
                           "--rdzv-endpoint=HOST:29500 -m torchtitan.train --module llama3 "
                           "--config llama3_8b ")
    shown = next(h for h in report.headline if f"`{line}`" in h)
    assert shown.startswith(("run it: ", "on torchtitan 0.3: ")) and "run it on every node" in shown
    words = shlex.split(line)
    flag = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    assert flag["--parallelism.tensor_parallel_degree"] == str(s["tp"])
    assert flag["--parallelism.data_parallel_shard_degree"] == str(s.get("dp_shard", 16 // s["tp"]))
    assert flag["--training.global_batch_size"] == "16" and flag["--training.seq_len"] == "8192"
    assert flag["--training.mixed_precision_param"] == "bfloat16"
    assert s["compile"] and "--compile.enable" in words
    assert words[-1] == "activation-checkpoint:" + s["checkpoint"]
    # what 0.3 takes as overrides needs no config module
    assert "torchtitan_config" not in m and not list(tmp_path.glob("*.py"))
    # the line is in the records: `lmperf table` says it again
    (again,) = build_reports(read_records(tmp_path / "plan.jsonl"))
    assert any(line in h for h in again.headline)


def test_a_preset_torchtitan_lacks_gets_its_config_module(tmp_path) -> None:
    report = lmperf.plan("tiny", gpu="H100-SXM", gpus=2, context=64, global_batch=4,
                         checkpoint=0, precision="bf16-mixed", out=tmp_path / "plan.jsonl")
    m = report.records[0]["metrics"]
    module = m["torchtitan_config"]
    assert module.startswith(str(tmp_path)) and module.endswith("_torchtitan.py")
    assert any(h == f"torchtitan config module of the winner: {module}" for h in report.headline)
    assert m["torchtitan_command"].startswith(f"PYTHONPATH={tmp_path} torchrun --nnodes=1 "
                                              "--nproc_per_node=2 -m torchtitan.train --module ")
    text = open(module, encoding="utf-8").read()
    assert "lmperf's tiny (course 2026), a flavor torchtitan lacks" in text
    assert m["torchtitan_command"] in text and "def lmperf_plan()" in text
    assert any("no autocast" in n for n in m["torchtitan_notes"])  # bf16-mixed's nearest


@pytest.mark.parametrize("device, optimizer", [("cuda", "fused"), ("cpu", "foreach")])
def test_the_one_device_command_runs_the_plans_optimizer(device, optimizer) -> None:
    """The plan simulates fused AdamW on GPUs, foreach on the CPU: bench's `auto` may differ."""
    from lmperf.questions.plan.run import command
    from lmperf.questions.plan.spec import PlanSpec

    spec = PlanSpec("tiny", 64, 2, 1, gpu="H100-SXM" if device == "cuda" else None,
                    device=device, gib=1.0, precisions=("fp32",)).to_dict()
    row = {"micro_batch": 2, "grad_accum": 1, "checkpoint": 0, "precision": "bf16-mixed",
           "strategy": "single", "tp": 1, "pp": 1, "cp": 1, "dp_replicate": 1, "dp_shard": 1}
    assert f" --optimizer {optimizer}" in command(spec, row)


def test_two_searches_in_one_file_are_two_groups_with_their_own_winner(tmp_path, capsys) -> None:
    out = tmp_path / "plan.jsonl"
    for gpu in ("A100-80GB", "H100-SXM"):
        lmperf.plan("tiny", gpu=gpu, gpus=2, context=64, global_batch=4, checkpoint=0,
                    precision="bf16-mixed", out=out)
    assert main(["table", str(out)]) == 0
    text = capsys.readouterr().out
    for gpu in ("A100-80GB", "H100-SXM"):
        assert re.search(rf"search \S+: tiny on 2 x {gpu}, 80 GiB each, context 64, global batch 4",
                         text)
    assert len(re.findall(r"search \S+: winner: ", text)) == 2
    assert main(["report", str(out), "--format", "markdown", "-o", str(tmp_path / "r.md")]) == 0
    page = (tmp_path / "r.md").read_text()
    assert all(f"tiny on 2 x {gpu}" in page for gpu in ("A100-80GB", "H100-SXM"))
    assert len(re.findall(r"search \S+: winner: ", page)) == 2


def test_equal_predictions_are_one_row_naming_the_others() -> None:
    from lmperf.questions.plan.report import _distinct

    import pandas as pd

    layout = dict(tp=1, pp=1, cp=1, pp_schedule=None, pp_virtual=1, async_tp=False)
    rows = pd.DataFrame([
        dict(rank=1, precision="fp32", checkpoint=0, strategy="ddp", dp_replicate=2, dp_shard=1,
             **layout, micro_batch=2, grad_accum=1, peak_gib=1.0, fits=True, step_s=0.5,
             why=None),
        dict(rank=2, precision="fp32", checkpoint=0, strategy="zero1", dp_replicate=1,
             dp_shard=2, **layout, micro_batch=2, grad_accum=1, peak_gib=1.0, fits=True,
             step_s=0.5, why="1.00x"),
        dict(rank=3, precision="fp32", checkpoint=1, strategy="ddp", dp_replicate=2, dp_shard=1,
             **layout, micro_batch=2, grad_accum=1, peak_gib=0.5, fits=True, step_s=0.6,
             why="1.20x")])
    distinct = _distinct(rows)
    assert list(distinct["rank"]) == [1, 3]
    assert distinct.loc[0, "same_as"] == "zero12 fp32 ckpt 0 b 2" and pd.isna(distinct.loc[1, "same_as"])


def test_the_default_output_is_short_and_shows_the_best_of_each_strategy(capsys, tmp_path) -> None:
    assert main(["plan", "--size", "tiny", "--gpu", "H100-SXM", "--gpus", "8", "--context", "64",
                 "--global-batch", "16", "--top", "3", "--out", str(tmp_path / "p.jsonl")]) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 32
    table = text.split("(PREDICTED)\n")[1].split("\n\n")[0]
    rows = [line.split() for line in table.splitlines()[1:] if line.split()[0].isdigit()]
    layouts = [" ".join(r[3:-7]) for r in rows]
    assert len(layouts) == len(set(layouts))  # one row per layout
    shown = {layout.split()[0].rstrip("0123456789") for layout in layouts}
    # each family's best, beyond the top 3: every data-parallel strategy, TP, PP
    assert {"ddp", "zero", "fsdp"} <= shown
    assert any(" tp" in f" {x}" for x in layouts) and any(" pp" in f" {x}" for x in layouts)


def test_searches_written_before_they_had_ids_are_kept_apart(tmp_path, capsys) -> None:
    import json

    new, old = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
    for gpu in ("A100-80GB", "H100-SXM"):
        lmperf.plan("tiny", gpu=gpu, gpus=2, context=64, global_batch=4, checkpoint=0,
                    precision="bf16-mixed", out=new)
    lines = [json.loads(line) for line in new.read_text().splitlines()]
    for r in lines:  # the layout before issue 35 (a TOML of torchtitan 0.2.2's keys)
        del r["spec"]["search"]
        for key in ("torchtitan_command", "torchtitan_notes", "torchtitan_config"):
            r["metrics"].pop(key, None)
        if r["metrics"]["rank"] == 1:
            r["metrics"]["torchtitan_toml"] = "results/plan-x.torchtitan.toml"
    old.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main(["table", str(old)]) == 0
    text = capsys.readouterr().out
    assert len(re.findall(r"search \S+: winner: ", text)) == 2
    assert len(re.findall(r"torchtitan 0.2.2 job config of the winner: results/plan-x", text)) == 2
    # torchtitan 0.3's line again, naming the config module a plan with --out writes
    assert len(re.findall(r"PYTHONPATH=DIR torchrun ", text)) == 2
