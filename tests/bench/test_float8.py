"""Issue 41's acceptance on the CPU: `lmperf bench --float8 rowwise` either runs with ok rows
(torch runs float8 scaled matmuls on this CPU: torch 2.13 does) or is refused in one line with
exit code 2 before anything runs."""

from __future__ import annotations

import json

import torch

from lmperf.cli import main
from lmperf.runtime.device import float8_unsupported_reason


def test_bench_float8_rowwise_runs_on_the_cpu_or_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    code = main(["bench", "--size", "tiny", "--context", "16", "--batch", "2", "--precision",
                 "bf16-mixed", "--float8", "none", "rowwise", "--mode", "train-step",
                 "--warmup", "1", "--steps", "2", "--device", "cpu", "--inline", "--out",
                 str(out)])
    err = capsys.readouterr().err
    why = float8_unsupported_reason(torch.device("cpu"), "rowwise")
    if why is not None:
        assert code == 2 and not out.exists()
        assert err.strip() == f"lmperf: error: --float8 rowwise cannot run here: {why}"
        return
    assert code == 0, err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["spec"]["float8"], r["status"]) for r in records] == [("none", "ok"),
                                                                     ("rowwise", "ok")]
    # the same model FLOPs: float8 changes the matmuls' dtype, not their count
    assert records[0]["metrics"]["flops_per_step"] == records[1]["metrics"]["flops_per_step"]
