"""ProfileSpec and the plan of `lmperf profile`: defaults, checks, and the trip to a child."""

from __future__ import annotations

import pytest

from lmperf.core.jobs import job_id
from lmperf.errors import SpecError
from lmperf.questions.profile.plan import plan_profile
from lmperf.questions.profile.spec import ProfileSpec
from lmperf.workload.spec import RunSpec


def test_plan_takes_the_cpu_defaults_and_the_thread_policy():
    spec = plan_profile(device="cpu").spec
    assert (spec.size, spec.context, spec.precision) == ("mini", 128, "fp32")
    assert (spec.warmup, spec.steps, spec.threads) == (2, 10, 1)
    assert spec.trace.startswith("results/traces/mini_ctx128")


def test_a_user_model_without_size_runs_one_shape():
    plan = plan_profile(model="tests.fixtures.models:bigram", device="cpu", context=16)
    assert plan.spec.model == "tests.fixtures.models:bigram" and plan.spec.size == "mini"
    assert "receives mini's shape" in plan.notes[0]


def test_spec_round_trips_and_records_carry_the_run_spec(tmp_path):
    spec = plan_profile(size="tiny", context=32, warmup=0, top=3, device="cpu",
                        trace=tmp_path / "t.json").spec
    assert ProfileSpec.from_dict(spec.to_dict()) == spec  # what a child process rebuilds
    assert spec.record_spec() == RunSpec.from_dict(spec.record_spec()).to_dict()
    assert {"top", "trace"} <= set(spec.to_dict()) and "top" not in spec.record_spec()
    # a record's spec (no top, no trace) rebuilds a spec with the defaults
    assert ProfileSpec.from_dict(spec.record_spec()).top == 10
    assert job_id(spec) != job_id(spec.with_(top=4))


@pytest.mark.parametrize("kwargs, fragment", [
    ({"top": 0}, "--top must be a positive integer"),
    ({"context": [32, 64]}, "a profile is one run"),
    ({"warmup": -1}, "warmup must be a non-negative integer"),
])
def test_bad_input_is_a_spec_error(kwargs, fragment):
    with pytest.raises(SpecError, match=fragment):
        plan_profile(size="tiny", device="cpu", **kwargs)
