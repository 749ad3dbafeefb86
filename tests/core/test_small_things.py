"""Issue 43's small things, each failing on d11c26e: one unsupported reason said once on stderr
(the doctor's 22 CUDA checks), "1 call", "holds", the closing line after --resume, a predicted
oom row naming the pre-flight (not "building the model"), and the memory frame's estimate rows
each with a key of its own."""

from __future__ import annotations

import io
import json

import pandas as pd
from rich.console import Console

from lmperf.cli import main
from lmperf.core.command import closing_line
from lmperf.core.progress import RichReporter
from lmperf.core.report import Report
from tests.conftest import CPU_CAP_GIB


class _Spec:
    def label(self) -> str:
        return "doctor (cuda): a check"


def test_one_reason_for_many_rows_is_said_once():
    console = Console(file=io.StringIO(), width=200)
    reporter = RichReporter(console)
    why = "no CUDA device: this torch (2.13.0+cpu) is a CPU build"
    records = [{"kind": "any", "status": "unsupported", "message": why, "spec": {}}] * 22
    reporter.begin(len(records), 0)
    for i, record in enumerate(records):
        reporter.finish(i, _Spec(), [record])
    reporter.end()
    out = console.file.getvalue()
    assert out.count("no CUDA device") == 2  # the first row, then one line for the 21 others
    assert "unsupported 21 more for the same reason: no CUDA device" in " ".join(out.split())


def test_counts_read_as_words():
    from lmperf.core.report import plural
    from lmperf.questions.profile.report import top_line

    assert [plural(n, "call") for n in (1, 1.0, 2, 1.5)] == ["1 call", "1 call", "2 calls",
                                                              "1.5 calls"]
    top = pd.DataFrame([{"name": "aten::_fused_adamw_", "share": 0.5, "calls_per_step": 1.0}])
    assert "(1 call per step)" in top_line({"top operators (self time): step": top})


def test_an_empty_file_holds_no_records(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["table", str(empty)]) == 2
    assert f"{empty} holds no records" in capsys.readouterr().err


def test_the_closing_line_after_resume_counts_what_it_appended():
    report = Report(kind="bench", records=[{"status": "ok"}] * 6)
    assert closing_line(report, "r.jsonl", appended=4) == (
        "6 run(s): 6 ok (2 done before); 4 records appended to r.jsonl")
    assert closing_line(report, "r.jsonl", appended=6) == "6 run(s): 6 ok; records appended to r.jsonl"


def test_a_predicted_oom_says_the_preflight_not_building_the_model(tmp_path, capsys):
    """small's parameters, gradients and AdamW state alone (2 GiB) exceed what the cap leaves."""
    out = tmp_path / "b.jsonl"
    assert main(["bench", "--size", "small", "--context", "64", "--precision", "fp32",
                 "--max-memory-gib", str(CPU_CAP_GIB), "--out", str(out)]) == 0
    capsys.readouterr()
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["status"] == "oom" and "predicted" in record["message"]
    assert "building the model" not in record["message"]
    assert "checking that one step fits" in record["message"]


def test_the_memory_frame_keys_each_estimate_row_apart():
    import lmperf

    frame = lmperf.memory(size="tiny", context=16, estimate=True, checkpoint=[1],
                          mode="train-step").frame
    key = ["mode", "precision", "context", "checkpoint_group"]
    assert len(frame) == 2 and not frame.duplicated(key).any()
