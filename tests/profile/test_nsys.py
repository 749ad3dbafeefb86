"""Nsight Systems backend: command lines, CSV parsing of report exports, and the no-nsys path.

Fixture format (tests/profile/data/nsys_*.csv): what `nsys stats --report <r> --format csv`
writes for Nsight Systems 2022.x-2025.x. Column names are those of the report scripts shipped with
Nsight (`host-linux-x64/reports/cuda_gpu_kern_sum.py`, (c) 2020-2024 NVIDIA: "Time:ratio_%",
"Total Time:dur_ns", "Instances", "Avg:dur_ns", "Med:dur_ns", "Min:dur_ns", "Max:dur_ns",
"StdDev:dur_ns", "Name" -> "Time (%)", "Total Time (ns)", ...; `nvtx_sum` adds "Style","Range",
default-domain ranges printed as ":name"), documented in the Nsight Systems Post-Collection
Analysis Guide ("cuda_gpu_kern_sum[:nvtx-name][:base|:mangled]", "nvtx_sum"). Values follow the
scripts' SQL (Time % = round(total * 100 / sum, 1), Avg/Med/StdDev rounded to 0.1 ns, rows ordered
by total time descending) and Python csv quoting (names quoted only when they contain a comma),
as in published exports. Kernel names are seed 002's A100 list; the times are illustrative, not a
measurement. Line endings (LF here) and quoting are not verified against a real export on this
machine (no nsys, no GPU): replace the fixtures with real exports when a GPU with nsys is available.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from lmperf.errors import LmperfError
from lmperf.questions.profile.backends import nsys_commands as ns

DATA = Path(__file__).parent / "data"
KERN_CSV = (DATA / "nsys_cuda_gpu_kern_sum.csv").read_text()
NVTX_CSV = (DATA / "nsys_nvtx_sum.csv").read_text()


# --- command construction ------------------------------------------------------------------------

def test_profile_command_flags_and_order(tmp_path: Path) -> None:
    child = [sys.executable, "-m", "lmperf.questions.bench.child", "--spec", "x.json"]
    argv = ns.build_profile_command("/opt/nsys/bin/nsys", tmp_path / "run1", child)
    assert argv[:2] == ["/opt/nsys/bin/nsys", "profile"]
    assert argv[-len(child):] == child  # the application comes last, after every nsys option
    options = argv[2:-len(child)]
    assert all(o.startswith("--") for o in options)
    assert "--trace=cuda,nvtx" in options
    assert "--capture-range=nvtx" in options
    assert f"--nvtx-capture={ns.MEASURED_RANGE}" in options
    assert ns.MEASURED_RANGE == "measured"
    assert "--capture-range-end=stop" in options
    assert "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0" in options
    assert "--force-overwrite=true" in options
    assert f"--output={tmp_path / 'run1'}" in options


def test_profile_command_custom_capture_range(tmp_path: Path) -> None:
    argv = ns.build_profile_command("nsys", tmp_path / "r", ["python", "x.py"], capture_range="step")
    assert "--nvtx-capture=step" in argv


def test_report_path() -> None:
    assert ns.report_path(Path("/tmp/run1")) == Path("/tmp/run1.nsys-rep")
    assert ns.report_path(Path("/tmp/run1.nsys-rep")) == Path("/tmp/run1.nsys-rep")
    assert ns.report_path(Path("/tmp/small.ctx128")) == Path("/tmp/small.ctx128.nsys-rep")


def test_stats_command() -> None:
    report = Path("/tmp/run1.nsys-rep")
    assert ns.build_stats_command("nsys", report) == [
        "nsys", "stats", "--report=cuda_gpu_kern_sum", "--format=csv", "--output=-", str(report)]
    argv = ns.build_stats_command("nsys", report, ns.NVTX_SUM, nvtx_filter=ns.nvtx_filter("forward"))
    assert argv[2] == "--report=nvtx_sum"
    assert "--filter-nvtx=forward" in argv
    assert argv[-1] == str(report)


def test_nvtx_filter_syntax() -> None:
    assert ns.nvtx_filter("forward") == "forward"
    assert ns.nvtx_filter("forward", domain="lmperf") == "forward@lmperf"
    assert ns.nvtx_filter("step", index=3) == "step/3"
    assert ns.nvtx_filter("computing softmax", domain="NVTX", index=0) == "computing softmax@NVTX/0"


# --- parsing ---------------------------------------------------------------------------------------

def test_parse_kern_sum_fixture() -> None:
    df = ns.parse_kern_sum_csv(KERN_CSV)
    assert list(df.columns) == ns.KERNEL_COLUMNS
    assert len(df) == 14
    top = df.iloc[0]
    assert top["name"] == "ampere_sgemm_128x64_tn"
    assert top["calls"] == 241
    assert top["total_ms"] == pytest.approx(2849887 / 1e6)  # ns -> ms
    assert top["avg_us"] == pytest.approx(11825.3 / 1e3)  # ns -> us
    assert (top["min_us"], top["max_us"]) == pytest.approx((10.906, 13.031))
    # a quoted templated name with commas survives intact
    copy = df[df["name"].str.contains("direct_copy_kernel_cuda")].iloc[0]
    assert copy["name"].startswith("void at::native::elementwise_kernel<(int)128, (int)2, ")
    assert copy["calls"] == 480
    assert df["share"].sum() == pytest.approx(1.0)
    # share agrees with nsys's own rounded Time (%) column
    assert top["share"] * 100 == pytest.approx(14.8, abs=0.05)


def test_parse_nvtx_sum_fixture() -> None:
    df = ns.parse_nvtx_sum_csv(NVTX_CSV)
    assert list(df.columns) == ns.RANGE_COLUMNS
    by = df.set_index("range")
    assert set(by.index) >= {"measured", "step", "forward", "loss", "backward", "optimizer",
                             "computing attention scores", "computing softmax", "final matmul"}
    assert by.loc["forward", "raw_range"] == ":forward"  # default domain prefix removed
    assert by.loc["forward", "instances"] == 10
    assert by.loc["forward", "total_ms"] == pytest.approx(89299898 / 1e6)
    assert by.loc["computing softmax", "instances"] == 120
    assert (df["style"] == "PushPop").all()
    assert df["share"].sum() == pytest.approx(1.0)


def test_parse_skips_nsys_preamble() -> None:
    text = ("Processing [run1.sqlite] with [/opt/nvidia/nsight-systems/2024.5.1/host-linux-x64/"
            "reports/cuda_gpu_kern_sum.py]... \n\n" + KERN_CSV)
    assert ns.parse_kern_sum_csv(text).equals(ns.parse_kern_sum_csv(KERN_CSV))


def test_parse_crlf_and_old_gpukernsum_header() -> None:
    # Nsight 2020.x gpukernsum.py: "Time(%)","Total Time (ns)","Instances","Average","Minimum",
    # "Maximum","Name" (times in ns, no median or stddev).
    old = ("Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,Name\r\n"
           "75.0,3000,2,1500.0,1400,1600,ampere_sgemm_128x64_tn\r\n"
           "25.0,1000,4,250.0,200,300,\"void k<float, 4>(float*, int)\"\r\n")
    df = ns.parse_kern_sum_csv(old)
    assert list(df["calls"]) == [2, 4]
    assert list(df["total_ms"]) == pytest.approx([0.003, 0.001])
    assert df.iloc[0]["avg_us"] == pytest.approx(1.5)
    assert df["med_us"].isna().all() and df["stddev_us"].isna().all()
    assert df.iloc[1]["name"] == "void k<float, 4>(float*, int)"


def test_parse_other_time_unit() -> None:
    text = "Time (%),Total Time (us),Instances,Avg (us),Name\n100.0,250.5,5,50.1,k\n"
    df = ns.parse_kern_sum_csv(text)
    assert df.iloc[0]["total_ms"] == pytest.approx(0.2505)
    assert df.iloc[0]["avg_us"] == pytest.approx(50.1)


def test_parse_empty_and_bad_input() -> None:
    assert ns.parse_kern_sum_csv("").empty
    assert list(ns.parse_kern_sum_csv("SKIPPED: run1.sqlite does not contain CUDA kernel data.\n").columns) == ns.KERNEL_COLUMNS
    assert ns.parse_nvtx_sum_csv("").empty
    with pytest.raises(LmperfError):
        ns.parse_kern_sum_csv("Time,Total Time [ns],Count,Name\n1,2,3,k\n")


# --- without nsys ----------------------------------------------------------------------------------

def test_nsys_not_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ns.nsys_path() is None
    with pytest.raises(LmperfError, match="nsys is not on PATH; use --backend torch"):
        ns.run_nsys(["python", "-c", "pass"], tmp_path / "run1")


# --- run_nsys with a stand-in nsys -----------------------------------------------------------------

FAKE_NSYS = r'''#!{python}
"""Stand-in for nsys: `profile` writes <output>.nsys-rep; `stats --help-reports` lists the
reports this version has (and exits {help_exit}, as some versions do); `stats` exports the report
to <report>.sqlite as nsys does (refusing a stale one without --force-export=true) and prints a
fixture of the requested report, or fails for a report this version does not have."""
import json, os, sys
from pathlib import Path
log = Path({log!r})
with log.open("a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "env": os.environ.get("NSYS_NVTX_PROFILER_REGISTER_ONLY")}}) + "\n")
args = sys.argv[1:]
reports = {reports!r}
if args[0] == "profile":
    if {fail!r}:
        sys.exit("failed to start the collection")
    out = next(a.split("=", 1)[1] for a in args if a.startswith("--output="))
    if {write!r}:
        Path(out + ".nsys-rep").write_text("report")
    sys.exit(0)
if args[:2] == ["stats", "--help-reports"]:
    print("The following built-in reports are available:\n")
    for r in reports:
        print("  " + r + "[:base|:mangled] -- a report")
    sys.exit({help_exit!r})
report = next(a.split("=", 1)[1] for a in args if a.startswith("--report="))
if report not in reports:
    sys.exit("ERROR: Report '" + report + "' could not be found.")
rep = Path(args[-1])
sqlite = rep.with_suffix(".sqlite")
if "--force-export=true" in args or not sqlite.exists():
    sqlite.write_text("exported")
elif sqlite.stat().st_mtime_ns < rep.stat().st_mtime_ns:
    sys.exit("ERROR: " + str(sqlite) + " File is older than input file " + str(rep))
filt = [a.split("=", 1)[1] for a in args if a.startswith("--filter-nvtx=")]
if filt and filt[0] == "loss":
    sys.exit(0)  # a range without kernels: nsys prints no table and exits 0
print("Processing [run1.sqlite] with [/opt/reports/" + report + ".py]... ")
print()
print(Path({data!r}, "nsys_" + report + ".csv").read_text(), end="")
'''
NEW_REPORTS = ("cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_trace", "nvtx_sum", "nvtx_kern_sum")
OLD_REPORTS = ("cudaapisum", "gpukernsum", "gputrace", "nvtxppsum")  # Nsight Systems 2020.x-2021.x


def _fake_nsys(tmp_path: Path, fail: bool = False, write: bool = True,
               reports: tuple[str, ...] = NEW_REPORTS, help_exit: int = 0,
               data: Path = DATA) -> tuple[str, Path]:
    home = tmp_path / f"fake-{fail}-{write}-{reports[1]}-{help_exit}"
    log = home / "calls.jsonl"
    exe = home / "bin" / "nsys"
    exe.parent.mkdir(parents=True)
    exe.write_text(FAKE_NSYS.format(python=sys.executable, log=str(log), fail=fail, write=write,
                                    data=str(data), reports=list(reports), help_exit=help_exit))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe), log


def test_run_nsys_plumbing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe, log = _fake_nsys(tmp_path)
    monkeypatch.setenv("PATH", str(Path(exe).parent) + os.pathsep + os.environ.get("PATH", ""))
    assert ns.nsys_path() == exe
    run = ns.run_nsys(["python", "child.py"], tmp_path / "out" / "run1")
    assert run.report == tmp_path / "out" / "run1.nsys-rep"
    assert set(run.kernels) == {"all", "step", "forward", "loss", "backward", "optimizer"}
    assert run.kernels["all"]["calls"].iloc[0] == 241
    assert run.kernels["loss"].empty  # the stand-in prints no table for "loss", as nsys does
    assert run.kernels["forward"]["share"].sum() == pytest.approx(1.0)
    assert "forward" in set(run.ranges["range"])
    calls = log.read_text().splitlines()
    assert len(calls) == len(run.commands) == 1 + 1 + 6 + 1  # profile, help-reports, 6 + 1 stats
    assert '"env": "0"' in calls[0]  # the capture range needs unregistered NVTX strings
    argvs = [json.loads(c)["argv"] for c in calls]
    assert argvs[1] == ["stats", "--help-reports"]
    stats = argvs[2:]
    assert all(a[0] == "stats" for a in stats)
    # the first export refreshes the SQLite file; the others reuse it
    assert [("--force-export=true" in a) for a in stats] == [True] + [False] * 6
    assert [a for a in stats[0] if a.startswith("--report=")] == ["--report=cuda_gpu_kern_sum"]
    assert [a for a in stats[-1] if a.startswith("--report=")] == ["--report=nvtx_sum"]


def test_run_nsys_empty_range_and_failures(tmp_path: Path) -> None:
    exe, _ = _fake_nsys(tmp_path)
    run = ns.run_nsys(["python", "child.py"], tmp_path / "run1", filters=("loss",), nsys=exe)
    assert run.kernels["loss"].empty and list(run.kernels["loss"].columns) == ns.KERNEL_COLUMNS

    failing, _ = _fake_nsys(tmp_path, fail=True)
    with pytest.raises(LmperfError, match="nsys profile failed with exit code 1"):
        ns.run_nsys(["python", "child.py"], tmp_path / "run2", nsys=failing)

    silent, _ = _fake_nsys(tmp_path, write=False)
    with pytest.raises(LmperfError, match="wrote no report"):
        ns.run_nsys(["python", "child.py"], tmp_path / "run3", nsys=silent)


# --- the profiled child: phases end on the device inside their NVTX range (finding 3) -----------

def test_nsys_child_synchronises_inside_each_phase_range(tmp_path, monkeypatch):
    """--filter-nvtx keeps a range's kernels by its CPU start and end: each phase range must
    drain the device before it closes (and when it opens, for loss inside forward). On the CPU
    the sync is a no-op, so the order of range and sync calls is what is checked."""
    import contextlib
    import json

    import torch

    from lmperf.questions.profile.backends import torch_capture as capture, nsys_child
    from lmperf.runtime import device as dev
    from lmperf.workload.spec import RunSpec

    log: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def recording(name):
        log.append(("push", name))
        yield
        log.append(("pop", name))

    monkeypatch.setattr(capture, "annotate", recording)  # what prepare_annotated installs
    monkeypatch.setattr(dev, "synchronize", lambda device: log.append(("sync", "")))
    spec = tmp_path / "spec.json"
    run = RunSpec.from_size("tiny", context=16, batch=1, warmup=0, steps=2)
    spec.write_text(json.dumps(run.to_dict()))
    threads = torch.get_num_threads()
    try:
        assert nsys_child.main([str(spec)]) == 0
    finally:
        torch.set_num_threads(threads)
    for phase in ("forward", "loss", "backward", "optimizer", "step"):
        pushes = [i for i, e in enumerate(log) if e == ("push", phase)]
        pops = [i for i, e in enumerate(log) if e == ("pop", phase)]
        assert len(pushes) == len(pops) == 2, phase
        for i, j in zip(pushes, pops):
            assert log[i + 1] == ("sync", ""), (phase, log[i:j + 1])
            assert log[j - 1] == ("sync", ""), (phase, log[i:j + 1])


def test_synced_annotate_leaves_other_ranges_alone():
    import contextlib

    from lmperf.questions.profile.backends.nsys_child import SYNCED_RANGES, synced_annotate

    log = []

    @contextlib.contextmanager
    def rng(name):
        log.append(f"+{name}")
        yield
        log.append(f"-{name}")

    ann = synced_annotate("dev", annotate=rng, sync=lambda d: log.append(f"sync {d}"))
    with ann("forward"):
        with ann("computing scores"):
            log.append("work")
    assert log == ["+forward", "sync dev", "+computing scores", "work", "-computing scores",
                   "sync dev", "-forward"]
    assert set(SYNCED_RANGES) == {"step", "forward", "loss", "backward", "optimizer"}


def test_stats_command_force_export_flag() -> None:
    report = Path("/tmp/run1.nsys-rep")
    argv = ns.build_stats_command("nsys", report, force_export=True, nvtx_filter="forward")
    assert "--force-export=true" in argv and argv[-1] == str(report)
    assert argv.index("--force-export=true") < len(argv) - 1  # an option, before the file
    assert "--force-export=true" not in ns.build_stats_command("nsys", report)


def test_report_names_and_pick() -> None:
    text = ("The following built-in reports are available:\n\n"
            "  cuda_gpu_kern_sum[:nvtx-name][:base|:mangled] -- CUDA GPU Kernel Summary\n"
            "  nvtx_sum -- NVTX Range Summary\n")
    names = ns.report_names(text)
    assert {"cuda_gpu_kern_sum", "nvtx_sum"} <= names
    assert ns.pick_report(names, ns.KERN_SUM_NAMES) == "cuda_gpu_kern_sum"
    old = ns.report_names("gpukernsum[:base|:mangled] -- CUDA GPU Kernel Summary\nnvtxppsum -- x")
    assert ns.pick_report(old, ns.KERN_SUM_NAMES) == "gpukernsum"
    assert ns.pick_report(old, ns.NVTX_SUM_NAMES) == "nvtxppsum"
    assert ns.pick_report(set(), ns.NVTX_SUM_NAMES) == "nvtx_sum"  # unreadable: the newest
    # several names on one line (some versions print them so)
    assert ns.pick_report(ns.report_names("gpukernsum cudaapisum nvtxsum"), ns.NVTX_SUM_NAMES) == "nvtxsum"


def _old_format(text: str, label: str) -> str:
    """A 2022+ report CSV rewritten as Nsight 2020.x-2021.x printed it: `Time(%)`, unit-less
    Average/Minimum/Maximum, no Med/StdDev/Style columns (gpukernsum.py / nvtxppsum.py)."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    keep = {"Time (%)": "Time(%)", "Total Time (ns)": "Total Time (ns)", "Instances": "Instances",
            "Avg (ns)": "Average", "Min (ns)": "Minimum", "Max (ns)": "Maximum", label: label}
    at = [rows[0].index(k) for k in keep]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(list(keep.values()))
    for row in rows[1:]:
        writer.writerow([row[i] for i in at])
    return out.getvalue()


def test_run_nsys_with_old_report_names(tmp_path: Path) -> None:
    """An Nsight Systems that only has gpukernsum / nvtxppsum (and exits 1 after listing its
    reports, as some versions do): run_nsys asks for those and parses their older CSV."""
    data = tmp_path / "old-data"
    data.mkdir()
    (data / "nsys_gpukernsum.csv").write_text(_old_format(KERN_CSV, "Name"))
    (data / "nsys_nvtxppsum.csv").write_text(_old_format(NVTX_CSV, "Range"))
    exe, log = _fake_nsys(tmp_path, reports=OLD_REPORTS, help_exit=1, data=data)
    run = ns.run_nsys(["python", "child.py"], tmp_path / "run1", nsys=exe)
    stats = [json.loads(c)["argv"] for c in log.read_text().splitlines()][2:]
    assert {a for s in stats for a in s if a.startswith("--report=")} == {
        "--report=gpukernsum", "--report=nvtxppsum"}
    new = ns.parse_kern_sum_csv(KERN_CSV)
    got = run.kernels["all"]
    assert got["name"].tolist() == new["name"].tolist() and got["calls"].tolist() == new["calls"].tolist()
    assert got["med_us"].isna().all()  # the old report has no median
    assert run.kernels["forward"]["share"].sum() == pytest.approx(1.0)
    assert run.ranges.set_index("range").loc["forward", "instances"] == 10
    assert run.ranges["style"].isna().all()


def test_rerun_with_a_stale_sqlite_beside_the_report(tmp_path: Path) -> None:
    """Profiling again to the same output leaves the first run's .sqlite older than the new
    .nsys-rep; without --force-export nsys stats stops on it."""
    exe, _ = _fake_nsys(tmp_path)
    ns.run_nsys(["python", "child.py"], tmp_path / "run1", nsys=exe)
    sqlite = tmp_path / "run1.sqlite"
    assert sqlite.exists()
    os.utime(sqlite, ns=(1, 1))  # older than any report written after it
    run = ns.run_nsys(["python", "child.py"], tmp_path / "run1", nsys=exe)
    assert run.kernels["all"]["calls"].iloc[0] == 241
    stale = [a for a in run.commands if "--force-export=true" not in a and a[1] == "stats"
             and a[-1].endswith(".nsys-rep")]
    with pytest.raises(LmperfError, match="older than input file"):  # what the flag prevents
        os.utime(sqlite, ns=(1, 1))
        ns._run(stale[0], None, None)
