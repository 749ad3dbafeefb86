"""A plan you can run (issue 35): the winner's command runs, one GPU and two ranks; the torchtitan
job config holds the winner's fields; one row per distinct plan; searches kept apart."""

from __future__ import annotations

import re
import shlex
import tomllib

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
    report = lmperf.plan("medium", gpu="H100-SXM", gpus=1, context=512, global_batch=8)
    seen = [(r["spec"]["precision"], r["spec"]["checkpoint"], r["spec"]["micro_batch"])
            for r in report.records]
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
                         checkpoint=[0, 1], out=tmp_path / "plan.jsonl")
    argv = _run_it(report)
    assert argv[:3] == ["lmperf", "dist", "train"] and argv[argv.index("--world-size") + 1] == "2"
    assert main(_on_this_cpu(argv, tmp_path / "run.jsonl")) == 0
    (record,) = read_records(tmp_path / "run.jsonl")
    assert record["status"] == "ok" and record["spec"]["world_size"] == 2
    assert record["spec"]["strategy"] in ("torch-ddp", "torch-zero1", "torch-zero2", "fsdp2")


def test_the_torchtitan_config_is_the_winners(tmp_path) -> None:
    report = lmperf.plan("llama3-8b", gpu="H100-SXM", gpus=16, context=8192, global_batch=16,
                         precision="bf16-fsdp", checkpoint=[0, 1], out=tmp_path / "plan.jsonl")
    winner = report.records[0]
    s, m = winner["spec"], winner["metrics"]
    assert m["fits"] and f"{m['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU" in report.headline[0]
    path = m["torchtitan_toml"]
    assert path.startswith(str(tmp_path)) and any(path in h for h in report.headline)
    # two nodes of 8: every node runs 8 processes, meeting at the first
    launch = ("torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d "
              "--rdzv-endpoint=HOST:29500 -m torchtitan.train --job.config_file ")
    assert report.headline[1].startswith(f"run it: `{launch}{path}` (run it on every node; HOST")
    text = open(path, encoding="utf-8").read()
    assert f"# run: {launch}THIS_FILE (run it on every node" in text
    config = tomllib.loads(text)
    d = 16 // s["tp"]
    assert config["model"] == {"name": "llama3", "flavor": "8B"}
    assert config["training"]["local_batch_size"] == s["micro_batch"]
    assert config["training"]["global_batch_size"] == s["micro_batch"] * d * s["grad_accum"] == 16
    assert config["training"]["seq_len"] == 8192
    assert config["training"]["mixed_precision_param"] == "bfloat16"
    assert config["parallelism"]["data_parallel_shard_degree"] == d
    assert config["parallelism"]["tensor_parallel_degree"] == s["tp"]
    assert config["activation_checkpoint"]["mode"] == ("full" if s["checkpoint"] else "none")
    # the file is in the records: `lmperf table` says where it is
    (again,) = build_reports(read_records(tmp_path / "plan.jsonl"))
    assert any(path in h for h in again.headline)


def test_the_torchtitan_config_of_zero2_and_of_tp_says_what_differs() -> None:
    from lmperf.questions.plan.run import torchtitan_toml

    spec = {"size": "llama3-8b", "course": "2026", "model": None, "gpus": 8, "gpus_per_node": 8,
            "context": 8192, "global_batch": 8}
    row = {"micro_batch": 1, "grad_accum": 1, "checkpoint": 1, "precision": "bf16-fsdp"}
    zero2 = torchtitan_toml(spec, {**row, "strategy": "zero2", "tp": 1})
    assert tomllib.loads(zero2)["parallelism"]["fsdp_reshard_after_forward"] == "never"
    assert "# run: torchrun --nnodes=1 --nproc_per_node=8 -m torchtitan.train" in zero2
    assert "steps (torchtitan's default 10000)" in zero2 and "hf_assets_path" in zero2
    tp = torchtitan_toml(spec, {**row, "strategy": "fsdp+tp", "tp": 2})
    assert "fsdp_reshard_after_forward" not in tp
    assert "sequence parallelism to the norms and loss parallelism" in tp


@pytest.mark.parametrize("device, optimizer", [("cuda", "fused"), ("cpu", "foreach")])
def test_the_one_device_command_runs_the_plans_optimizer(device, optimizer) -> None:
    """The plan simulates fused AdamW on GPUs, foreach on the CPU: bench's `auto` may differ."""
    from lmperf.questions.plan.run import command
    from lmperf.questions.plan.spec import PlanSpec

    spec = PlanSpec("tiny", 64, 2, 1, gpu="H100-SXM" if device == "cuda" else None,
                    device=device, gib=1.0, precisions=("fp32",)).to_dict()
    row = {"micro_batch": 2, "grad_accum": 1, "checkpoint": 0, "precision": "bf16-mixed",
           "strategy": "single", "tp": 1}
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

    rows = pd.DataFrame([
        dict(rank=1, precision="fp32", checkpoint=0, strategy="ddp", tp=1, micro_batch=2,
             grad_accum=1, peak_gib=1.0, fits=True, step_s=0.5, why=None),
        dict(rank=2, precision="fp32", checkpoint=0, strategy="zero1", tp=1, micro_batch=2,
             grad_accum=1, peak_gib=1.0, fits=True, step_s=0.5, why="1.00x"),
        dict(rank=3, precision="fp32", checkpoint=1, strategy="ddp", tp=1, micro_batch=2,
             grad_accum=1, peak_gib=0.5, fits=True, step_s=0.6, why="1.20x")])
    distinct = _distinct(rows)
    assert list(distinct["rank"]) == [1, 3]
    assert distinct.loc[0, "same_as"] == "zero1 fp32 ckpt 0 b 2" and pd.isna(distinct.loc[1, "same_as"])


def test_the_default_output_is_short_and_shows_the_best_of_each_strategy(capsys, tmp_path) -> None:
    assert main(["plan", "--size", "tiny", "--gpu", "H100-SXM", "--gpus", "8", "--context", "64",
                 "--global-batch", "16", "--top", "3", "--out", str(tmp_path / "p.jsonl")]) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 30
    table = text.split("(PREDICTED)\n")[1].split("\n\n")[0]
    shown = {line.split()[3] for line in table.splitlines()[1:] if line.split()[0].isdigit()}
    assert {"ddp", "zero1", "zero2", "fsdp"} <= shown  # each strategy's best, beyond the top 3


def test_searches_written_before_they_had_ids_are_kept_apart(tmp_path, capsys) -> None:
    import json

    new, old = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
    for gpu in ("A100-80GB", "H100-SXM"):
        lmperf.plan("tiny", gpu=gpu, gpus=2, context=64, global_batch=4, checkpoint=0,
                    precision="bf16-mixed", out=new)
    lines = [json.loads(line) for line in new.read_text().splitlines()]
    for r in lines:  # the layout before issue 35
        del r["spec"]["search"]
        r["metrics"].pop("torchtitan_toml", None)
    old.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main(["table", str(old)]) == 0
    assert len(re.findall(r"search \S+: winner: ", capsys.readouterr().out)) == 2
