"""`lmperf dist leaderboard`: do_bench-style counts, the job's validation and shape, and the same
path end to end on the CPU (2 gloo ranks, a scaled-down model)."""

from __future__ import annotations

import pytest

from lmperf.cli import main
from lmperf.errors import SpecError
from lmperf.model.checks import count_params
from lmperf.model.custom import build_model
from lmperf.model.presets import ModelConfig
from lmperf.questions.parallel import leaderboard
from lmperf.results.store import read_records


class FakeClock:
    """A clock each call of `fn` advances by `ms`."""

    def __init__(self, ms: float):
        self.now, self.ms, self.calls = 0.0, ms, 0

    def __call__(self) -> float:
        return self.now

    def fn(self) -> None:
        self.calls += 1
        self.now += self.ms / 1e3


def test_do_bench_counts_follow_the_budgets():
    clock = FakeClock(10.0)
    out = leaderboard.do_bench(clock.fn, lambda: None, warmup_ms=25, rep_ms=100, clock=clock)
    assert out["estimate_ms"] == pytest.approx(10.0)
    assert (out["n_warmup"], out["n_rep"]) == (2, 10)
    assert out["times_ms"] == pytest.approx([10.0] * 10)
    assert clock.calls == 1 + leaderboard.ESTIMATE_CALLS + 2 + 10  # untimed, estimate, warm-up, timed


def test_do_bench_takes_one_of_each_for_a_step_longer_than_the_budgets():
    clock = FakeClock(5000.0)  # a multi-second step: the leaderboard's case
    out = leaderboard.do_bench(clock.fn, lambda: None, warmup_ms=25, rep_ms=100, clock=clock)
    assert (out["n_warmup"], out["n_rep"]) == (1, 1) and out["times_ms"] == pytest.approx([5000.0])


def test_plan_is_the_leaderboards_shape():
    job = leaderboard.plan(device="cpu")
    assert (job.d_model, job.num_layers, job.num_heads, job.d_ff, job.vocab_size) == (
        4096, 34, 32, 11008, 151_936)
    assert (job.context, job.batch, job.world_size) == (32768, 2, 2)
    assert job.precision == "bf16-true" and job.checkpointing and job.backend == "gloo"
    assert leaderboard.LeaderboardJob.from_dict(job.to_dict()) == job


@pytest.mark.parametrize("bad", [dict(batch=3), dict(precision="fp8"), dict(warmup_ms=-1),
                                 dict(size="huge")])
def test_bad_options_are_spec_errors(bad):
    with pytest.raises(SpecError):
        leaderboard.plan(**{"size": "tiny", "device": "cpu", **bad})


def test_two_world_sizes_are_refused_in_one_line(capsys):
    assert main(["dist", "leaderboard", "--world-size", "2", "4", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "one world size" in err and "Traceback" not in err


@pytest.mark.slow
def test_the_step_runs_on_two_gloo_ranks(tmp_path, capsys):
    out = tmp_path / "lb.jsonl"
    code = main(["dist", "leaderboard", "--size", "tiny", "--context", "32", "--batch", "2",
                 "--device", "cpu", "--warmup-ms", "1", "--rep-ms", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    (record,) = read_records(out)
    assert record["status"] == "ok", record.get("message")
    spec, m = record["spec"], record["metrics"]
    assert spec["what"] == "leaderboard" and spec["checkpointing"] and spec["world_size"] == 2
    assert m["n_rep"] >= 1 and m["n_warmup"] >= 1 and m["step_ms"]["median"] > 0
    assert len(m["per_rank_times_ms"]) == 2 and all(len(t) == m["n_rep"] for t in m["per_rank_times_ms"])
    # the slowest rank per repetition
    assert m["step_ms"]["max"] == pytest.approx(max(max(t) for t in m["per_rank_times_ms"]))
    assert m["tokens_per_step"] == 64 and m["cold_start_s"] > 0
    tiny = build_model(ModelConfig(vocab_size=spec["vocab_size"], context_length=32,
                                   d_model=spec["d_model"], num_layers=spec["num_layers"],
                                   num_heads=spec["num_heads"], d_ff=spec["d_ff"]))
    assert record["params"] == count_params(tiny)  # the whole model, not one rank's shard
    assert "leaderboard step" in capsys.readouterr().out
    # lmperf table reads the file back with the leaderboard's own Report
    assert main(["table", str(out)]) == 0
    assert "leaderboard step" in capsys.readouterr().out


def test_the_python_api_plans_the_same_job(monkeypatch):
    import lmperf

    seen = {}
    monkeypatch.setattr("lmperf.core.torchrun.run_job",
                        lambda job: seen.setdefault("job", job) and [])
    report = lmperf.dist("leaderboard", size="tiny", context=32, device="cpu", precision="bf16-mixed",
                         rep_ms=5.0)
    job = seen["job"]
    assert (job.size, job.context, job.batch, job.precision, job.rep_ms) == (
        "tiny", 32, 2, "bf16-mixed", 5.0)
    assert report.kind == "leaderboard" and report.frame.empty
    with pytest.raises(SpecError):
        lmperf.dist("leaderboard", world_size=[2, 4], device="cpu")
