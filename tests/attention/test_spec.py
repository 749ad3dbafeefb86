"""AttnSpec validation, the analytic matrix, and the suites' CPU scaling."""

from __future__ import annotations

import pytest

from lmperf.questions.attention.spec import SUITES, AttnSpec, plan_sweep
from lmperf.errors import SpecError


@pytest.mark.parametrize("bad, match", [
    (dict(attention="nope"), "unknown attention implementation 'nope'"),
    (dict(dtype="fp8"), "unknown dtype 'fp8'"),
    (dict(context=0), "context must be a positive integer"),
    (dict(d=-4), "d must be a positive integer"),
    (dict(warmup=-1), "warmup must be a non-negative"),
    (dict(device="tpu"), "unknown device"),
])
def test_bad_specs_raise_spec_error(bad, match):
    with pytest.raises(SpecError, match=match):
        AttnSpec(**{"attention": "naive", "context": 64, **bad})


def test_the_analytic_score_matrix_is_batch_heads_seq_squared_bytes():
    assert AttnSpec("naive", context=1024, batch=8, heads=2, dtype="bf16").score_matrix_bytes() \
        == 8 * 2 * 1024 * 1024 * 2


def test_a_spec_round_trips_through_its_dict():
    s = AttnSpec("flash-torch", context=100, causal=False, threads=1)
    assert AttnSpec.from_dict(s.to_dict()) == s


def test_cpu_default_covers_the_acceptance_sequence_lengths_and_says_what_is_opt_in():
    plan = plan_sweep("flash", "cpu")
    assert {s.attention for s in plan.specs} == {"naive", "sdpa", "flash-torch"}
    assert {1024, 2048} <= {s.context for s in plan.specs}
    assert all(s.causal and s.batch == 1 and s.dtype == "fp32" for s in plan.specs)
    assert any("compiled is opt-in" in n for n in plan.notes)
    assert any("flash-triton is opt-in" in n for n in plan.notes)


def test_the_gpu_suites_are_the_courses():
    flash = plan_sweep("flash", "cuda")
    assert {s.context for s in flash.specs} == {2**i for i in range(7, 17)}
    assert {s.dtype for s in flash.specs} == {"bf16", "fp32"}
    assert len(flash.specs) == 5 * 10 * 4 * 2
    torch_suite = plan_sweep("pytorch", "cuda")
    assert {(s.batch, s.heads, s.causal) for s in torch_suite.specs} == {(8, 1, False)}
    assert {s.attention for s in torch_suite.specs} == set(SUITES["pytorch"].impls)


def test_explicit_values_replace_the_suites():
    plan = plan_sweep("flash", "cpu", impls=["naive", "naive"], seqs=[64, 32], ds=[16],
                      batch=2, causal=False)
    assert [(s.attention, s.context, s.batch, s.causal) for s in plan.specs] == \
        [("naive", 32, 2, False), ("naive", 64, 2, False)]


def test_an_unknown_suite_or_zero_batch_is_a_spec_error():
    with pytest.raises(SpecError, match="unknown suite"):
        plan_sweep("course", "cpu")
    with pytest.raises(SpecError, match="--batch must be"):
        plan_sweep("flash", "cpu", batch=0)


def test_the_spec_is_a_core_job_and_reads_older_fields():
    assert AttnSpec.kind == "attention"
    assert AttnSpec.runner == "lmperf.questions.attention.job:run_spec"
    # an older record has no threads (its names before issue 17: results.record.migrate)
    assert AttnSpec.from_dict({"attention": "naive", "context": 64, "dtype": "bf16"}).threads == 0
