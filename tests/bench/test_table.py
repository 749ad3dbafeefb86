"""Tables from records: text, Markdown, LaTeX and CSV renderings of realistic records."""

from __future__ import annotations

import io
import re

import pandas as pd
import pytest

from lmperf.workload.spec import RunSpec
from lmperf.measure.stats import summarize
from lmperf.results.schema import make_record
from lmperf.questions.bench.report import build_report
from lmperf.questions.bench.table import display_frame, records_frame

FORMATS = ("text", "markdown", "latex", "csv")


def render(records: list[dict], fmt: str) -> str:
    """The bench table as the CLI prints it (through the bench Report)."""
    return build_report(records).render(fmt)

ENV = {"device": "cpu", "device_name": "Test CPU", "timestamp": "2025-01-01T00:00:00+00:00"}
CUSTOM = "pkg.my_mod:make_model"

# Samples with round means and standard deviations (std with ddof=1).
FWD = [1.0, 2.0, 3.0]          # 2.00 +- 1.00
BWD = [4.0, 6.0, 8.0]          # 6.00 +- 2.00
OPT = [0.5, 0.5, 0.5]          # 0.50 +- 0.00
STEP = [5.5, 8.5, 11.5]        # 8.50 +- 3.00


def spec(**overrides) -> dict:
    fields = dict(context=128, batch=4, precision="fp32", mode="train-step",
                  attention="naive", optimizer="fused", device="cpu")
    fields.update(overrides)
    return RunSpec.from_size("tiny", **fields).to_dict()


def cpu_memory(phases: tuple[str, ...], peaks: tuple[float, ...]) -> dict:
    return {"kind": "cpu_process_peak_rss", "unit": "MiB",
            "phases": {p: {"rss": v} for p, v in zip(phases, peaks)}}


def cuda_memory(phases: tuple[str, ...], allocated: tuple[float, ...], reserved: tuple[float, ...]) -> dict:
    return {"kind": "cuda_allocator", "unit": "MiB",
            "phases": {p: {"allocated": a, "reserved": r}
                       for p, a, r in zip(phases, allocated, reserved)}}


def ok_record(*, params: int = 1_234_567, fwd=FWD, bwd=BWD, opt=OPT, step=STEP,
              tokens_per_s: float = 12345.6, tflops: float = 0.0421, mfu=None, memory=None,
              **spec_overrides) -> dict:
    """A record laid out as lmperf.questions.bench.job builds it for a finished run."""
    s = spec(**spec_overrides)
    mode = s["mode"]
    metrics: dict = {"timer": "perf_counter"}
    metrics["forward_ms"] = summarize(fwd)
    metrics["backward_ms"] = summarize(bwd) if mode in ("forward-backward", "train-step") else None
    metrics["optimizer_ms"] = summarize(opt) if mode == "train-step" else None
    metrics["step_ms"] = summarize(step)
    metrics.update({
        "tokens_per_step": s["batch"] * s["context"],
        "tokens_per_s": tokens_per_s, "flops_per_step": 123_456_789,
        "flops_per_step_analytic": 123_456_789, "flops_source": "torch.utils.flop_counter",
        "flops_includes": "forward + backward", "tflops": tflops, "math_dtype": "fp32",
        "peak_tflops": None, "peak_source": None, "mfu": mfu,
    })
    phases = {"forward": ("forward",), "forward-backward": ("forward", "backward"),
              "train-step": ("forward", "backward", "optimizer")}[mode]
    metrics["memory"] = memory or cpu_memory(phases, (100.0, 250.0, 180.0)[: len(phases)])
    return make_record("bench", s, "ok", ENV, params=params, metrics=metrics)


def failed_record(status: str, message: str, **spec_overrides) -> dict:
    return make_record("bench", spec(**spec_overrides), status, ENV, message=message)


OOM_MSG = "out of memory while measuring (10 steps): DefaultCPUAllocator: can't allocate memory"
ERR_MSG = "ValueError while counting FLOPs (one untimed step): shapes do not match"


def mixed() -> list[dict]:
    return [
        ok_record(context=128, precision="fp32"),
        failed_record("oom", OOM_MSG, context=256, precision="fp32"),
        ok_record(context=128, precision="bf16-mixed", fwd=[10.0, 12.0, 14.0]),
        failed_record("error", ERR_MSG, context=512, precision="bf16-mixed"),
    ]


# --- the median first, the step's mean +- std beside it (issue 28) --------------------------------

@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_medians_are_the_headline_with_the_steps_mean_std_beside(fmt):
    table, _, _ = display_frame([ok_record(step=[5.5, 8.0, 11.5])])
    assert list(table.columns[table.columns.get_loc("forward (ms)"):][:5]) == [
        "forward (ms)", "backward (ms)", "optimizer (ms)", "step (ms)", "step mean ± std"]
    assert table["step (ms)"].iloc[0] == 8.0 and table["forward (ms)"].iloc[0] == 2.0  # medians
    out = render([ok_record(step=[5.5, 8.0, 11.5])], fmt)
    assert "8.33 ± 3.01" in out and "step time (median of 3 steps): tiny fp32 8 ms" in out


def test_mean_std_rounded_to_two_decimals():
    out = render([ok_record(step=[1.2345, 1.2355, 1.2365])], "text")
    assert re.findall(r"-?\d+\.\d+ ± \d+\.\d+", out) == ["1.24 ± 0.00"]


def test_phase_columns_only_for_measured_phases():
    table, _, _ = display_frame([ok_record(mode="forward")])
    assert "forward (ms)" in table.columns and "step (ms)" in table.columns
    assert "backward (ms)" not in table.columns and "optimizer (ms)" not in table.columns


def test_other_numeric_cells():
    out = render([ok_record(tokens_per_s=12345.6, tflops=0.0421)], "text")
    assert "12,346" in out      # tokens/s, thousands separator, no decimals
    assert "0.042" not in out   # TFLOP/s without a peak (CPU): in the CSV, not the screen
    assert "0.042" in render([ok_record(tflops=0.0421, mfu=0.5)], "text")  # 3 decimals
    assert "1,234,567" in out   # params


# --- LaTeX ----------------------------------------------------------------------------------------

def test_latex_uses_pm_and_escapes_underscores():
    out = render([ok_record(model=CUSTOM), ok_record(context=256)], "latex")
    assert r"8.50 $\pm$ 3.00" in out
    assert "±" not in out
    assert r"pkg.my\_mod:make\_model" in out
    table = out.split(r"\end{tabular}")[0]  # notes under it are % comments, unescaped
    assert "my_mod" not in table and "make_model" not in table
    assert r"\begin{tabular}" in out and r"\end{tabular}" in out
    assert r"\caption{" in out


def test_latex_notes_are_comments():
    out = render(mixed(), "latex")
    assert f"% [1] oom: {OOM_MSG}\n" in out
    assert f"% [2] error: {ERR_MSG}\n" in out
    assert "oom [1]" in out and "error [2]" in out


def test_latex_multiline_note_stays_commented():
    multi = "RuntimeError while measuring: line one\nline two {with braces}"
    out = render([ok_record(), failed_record("error", multi)], "latex")
    after_table = out.split(r"\end{table}", 1)[1].split(r"\begin{itemize}")[0]  # findings follow
    assert all(line.startswith("%") for line in after_table.splitlines() if line.strip())
    assert "line one line two {with braces}" in after_table


# --- CSV ------------------------------------------------------------------------------------------

def test_csv_round_trips_numeric_columns():
    records = [ok_record(model=CUSTOM), ok_record(context=256), failed_record("oom", OOM_MSG)]
    df = pd.read_csv(io.StringIO(render(records, "csv")))
    assert len(df) == 3
    assert df["forward_ms_mean"].iloc[0] == pytest.approx(records[0]["metrics"]["forward_ms"]["mean"])
    assert df["step_ms_std"].iloc[1] == pytest.approx(records[1]["metrics"]["step_ms"]["std"])
    assert pd.isna(df["forward_ms_mean"].iloc[2]) and df["status"].iloc[2] == "oom"
    assert df["params"].iloc[0] == 1_234_567
    assert list(df["model"])[:2] == [CUSTOM, "tiny"]


# --- axes: caption vs columns ---------------------------------------------------------------------

def test_constant_axes_go_to_the_caption_and_varying_ones_become_columns():
    records = [ok_record(), ok_record(attention="sdpa", context=256)]
    table, caption, _ = display_frame(records)
    assert "attention" in table.columns and list(table["attention"]) == ["naive", "sdpa"]
    for axis in ("batch", "mode", "optimizer", "device"):
        assert axis not in table.columns
        assert axis in caption
    assert "attention" not in caption
    # size and precision are columns even with one value: the same columns on every CPU
    assert {"context", "size", "precision"} <= set(table.columns) and "precision" not in caption
    assert "tiny (d=64 L=2 H=4 ff=256), 1,234,567 parameters" in render(records, "text")


def test_params_stay_integers_next_to_failed_rows():
    out = render([ok_record(params=1_234_567), failed_record("oom", OOM_MSG)], "text")
    assert "1,234,567" in out and "1,234,567.0" not in out


# --- notes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_non_ok_rows_get_numbered_notes(fmt):
    out = render(mixed(), fmt)
    assert f"[1] oom: {OOM_MSG}" in out
    assert f"[2] error: {ERR_MSG}" in out
    assert out.index("[1] oom:") < out.index("[2] error:")


def test_status_column_references_the_notes():
    table, _, notes = display_frame(mixed())
    assert list(table["status"]) == ["ok", "oom [1]", "ok", "error [2]"]
    assert notes[-2:] == [f"[1] oom: {OOM_MSG}", f"[2] error: {ERR_MSG}"]


def test_no_notes_when_all_ok():
    table, _, notes = display_frame([ok_record(), ok_record(context=256)])
    assert not any(n.startswith("[") for n in notes)
    assert list(table["status"]) == ["ok", "ok"]
    assert "[1]" not in render([ok_record(), ok_record(context=256)], "text")


def test_failed_rows_show_dashes():
    table, _, _ = display_frame(mixed())
    row = table.iloc[1]
    assert pd.isna(row["forward (ms)"]) and row["tokens/s"] == "-" and row["step mean ± std"] == "-"
    oom = next(line for line in render(mixed(), "text").splitlines() if "oom [1]" in line)
    assert "  -  " in oom




# --- empty, unknown format ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "markdown", "latex"])
def test_empty_list(fmt):
    assert render([], fmt) == "no records\n"


def test_empty_display_frame():
    table, caption, notes = display_frame([])
    assert table.empty and caption == "no records" and notes == []


@pytest.mark.parametrize("fmt", ["html", "", "TEXT"])
def test_unknown_format(fmt):
    with pytest.raises(ValueError, match="unknown format") as info:
        render([ok_record()], fmt)
    for name in FORMATS:
        assert name in str(info.value)


def test_formats():
    assert set(FORMATS) == {"text", "markdown", "latex", "csv"}


# --- memory column --------------------------------------------------------------------------------

def test_memory_column_for_cpu_records():
    table, _, _ = display_frame([ok_record(), ok_record(context=256)])
    assert "peak RSS" in table.columns
    assert "peak GPU" not in table.columns
    assert table["peak RSS"].iloc[0] == "250 MiB"  # max over the phases


def test_memory_column_for_cuda_records():
    phases = ("forward", "backward", "optimizer")
    mem = cuda_memory(phases, allocated=(1000.0, 2345.4, 1800.0), reserved=(4096.0, 8192.0, 8192.0))
    records = [ok_record(device="cuda", memory=mem), ok_record(device="cuda", context=256, memory=mem)]
    table, _, _ = display_frame(records)
    assert "peak GPU" in table.columns
    assert "peak RSS" not in table.columns
    assert table["peak GPU"].iloc[0] == "2.29 GiB"  # allocated peak (2,345.4 MiB), not reserved
    out = render(records, "text")
    assert "peak GPU" in out and "peak RSS" not in out


def test_memory_column_for_mixed_kinds():
    phases = ("forward", "backward", "optimizer")
    records = [ok_record(), ok_record(device="cuda", memory=cuda_memory(phases, (1.0,) * 3, (2.0,) * 3))]
    table, _, _ = display_frame(records)
    assert "peak memory" in table.columns
    assert "peak GPU" not in table.columns and "peak RSS" not in table.columns


def test_memory_title_ignores_failed_rows():
    table, _, _ = display_frame(mixed())
    assert "peak RSS" in table.columns


# --- MFU --------------------------------------------------------------------------------------------

def test_mfu_column_only_when_known():
    assert "MFU" not in display_frame([ok_record()])[0].columns
    table, _, _ = display_frame([ok_record(mfu=0.4534), ok_record(context=256)])
    assert list(table["MFU"]) == ["45.3%", "-"]


def test_two_runs_of_one_spec_are_told_apart_and_never_held_against_each_other():
    """Issue 43 (11): `lmperf table` printed two runs of one spec as rows nothing told apart,
    and held a bf16-mixed run against the fp32 run of another command (0.31x)."""
    first = ok_record(precision="fp32", step=[10.0, 10.0, 10.0]) | {"sweep": "2025-01-01T10:00:00Z"}
    again = ok_record(precision="fp32", step=[30.0, 30.0, 30.0]) | {"sweep": "2025-01-01T11:00:00Z"}
    later = ok_record(precision="bf16-mixed", step=[3.0, 3.0, 3.0]) | {"sweep": "2025-01-01T12:00:00Z"}
    report = build_report([first, again, later])
    shown, _, _ = report.main()
    assert list(shown["run"]) == ["10:00:00", "11:00:00", "12:00:00"]
    assert not any(name.startswith("precision") for name in report.tables)  # no pair in a run
    assert not any("bf16-mixed / fp32" in line for line in report.headline)
    mine = ok_record(precision="bf16-mixed", step=[5.0, 5.0, 5.0]) | {"sweep": first["sweep"]}
    report = build_report([first, again, mine])  # bf16-mixed of the first run: against it
    (table,) = [df for name, df in report.tables.items() if name.startswith("precision")]
    assert table["step (x fp32)"].tolist() == [0.5]
